//! [`BudgetSnapshot`]: what a store saw when it decided (the two windows, their weights, the
//! allowance, and what the fleet store said of policy and overrides), and the estimates read
//! from it. Every store call returns one, so that a dead-letter can say why.

use serde::Serialize;

use super::WindowCounters;
use crate::policy::DepositBasis;

/// What the store saw when it decided: the two windows, their weights and the allowance.
///
/// Returned by every store call (deposit, retry, status) so that a dead-letter can say why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BudgetSnapshot {
    /// Window length in milliseconds.
    pub window_ms: u64,
    /// Index of the current window (`floor(server_time_ms / window_ms)`).
    pub window_index: u64,
    /// Milliseconds since the current window began (server time).
    pub elapsed_ms: u64,
    /// Weight of the previous window, in milliseconds out of `window_ms` (0 in fixed mode).
    pub previous_weight_ms: u64,
    /// Counters of the current window.
    pub current: WindowCounters,
    /// Counters of the previous window.
    pub previous: WindowCounters,
    /// Retries allowed in the last window: `max(min_allowance, floor(ratio × deposits_est))`
    /// (0 while the dependency is frozen).
    pub allowance: u64,
    /// What the fleet store said about the policy and the overrides (all false from the local
    /// store, which has neither).
    pub control: Control,
}

/// How the fleet store's answer relates to the caller's policy and to operators' overrides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Control {
    /// The caller's policy differs from the policy in force, which served the call instead.
    pub conflict: bool,
    /// A freeze is in force: no retry is granted, the floor included.
    pub frozen: bool,
    /// A `set` override replaces the ratio and/or the floor.
    pub overridden: bool,
    /// The call found the budget hash this process remembered gone (evicted, flushed, or
    /// Redis restarted empty) and restored what still counted before deciding (`lua/README.md`,
    /// "Lost budgets"). Counted in `fleet_budget_budget_lost_total`; not serialized.
    #[serde(skip)]
    pub lost: bool,
}

impl BudgetSnapshot {
    fn scaled(&self, cur: u64, prev: u64) -> u128 {
        u128::from(cur) * u128::from(self.window_ms)
            + u128::from(prev) * u128::from(self.previous_weight_ms)
    }

    /// Deposits estimate scaled by `window_ms`.
    #[must_use]
    pub fn deposits_scaled(&self, basis: DepositBasis) -> u128 {
        self.scaled(self.current.deposits(basis), self.previous.deposits(basis))
    }

    /// Retries estimate scaled by `window_ms`.
    #[must_use]
    pub fn retries_scaled(&self) -> u128 {
        self.scaled(self.current.retries, self.previous.retries)
    }

    /// The sliding estimate over the last window of a counter that holds `current` in the
    /// current window and `previous` in the previous one, rounded down:
    /// `floor((current × window_ms + previous × previous_weight_ms) / window_ms)`.
    #[must_use]
    pub fn estimate(&self, current: u64, previous: u64) -> u64 {
        let window = u128::from(self.window_ms.max(1));
        u64::try_from(self.scaled(current, previous) / window).unwrap_or(u64::MAX)
    }

    /// The sliding estimates of every counter over the last window, rounded down: the counts
    /// the allowance is computed from, as `budgetctl status` shows them and dead-letter headers
    /// carry them.
    #[must_use]
    pub fn estimates(&self) -> WindowCounters {
        let (c, p) = (&self.current, &self.previous);
        WindowCounters {
            successes: self.estimate(c.successes, p.successes),
            first_attempts: self.estimate(c.first_attempts, p.first_attempts),
            retries: self.estimate(c.retries, p.retries),
            denied: self.estimate(c.denied, p.denied),
        }
    }

    /// Sliding estimate of retries granted in the last window.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn retries_estimate(&self) -> f64 {
        self.retries_scaled() as f64 / self.window_ms.max(1) as f64
    }

    /// Sliding estimate of deposits in the last window.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn deposits_estimate(&self, basis: DepositBasis) -> f64 {
        self.deposits_scaled(basis) as f64 / self.window_ms.max(1) as f64
    }

    /// Retries that would still be granted now (the headroom).
    #[must_use]
    pub fn remaining(&self) -> u64 {
        let window = u128::from(self.window_ms.max(1));
        let room = (u128::from(self.allowance) * window).saturating_sub(self.retries_scaled());
        u64::try_from(room / window).unwrap_or(u64::MAX)
    }

    /// Milliseconds until the current window rolls over.
    #[must_use]
    pub fn ms_until_roll(&self) -> u64 {
        self.window_ms.saturating_sub(self.elapsed_ms)
    }
}
