//! Reading `status` from Redis: the library's read model of the dependencies configured and
//! discovered ([`fleet_budget::view`]), laid out as the report; a key the scripts refuse is
//! listed, not fatal.

use fleet_budget::store::RedisStore;
use fleet_budget::view::{self, Unusable};
use fleet_budget::{Config, Dependency};

use super::view::{DependencyStatus, KeyProblem, StatusReport};
use crate::redis_conn;

/// Reads the budget (and breaker, and calls in flight) of `only`, or of every dependency
/// configured or found in Redis.
pub(super) async fn collect(
    config: &Config,
    store: &RedisStore,
    only: Option<&Dependency>,
) -> anyhow::Result<StatusReport> {
    let shown = config.redis_display();
    let dependencies: Vec<Dependency> = match only {
        Some(d) => vec![d.clone()],
        None => view::read::dependencies(store, config)
            .await
            .map_err(|e| redis_conn::unreachable(&e.node, &e.source))?,
    };
    let fleet = view::read_fleet(store, config, &dependencies)
        .await
        .map_err(|e| redis_conn::unreachable(&shown, &e))?;
    Ok(StatusReport {
        redis: shown,
        key_prefix: config.redis.key_prefix.clone(),
        dependencies: fleet
            .dependencies
            .iter()
            .map(DependencyStatus::new)
            .collect(),
        unusable: fleet.unusable.iter().map(problem).collect(),
    })
}

fn problem(u: &Unusable) -> KeyProblem {
    KeyProblem {
        dependency: u.dependency.to_string(),
        key: u.key.clone(),
        error: u.detail.clone(),
    }
}
