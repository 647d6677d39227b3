//! The budget a model runs: the project's [`FleetBudget`] on a [`LocalStore`] whose clock only
//! moves when the model says so, or no budget at all (only the attempt ceiling).

use std::sync::Arc;
use std::time::Duration;

use fleet_budget::clock::ManualClock;
use fleet_budget::store::LocalStore;
use fleet_budget::{
    BudgetPolicy, Config, DeadLetterReason, Decision, DepositBasis, Error, Failure, FleetBudget,
    WindowMode,
};
use futures::executor::block_on;

/// The task every modelled job runs, and so the dependency whose budget it spends.
const TASK: &str = "upstream";

/// A retry budget for a model (one policy for the modelled dependency, sliding window).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetParams {
    /// Retries allowed per deposit.
    pub ratio: f64,
    /// What earns allowance.
    pub deposit: DepositBasis,
    /// Retries always allowed per window.
    pub min_allowance: u64,
}

/// What a model's budget said about one failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryVerdict {
    /// The attempt is retried.
    Granted,
    /// The budget denied the retry (dead-lettered `budget_exhausted`).
    Denied,
    /// The job used its last attempt (dead-lettered `attempts_exhausted`).
    Exhausted,
}

/// A model's budget and its clock.
#[derive(Debug)]
pub(crate) struct ModelBudget {
    budget: Option<FleetBudget>,
    clock: ManualClock,
    max_attempts: u32,
}

impl ModelBudget {
    /// `params` on a window of `window`, with `max_attempts` executions per job; without
    /// `params`, only the attempt ceiling decides.
    pub(crate) fn new(
        params: Option<BudgetParams>,
        window: Duration,
        max_attempts: u32,
        seed: u64,
    ) -> Self {
        let clock = ManualClock::new(0);
        let budget = params.map(|p| {
            let mut config = Config {
                defaults: BudgetPolicy {
                    window,
                    ratio: p.ratio,
                    min_allowance: p.min_allowance,
                    deposit: p.deposit,
                    mode: WindowMode::Sliding,
                },
                ..Config::default()
            };
            config.ceilings.default.max_attempts = max_attempts;
            FleetBudget::builder(&config)
                .local_store(LocalStore::with_clock(Arc::new(clock.clone())))
                .seed(seed)
                .build()
        });
        Self {
            budget,
            clock,
            max_attempts,
        }
    }

    /// Sets the model time, in milliseconds.
    pub(crate) fn set_ms(&self, ms: u64) {
        self.clock.set_ms(ms);
    }

    /// An execution starts (`attempt` 1 is the first).
    pub(crate) fn attempt(&self, attempt: u32) -> Result<(), Error> {
        match &self.budget {
            Some(b) => block_on(b.on_attempt(TASK, attempt)),
            None => Ok(()),
        }
    }

    /// An execution succeeded.
    pub(crate) fn success(&self) -> Result<(), Error> {
        match &self.budget {
            Some(b) => block_on(b.on_success(TASK)),
            None => Ok(()),
        }
    }

    /// Execution `attempt` failed: is it retried?
    pub(crate) fn failed(&self, attempt: u32) -> Result<RetryVerdict, Error> {
        let Some(budget) = &self.budget else {
            return Ok(if attempt >= self.max_attempts {
                RetryVerdict::Exhausted
            } else {
                RetryVerdict::Granted
            });
        };
        let failure = Failure::retryable("simulated failure");
        Ok(
            match block_on(budget.on_failure(TASK, attempt, &failure))? {
                Decision::Retry { .. } => RetryVerdict::Granted,
                Decision::DeadLetter {
                    reason: DeadLetterReason::BudgetExhausted,
                    ..
                } => RetryVerdict::Denied,
                Decision::DeadLetter { .. } => RetryVerdict::Exhausted,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_budget_only_the_ceiling_decides() {
        let b = ModelBudget::new(None, Duration::from_secs(1), 3, 1);
        assert_eq!(b.failed(1).ok(), Some(RetryVerdict::Granted));
        assert_eq!(b.failed(2).ok(), Some(RetryVerdict::Granted));
        assert_eq!(b.failed(3).ok(), Some(RetryVerdict::Exhausted));
    }

    #[test]
    fn the_budget_denies_past_its_floor_and_a_new_window_restores_it() {
        let params = BudgetParams {
            ratio: 0.0,
            deposit: DepositBasis::Success,
            min_allowance: 2,
        };
        let b = ModelBudget::new(Some(params), Duration::from_secs(1), 5, 1);
        let verdicts: Vec<_> = (0..3).map(|_| b.failed(1).ok()).collect();
        assert_eq!(
            verdicts,
            [
                Some(RetryVerdict::Granted),
                Some(RetryVerdict::Granted),
                Some(RetryVerdict::Denied)
            ]
        );
        assert_eq!(b.failed(5).ok(), Some(RetryVerdict::Exhausted));
        // Two windows later the previous window no longer weighs: the floor is back.
        b.set_ms(2_000);
        assert_eq!(b.failed(1).ok(), Some(RetryVerdict::Granted));
    }
}
