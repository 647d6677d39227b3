//! The concurrency arithmetic of a dependency with a hard cap on calls in flight: what retries
//! add to the calls in flight at a failure rate, what a separate retry pool adds in the worst
//! case, and what a concurrency budget (a share of the primary calls in flight, with a floor of
//! retry slots, never past the cap) lets through. Pure arithmetic, in expected values.
//!
//! The reference: a cap of 20, 16 primary calls in flight, 20% failures, each failure retried
//! once: retries add 16 × 0.2 = 3.2, so 19.2 are in flight; the budget's share is
//! (20 − 16) / 16 = 0.25; a primary pool of 20 beside a retry pool of 4 can put 24 in flight.
//!
//! ```
//! use fleet_budget_sim::concurrency::{self, ConcurrencyParams};
//!
//! let r = concurrency::analyze(&ConcurrencyParams {
//!     cap: 20,
//!     primary: 16.0,
//!     failure_rate: 0.2,
//!     retries: 1,
//!     min_retry_slots: 3,
//!     max_retry_fraction: None,
//! })?;
//! assert_eq!(r.max_retry_fraction, 0.25);
//! assert!((r.offered_in_flight - 19.2).abs() < 1e-9);
//! assert_eq!(r.separate_pools_worst_case, 24);
//! # Ok::<(), fleet_budget_sim::concurrency::ConcurrencyError>(())
//! ```

use serde::Serialize;

/// The most retries per failure the model takes (a chain longer than this is not a policy).
pub const MAX_RETRIES: u32 = 100;

/// Parameters of the concurrency arithmetic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConcurrencyParams {
    /// The dependency's cap on calls in flight.
    pub cap: u64,
    /// Primary (first-attempt) calls in flight at planned load, from 1 to `cap`.
    pub primary: f64,
    /// Probability that one call fails, from 0 to 1.
    pub failure_rate: f64,
    /// Retries per failure at most: a failed retry is retried again until this many were made.
    pub retries: u32,
    /// Retry slots always allowed, however few primary calls are in flight.
    pub min_retry_slots: u64,
    /// Retry slots per primary call in flight; `None`: `(cap − primary) / primary`.
    pub max_retry_fraction: Option<f64>,
}

/// Parameters the arithmetic cannot take.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConcurrencyError {
    /// `primary` is not a number from 1 to `cap`.
    #[error("primary calls in flight must be from 1 to the cap ({cap}), not {primary}")]
    Primary {
        /// The cap.
        cap: u64,
        /// The primary calls in flight asked for.
        primary: f64,
    },
    /// `failure_rate` is not a probability.
    #[error("the failure rate must be from 0 to 1, not {0}")]
    FailureRate(f64),
    /// `retries` is above [`MAX_RETRIES`].
    #[error("retries per failure must be at most {MAX_RETRIES}, not {0}")]
    Retries(u32),
    /// `max_retry_fraction` is negative or not finite.
    #[error("the retry fraction must be a finite number >= 0, not {0}")]
    Fraction(f64),
}

/// What each way of retrying puts in flight.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ConcurrencyReport {
    /// The cap on calls in flight.
    pub cap: u64,
    /// Primary calls in flight.
    pub primary: f64,
    /// The failure rate.
    pub failure_rate: f64,
    /// Retries per failure at most.
    pub retries: u32,
    /// Retry slots per primary call in flight: derived `(cap − primary) / primary`, or as set.
    pub max_retry_fraction: f64,
    /// Retry slots the budget allows: `max(min_retry_slots, floor(fraction × primary))`, and no
    /// more than the cap leaves after the primary calls.
    pub retry_slots: u64,
    /// Retry calls the failures ask for: `primary × (f + f² + … + f^retries)`.
    pub retry_demand: f64,
    /// Calls in flight with no budget: primary calls and every retry asked for.
    pub offered_in_flight: f64,
    /// Calls in flight with the concurrency budget: primary calls and the retries it grants.
    pub offered_in_flight_with_budget: f64,
    /// Retries the budget refuses (dead-lettered, not queued).
    pub retries_refused: f64,
    /// A primary pool sized to the cap beside a separate retry pool of `cap − primary`, both
    /// full: `cap + cap − primary`.
    pub separate_pools_worst_case: u64,
    /// Whether the calls offered without budget exceed the cap (excess calls queue and time out).
    pub over_cap_without_budget: bool,
}

