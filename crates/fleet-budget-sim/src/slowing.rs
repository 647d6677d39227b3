//! A dependency that slows down, tick by tick: the retry storm of a concurrency cap, and what
//! the concurrency budget cuts from it. A fluid model in expected values (no randomness).
//!
//! The dependency serves at most `cap` calls at once. Its latency rises as the calls in flight
//! near the cap (`latency × (1 + ¼ (n / cap)⁴)`, so a quarter more at the cap, while throughput
//! still grows), and past the cap calls queue: latency `1.25 × latency × n / cap`, the cap's
//! throughput shared by everyone in the queue. A caller gives up after `timeout_ms`: with
//! latencies spread exponentially around the mean, a call times out with probability
//! `exp(−timeout / mean latency)`, and a timeout is a failure like any other (the dependency
//! still does the work: an abandoned call stays in flight until it completes). Each failure is
//! retried the next tick, up to `retries` times.
//!
//! Primary calls arrive at the rate that keeps `primary` in flight at the normal latency. From
//! tick `slow_from`, for `slow_ticks`, the latency is `slow_factor` times longer. Without a
//! budget the retries push the calls in flight past the cap, the queue makes calls time out,
//! timeouts become failures and failures become retries: the storm can outlive the slowdown
//! (metastable). With the concurrency budget a retry starts only while the retries in flight are
//! below `max(min_retry_slots, floor(fraction × primaries in flight))` and the calls in flight
//! below the cap ([`crate::concurrency::retry_slots`], the rule of the fleet's leases); the rest
//! are refused (dead-lettered, replayed later), never queued.
//!
//! ```
//! use fleet_budget_sim::slowing::{self, SlowingParams};
//!
//! let p = SlowingParams::default();
//! let without = slowing::run(&p)?;
//! let with = slowing::run(&SlowingParams { budget: Some(Default::default()), ..p })?;
//! assert!(without.peak_in_flight > 20.0 && with.peak_in_flight <= 20.0 + 1e-9);
//! assert!(with.timeouts_total < without.timeouts_total);
//! # Ok::<(), fleet_budget_sim::slowing::SlowingError>(())
//! ```

use serde::Serialize;

use crate::concurrency::{MAX_RETRIES, retry_slots};

/// The most ticks a run takes.
pub const MAX_TICKS: u32 = 100_000;

/// The concurrency budget of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlowingBudget {
    /// Retry slots always allowed.
    pub min_retry_slots: u64,
    /// Retry slots per primary call in flight; `None`: `(cap − primary) / primary`.
    pub max_retry_fraction: Option<f64>,
}

impl Default for SlowingBudget {
    fn default() -> Self {
        Self {
            min_retry_slots: 3,
            max_retry_fraction: None,
        }
    }
}

/// Parameters of the model (defaults: the issue's dependency, cap 20, 16 primaries in flight).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlowingParams {
    /// Calls the dependency serves at once; more queue.
    pub cap: u64,
    /// Primary calls in flight at normal load and latency (1 to the cap).
    pub primary: f64,
    /// Latency of an unloaded call, ms.
    pub latency_ms: f64,
    /// The caller's timeout, ms.
    pub timeout_ms: f64,
    /// Failures other than timeouts, 0 to 1.
    pub failure_rate: f64,
    /// Retries per failure at most.
    pub retries: u32,
    /// Latency multiplier while the dependency is slow (≥ 1).
    pub slow_factor: f64,
    /// First slow tick.
    pub slow_from: u32,
    /// Slow ticks.
    pub slow_ticks: u32,
    /// Ticks run.
    pub ticks: u32,
    /// Length of a tick, ms.
    pub tick_ms: f64,
    /// The concurrency budget; `None`: every retry starts.
    pub budget: Option<SlowingBudget>,
}

impl Default for SlowingParams {
    fn default() -> Self {
        Self {
            cap: 20,
            primary: 16.0,
            latency_ms: 200.0,
            timeout_ms: 1000.0,
            failure_rate: 0.05,
            retries: 1,
            slow_factor: 1.08,
            slow_from: 50,
            slow_ticks: 200,
            ticks: 600,
            tick_ms: 100.0,
            budget: None,
        }
    }
}

