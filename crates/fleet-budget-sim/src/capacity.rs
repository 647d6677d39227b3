//! The capacity model: each tick, offered = new jobs + retries scheduled for this tick; the
//! dependency serves `min(offered, capacity)` of them chosen at random; each failed attempt
//! retries next tick if attempts remain and the budget (a sliding window of W ticks) grants,
//! else it is dead-lettered.
//!
//! Reference numbers (900 jobs per tick, capacity 1,000 dropping to 200 for 3 ticks from tick 5,
//! 3 attempts, seed 7): a peak of about 2,400 calls offered in a tick without a budget, about
//! half of that with a 10% budget on successes.

use std::time::Duration;

use fleet_budget::Error;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use serde::Serialize;

use crate::budget::{BudgetParams, ModelBudget, RetryVerdict};

/// Milliseconds of model time per tick.
const TICK_MS: u64 = 1000;

/// Parameters of the capacity model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapacityParams {
    /// New jobs per tick.
    pub incoming: u64,
    /// Ticks to model.
    pub ticks: u32,
    /// Calls the dependency serves per tick when healthy.
    pub capacity: u64,
    /// Calls it serves per tick while degraded.
    pub degraded_capacity: u64,
    /// First degraded tick (ticks count from 0).
    pub degraded_from: u32,
    /// How many ticks the dependency stays degraded.
    pub degraded_ticks: u32,
    /// Executions per job at most, including the first.
    pub attempts: u32,
    /// The retry budget; `None`: no budget, only the attempt ceiling.
    pub budget: Option<BudgetParams>,
    /// Length of the budget's sliding window, in ticks.
    pub window_ticks: u32,
    /// Random seed.
    pub seed: u64,
}

impl CapacityParams {
    /// Whether the dependency is degraded in tick `t`.
    #[must_use]
    pub fn degraded_at(&self, t: u32) -> bool {
        t >= self.degraded_from && t - self.degraded_from < self.degraded_ticks
    }

    /// Calls the dependency serves in tick `t`.
    #[must_use]
    pub fn capacity_at(&self, t: u32) -> u64 {
        if self.degraded_at(t) {
            self.degraded_capacity
        } else {
            self.capacity
        }
    }
}

/// One tick of the capacity model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tick {
    /// The tick's number, from 0.
    pub tick: u32,
    /// Calls offered: new jobs and the retries scheduled for this tick.
    pub offered: u64,
    /// Calls served.
    pub served: u64,
    /// Calls that failed (over capacity).
    pub failed: u64,
    /// Failed calls retried next tick.
    pub retries_granted: u64,
    /// Failed calls dead-lettered (attempts or budget exhausted).
    pub dead_lettered: u64,
}

/// The result of one capacity run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CapacityReport {
    /// Every tick, in order.
    pub ticks: Vec<Tick>,
    /// The most calls offered in one tick.
    pub peak_offered: u64,
    /// Calls served in all ticks.
    pub served_total: u64,
    /// Jobs dead-lettered in all ticks.
    pub dead_lettered_total: u64,
}

