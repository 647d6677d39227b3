//! Whether the fleet store answers, and who decides when it does not.
//!
//! Health is kept per dependency: on Redis Cluster one master can fail while the others serve, so
//! only the dependencies whose slots fail go to the fallback. While a dependency is degraded the
//! store is probed for it at most once per [`PROBE_INTERVAL`] of the budget's clock; every other
//! call goes straight to the fallback instead of each waiting for a deadline. The fallback
//! (`redis.fallback`) is the local store (`local`), a refusal (`deny`) or a grant (`allow`).
//!
//! `Health` owns all of it: every store result goes through `Health::record`, the one place
//! that moves a dependency into or out of the fallback, and `Health::fallback_withdrawal` is the
//! fallback's answer.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::breaker::{BreakerState, Decided};
use crate::clock::Clock;
use crate::config::FallbackMode;
use crate::decision::BudgetSource;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::metrics::Metrics;
use crate::policy::BudgetPolicy;
use crate::store::{LocalStore, Withdrawal};

/// While the fleet store is failing for a dependency, it is tried again for it at most this
/// often (clock time).
pub const PROBE_INTERVAL: Duration = Duration::from_millis(PROBE_INTERVAL_MS);

const PROBE_INTERVAL_MS: u64 = 200;

/// The health of the fleet store, per dependency, and the fallback that decides meanwhile.
///
/// Logs one line when the first dependency enters the fallback and one when the last leaves
/// (per-dependency changes at debug level), so an outage of a single Redis is two lines, not one
/// per dependency or per call.
#[derive(Debug)]
pub(super) struct Health {
    clock: Arc<dyn Clock>,
    /// Who decides while the store fails (`redis.fallback`).
    fallback: FallbackMode,
    /// The in-process store: the `local` fallback's budget.
    local: LocalStore,
    metrics: Metrics,
    /// Dependencies in fallback; read without the lock on the hot path.
    degraded_count: AtomicU64,
    /// Degraded dependencies → their episode.
    degraded: Mutex<HashMap<Dependency, Episode>>,
    /// Whether "Redis's memory is full" was logged in this outage (reset when the last
    /// dependency leaves the fallback): one line per episode, not one per call.
    oom_logged: AtomicBool,
    /// Dependencies the fleet store last answered frozen → when that freeze ends (clock ms:
    /// the call's own time plus the reply's wait, `next_grant_ms`). The fallback grants
    /// nothing for them until then: an operator's freeze holds while Redis fails.
    freezes: Mutex<HashMap<Dependency, u64>>,
    /// Dependencies whose breaker this process last saw open → when its open period ends
    /// (server ms): one found closed before then was lost (evicted, flushed).
    open_breakers: Mutex<HashMap<Dependency, u64>>,
}

/// One dependency's time in the fallback.
#[derive(Debug, Clone, Copy)]
struct Episode {
    /// When the store may next be probed for it (clock ms).
    next_probe: u64,
    /// When it went into the fallback (clock ms): the worker registry reports for how long.
    since: u64,
}

