//! Reading `status` from Redis: the dependencies configured and discovered, each one's fleet
//! status and breaker; a key the scripts refuse is listed, not fatal.

use fleet_budget::breaker::status_on;
use fleet_budget::control::fleet_status;
use fleet_budget::store::RedisStore;
use fleet_budget::{Config, Dependency, StoreError};

use super::breaker::BreakerLine;
use super::view::{DependencyStatus, KeyProblem, StatusReport};
use crate::redis_conn;

/// Reads the budget (and breaker) of `only`, or of every dependency configured or found in
/// Redis.
pub(super) async fn collect(
    config: &Config,
    store: &RedisStore,
    only: Option<&Dependency>,
) -> anyhow::Result<StatusReport> {
    let shown = config.redis_display();
    let dependencies: Vec<Dependency> = match only {
        Some(d) => vec![d.clone()],
        None => {
            let mut deps: Vec<Dependency> = config.policies.keys().cloned().collect();
            let found = store
                .discover_dependencies()
                .await
                .map_err(|e| redis_conn::unreachable(&e.node, &e.source))?;
            deps.extend(found);
            deps.sort();
            deps.dedup();
            deps
        }
    };
    let mut rows = Vec::new();
    let mut unusable = Vec::new();
    for dependency in &dependencies {
        let policy = config.policy(dependency);
        match fleet_status(store, dependency, &policy).await {
            Ok(fleet) => {
                let mut row = DependencyStatus::new(dependency, &fleet);
                let switched = fleet_budget::control::enforcement::read(store, dependency)
                    .await
                    .map_err(|e| redis_conn::unreachable(&shown, &e))?;
                let enforcement =
                    switched.map_or_else(|| config.enforcement.of(dependency), |s| s.enforcement);
                row.enforcement = enforcement.as_str();
                if enforcement == fleet_budget::Enforcement::Shadow {
                    row.would_deny = row.retries_denied;
                }
                if let Some(policy) = config.breakers.get(dependency) {
                    match status_on(store, dependency, policy).await {
                        Ok(b) => row.breaker = Some(BreakerLine::new(&b)),
                        Err(StoreError::BadKey { key, detail }) => unusable.push(KeyProblem {
                            dependency: dependency.to_string(),
                            key,
                            error: fleet_budget::redact::redact_text(&detail),
                        }),
                        Err(e) => return Err(redis_conn::unreachable(&shown, &e)),
                    }
                }
                rows.push(row);
            }
            Err(StoreError::BadKey { key, detail }) => unusable.push(KeyProblem {
                dependency: dependency.to_string(),
                key,
                error: fleet_budget::redact::redact_text(&detail),
            }),
            Err(e) => return Err(redis_conn::unreachable(&shown, &e)),
        }
    }
    Ok(StatusReport {
        redis: shown,
        key_prefix: config.redis.key_prefix.clone(),
        dependencies: rows,
        unusable,
    })
}
