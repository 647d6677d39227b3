//! The brownout model: each request makes up to K attempts; each attempt fails independently
//! with probability P; a failed attempt retries at once if attempts remain and the budget
//! grants. One window covers the whole run (time is not involved).
//!
//! Reference numbers (2,000 requests, 3 attempts, means of seeds 1–10): 1.05 calls per request
//! at P = 0.05; 2.71 at P = 0.9 without a budget; 1.10 at P = 0.9 with a 10% budget on first
//! attempts.

use std::time::Duration;

use fleet_budget::Error;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::budget::{BudgetParams, ModelBudget, RetryVerdict};

/// One window covering the run: the longest window the configuration accepts.
const WINDOW: Duration = Duration::from_secs(86_400);

/// Parameters of the brownout model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BrownoutParams {
    /// Client requests (jobs).
    pub requests: u64,
    /// Executions per request at most, including the first.
    pub attempts: u32,
    /// Probability that one attempt fails, from 0 to 1.
    pub failure_rate: f64,
    /// The retry budget; `None`: no budget, only the attempt ceiling.
    pub budget: Option<BudgetParams>,
    /// Random seed.
    pub seed: u64,
}

/// The result of one brownout run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct BrownoutReport {
    /// Requests made: each one's first attempt (the words of the metrics and `status`).
    pub first_attempts: u64,
    /// Attempts that reached the dependency, first attempts and retries.
    pub executions: u64,
    /// Executions per first attempt.
    pub amplification: f64,
    /// Requests that succeeded.
    pub successes: u64,
    /// Retries the budget (or, without one, the ceiling) let through.
    pub retries_granted: u64,
    /// Retries the budget denied.
    pub retries_denied: u64,
}

/// Runs the brownout model once.
///
/// # Errors
/// None in practice: the modelled task name is valid, and the local store does not fail. The
/// budget's error is passed on rather than hidden.
pub fn run(p: &BrownoutParams) -> Result<BrownoutReport, Error> {
    let budget = ModelBudget::new(p.budget, WINDOW, p.attempts, p.seed);
    let mut rng = SmallRng::seed_from_u64(p.seed);
    let mut r = BrownoutReport {
        first_attempts: p.requests,
        ..BrownoutReport::default()
    };
    for _ in 0..p.requests {
        let mut attempt = 1u32;
        loop {
            r.executions += 1;
            budget.attempt(attempt)?;
            if rng.random::<f64>() >= p.failure_rate {
                r.successes += 1;
                budget.success()?;
                break;
            }
            match budget.failed(attempt)? {
                RetryVerdict::Granted => r.retries_granted += 1,
                RetryVerdict::Denied => {
                    r.retries_denied += 1;
                    break;
                }
                RetryVerdict::Exhausted => break,
            }
            attempt += 1;
        }
    }
    r.amplification = ratio(r.executions, r.first_attempts);
    Ok(r)
}

#[allow(clippy::cast_precision_loss)]
fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The means of several brownout runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct BrownoutMean {
    /// Mean first attempts (requests).
    pub first_attempts: f64,
    /// Mean executions.
    pub executions: f64,
    /// Mean executions per mean first attempts.
    pub amplification: f64,
    /// Mean successes.
    pub successes: f64,
    /// Mean retries granted.
    pub retries_granted: f64,
    /// Mean retries denied.
    pub retries_denied: f64,
    /// How many runs.
    pub runs: u32,
}

/// The means of `reports` (all zero for none).
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn mean(reports: &[BrownoutReport]) -> BrownoutMean {
    let n = reports.len().max(1) as f64;
    let sum = |f: fn(&BrownoutReport) -> u64| reports.iter().map(f).sum::<u64>() as f64 / n;
    let mut m = BrownoutMean {
        first_attempts: sum(|r| r.first_attempts),
        executions: sum(|r| r.executions),
        successes: sum(|r| r.successes),
        retries_granted: sum(|r| r.retries_granted),
        retries_denied: sum(|r| r.retries_denied),
        runs: u32::try_from(reports.len()).unwrap_or(u32::MAX),
        amplification: 0.0,
    };
    m.amplification = if m.first_attempts > 0.0 {
        m.executions / m.first_attempts
    } else {
        0.0
    };
    m
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use fleet_budget::DepositBasis;

    use super::*;

    fn brownout_mean(p: f64, budget: Option<BudgetParams>, runs: u64) -> BrownoutMean {
        let reports: Vec<_> = (1..=runs)
            .map(|seed| {
                run(&BrownoutParams {
                    requests: 2000,
                    attempts: 3,
                    failure_rate: p,
                    budget,
                    seed,
                })
                .unwrap()
            })
            .collect();
        mean(&reports)
    }

    #[test]
    fn brownout_reproduces_the_published_reference_numbers() {
        let healthy = brownout_mean(0.05, None, 10);
        assert!((healthy.amplification - 1.05).abs() < 0.01, "{healthy:?}");
        let brownout = brownout_mean(0.9, None, 10);
        assert!((brownout.amplification - 2.71).abs() < 0.03, "{brownout:?}");
        let budget = BudgetParams {
            ratio: 0.1,
            deposit: DepositBasis::Request,
            min_allowance: 10,
        };
        let with = brownout_mean(0.9, Some(budget), 10);
        assert!((with.amplification - 1.10).abs() < 0.015, "{with:?}");
        assert!((with.successes - 220.0).abs() < 25.0, "{with:?}");
        let healthy_with = brownout_mean(0.05, Some(budget), 10);
        assert!(
            (healthy_with.amplification - healthy.amplification).abs() < 0.005,
            "{healthy_with:?}"
        );
    }

    #[test]
    fn every_request_ends_in_a_success_or_a_stop() {
        let r = run(&BrownoutParams {
            requests: 500,
            attempts: 4,
            failure_rate: 0.5,
            budget: None,
            seed: 9,
        })
        .unwrap();
        assert_eq!(r.executions, r.first_attempts + r.retries_granted);
        assert!(r.successes <= r.first_attempts);
        assert_eq!(r.retries_denied, 0, "no budget, no denials");
        assert_eq!(mean(&[]), BrownoutMean::default());
    }
}
