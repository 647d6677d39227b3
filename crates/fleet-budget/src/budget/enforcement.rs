//! Which enforcement a dependency is held to now: its configured one (`enforcement`), unless an
//! operator switched it (`budgetctl budget shadow|enforce`, [`crate::control::enforcement`]).
//!
//! Asked only when the rate budget refuses a retry (the one moment shadow and enforcement
//! differ), so the healthy path costs nothing. The switch is read from Redis at most once per
//! staleness per dependency (the deny cache's, `redis.deny_cache_ms`, or 100 ms with the cache
//! off): a switch reaches every worker within it, as a change of the budget reaches a denial
//! the deny cache keeps. While Redis does not answer, the last switch read stands (none read:
//! the configuration), and is asked again after the staleness.
//!
//! Bounded: one entry per dependency refused, and dependencies are bounded by the configuration
//! (plus `unmapped_tasks.max_own_budgets`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::config::Enforcements;
use crate::control::enforcement;
use crate::decision::Enforcement;
use crate::dependency::Dependency;
use crate::store::RedisStore;

/// The staleness without a deny cache.
const STALENESS_WITHOUT_CACHE: Duration = Duration::from_millis(100);

/// The enforcement in force, per dependency.
#[derive(Debug)]
pub(super) struct EnforcementInForce {
    configured: Enforcements,
    /// Where operators' switches are read; `None`: the configuration decides alone.
    store: Option<Arc<RedisStore>>,
    staleness: Duration,
    /// Dependency → when its switch was read, and what it said (`None`: no switch).
    read: Mutex<HashMap<Dependency, (Instant, Option<Enforcement>)>>,
}

impl EnforcementInForce {
    pub(super) fn new(
        configured: Enforcements,
        store: Option<Arc<RedisStore>>,
        deny_cache: Duration,
    ) -> Self {
        Self {
            configured,
            store,
            staleness: if deny_cache.is_zero() {
                STALENESS_WITHOUT_CACHE
            } else {
                deny_cache
            },
            read: Mutex::new(HashMap::new()),
        }
    }

    /// The enforcement `dependency` is held to now.
    pub(super) async fn of(&self, dependency: &Dependency) -> Enforcement {
        let configured = self.configured.of(dependency);
        let Some(store) = &self.store else {
            return configured;
        };
        let kept = {
            let read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
            read.get(dependency).copied()
        };
        if let Some((at, switched)) = kept
            && at.elapsed() < self.staleness
        {
            return switched.unwrap_or(configured);
        }
        // A read is kept from when it was asked, so a slow answer does not stretch "within the
        // staleness"; a failed one from the failure, so a Redis that does not answer is asked
        // at most once per staleness.
        let asked = Instant::now();
        let (at, switched) = match enforcement::read(store, dependency).await {
            Ok(switch) => (asked, switch.map(|s| s.enforcement)),
            Err(error) => {
                tracing::debug!(%error, %dependency, "enforcement switch not read; the last one read stands");
                (Instant::now(), kept.and_then(|(_, switched)| switched))
            }
        };
        self.read
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(dependency.clone(), (at, switched));
        switched.unwrap_or(configured)
    }
}