/// Runs the capacity model once.
///
/// # Errors
/// None in practice: the modelled task name is valid, and the local store does not fail. The
/// budget's error is passed on rather than hidden.
pub fn run(p: &CapacityParams) -> Result<CapacityReport, Error> {
    let window = Duration::from_millis(TICK_MS.saturating_mul(u64::from(p.window_ticks.max(1))));
    let budget = ModelBudget::new(p.budget, window, p.attempts, p.seed);
    let mut rng = SmallRng::seed_from_u64(p.seed);
    let mut report = CapacityReport::default();
    // Attempt numbers of the retries that run next tick.
    let mut scheduled: Vec<u32> = Vec::new();
    for t in 0..p.ticks {
        // Everything of tick t happens in its middle: the sliding window weighs the previous
        // window by the part of it still inside the last W ticks.
        budget.set_ms(u64::from(t) * TICK_MS + TICK_MS / 2);
        let mut offered: Vec<u32> = std::mem::take(&mut scheduled);
        offered.extend(std::iter::repeat_n(
            1,
            usize::try_from(p.incoming).unwrap_or(usize::MAX),
        ));
        let served = usize::try_from(p.capacity_at(t))
            .unwrap_or(usize::MAX)
            .min(offered.len());
        let (served_jobs, failed_jobs) = {
            let (chosen, rest) = offered.partial_shuffle(&mut rng, served);
            (chosen.to_vec(), rest.to_vec())
        };
        let mut tick = Tick {
            tick: t,
            offered: offered.len() as u64,
            served: served_jobs.len() as u64,
            failed: failed_jobs.len() as u64,
            ..Tick::default()
        };
        for attempt in &offered {
            budget.attempt(*attempt)?;
        }
        for _ in &served_jobs {
            budget.success()?;
        }
        for attempt in failed_jobs {
            match budget.failed(attempt)? {
                RetryVerdict::Granted => {
                    tick.retries_granted += 1;
                    scheduled.push(attempt + 1);
                }
                RetryVerdict::Denied | RetryVerdict::Exhausted => tick.dead_lettered += 1,
            }
        }
        report.peak_offered = report.peak_offered.max(tick.offered);
        report.served_total += tick.served;
        report.dead_lettered_total += tick.dead_lettered;
        report.ticks.push(tick);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use fleet_budget::DepositBasis;

    use super::*;

    fn reference(budget: Option<BudgetParams>) -> CapacityReport {
        run(&CapacityParams {
            incoming: 900,
            ticks: 20,
            capacity: 1000,
            degraded_capacity: 200,
            degraded_from: 5,
            degraded_ticks: 3,
            attempts: 3,
            budget,
            window_ticks: 3,
            seed: 7,
        })
        .unwrap()
    }

    #[test]
    fn capacity_reproduces_the_published_reference_numbers() {
        let without = reference(None);
        assert!(
            (2300..=2450).contains(&without.peak_offered),
            "{}",
            without.peak_offered
        );
        let budget = BudgetParams {
            ratio: 0.1,
            deposit: DepositBasis::Success,
            min_allowance: 10,
        };
        let with = reference(Some(budget));
        #[allow(clippy::cast_precision_loss)]
        let cut = 1.0 - with.peak_offered as f64 / without.peak_offered as f64;
        assert!(
            (0.4..=0.6).contains(&cut),
            "peak {} vs {}",
            with.peak_offered,
            without.peak_offered
        );
    }

    #[test]
    fn capacity_accounts_for_every_attempt() {
        let r = reference(Some(BudgetParams {
            ratio: 0.1,
            deposit: DepositBasis::Request,
            min_allowance: 10,
        }));
        for t in &r.ticks {
            assert_eq!(t.offered, t.served + t.failed);
            assert_eq!(t.failed, t.retries_granted + t.dead_lettered);
        }
        let jobs = 900 * 20;
        let in_flight = r.ticks.last().unwrap().retries_granted;
        assert_eq!(r.served_total + r.dead_lettered_total + in_flight, jobs);
    }

    #[test]
    fn the_degraded_ticks_are_the_ones_asked_for() {
        let mut p = CapacityParams {
            incoming: 0,
            ticks: 10,
            capacity: 10,
            degraded_capacity: 2,
            degraded_from: 3,
            degraded_ticks: 2,
            attempts: 1,
            budget: None,
            window_ticks: 1,
            seed: 1,
        };
        let caps: Vec<u64> = (0..6).map(|t| p.capacity_at(t)).collect();
        assert_eq!(caps, [10, 10, 10, 2, 2, 10]);
        p.degraded_from = u32::MAX;
        p.degraded_ticks = u32::MAX;
        assert!(p.degraded_at(u32::MAX) && !p.degraded_at(0));
    }
}
