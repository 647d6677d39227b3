//! [`ConcurrencyPolicy`]: a dependency's cap, its retry share and the lease length.

use std::time::Duration;

/// The longest lease a script accepts (one day).
pub const MAX_LEASE: Duration = Duration::from_secs(86_400);

/// A dependency's concurrency budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConcurrencyPolicy {
    /// Calls in flight the dependency accepts, primary and retry together.
    pub cap: u64,
    /// Retry slots per primary call in flight.
    pub max_retry_fraction: f64,
    /// Retry slots allowed however few primary calls are in flight.
    pub min_retry_slots: u64,
    /// How long a slot is held when its holder never gives it back: longer than the call's own
    /// timeout, so a live call never loses its slot.
    pub lease: Duration,
    /// Whether a primary call is refused at the cap (the caller waits or sheds it) instead of
    /// only being counted.
    pub primary_waits: bool,
    /// How long a primary call refused at the cap may wait in all before it is dead-lettered
    /// `concurrency_cap` (with `primary_waits`): a wait is never unbounded.
    pub max_wait: Duration,
}

/// A policy the scripts cannot take.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConcurrencyPolicyError {
    /// The cap is 0 or above 10^9.
    #[error("the concurrency cap must be from 1 to 10^9, not {0}")]
    Cap(u64),
    /// The planned primary calls in flight are 0 or above the cap.
    #[error("planned primary calls in flight must be from 1 to the cap ({cap}), not {planned}")]
    Planned {
        /// The cap.
        cap: u64,
        /// The planned primary calls.
        planned: u64,
    },
    /// The fraction is not a number from 0 to 1000.
    #[error("max_retry_fraction must be a number from 0 to 1000, not {0}")]
    Fraction(f64),
    /// The floor is above 10^9.
    #[error("min_retry_slots must be at most 10^9, not {0}")]
    MinSlots(u64),
    /// The lease is shorter than 1 ms or longer than a day.
    #[error("the lease must be from 1 ms to 1 day, not {0:?}")]
    Lease(Duration),
    /// The longest wait of a primary is longer than a day.
    #[error("max_wait must be at most 1 day, not {0:?}")]
    MaxWait(Duration),
}

impl ConcurrencyPolicy {
    /// The budget of a dependency with `cap` slots sized for `planned_primary` primary calls in
    /// flight: the retry share is `(cap − planned_primary) / planned_primary`. Leases last 30 s;
    /// primaries are counted, never refused.
    ///
    /// # Errors
    /// A cap or a planned load out of range.
    pub fn derived(
        cap: u64,
        planned_primary: u64,
        min_retry_slots: u64,
    ) -> Result<Self, ConcurrencyPolicyError> {
        if planned_primary == 0 || planned_primary > cap {
            return Err(ConcurrencyPolicyError::Planned {
                cap,
                planned: planned_primary,
            });
        }
        #[allow(clippy::cast_precision_loss)] // both at most 10^9 (checked below)
        let fraction = (cap - planned_primary) as f64 / planned_primary as f64;
        Self {
            cap,
            max_retry_fraction: fraction,
            min_retry_slots,
            lease: Duration::from_secs(30),
            primary_waits: false,
            max_wait: Duration::from_secs(600),
        }
        .checked()
    }

    /// The policy if the scripts take it.
    ///
    /// # Errors
    /// The first field out of range.
    pub fn checked(self) -> Result<Self, ConcurrencyPolicyError> {
        if self.cap == 0 || self.cap > 1_000_000_000 {
            return Err(ConcurrencyPolicyError::Cap(self.cap));
        }
        if !(self.max_retry_fraction.is_finite()
            && (0.0..=1000.0).contains(&self.max_retry_fraction))
        {
            return Err(ConcurrencyPolicyError::Fraction(self.max_retry_fraction));
        }
        if self.min_retry_slots > 1_000_000_000 {
            return Err(ConcurrencyPolicyError::MinSlots(self.min_retry_slots));
        }
        if self.lease < Duration::from_millis(1) || self.lease > MAX_LEASE {
            return Err(ConcurrencyPolicyError::Lease(self.lease));
        }
        if self.max_wait > MAX_LEASE {
            return Err(ConcurrencyPolicyError::MaxWait(self.max_wait));
        }
        Ok(self)
    }

    /// Retry slots with `primaries` in flight, as the script counts them.
    #[must_use]
    pub fn retry_slots(&self, primaries: u64) -> u64 {
        #[allow(clippy::cast_precision_loss)]
        let share = (self.max_retry_fraction * primaries as f64).floor();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // finite, >= 0
        let share = share.min(1e15) as u64;
        share.max(self.min_retry_slots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_is_derived_from_the_plan() {
        let p = ConcurrencyPolicy::derived(20, 16, 3).unwrap();
        assert!((p.max_retry_fraction - 0.25).abs() < 1e-12);
        assert_eq!(p.retry_slots(16), 4);
        assert_eq!(p.retry_slots(2), 3);
        assert!(ConcurrencyPolicy::derived(20, 21, 3).is_err());
        assert!(ConcurrencyPolicy::derived(20, 0, 3).is_err());
        let mut bad = p;
        bad.lease = Duration::ZERO;
        assert!(bad.checked().is_err());
        bad = p;
        bad.max_retry_fraction = f64::NAN;
        assert!(bad.checked().is_err());
    }
}
