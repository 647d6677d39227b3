//! The decision order of the contract (`docs/semantics.md`), as functions of the failure, the
//! task's ceiling and the rate budget's withdrawal, with no I/O: not retryable, out of attempts,
//! a wait past `max_delay` (each before any budget is spent), then the dependency's budget; a
//! granted retry gets its delay from the ceiling. A refusal a dependency in shadow lets through
//! ([`shadows`]) is retried as if granted. [`FleetBudget`](super::FleetBudget) and
//! [`FanOut`](super::FanOut) ask the budget between the two steps.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::allowance::BudgetSnapshot;
use crate::ceiling::TaskCeiling;
use crate::decision::{BudgetSource, DeadLetterReason, Decision, Enforcement, Failure};
use crate::dependency::Dependency;
use crate::metrics::Metrics;
use crate::store::Withdrawal;

/// Why a failure is dead-lettered before any budget is asked, if it is: not retryable, the
/// ceiling reached (`attempt` ≥ `max_attempts`, or the recovery window passed), or a
/// `Retry-After` longer than the ceiling's `max_delay`.
pub(super) fn before_budget(
    failure: &Failure,
    ceiling: &TaskCeiling,
    attempt: u32,
    since_first_failure: Option<Duration>,
) -> Option<DeadLetterReason> {
    if !failure.is_retryable() {
        return Some(DeadLetterReason::NonRetryable);
    }
    if ceiling.exhausted(attempt, since_first_failure) {
        return Some(DeadLetterReason::AttemptsExhausted);
    }
    // A wait the dependency asks for past `max_delay` is refused before any budget is spent:
    // honouring it would hold the job for longer than anyone agreed to wait.
    match failure.retry_after_hint() {
        Some(after) if !ceiling.allows_wait(after) => Some(DeadLetterReason::DelayExceeded),
        _ => None,
    }
}

/// Why the budget's answer dead-letters the job, if it does: a refusal while frozen is
/// `budget_frozen`, any other `budget_exhausted`.
pub(super) fn refusal(withdrawal: &Withdrawal) -> Option<DeadLetterReason> {
    if withdrawal.granted {
        None
    } else if withdrawal.snapshot.control.frozen {
        Some(DeadLetterReason::BudgetFrozen)
    } else {
        Some(DeadLetterReason::BudgetExhausted)
    }
}

/// Whether a refusal for `reason`, answered by `source`, is retried anyway under `enforcement`:
/// in shadow, a budget exhausted is (Redis's, the deny cache's, a `local` fallback's); a freeze
/// is an operator's order, not an observation, and holds; so does a `deny` fallback's refusal
/// while Redis fails ([`BudgetSource::Blind`]): the machinery's, not the budget's.
pub(super) fn shadows(
    reason: DeadLetterReason,
    source: BudgetSource,
    enforcement: Enforcement,
) -> bool {
    enforcement == Enforcement::Shadow
        && reason == DeadLetterReason::BudgetExhausted
        && source != BudgetSource::Blind
}

/// The jitter of delays and holds, seedable for deterministic tests and simulations.
#[derive(Debug)]
pub(super) struct Jitter(Mutex<SmallRng>);

impl Jitter {
    pub(super) fn new(seed: Option<u64>) -> Self {
        Self(Mutex::new(seed.map_or_else(
            || SmallRng::from_rng(&mut rand::rng()),
            SmallRng::seed_from_u64,
        )))
    }

    /// Runs `draw` with the generator.
    pub(super) fn draw<T>(&self, draw: impl FnOnce(&mut SmallRng) -> T) -> T {
        draw(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The decision to dead-letter a job of `dependency` for `reason`, counted in `metrics`.
pub(super) fn dead_letter(
    metrics: &Metrics,
    dependency: Dependency,
    reason: DeadLetterReason,
    snapshot: Option<BudgetSnapshot>,
    source: BudgetSource,
) -> Decision {
    metrics.dead_letter(&dependency, reason);
    Decision::DeadLetter {
        dependency,
        reason,
        snapshot,
        source,
    }
}
