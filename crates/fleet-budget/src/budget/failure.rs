//! A failed execution, decided in the order of the contract (`docs/semantics.md`): not
//! retryable, out of attempts, a wait past `max_delay`, then the dependency's budget; a granted
//! retry gets its delay from the task's ceiling.

use std::sync::PoisonError;
use std::time::Duration;

use super::{FleetBudget, Route};
use crate::ceiling::TaskCeiling;
use crate::decision::{BudgetSource, DeadLetterReason, Decision, Failure};
use crate::dependency::Dependency;
use crate::error::Error;

impl FleetBudget {
    /// Decides what to do with a failed execution, in the order of the contract:
    /// non-retryable → dead-letter; `attempt >= max_attempts` → dead-letter; a `Retry-After`
    /// longer than the task's `max_delay` → dead-letter `delay_exceeded`; ask the
    /// dependency's budget for one retry (denied → dead-letter `budget_exhausted`); granted →
    /// delay with backoff and jitter, at least any `Retry-After`.
    ///
    /// `attempt` is the number of the execution that failed (1 for the first). The budget asked
    /// is that of the task's dependency, or of the one the failure names
    /// ([`Failure::in_dependency`], a job calling several). A task with a
    /// recovery window is held to its derived count here; a caller that knows when the job
    /// first failed calls [`FleetBudget::on_failure_since`] to hold it to its window.
    ///
    /// # Errors
    /// See [`FleetBudget::dependency`]. A failing store is not an error: the fallback decides.
    pub async fn on_failure(
        &self,
        task: &str,
        attempt: u32,
        failure: &Failure,
    ) -> Result<Decision, Error> {
        self.on_failure_since(task, attempt, failure, None).await
    }

    /// [`FleetBudget::on_failure`] for a job that first failed `since_first_failure` ago (zero
    /// when this failure is its first): a task with a recovery window retries until the window
    /// has passed, its last delay fitted to end at it (`ceiling::window`). `None` is
    /// [`FleetBudget::on_failure`].
    ///
    /// # Errors
    /// See [`FleetBudget::dependency`].
    pub async fn on_failure_since(
        &self,
        task: &str,
        attempt: u32,
        failure: &Failure,
        since_first_failure: Option<Duration>,
    ) -> Result<Decision, Error> {
        let dependency = match &failure.dependency {
            None => self.dependency(task)?,
            Some(failed) => self.named_dependency(failed)?,
        };
        Ok(self
            .decide(
                dependency,
                &self.inner.ceilings.for_task(task),
                attempt,
                failure,
                since_first_failure,
            )
            .await)
    }

    /// [`FleetBudget::on_failure_since`] for a task already mapped ([`FleetBudget::route`]).
    ///
    /// # Errors
    /// A failure naming another dependency ([`Failure::in_dependency`]) that is refused, as
    /// [`FleetBudget::named_dependency`].
    pub async fn on_failure_routed(
        &self,
        route: &Route,
        attempt: u32,
        failure: &Failure,
        since_first_failure: Option<Duration>,
    ) -> Result<Decision, Error> {
        let dependency = match &failure.dependency {
            None => route.dependency().clone(),
            Some(failed) => self.named_dependency(failed)?,
        };
        Ok(self
            .decide(
                dependency,
                route.ceiling(),
                attempt,
                failure,
                since_first_failure,
            )
            .await)
    }

    /// The decision on a failure of `dependency`'s call, in the order of the contract.
    async fn decide(
        &self,
        dependency: Dependency,
        ceiling: &TaskCeiling,
        attempt: u32,
        failure: &Failure,
        since_first_failure: Option<Duration>,
    ) -> Decision {
        let attempt = attempt.max(1);
        if !failure.is_retryable() {
            return self.dead_letter(
                dependency,
                DeadLetterReason::NonRetryable,
                None,
                BudgetSource::NotConsulted,
            );
        }
        if ceiling.exhausted(attempt, since_first_failure) {
            return self.dead_letter(
                dependency,
                DeadLetterReason::AttemptsExhausted,
                None,
                BudgetSource::NotConsulted,
            );
        }
        // A wait the dependency asks for past `max_delay` is refused before any budget is
        // spent: honouring it would hold the job for longer than anyone agreed to wait.
        if let Some(after) = failure.retry_after_hint()
            && !ceiling.allows_wait(after)
        {
            return self.dead_letter(
                dependency,
                DeadLetterReason::DelayExceeded,
                None,
                BudgetSource::NotConsulted,
            );
        }
        let policy = self.policy(&dependency);
        let (withdrawal, source) = self.withdraw(&dependency, &policy).await;
        self.inner.metrics.decided(&dependency, &withdrawal, source);
        if !withdrawal.granted {
            let reason = if withdrawal.snapshot.control.frozen {
                DeadLetterReason::BudgetFrozen
            } else {
                DeadLetterReason::BudgetExhausted
            };
            return self.dead_letter(dependency, reason, Some(withdrawal.snapshot), source);
        }
        let delay = {
            let mut rng = self
                .inner
                .rng
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            ceiling.delay(
                attempt,
                since_first_failure,
                failure.retry_after_hint(),
                &mut *rng,
            )
        };
        Decision::Retry {
            dependency,
            delay,
            next_attempt: attempt.saturating_add(1),
            snapshot: withdrawal.snapshot,
            source,
        }
    }
}
