//! What the budget reports as it decides: each call counts, sets a gauge or observes a
//! duration on the metrics `mod.rs` defines (called from `crate::budget`, never by users).

use std::sync::PoisonError;

use super::{CONFLICT_LOG_LIMIT, Metrics, StoreOp};
use crate::allowance::BudgetSnapshot;
use crate::decision::DeadLetterReason;
use crate::dependency::Dependency;

impl Metrics {
    pub(crate) fn success(&self, d: &Dependency) {
        self.successes.with_label_values(&[d.as_str()]).inc();
    }

    pub(crate) fn execution(&self, d: &Dependency, first: bool) {
        self.executions.with_label_values(&[d.as_str()]).inc();
        if first {
            self.first_attempts.with_label_values(&[d.as_str()]).inc();
        }
    }

    pub(crate) fn retry(&self, d: &Dependency, granted: bool) {
        let c = if granted {
            &self.retries_granted
        } else {
            &self.retries_denied
        };
        c.with_label_values(&[d.as_str()]).inc();
    }

    /// Counts a budget's answer to a retry request: granted or denied; a denial answered in
    /// the process also as such. Its snapshot sets the gauges only when it is fresh: a denial
    /// answered in the process repeats the one its call saw (and is no store call, so no
    /// policy conflict either).
    pub(crate) fn decided(
        &self,
        d: &Dependency,
        withdrawal: &crate::store::Withdrawal,
        source: crate::decision::BudgetSource,
    ) {
        self.retry(d, withdrawal.granted);
        if source == crate::decision::BudgetSource::FleetCache {
            self.retries_denied_in_process
                .with_label_values(&[d.as_str()])
                .inc();
        } else {
            self.snapshot(d, &withdrawal.snapshot);
        }
    }

    /// Counts a refusal of a dependency in shadow, retried anyway.
    pub(crate) fn would_deny(&self, d: &Dependency) {
        self.retries_would_deny
            .with_label_values(&[d.as_str()])
            .inc();
    }

    pub(crate) fn dead_letter(&self, d: &Dependency, reason: DeadLetterReason) {
        self.dead_letters
            .with_label_values(&[d.as_str(), reason.as_str()])
            .inc();
    }

    pub(crate) fn snapshot(&self, d: &Dependency, s: &BudgetSnapshot) {
        if s.control.conflict {
            self.policy_conflict(d);
        }
        if s.control.lost {
            self.budget_lost(d, s);
        }
        self.allowance
            .with_label_values(&[d.as_str()])
            .set(i64::try_from(s.allowance).unwrap_or(i64::MAX));
        self.headroom
            .with_label_values(&[d.as_str()])
            .set(i64::try_from(s.remaining()).unwrap_or(i64::MAX));
    }

    /// Counts a call whose policy differed from the one in force, and logs the first per
    /// dependency (a rolling deploy makes many; one line says it).
    fn policy_conflict(&self, d: &Dependency) {
        self.policy_conflicts.with_label_values(&[d.as_str()]).inc();
        let first = {
            let mut logged = self
                .conflicts_logged
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            logged.len() < CONFLICT_LOG_LIMIT && logged.insert(d.clone())
        };
        if first {
            tracing::warn!(
                dependency = %d,
                "this worker's budget policy differs from the one in force in Redis, which \
                 decides instead (see `budgetctl status`); counted in \
                 fleet_budget_policy_conflicts_total"
            );
        }
    }

    /// Counts a call that found `d`'s budget hash lost and restored what this process
    /// remembered, and logs it once per dependency per window.
    fn budget_lost(&self, d: &Dependency, s: &BudgetSnapshot) {
        self.budget_lost.with_label_values(&[d.as_str()]).inc();
        let first = {
            let mut logged = self
                .lost_logged
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let room = logged.len() < CONFLICT_LOG_LIMIT;
            match logged.get_mut(d) {
                Some(window) if *window == s.window_index => false,
                Some(window) => {
                    *window = s.window_index;
                    true
                }
                None if room => {
                    logged.insert(d.clone(), s.window_index);
                    true
                }
                None => false,
            }
        };
        if first {
            tracing::warn!(
                dependency = %d,
                frozen = s.control.frozen,
                retries = s.current.retries,
                "the dependency's budget hash was lost in Redis (evicted by a maxmemory-policy, \
                 FLUSHALL, or a restart without persistence); restored what this worker \
                 remembered (overrides in force, counters) before deciding; counted in \
                 fleet_budget_budget_lost_total"
            );
        }
    }

    pub(crate) fn fallback(&self, d: &Dependency, active: bool) {
        self.fallback_active
            .with_label_values(&[d.as_str()])
            .set(i64::from(active));
    }

    /// Makes `fleet_budget_fallback_active` and `fleet_budget_budget_lost_total` show 0 for `d`
    /// before its first failure or loss, so that a dashboard and an alert see a series for
    /// every configured dependency.
    pub(crate) fn healthy(&self, d: &Dependency) {
        let _ = self.fallback_active.with_label_values(&[d.as_str()]);
        let _ = self.budget_lost.with_label_values(&[d.as_str()]);
    }

    pub(crate) fn store_call(&self, op: StoreOp, elapsed: std::time::Duration) {
        self.store_call_duration
            .with_label_values(&[op.as_str()])
            .observe(elapsed.as_secs_f64());
    }

    pub(crate) fn store_error(&self, kind: &str) {
        self.store_errors.with_label_values(&[kind]).inc();
    }

    pub(crate) fn fallback_dependencies(&self, n: u64) {
        self.fallback_dependencies
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn fallback_decision(&self, mode: &str) {
        self.fallback_decisions.with_label_values(&[mode]).inc();
    }

    pub(crate) fn pending(&self, n: u64) {
        self.deposits_pending
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn in_flight(&self, d: &Dependency, n: crate::concurrency::InFlight) {
        self.calls.in_flight(d, n);
    }

    pub(crate) fn hedge(&self, d: &Dependency, granted: bool) {
        self.calls.hedge(d, granted);
    }

    /// Counts a lease given back that was gone from Redis before its expiry, and logs it.
    pub(crate) fn lease_lost(&self, d: &Dependency) {
        self.calls.lease_lost(d);
        tracing::warn!(
            dependency = %d,
            "a concurrency lease was gone from Redis before its expiry (evicted by a \
             maxmemory-policy, FLUSHALL, or a restart without persistence): its slot was free \
             for others meanwhile; counted in fleet_budget_leases_lost_total"
        );
    }

    pub(crate) fn breaker_transition(&self, d: &Dependency, to: &str) {
        self.calls.breaker_transition(d, to);
    }

    pub(crate) fn breaker_state(&self, d: &Dependency, code: i64) {
        self.calls.breaker_state(d, code);
    }
}
