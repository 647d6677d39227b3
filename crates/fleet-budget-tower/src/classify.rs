//! Which results of the inner service are failures, and of what kind.

use std::fmt;

use fleet_budget::Failure;

/// What one result of the inner service was, for the budget.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The dependency served it: a deposit (`deposit = "success"`), no retry.
    Success,
    /// It failed: retried when the failure is retryable and the fleet budget grants it
    /// ([`Failure::retryable`], [`Failure::retry_after`]); returned as it is when not
    /// ([`Failure::non_retryable`]: no budget asked).
    Failure(Failure),
}

/// Classifies a result of the inner service. Implemented for every
/// `Fn(&Result<Res, E>) -> Outcome`.
pub trait Classify<Res, E> {
    /// What `result` was.
    fn classify(&self, result: &Result<Res, E>) -> Outcome;
}

impl<F, Res, E> Classify<Res, E> for F
where
    F: Fn(&Result<Res, E>) -> Outcome,
{
    fn classify(&self, result: &Result<Res, E>) -> Outcome {
        self(result)
    }
}

/// The default: `Ok` is a success, every `Err` a retryable failure with the error's text.
#[derive(Debug, Clone, Copy, Default)]
pub struct ErrorsAreRetryable;

impl<Res, E: fmt::Display> Classify<Res, E> for ErrorsAreRetryable {
    fn classify(&self, result: &Result<Res, E>) -> Outcome {
        match result {
            Ok(_) => Outcome::Success,
            Err(e) => Outcome::Failure(Failure::retryable(e)),
        }
    }
}
