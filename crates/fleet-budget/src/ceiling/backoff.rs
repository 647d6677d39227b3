//! Exponential backoff, and the jitter that spreads retries without shortening the schedule.
//!
//! # Why centred jitter
//!
//! Jitter exists so that jobs which failed together do not retry together. The usual choices,
//! for a nominal delay `n`:
//!
//! | jitter | delay | spread | mean |
//! |---|---|---|---|
//! | full | uniform in `[0, n]` | `n` | `n / 2` |
//! | equal | uniform in `[n/2, n]` | `n / 2` | `3n / 4` |
//! | decorrelated | uniform in `[base, 3 × previous]` | grows with the previous draw | not tied to `n` |
//! | **centred (this crate)** | uniform in `[3n/4, 5n/4]` | `n / 2` | `n` |
//!
//! Full and equal jitter shorten every delay on average (by a half, by a quarter), so a schedule
//! solved for a recovery window ends early; decorrelated jitter has no nominal schedule to plan
//! with at all. Centred jitter spreads a synchronised failure over the same width as equal
//! jitter (`n / 2`) but keeps the mean at the nominal delay, so the sum of `k` delays has the
//! nominal sum as its mean and its spread shrinks relative to it as `k` grows. The cap applies to
//! the nominal delay: a delay at the 10-minute cap is drawn from 7.5 to 12.5 minutes.

use std::time::Duration;

use rand::Rng;

/// The lowest jittered delay, as a fraction of the nominal.
pub const JITTER_LOW: f64 = 0.75;
/// The highest jittered delay, as a fraction of the nominal.
pub const JITTER_HIGH: f64 = 1.25;

/// Exponential backoff with centred jitter and a cap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay after the first failed attempt, before jitter.
    pub base: Duration,
    /// Growth per attempt (2 doubles the delay each time).
    pub factor: f64,
    /// No nominal delay exceeds this (jitter may stretch it by a quarter).
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(2),
            factor: 2.0,
            cap: Duration::from_secs(600),
        }
    }
}

impl Backoff {
    /// The delay after attempt `failed_attempt` (1 = the first execution) failed, before jitter:
    /// `min(cap, base × factor^(failed_attempt − 1))`.
    #[must_use]
    pub fn nominal(&self, failed_attempt: u32) -> Duration {
        let exponent = i32::try_from(failed_attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let secs = self.base.as_secs_f64() * self.factor.powi(exponent);
        let cap = self.cap.as_secs_f64();
        if secs.is_finite() && secs < cap {
            Duration::from_secs_f64(secs.max(0.0))
        } else {
            self.cap
        }
    }

    /// The range a jittered `nominal` delay is drawn from: `[3n/4, 5n/4]`.
    #[must_use]
    pub fn jitter_bounds(nominal: Duration) -> (Duration, Duration) {
        (nominal.mul_f64(JITTER_LOW), nominal.mul_f64(JITTER_HIGH))
    }

    /// `nominal` with centred jitter: uniform in `[3n/4, 5n/4]`, mean `n`.
    pub fn jitter<R: Rng + ?Sized>(nominal: Duration, rng: &mut R) -> Duration {
        let spread = JITTER_HIGH - JITTER_LOW;
        nominal.mul_f64(JITTER_LOW + spread * rng.random::<f64>())
    }

    /// The delay to wait after attempt `failed_attempt` failed: the nominal delay with centred
    /// jitter. A `Retry-After` from the dependency is a lower bound.
    pub fn delay<R: Rng + ?Sized>(
        &self,
        failed_attempt: u32,
        retry_after: Option<Duration>,
        rng: &mut R,
    ) -> Duration {
        let jittered = Self::jitter(self.nominal(failed_attempt), rng);
        match retry_after {
            Some(floor) if floor > jittered => floor,
            _ => jittered,
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let b = Backoff::default();
        assert_eq!(b.nominal(1), Duration::from_secs(2));
        assert_eq!(b.nominal(4), Duration::from_secs(16));
        assert_eq!(b.nominal(20), Duration::from_secs(600));
        assert_eq!(b.nominal(u32::MAX), Duration::from_secs(600));
        let huge = Backoff {
            factor: f64::MAX,
            ..b
        };
        assert_eq!(huge.nominal(3), Duration::from_secs(600));
    }

    #[test]
    fn jitter_stays_within_its_bounds_and_keeps_the_nominal_on_average() {
        let b = Backoff::default();
        let mut rng = SmallRng::seed_from_u64(7);
        for attempt in 1..15 {
            let nominal = b.nominal(attempt);
            let (low, high) = Backoff::jitter_bounds(nominal);
            let mut sum = Duration::ZERO;
            let draws = 4000;
            for _ in 0..draws {
                let d = b.delay(attempt, None, &mut rng);
                assert!(d >= low && d <= high, "{attempt}: {d:?}");
                sum += d;
            }
            // The mean of 4,000 uniform draws is within 2% of the centre (its standard error is
            // 0.2% of the nominal); equal jitter would be 25% short.
            let mean = sum.as_secs_f64() / f64::from(draws);
            let ratio = mean / nominal.as_secs_f64();
            assert!(
                (0.98..1.02).contains(&ratio),
                "{attempt}: mean/nominal {ratio}"
            );
        }
    }

    #[test]
    fn retry_after_is_a_lower_bound() {
        let b = Backoff::default();
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(
            b.delay(1, Some(Duration::from_secs(30)), &mut rng),
            Duration::from_secs(30)
        );
        let d = b.delay(5, Some(Duration::from_millis(1)), &mut rng);
        assert!(d >= Duration::from_secs(24));
    }
}
