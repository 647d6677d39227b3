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

/// Dependencies with a budget key under the configured prefix (`SCAN` on the key pattern).
/// Only on a single server; on a cluster the configured dependencies are all that is listed.
pub(crate) async fn scan_dependencies(
    config: &Config,
    timeout: Duration,
) -> anyhow::Result<Vec<Dependency>> {
    if !config.redis.cluster_urls.is_empty() {
        return Ok(Vec::new());
    }
    let shown = fleet_budget::redact::redact_url(&config.redis.url);
    let client = redis::Client::open(config.redis.url.as_str())
        .with_context(|| format!("redis URL {shown}"))?;
    let prefix = config.redis.key_prefix.clone();
    let scan = async move {
        let mut conn = client.get_multiplexed_async_connection().await?;
        let pattern = budget_key_pattern(&prefix);
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
            found.extend(keys.iter().filter_map(|k| dependency_of_key(&prefix, k)));
            cursor = next;
            if cursor == 0 || found.len() > 100_000 {
                break;
            }
        }
        Ok::<_, redis::RedisError>(found)
    };
    let mut found = tokio::time::timeout(timeout.saturating_mul(10), scan)
        .await
        .map_err(|_| unreachable(&shown, &"SCAN timed out"))?
        .map_err(|e| unreachable(&shown, &e))?;
    found.sort();
    found.dedup();
    Ok(found)
}