impl Health {
    pub(super) fn new(
        clock: Arc<dyn Clock>,
        fallback: FallbackMode,
        local: LocalStore,
        metrics: Metrics,
    ) -> Self {
        Self {
            clock,
            fallback,
            local,
            metrics,
            degraded_count: AtomicU64::new(0),
            degraded: Mutex::new(HashMap::new()),
            oom_logged: AtomicBool::new(false),
            freezes: Mutex::new(HashMap::new()),
            open_breakers: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn any_degraded(&self) -> bool {
        self.degraded_count.load(Ordering::Acquire) > 0
    }

    /// Whether to call the fleet store for `dependency`: always when it is healthy; when it is
    /// degraded, one caller per probe interval. A clock that went back by more than an interval
    /// (the wall clock was set back) opens the probe at once rather than after the jump.
    pub(super) fn should_try(&self, dependency: &Dependency) -> bool {
        if !self.any_degraded() {
            return true;
        }
        let now = self.clock.now_ms();
        let mut degraded = self.degraded.lock().unwrap_or_else(PoisonError::into_inner);
        match degraded.get_mut(dependency) {
            None => true,
            Some(Episode { next_probe, .. })
                if now >= *next_probe || *next_probe > now.saturating_add(PROBE_INTERVAL_MS) =>
            {
                *next_probe = now.saturating_add(PROBE_INTERVAL_MS);
                true
            }
            Some(_) => false,
        }
    }

    /// Remembers whether the fleet store's answer `withdrawal` for `dependency`, given at
    /// clock ms `at`, showed a freeze in force, and until when.
    pub(super) fn saw(&self, dependency: &Dependency, at: u64, withdrawal: &Withdrawal) {
        let frozen = withdrawal.snapshot.control.frozen;
        let mut freezes = self.freezes.lock().unwrap_or_else(PoisonError::into_inner);
        if frozen {
            // While frozen the wait is the freeze's remaining time (lua/README.md, "When a
            // retry could next be granted"); never, without an end, is an hour at a time.
            let wait = withdrawal.next_grant_ms.unwrap_or(3_600_000);
            freezes.insert(dependency.clone(), at.saturating_add(wait));
        } else if !freezes.is_empty() {
            freezes.remove(dependency);
        }
    }

    /// Whether the fleet store's last answer for `dependency` showed a freeze that has not
    /// ended yet by this process's clock.
    fn frozen(&self, dependency: &Dependency) -> bool {
        let freezes = self.freezes.lock().unwrap_or_else(PoisonError::into_inner);
        freezes
            .get(dependency)
            .is_some_and(|until| *until > self.clock.now_ms())
    }

    /// Remembers the breaker state `decided` shows for `dependency`, and says whether it shows
    /// the breaker this process last saw open closed before its open period ended, without
    /// this call closing it: its key was lost (an open breaker only closes through half-open).
    pub(super) fn breaker_lost(&self, dependency: &Dependency, decided: &Decided) -> bool {
        let mut open = self
            .open_breakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let lost = decided.state == BreakerState::Closed
            && !decided.changed
            && open
                .get(dependency)
                .is_some_and(|until| *until > decided.now_ms);
        if decided.state == BreakerState::Open {
            open.insert(dependency.clone(), decided.open_until_ms);
        } else if !open.is_empty() {
            open.remove(dependency);
        }
        lost
    }

    /// The clock's ms now.
    pub(super) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The dependencies in the fallback now, each with how long it has been (clock ms; 0 when
    /// the clock went back since), in name order: what the worker registry reports.
    pub(super) fn episodes(&self) -> Vec<(Dependency, u64)> {
        if !self.any_degraded() {
            return Vec::new();
        }
        let now = self.clock.now_ms();
        let degraded = self.degraded.lock().unwrap_or_else(PoisonError::into_inner);
        let mut episodes: Vec<(Dependency, u64)> = degraded
            .iter()
            .map(|(d, e)| (d.clone(), now.saturating_sub(e.since)))
            .collect();
        drop(degraded);
        episodes.sort_by(|a, b| a.0.cmp(&b.0));
        episodes
    }

    /// Records the result of a fleet store call for `dependency`: an answer takes it out of the
    /// fallback, a failure (counted by kind) puts it in until a probe succeeds.
    pub(super) fn record<T>(&self, dependency: &Dependency, result: &Result<T, StoreError>) {
        match result {
            Ok(_) => self.ok(dependency),
            Err(e) => self.failed(dependency, e),
        }
    }

    fn ok(&self, dependency: &Dependency) {
        let metrics = &self.metrics;
        if !self.any_degraded() {
            return;
        }
        let mut degraded = self.degraded.lock().unwrap_or_else(PoisonError::into_inner);
        if degraded.remove(dependency).is_some() {
            let left = degraded.len() as u64;
            self.degraded_count.store(left, Ordering::Release);
            metrics.fallback_dependencies(left);
            metrics.fallback(dependency, false);
            tracing::debug!(%dependency, "fleet budget store answers for this dependency again");
            if left == 0 {
                self.oom_logged.store(false, Ordering::Relaxed);
                tracing::info!("fleet budget store answers again; leaving fallback");
            }
        }
    }

    fn failed(&self, dependency: &Dependency, error: &StoreError) {
        let (metrics, mode) = (&self.metrics, self.fallback);
        metrics.store_error(error.kind_label());
        if error.is_out_of_memory() && !self.oom_logged.swap(true, Ordering::Relaxed) {
            tracing::error!(
                %error,
                %dependency,
                reason = "oom",
                fallback = mode.as_str(),
                "Redis refuses the budget's writes: its memory is full (maxmemory reached under \
                 maxmemory-policy noeviction). Retry decisions come from the fallback until it \
                 frees memory; counted in fleet_budget_store_errors_total{{kind=\"oom\"}}"
            );
        }
        let now = self.clock.now_ms();
        let next_probe = now.saturating_add(PROBE_INTERVAL_MS);
        let mut degraded = self.degraded.lock().unwrap_or_else(PoisonError::into_inner);
        let began = match degraded.entry(dependency.clone()) {
            Entry::Occupied(mut episode) => {
                episode.get_mut().next_probe = next_probe;
                false
            }
            Entry::Vacant(entry) => {
                entry.insert(Episode {
                    next_probe,
                    since: now,
                });
                true
            }
        };
        if began {
            let now_degraded = degraded.len() as u64;
            self.degraded_count.store(now_degraded, Ordering::Release);
            metrics.fallback_dependencies(now_degraded);
            metrics.fallback(dependency, true);
            if now_degraded == 1 {
                tracing::warn!(%error, %dependency, reason = error.kind_label(), fallback = mode.as_str(), "fleet budget store failed; entering fallback");
            } else {
                tracing::debug!(%error, %dependency, "fleet budget store failed for this dependency too");
            }
        }
    }
}

impl Health {
    /// The answer of the fallback to a request for one retry, while the fleet store does not
    /// answer for `dependency`.
    pub(super) fn fallback_withdrawal(
        &self,
        dependency: &Dependency,
        policy: &BudgetPolicy,
    ) -> (Withdrawal, BudgetSource) {
        self.metrics.fallback_decision(self.fallback.as_str());
        if self.frozen(dependency) {
            // An operator's freeze the fleet store showed, not ended: whatever the fallback
            // mode, nothing is granted (the dead letter says `budget_frozen`).
            let mut snapshot = self.local.status_now(dependency, policy);
            snapshot.allowance = 0;
            snapshot.control.frozen = true;
            let withdrawal = Withdrawal {
                granted: false,
                snapshot,
                next_grant_ms: Some(0),
            };
            let source = match self.fallback {
                FallbackMode::Local => BudgetSource::LocalFallback,
                FallbackMode::Deny | FallbackMode::Allow => BudgetSource::Blind,
            };
            return (withdrawal, source);
        }
        let blind = |granted| {
            let snapshot = self.local.status_now(dependency, policy);
            let withdrawal = Withdrawal {
                granted,
                snapshot,
                next_grant_ms: Some(0),
            };
            (withdrawal, BudgetSource::Blind)
        };
        match self.fallback {
            FallbackMode::Local => (
                self.local.withdraw_now(dependency, policy),
                BudgetSource::LocalFallback,
            ),
            FallbackMode::Deny => blind(false),
            FallbackMode::Allow => blind(true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn degraded(clock: &ManualClock) -> (Health, Dependency, Metrics) {
        let metrics = Metrics::new();
        let local = LocalStore::with_clock(Arc::new(clock.clone()));
        let health = Health::new(
            Arc::new(clock.clone()),
            FallbackMode::Local,
            local,
            metrics.clone(),
        );
        let d = Dependency::new("search").unwrap();
        let e = StoreError::Timeout(Duration::from_millis(50));
        health.failed(&d, &e);
        (health, d, metrics)
    }

    #[test]
    fn a_degraded_dependency_is_probed_once_per_interval_of_the_clock() {
        let clock = ManualClock::new(1_000_000);
        let (health, d, metrics) = degraded(&clock);
        let other = Dependency::new("mail").unwrap();
        assert!(health.any_degraded() && metrics.fallback_is_active("search"));
        assert!(!metrics.fallback_is_active("mail"), "per dependency");
        assert!(health.should_try(&other), "only the failing dependency");
        assert!(!health.should_try(&d));
        clock.advance(PROBE_INTERVAL - Duration::from_millis(1));
        assert!(!health.should_try(&d));
        clock.advance(Duration::from_millis(1));
        assert!(health.should_try(&d), "the probe slot opens");
        assert!(!health.should_try(&d), "for one caller");
        clock.advance(PROBE_INTERVAL);
        assert!(health.should_try(&d));
        health.ok(&d);
        assert!(!health.any_degraded() && !metrics.fallback_is_active("search"));
        assert!(health.should_try(&d) && health.should_try(&d));
    }

    /// The registry reports for how long: from the first failure of the episode, not the last.
    #[test]
    fn an_episode_is_timed_from_its_first_failure() {
        let clock = ManualClock::new(1_000_000);
        let (health, d, _) = degraded(&clock);
        clock.advance(Duration::from_millis(700));
        let e = StoreError::Timeout(Duration::from_millis(50));
        health.failed(&d, &e);
        clock.advance(Duration::from_millis(300));
        assert_eq!(health.episodes(), vec![(d.clone(), 1000)]);
        health.ok(&d);
        assert!(health.episodes().is_empty());
        health.failed(&d, &e);
        assert_eq!(health.episodes(), vec![(d, 0)], "a new episode");
    }

    #[test]
    fn a_clock_set_back_does_not_lock_the_store_out() {
        let clock = ManualClock::new(1_000_000);
        let (health, d, _) = degraded(&clock);
        clock.set_ms(1_000_000 - 60_000);
        assert!(health.should_try(&d), "probed now, not in a minute");
        assert!(!health.should_try(&d));
        clock.advance(PROBE_INTERVAL);
        assert!(health.should_try(&d));
    }
}