/// Works out what each way of retrying puts in flight.
///
/// # Errors
///
/// [`ConcurrencyError`] when a parameter is out of its range.
pub fn analyze(p: &ConcurrencyParams) -> Result<ConcurrencyReport, ConcurrencyError> {
    #[allow(clippy::cast_precision_loss)] // caps are far below 2^53
    let cap = p.cap as f64;
    if !(p.primary.is_finite() && p.primary >= 1.0 && p.primary <= cap) {
        return Err(ConcurrencyError::Primary {
            cap: p.cap,
            primary: p.primary,
        });
    }
    if !(0.0..=1.0).contains(&p.failure_rate) {
        return Err(ConcurrencyError::FailureRate(p.failure_rate));
    }
    if p.retries > MAX_RETRIES {
        return Err(ConcurrencyError::Retries(p.retries));
    }
    let fraction = match p.max_retry_fraction {
        Some(f) if !(f.is_finite() && f >= 0.0) => return Err(ConcurrencyError::Fraction(f)),
        Some(f) => f,
        None => (cap - p.primary) / p.primary,
    };
    // f + f² + … + f^retries, summed term by term (no division by 1 − f, which is 0 at f = 1).
    let mut chain = 0.0;
    let mut term = 1.0;
    for _ in 0..p.retries {
        term *= p.failure_rate;
        chain += term;
    }
    let retry_demand = p.primary * chain;
    let retry_slots = retry_slots(p.cap, p.primary, fraction, p.min_retry_slots);
    #[allow(clippy::cast_precision_loss)]
    let granted = retry_demand.min(retry_slots as f64);
    let offered = p.primary + retry_demand;
    // The cap is at least `primary` (checked), so `cap - floor(primary)` cannot underflow.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let primary_whole = p.primary.ceil() as u64;
    Ok(ConcurrencyReport {
        cap: p.cap,
        primary: p.primary,
        failure_rate: p.failure_rate,
        retries: p.retries,
        max_retry_fraction: fraction,
        retry_slots,
        retry_demand,
        offered_in_flight: offered,
        offered_in_flight_with_budget: p.primary + granted,
        retries_refused: retry_demand - granted,
        separate_pools_worst_case: p.cap.saturating_add(p.cap.saturating_sub(primary_whole)),
        over_cap_without_budget: offered > cap,
    })
}

/// Retry slots with `primary` calls in flight: `max(min_slots, floor(fraction × primary))`, and
/// never more than the cap leaves free. The same rule as the fleet's concurrency budget.
#[must_use]
pub fn retry_slots(cap: u64, primary: f64, fraction: f64, min_slots: u64) -> u64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // clamped to [0, cap]
    let share = (fraction * primary).floor().clamp(0.0, 1e15) as u64;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let free = free_slots(cap, primary).floor() as u64;
    share.max(min_slots).min(free)
}

/// Slots the cap leaves after `primary` calls, never negative.
#[allow(clippy::cast_precision_loss)]
fn free_slots(cap: u64, primary: f64) -> f64 {
    (cap as f64 - primary).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(failure_rate: f64) -> ConcurrencyParams {
        ConcurrencyParams {
            cap: 20,
            primary: 16.0,
            failure_rate,
            retries: 1,
            min_retry_slots: 3,
            max_retry_fraction: None,
        }
    }

    #[test]
    fn forty_percent_goes_past_the_cap_and_the_budget_holds_it() {
        let r = analyze(&params(0.4)).unwrap();
        assert!((r.offered_in_flight - 22.4).abs() < 1e-9, "{r:?}");
        assert!(r.over_cap_without_budget);
        assert_eq!(r.retry_slots, 4);
        assert!(
            (r.offered_in_flight_with_budget - 20.0).abs() < 1e-9,
            "{r:?}"
        );
        assert!((r.retries_refused - 2.4).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn the_floor_lets_a_quiet_service_retry_but_never_past_the_cap() {
        // 2 primary calls: 25% of 2 is 0 slots, the floor gives 3.
        assert_eq!(retry_slots(20, 2.0, 0.25, 3), 3);
        // 19 of 20 in flight: the floor cannot open more than the one free slot.
        assert_eq!(retry_slots(20, 19.0, 0.25, 3), 1);
        assert_eq!(retry_slots(20, 20.0, 0.25, 3), 0);
    }

    #[test]
    fn bad_parameters_are_refused() {
        let mut p = params(0.2);
        p.primary = 21.0;
        assert!(matches!(analyze(&p), Err(ConcurrencyError::Primary { .. })));
        p.primary = f64::NAN;
        assert!(analyze(&p).is_err());
        let mut p = params(1.5);
        assert!(matches!(analyze(&p), Err(ConcurrencyError::FailureRate(_))));
        p.failure_rate = 0.2;
        p.max_retry_fraction = Some(-1.0);
        assert!(matches!(analyze(&p), Err(ConcurrencyError::Fraction(_))));
        p.max_retry_fraction = None;
        p.retries = MAX_RETRIES + 1;
        assert!(matches!(analyze(&p), Err(ConcurrencyError::Retries(_))));
    }

    #[test]
    fn every_failure_retried_forever_at_certain_failure() {
        let mut p = params(1.0);
        p.retries = 3;
        let r = analyze(&p).unwrap();
        assert!((r.retry_demand - 48.0).abs() < 1e-9, "{r:?}");
        assert!(
            (r.offered_in_flight_with_budget - 20.0).abs() < 1e-9,
            "{r:?}"
        );
    }
}
