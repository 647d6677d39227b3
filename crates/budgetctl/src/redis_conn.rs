//! Connecting the CLI to the fleet store in Redis, with errors that say which URL failed.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fleet_budget::Config;
use fleet_budget::Dependency;
use fleet_budget::keys::{budget_key_pattern, dependency_of_key};
use fleet_budget::store::{RedisStore, RedisTarget};

/// How long the CLI waits for one Redis call: the configured deadline, but at least a second
/// (an operator's command is not a worker's hot path).
pub(crate) fn cli_timeout(config: &Config) -> Duration {
    config.redis.timeout.max(Duration::from_secs(1))
}

/// The Redis target of `config`.
pub(crate) fn target(config: &Config) -> RedisTarget {
    if config.redis.cluster_urls.is_empty() {
        RedisTarget::Single(config.redis.url.clone())
    } else {
        RedisTarget::Cluster(config.redis.cluster_urls.clone())
    }
}

/// Connects to the fleet store and checks that it answers `PING`.
///
/// # Errors
/// A URL that cannot be used, or a server that does not answer (the message names the URL,
/// password redacted, and how to start one).
pub(crate) async fn connect(config: &Config, timeout: Duration) -> anyhow::Result<Arc<RedisStore>> {
    let target = target(config);
    let shown = target.display();
    let store = RedisStore::new(target, &config.redis.key_prefix, timeout)
        .map_err(|e| crate::exit::usage(format!("--redis-url / redis.url {shown}: {e}")))?;
    store.ping().await.map_err(|e| unreachable(&shown, &e))?;
    Ok(Arc::new(store))
}

/// The error for a Redis that does not answer.
pub(crate) fn unreachable(shown: &str, e: &dyn std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!(
        "Redis at {shown} does not answer: {}. Start one with `docker compose up -d` (repository root) or point --redis-url / FLEET_BUDGET_REDIS_URL at yours",
        fleet_budget::redact::redact_text(&e.to_string())
    )
}

/// Dependencies with a budget key under the configured prefix (`SCAN` on the key pattern): on
/// the server, or on every master of a Redis Cluster (found with `CLUSTER NODES` on the first
/// seed that answers).
pub(crate) async fn scan_dependencies(
    config: &Config,
    timeout: Duration,
) -> anyhow::Result<Vec<Dependency>> {
    let prefix = config.redis.key_prefix.clone();
    let nodes = if config.redis.cluster_urls.is_empty() {
        vec![config.redis.url.clone()]
    } else {
        cluster_masters(&config.redis.cluster_urls, timeout).await?
    };
    let mut found = Vec::new();
    for url in nodes {
        found.extend(scan_node(&url, &prefix, timeout).await?);
    }
    found.sort();
    found.dedup();
    Ok(found)
}

async fn scan_node(url: &str, prefix: &str, timeout: Duration) -> anyhow::Result<Vec<Dependency>> {
    let shown = fleet_budget::redact::redact_url(url);
    let client = redis::Client::open(url).with_context(|| format!("redis URL {shown}"))?;
    let scan = async move {
        let mut conn = client.get_multiplexed_async_connection().await?;
        let pattern = budget_key_pattern(prefix);
        let mut found = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            found.extend(keys.iter().filter_map(|k| dependency_of_key(prefix, k)));
            cursor = next;
            if cursor == 0 || found.len() > 100_000 {
                break;
            }
        }
        Ok::<_, redis::RedisError>(found)
    };
    tokio::time::timeout(timeout.saturating_mul(10), scan)
        .await
        .map_err(|_| unreachable(&shown, &"SCAN timed out"))?
        .map_err(|e| unreachable(&shown, &e))
}

/// The URLs of a cluster's masters that are not marked failed, from the first seed that answers
/// `CLUSTER NODES`; each keeps its seed's scheme, credentials and options.
async fn cluster_masters(seeds: &[String], timeout: Duration) -> anyhow::Result<Vec<String>> {
    let mut last_error = None;
    for seed in seeds {
        let shown = fleet_budget::redact::redact_url(seed);
        let query = async {
            let client = redis::Client::open(seed.as_str())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async::<String>(&mut conn)
                .await
        };
        match tokio::time::timeout(timeout, query).await {
            Ok(Ok(nodes)) => {
                let masters: Vec<String> = nodes
                    .lines()
                    .filter_map(|line| {
                        let mut fields = line.split_whitespace();
                        let address = fields.nth(1)?;
                        let flags = fields.next()?;
                        let is_live_master = flags.split(',').any(|f| f == "master")
                            && !flags.split(',').any(|f| f == "fail" || f == "noaddr");
                        let host_port = address.split('@').next()?;
                        is_live_master.then(|| with_authority(seed, host_port))?
                    })
                    .collect();
                return Ok(masters);
            }
            Ok(Err(e)) => last_error = Some(unreachable(&shown, &e)),
            Err(_) => last_error = Some(unreachable(&shown, &"CLUSTER NODES timed out")),
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no Redis Cluster seed URL configured")))
}

/// `seed` with its `host:port` replaced by `host_port` (credentials, path and query kept).
fn with_authority(seed: &str, host_port: &str) -> Option<String> {
    let (scheme, rest) = seed.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let userinfo = authority.rfind('@').map_or("", |at| &authority[..=at]);
    Some(format!("{scheme}://{userinfo}{host_port}{tail}"))
}

#[cfg(test)]
mod tests {
    use super::with_authority;

    #[test]
    fn cluster_node_urls_keep_the_seed_credentials() {
        assert_eq!(
            with_authority("redis://:pw@10.0.0.1:7000/0", "10.0.0.2:7001").as_deref(),
            Some("redis://:pw@10.0.0.2:7001/0")
        );
        assert_eq!(
            with_authority("rediss://h:1", "[::1]:7000").as_deref(),
            Some("rediss://[::1]:7000")
        );
        assert_eq!(with_authority("not a url", "h:1"), None);
    }
}
