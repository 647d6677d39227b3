//! What tests and tools (`budgetctl`) read back from the metrics, by name and label, without
//! parsing the text exposition.

use super::{Metrics, StoreOp};
use crate::decision::DeadLetterReason;

impl Metrics {
    /// Hedges of `dependency` asked for and `granted` (or refused).
    #[must_use]
    pub fn hedges(&self, dependency: &str, granted: bool) -> u64 {
        self.calls.hedges(dependency, granted)
    }

    /// Breaker transitions of `dependency` into `to` (`open`, `half_open`, `closed`).
    #[must_use]
    pub fn breaker_transitions(&self, dependency: &str, to: &str) -> u64 {
        self.calls.breaker_transitions(dependency, to)
    }

    /// Retries in flight over primaries in flight at the last lease call for `dependency`.
    #[must_use]
    pub fn retry_fraction(&self, dependency: &str) -> f64 {
        self.calls.retry_fraction(dependency)
    }

    /// Leases given back that were gone from Redis before their expiry, for `dependency`.
    #[must_use]
    pub fn leases_lost(&self, dependency: &str) -> u64 {
        self.calls.leases_lost(dependency)
    }

    /// Calls in flight of `kind` (`primary`, `retry`) at the last lease call for `dependency`.
    #[must_use]
    pub fn calls_in_flight(&self, dependency: &str, kind: &str) -> i64 {
        self.calls.calls_in_flight(dependency, kind)
    }

    /// Value of a per-dependency counter, for tests and `budgetctl` (`successes`,
    /// `first_attempts`, `executions`, `retries_granted`, `retries_denied`,
    /// `retries_denied_in_process`, `retries_would_deny`, `policy_conflicts`, `budget_lost`).
    #[must_use]
    pub fn counter(&self, name: &str, dependency: &str) -> u64 {
        let c = match name {
            "successes" => &self.successes,
            "first_attempts" => &self.first_attempts,
            "executions" => &self.executions,
            "retries_granted" => &self.retries_granted,
            "retries_denied" => &self.retries_denied,
            "retries_denied_in_process" => &self.retries_denied_in_process,
            "retries_would_deny" => &self.retries_would_deny,
            "policy_conflicts" => &self.policy_conflicts,
            "budget_lost" => &self.budget_lost,
            _ => return 0,
        };
        c.with_label_values(&[dependency]).get()
    }

    /// Dead-letter decisions for `dependency` and `reason`.
    #[must_use]
    pub fn dead_letters(&self, dependency: &str, reason: DeadLetterReason) -> u64 {
        self.dead_letters
            .with_label_values(&[dependency, reason.as_str()])
            .get()
    }

    /// Whether the fallback is deciding now for `dependency`.
    #[must_use]
    pub fn fallback_is_active(&self, dependency: &str) -> bool {
        self.fallback_active.with_label_values(&[dependency]).get() == 1
    }

    /// Store calls of `op` observed so far.
    #[must_use]
    pub fn store_calls(&self, op: StoreOp) -> u64 {
        self.store_call_duration
            .with_label_values(&[op.as_str()])
            .get_sample_count()
    }

    /// Store errors of `kind`.
    #[must_use]
    pub fn store_errors(&self, kind: &str) -> u64 {
        self.store_errors.with_label_values(&[kind]).get()
    }
}
