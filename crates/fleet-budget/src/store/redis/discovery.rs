//! Which dependencies have a budget in Redis: `SCAN` of the key pattern on the server, or on
//! every master of a Redis Cluster (found with `CLUSTER NODES`). For operators' tools
//! (`budgetctl status`); a worker knows its dependencies from its configuration.

use std::time::Duration;

use thiserror::Error;

use super::RedisStore;
use super::connect::RedisTarget;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::keys::{budget_key_pattern, dependency_of_key};
use crate::redact::redact_url;

/// A node's listing may take this many store deadlines.
const SCAN_DEADLINES: u32 = 10;
/// A node's listing stops after this many budget keys.
const MAX_KEYS_PER_NODE: usize = 100_000;
/// Keys `SCAN` looks at per round trip.
const SCAN_COUNT: u32 = 1000;

/// The budget keys of a node could not be listed.
#[derive(Debug, Error)]
#[error("{node}: {source}")]
pub struct DiscoveryError {
    /// The node's URL, password redacted.
    pub node: String,
    /// What failed.
    #[source]
    pub source: StoreError,
}

impl RedisStore {
    /// The dependencies with a budget key under this store's prefix, sorted: on the server, or on
    /// every master of a Redis Cluster that is not marked failed (found with `CLUSTER NODES` on
    /// the first seed that answers). Each node's listing is bounded by ten store deadlines and
    /// 100,000 keys.
    ///
    /// # Errors
    /// A node (or every seed of a cluster) does not answer in time.
    pub async fn discover_dependencies(&self) -> Result<Vec<Dependency>, DiscoveryError> {
        let prefix = self.prefix();
        let keys = self
            .scan_keys(&budget_key_pattern(prefix), MAX_KEYS_PER_NODE)
            .await?;
        // Bytes, not text: a key that is not UTF-8 (anyone can make one) is no budget this
        // library wrote, and must not fail the listing of the others.
        let mut found: Vec<Dependency> = keys
            .iter()
            .filter_map(|k| std::str::from_utf8(k).ok())
            .filter_map(|k| dependency_of_key(prefix, k))
            .collect();
        found.sort();
        found.dedup();
        Ok(found)
    }

    /// The keys matching the `SCAN` pattern `pattern`, on the server or on every live master of
    /// a Redis Cluster (as [`RedisStore::discover_dependencies`]), as Redis holds them (bytes:
    /// anyone can make a key that is not UTF-8); each node's listing bounded by ten store
    /// deadlines and stopped once it holds more than `max` keys. Unsorted; a key may repeat.
    ///
    /// # Errors
    /// A node (or every seed of a cluster) does not answer in time.
    pub async fn scan_keys(
        &self,
        pattern: &str,
        max: usize,
    ) -> Result<Vec<Vec<u8>>, DiscoveryError> {
        let nodes = match self.target() {
            RedisTarget::Single(url) => vec![url.clone()],
            RedisTarget::Cluster(seeds) => cluster_masters(self, seeds, self.timeout()).await?,
        };
        let mut found = Vec::new();
        for url in nodes {
            found.extend(scan_node(self, &url, pattern, max, self.timeout()).await?);
        }
        Ok(found)
    }
}

/// The keys matching `pattern` on the node at `url` (connected with `store`'s TLS
/// certificates), up to a little more than `max`.
async fn scan_node(
    store: &RedisStore,
    url: &str,
    pattern: &str,
    max: usize,
    timeout: Duration,
) -> Result<Vec<Vec<u8>>, DiscoveryError> {
    let failed = |source: StoreError| DiscoveryError {
        node: redact_url(url),
        source,
    };
    let client = store.client_for(url).map_err(|e| failed(e.into()))?;
    let scan = async move {
        let mut conn = client.get_multiplexed_async_connection().await?;
        let mut found = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query_async(&mut conn)
                .await?;
            found.extend(keys);
            cursor = next;
            if cursor == 0 || found.len() > max {
                break;
            }
        }
        Ok::<_, redis::RedisError>(found)
    };
    let deadline = timeout.saturating_mul(SCAN_DEADLINES);
    tokio::time::timeout(deadline, scan)
        .await
        .map_err(|_| failed(StoreError::Timeout(deadline)))?
        .map_err(|e| failed(e.into()))
}

/// The URLs of a cluster's live masters, from the first seed that answers `CLUSTER NODES`.
async fn cluster_masters(
    store: &RedisStore,
    seeds: &[String],
    timeout: Duration,
) -> Result<Vec<String>, DiscoveryError> {
    let mut last_error = None;
    for seed in seeds {
        let query = async {
            let client = store.client_for(seed)?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async::<String>(&mut conn)
                .await
        };
        let source = match tokio::time::timeout(timeout, query).await {
            Ok(Ok(nodes)) => return Ok(live_masters(&nodes, seed)),
            Ok(Err(e)) => StoreError::from(e),
            Err(_) => StoreError::Timeout(timeout),
        };
        last_error = Some(DiscoveryError {
            node: redact_url(seed),
            source,
        });
    }
    // No seeds, no masters: nothing to list.
    last_error.map_or(Ok(Vec::new()), Err)
}

/// The masters in a `CLUSTER NODES` reply that are not marked failed or without an address, as
/// URLs with `seed`'s scheme, credentials and options.
fn live_masters(nodes: &str, seed: &str) -> Vec<String> {
    nodes
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
        .collect()
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
    use super::*;

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

    #[test]
    fn only_live_masters_are_listed() {
        let nodes = "\
a1 10.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 10.0.0.2:7001@17001 master - 0 0 2 connected 5461-10922
c3 10.0.0.3:7002@17002 master,fail - 0 0 3 disconnected 10923-16383
d4 10.0.0.4:7003@17003 slave a1 0 0 1 connected
e5 :0@0 master,noaddr - 0 0 4 disconnected
garbage
";
        assert_eq!(
            live_masters(nodes, "redis://:pw@seed:7000"),
            ["redis://:pw@10.0.0.1:7000", "redis://:pw@10.0.0.2:7001"]
        );
        assert!(live_masters("", "redis://seed:1").is_empty());
    }
}
