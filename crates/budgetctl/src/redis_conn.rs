//! Connecting the CLI to the fleet store in Redis, with errors that say which URL failed.

use std::sync::Arc;
use std::time::Duration;

use fleet_budget::Config;
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::tls::TlsFailure;

/// How long the CLI waits for one Redis call: the configured deadline, but at least a second
/// (an operator's command is not a worker's hot path).
pub(crate) fn cli_timeout(config: &Config) -> Duration {
    config.redis.timeout.max(Duration::from_secs(1))
}

/// The Redis target of `config`.
pub(crate) fn target(config: &Config) -> RedisTarget {
    RedisTarget::from_settings(&config.redis)
}

/// Connects to the fleet store and checks that it answers `PING`.
///
/// # Errors
/// A URL that cannot be used, or a server that does not answer (the message names the URL,
/// password redacted, and how to start one).
pub(crate) async fn connect(config: &Config, timeout: Duration) -> anyhow::Result<Arc<RedisStore>> {
    let target = target(config);
    let shown = target.display();
    let store =
        RedisStore::new_with_tls(target, &config.redis.key_prefix, timeout, &config.redis.tls)
            .map_err(|e| {
                crate::exit::usage(format!(
                    "--redis-url / redis.url {shown}: {}",
                    fleet_budget::redact::redact_text(&e.to_string())
                ))
            })?;
    store.ping().await.map_err(|e| unreachable(&shown, &e))?;
    Ok(Arc::new(store))
}

/// The error for a Redis that does not answer, or (`rediss://`) whose TLS handshake failed:
/// then which failure and what to check, never "does not answer" (both exit 1).
pub(crate) fn unreachable(shown: &str, e: &dyn std::fmt::Display) -> anyhow::Error {
    let text = fleet_budget::redact::redact_text(&e.to_string());
    match TlsFailure::of_text(&text) {
        Some(failure) => anyhow::anyhow!(
            "Redis at {shown}: TLS refused ({failure}): {} [{text}]",
            failure.explain("redis"),
        ),
        None => anyhow::anyhow!(
            "Redis at {shown} does not answer: {text}. Start one with `docker compose up -d` (repository root) or point --redis-url / FLEET_BUDGET_REDIS_URL at yours"
        ),
    }
}