/// Parameters the model cannot take.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SlowingError {
    /// A parameter out of its range: its name and what is allowed.
    #[error("{name} must be {allowed}, not {value}")]
    Range {
        /// The parameter.
        name: &'static str,
        /// What is allowed.
        allowed: &'static str,
        /// The value given.
        value: f64,
    },
}

/// One tick.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SlowingTick {
    /// The tick, from 0.
    pub tick: u32,
    /// Whether the dependency is slow in it.
    pub slow: bool,
    /// Calls in flight at its end (queued ones included).
    pub in_flight: f64,
    /// Retries among them.
    pub retries_in_flight: f64,
    /// Mean latency of the calls in flight at its start, ms.
    pub latency_ms: f64,
    /// Calls that completed.
    pub completed: f64,
    /// Completed calls that timed out.
    pub timeouts: f64,
    /// Completed calls that failed (timeouts included).
    pub failures: f64,
    /// Retries started.
    pub retries_started: f64,
    /// Retries refused by the budget.
    pub retries_refused: f64,
}

/// A run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlowingReport {
    /// Every tick.
    pub ticks: Vec<SlowingTick>,
    /// Most calls in flight at a tick's end.
    pub peak_in_flight: f64,
    /// Highest mean latency, ms.
    pub peak_latency_ms: f64,
    /// Calls that timed out.
    pub timeouts_total: f64,
    /// Calls that failed (timeouts included).
    pub failures_total: f64,
    /// Calls that succeeded.
    pub succeeded_total: f64,
    /// Retries started.
    pub retries_started_total: f64,
    /// Retries refused by the budget (dead-lettered).
    pub retries_refused_total: f64,
    /// Failures with no retry left.
    pub given_up_total: f64,
    /// Calls still in flight at the end.
    pub in_flight_at_end: f64,
    /// Ticks after the slowdown ended until the calls in flight were back within 5% of what
    /// they were just before it; `None` if they never came back within the run.
    pub recovery_ticks: Option<u32>,
}

fn check(
    name: &'static str,
    value: f64,
    ok: bool,
    allowed: &'static str,
) -> Result<(), SlowingError> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(SlowingError::Range {
            name,
            allowed,
            value,
        })
    }
}

impl SlowingParams {
    fn checked(&self) -> Result<(), SlowingError> {
        #[allow(clippy::cast_precision_loss)] // caps are far below 2^53
        let cap = self.cap as f64;
        check("cap", cap, (1.0..=1e9).contains(&cap), "from 1 to 10^9")?;
        check(
            "primary",
            self.primary,
            self.primary >= 1.0 && self.primary <= cap,
            "from 1 to the cap",
        )?;
        for (name, v) in [
            ("latency_ms", self.latency_ms),
            ("timeout_ms", self.timeout_ms),
            ("tick_ms", self.tick_ms),
        ] {
            check(name, v, (1e-3..=1e9).contains(&v), "from 0.001 to 10^9 ms")?;
        }
        check(
            "failure_rate",
            self.failure_rate,
            (0.0..=1.0).contains(&self.failure_rate),
            "from 0 to 1",
        )?;
        check(
            "retries",
            f64::from(self.retries),
            self.retries <= MAX_RETRIES,
            "at most 100",
        )?;
        check(
            "slow_factor",
            self.slow_factor,
            (1.0..=1000.0).contains(&self.slow_factor),
            "from 1 to 1000",
        )?;
        check(
            "ticks",
            f64::from(self.ticks),
            (1..=MAX_TICKS).contains(&self.ticks),
            "from 1 to 100000",
        )?;
        if let Some(SlowingBudget {
            max_retry_fraction: Some(f),
            ..
        }) = self.budget
        {
            check(
                "max_retry_fraction",
                f,
                (0.0..=1000.0).contains(&f),
                "from 0 to 1000",
            )?;
        }
        Ok(())
    }

