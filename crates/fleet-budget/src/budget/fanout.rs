//! Jobs that fan out to several dependencies.
//!
//! A job that calls three dependencies makes one budget check per dependency: a failure in
//! `mail` must spend `mail`'s budget, not that of the dependency the task is mapped to. Two ways
//! to say which branch failed:
//!
//! - the job is retried as a whole (the RabbitMQ worker): the handler names the failing branch
//!   with [`Failure::in_dependency`], and [`FleetBudget::on_failure`] asks *that* dependency's
//!   budget (the task's ceiling still bounds the job's executions);
//! - the branches are retried inside the job: [`FleetBudget::fan_out`] gives a [`FanOut`] that
//!   asks the failing branch's budget for each retry *and* holds the job to a cap of its own,
//!   `max_retries` across all its branches. Per-hop budgets alone add up to something nobody
//!   approved: three branches each allowed their own retries retry three times as much as one.
//!
//! A refusal by the cap is `fanout_exhausted`, decided before any budget is asked (like the
//! attempt ceiling), so it spends nothing.

use std::time::Duration;

use super::FleetBudget;
use super::decide;
use crate::decision::{BudgetSource, DeadLetterReason, Decision, Failure};
use crate::error::Error;

/// One job's retries across its branches (see the module documentation).
#[derive(Debug)]
pub struct FanOut {
    budget: FleetBudget,
    task: String,
    max_retries: u32,
    retries: u32,
}

impl FanOut {
    /// The branches of one execution of `task` on `budget`, allowed `max_retries` retries
    /// across all of them ([`FleetBudget::fan_out`]).
    pub(super) fn new(budget: FleetBudget, task: &str, max_retries: u32) -> Self {
        Self {
            budget,
            task: task.to_owned(),
            max_retries,
            retries: 0,
        }
    }
}

impl FanOut {
    /// Retries granted so far, all branches together.
    #[must_use]
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// Decides whether the branch calling `dependency` may retry after `failure`, in order:
    /// not retryable → dead-letter `non_retryable`; the job's retries across its branches at
    /// `max_retries` → `fanout_exhausted` (no budget asked); then one retry from
    /// `dependency`'s budget (refused → `budget_exhausted` or `budget_frozen`); granted → the
    /// task's backoff for this branch retry, at least any `Retry-After`.
    ///
    /// A `dependency` no section configures spends what `[unmapped_tasks]` says, as an
    /// unmapped task would ([`FleetBudget::named_dependency`]).
    ///
    /// # Errors
    /// `dependency` is unknown and refused, or unknown and not a valid dependency name.
    pub async fn on_branch_failure(
        &mut self,
        dependency: &str,
        failure: &Failure,
    ) -> Result<Decision, Error> {
        let budget = &self.budget;
        let dependency = budget.named_dependency(dependency)?;
        let refused = if failure.is_retryable() {
            (self.retries >= self.max_retries).then_some(DeadLetterReason::FanoutExhausted)
        } else {
            Some(DeadLetterReason::NonRetryable)
        };
        if let Some(reason) = refused {
            return Ok(budget.dead_letter(dependency, reason, None, BudgetSource::NotConsulted));
        }
        let (withdrawal, source) = budget.withdraw_counted(&dependency).await;
        let shadow_denied = decide::refusal(&withdrawal);
        if let Some(reason) = shadow_denied
            && !budget.shadows(&dependency, reason, source).await
        {
            return Ok(budget.dead_letter(dependency, reason, Some(withdrawal.snapshot), source));
        }
        self.retries += 1;
        let backoff = budget.ceiling(&self.task).backoff;
        let delay: Duration = budget
            .jitter()
            .draw(|rng| backoff.delay(self.retries, failure.retry_after_hint(), rng));
        Ok(Decision::Retry {
            dependency,
            delay,
            next_attempt: self.retries.saturating_add(1),
            snapshot: withdrawal.snapshot,
            source,
            shadow_denied,
        })
    }
}