    /// Mean latency with `n` calls in flight and base latency `base`.
    fn latency(&self, n: f64, base: f64) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let cap = self.cap as f64;
        let load = n / cap;
        if load <= 1.0 {
            base * (1.0 + 0.25 * load.powi(4))
        } else {
            base * 1.25 * load
        }
    }
}

/// Runs the model.
///
/// # Errors
/// A parameter out of its range.
pub fn run(p: &SlowingParams) -> Result<SlowingReport, SlowingError> {
    p.checked()?;
    #[allow(clippy::cast_precision_loss)]
    let cap = p.cap as f64;
    let fraction = p.budget.map(|b| {
        b.max_retry_fraction
            .unwrap_or((cap - p.primary) / p.primary)
    });
    // Primary arrivals per tick: what keeps `primary` in flight at the normal latency.
    let arrivals = p.primary / p.latency(p.primary, p.latency_ms) * p.tick_ms;
    let retries = usize::try_from(p.retries).unwrap_or(0);
    // Calls in flight: primaries, and retries by generation (`retrying[i]`: the (i+1)-th retry
    // of a job); `demand[i]`: the (i+1)-th retries asked for by last tick's failures.
    let mut primaries = p.primary;
    let mut retrying = vec![0.0_f64; retries];
    let mut demand = vec![0.0_f64; retries];
    let mut report = SlowingReport {
        ticks: Vec::with_capacity(usize::try_from(p.ticks).unwrap_or(0)),
        peak_in_flight: p.primary,
        peak_latency_ms: 0.0,
        timeouts_total: 0.0,
        failures_total: 0.0,
        succeeded_total: 0.0,
        retries_started_total: 0.0,
        retries_refused_total: 0.0,
        given_up_total: 0.0,
        in_flight_at_end: 0.0,
        recovery_ticks: None,
    };
    let slow_end = p.slow_from.saturating_add(p.slow_ticks);
    let mut before_slowdown = p.primary;
    for tick in 0..p.ticks {
        let slow = (p.slow_from..slow_end).contains(&tick);
        let base = if slow {
            p.latency_ms * p.slow_factor
        } else {
            p.latency_ms
        };
        let n = primaries + retrying.iter().sum::<f64>();
        let latency = p.latency(n, base);
        let done_share = (p.tick_ms / latency).min(1.0);
        let timeout_share = (-p.timeout_ms / latency).exp();
        let failure_share = p.failure_rate + (1.0 - p.failure_rate) * timeout_share;
        let (mut completed, mut timeouts, mut failures) = (0.0, 0.0, 0.0);
        // Generation g's failures ask for generation g + 1 (`demand[g]`); the last gives up.
        for (g, count) in std::iter::once(&mut primaries)
            .chain(retrying.iter_mut())
            .enumerate()
        {
            let done = *count * done_share;
            *count -= done;
            let failed = done * failure_share;
            completed += done;
            timeouts += done * (1.0 - p.failure_rate) * timeout_share;
            failures += failed;
            report.succeeded_total += done - failed;
            match demand.get_mut(g) {
                Some(asked) => *asked += failed,
                None => report.given_up_total += failed,
            }
        }
        primaries += arrivals;
        let (mut started, mut refused) = (0.0, 0.0);
        let mut retrying_total: f64 = retrying.iter().sum();
        for (asked, count) in demand.iter_mut().zip(retrying.iter_mut()) {
            let asked = std::mem::take(asked);
            let admitted = match (p.budget, fraction) {
                (Some(b), Some(f)) => {
                    #[allow(clippy::cast_precision_loss)]
                    let slots = retry_slots(p.cap, primaries.min(cap), f, b.min_retry_slots) as f64;
                    let room = (slots - retrying_total)
                        .min(cap - primaries - retrying_total)
                        .max(0.0);
                    asked.min(room)
                }
                _ => asked,
            };
            *count += admitted;
            retrying_total += admitted;
            started += admitted;
            refused += asked - admitted;
        }
        let total = primaries + retrying_total;
        report.ticks.push(SlowingTick {
            tick,
            slow,
            in_flight: total,
            retries_in_flight: retrying_total,
            latency_ms: latency,
            completed,
            timeouts,
            failures,
            retries_started: started,
            retries_refused: refused,
        });
        report.peak_in_flight = report.peak_in_flight.max(total);
        report.peak_latency_ms = report.peak_latency_ms.max(latency);
        report.timeouts_total += timeouts;
        report.failures_total += failures;
        report.retries_started_total += started;
        report.retries_refused_total += refused;
        if tick < p.slow_from {
            before_slowdown = total;
        }
        if tick >= slow_end && report.recovery_ticks.is_none() && total <= before_slowdown * 1.05 {
            report.recovery_ticks = Some(tick - slow_end);
        }
    }
    report.in_flight_at_end = primaries + retrying.iter().sum::<f64>();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_healthy_dependency_stays_at_its_planned_load() {
        let r = run(&SlowingParams {
            slow_ticks: 0,
            ..SlowingParams::default()
        })
        .unwrap();
        // Failures of 5% and a few timeouts add their retries: a little over 16, below 20.
        assert!(r.peak_in_flight < 19.0, "{}", r.peak_in_flight);
        assert_eq!(r.recovery_ticks, Some(0));
    }

    #[test]
    fn the_slowdown_becomes_a_storm_that_outlives_it_and_the_budget_cuts_it() {
        let p = SlowingParams::default();
        let without = run(&p).unwrap();
        let with = run(&SlowingParams {
            budget: Some(SlowingBudget::default()),
            ..p
        })
        .unwrap();
        // Without a budget: past the cap, queued, timing out, and still storming at the end.
        assert!(without.peak_in_flight > 40.0, "{}", without.peak_in_flight);
        assert_eq!(without.recovery_ticks, None);
        // With it: never past the cap, back to the planned load once the slowdown ends.
        assert!(
            with.peak_in_flight <= 20.0 + 1e-9,
            "{}",
            with.peak_in_flight
        );
        assert!(
            with.recovery_ticks.is_some_and(|t| t < 50),
            "{:?}",
            with.recovery_ticks
        );
        assert!(with.timeouts_total * 10.0 < without.timeouts_total);
        assert!(with.retries_refused_total > 0.0);
        // Every call is accounted for: what entered (the first primaries, the arrivals, the
        // retries started) completed or is still in flight; every failure was retried, refused,
        // given up, or (the last tick's) is still asking.
        let arrivals = p.primary / p.latency(p.primary, p.latency_ms) * p.tick_ms;
        for r in [&without, &with] {
            let entered = p.primary + arrivals * f64::from(p.ticks) + r.retries_started_total;
            let left = r.succeeded_total + r.failures_total;
            assert!((entered - left - r.in_flight_at_end).abs() < 1e-6 * entered);
            let last = r.ticks.last().unwrap().failures;
            let placed = r.given_up_total + r.retries_started_total + r.retries_refused_total;
            assert!(
                (r.failures_total - placed) >= -1e-6 && (r.failures_total - placed) <= last + 1e-6
            );
        }
    }

    #[test]
    fn bad_parameters_are_named() {
        for (p, name) in [
            (
                SlowingParams {
                    primary: 30.0,
                    ..SlowingParams::default()
                },
                "primary",
            ),
            (
                SlowingParams {
                    slow_factor: 0.5,
                    ..SlowingParams::default()
                },
                "slow_factor",
            ),
            (
                SlowingParams {
                    timeout_ms: f64::NAN,
                    ..SlowingParams::default()
                },
                "timeout_ms",
            ),
            (
                SlowingParams {
                    ticks: 0,
                    ..SlowingParams::default()
                },
                "ticks",
            ),
        ] {
            let SlowingError::Range { name: got, .. } = run(&p).unwrap_err();
            assert_eq!(got, name);
        }
    }
}
