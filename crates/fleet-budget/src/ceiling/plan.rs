//! Planning: the schedule a ceiling gives, attempt by attempt, before any job runs.
//! `budgetctl plan` prints it; [`super::Backoff::attempts_for_recovery_window`] counts it.

use std::time::Duration;

use super::backoff::Backoff;
use super::window::{MAX_ATTEMPTS, delay_within_window};

/// The recovery windows of the guide's table (1 min, 5 min, 15 min, 1 h, 4 h).
pub const GUIDE_WINDOWS: [Duration; 5] = [
    Duration::from_secs(60),
    Duration::from_secs(300),
    Duration::from_secs(900),
    Duration::from_secs(3600),
    Duration::from_secs(4 * 3600),
];

/// One execution of a planned schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlannedAttempt {
    /// 1 = the first execution.
    pub attempt: u32,
    /// The delay before it (zero for the first), as planned: nominal, or adjusted to the window.
    pub delay: Duration,
    /// The range jitter draws that delay from before the window adjusts it (`[3n/4, 5n/4]` of
    /// the nominal); zero for the first.
    pub jitter: (Duration, Duration),
    /// When it runs, after the first failure (the first execution counts as time zero).
    pub at: Duration,
}

/// The schedule of a ceiling without jitter: every execution, and when it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// The recovery window, for a ceiling by time.
    pub window: Option<Duration>,
    /// The executions, the first at time zero.
    pub attempts: Vec<PlannedAttempt>,
}

impl Schedule {
    /// The schedule of a task that retries until `window` after its first failure has passed.
    #[must_use]
    pub fn for_window(backoff: &Backoff, window: Duration) -> Self {
        Self::build(backoff, Some(window), MAX_ATTEMPTS)
    }

    /// The schedule of a task with `max_attempts` executions.
    #[must_use]
    pub fn for_attempts(backoff: &Backoff, max_attempts: u32) -> Self {
        Self::build(backoff, None, max_attempts.clamp(1, MAX_ATTEMPTS))
    }

    fn build(backoff: &Backoff, window: Option<Duration>, max_attempts: u32) -> Self {
        let first = PlannedAttempt {
            attempt: 1,
            delay: Duration::ZERO,
            jitter: (Duration::ZERO, Duration::ZERO),
            at: Duration::ZERO,
        };
        let mut attempts = vec![first];
        let mut at = Duration::ZERO;
        for failed in 1..max_attempts {
            let nominal = backoff.nominal(failed);
            let delay = match window {
                None => nominal,
                Some(w) => match delay_within_window(backoff, failed, at, w, nominal) {
                    Some(d) => d,
                    None => break,
                },
            };
            at = at.saturating_add(delay);
            attempts.push(PlannedAttempt {
                attempt: failed + 1,
                delay,
                jitter: Backoff::jitter_bounds(nominal),
                at,
            });
        }
        Self { window, attempts }
    }

    /// How many executions (the first included).
    #[must_use]
    pub fn max_attempts(&self) -> u32 {
        u32::try_from(self.attempts.len()).unwrap_or(MAX_ATTEMPTS)
    }

    /// When the last execution runs after the first (for a ceiling by time, the window unless
    /// the attempts ran out first).
    #[must_use]
    pub fn span(&self) -> Duration {
        self.attempts.last().map_or(Duration::ZERO, |a| a.at)
    }

    /// The earliest and latest the last execution can run with every delay jittered to one end
    /// of its range. For a ceiling by time both are the window (the last delay is adjusted to
    /// it); for a ceiling by count they are ¾ and 5⁄4 of the nominal span.
    #[must_use]
    pub fn span_bounds(&self) -> (Duration, Duration) {
        if let Some(w) = self.window
            && self.span() >= w
        {
            return (w, w);
        }
        let low = self.attempts.iter().map(|a| a.jitter.0).sum();
        let high = self.attempts.iter().map(|a| a.jitter.1).sum();
        (low, high)
    }
}

impl Backoff {
    /// The executions a task whose retries end `recovery` after its first failure runs without
    /// jitter: the length of [`Schedule::for_window`]. `n` executions have `n − 1` delays
    /// between them, and the last one runs when the window ends.
    ///
    /// With base 2 s, factor 2 and cap 600 s: 15 s → 4, 60 s → 6, 900 s → 10, 4 h → 32.
    /// Returns at least 1, at most 1000.
    #[must_use]
    pub fn attempts_for_recovery_window(&self, recovery: Duration) -> u32 {
        Schedule::for_window(self, recovery).max_attempts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn times(s: &Schedule) -> Vec<u64> {
        s.attempts.iter().map(|a| a.at.as_secs()).collect()
    }

    #[test]
    fn windows_of_the_issue_end_at_the_window() {
        let b = Backoff::default();
        assert_eq!(times(&Schedule::for_window(&b, secs(15))), [0, 2, 6, 15]);
        assert_eq!(
            times(&Schedule::for_window(&b, secs(40))),
            [0, 2, 6, 14, 40]
        );
        assert_eq!(
            times(&Schedule::for_window(&b, secs(60))),
            [0, 2, 6, 14, 30, 60]
        );
        for w in [1, 15, 40, 60, 300, 900, 3600, 4 * 3600] {
            let s = Schedule::for_window(&b, secs(w));
            assert_eq!(s.span(), secs(w), "{w}");
            assert_eq!(s.span_bounds(), (secs(w), secs(w)));
        }
    }

    #[test]
    fn recovery_window_reference_points() {
        let b = Backoff::default();
        assert_eq!(b.attempts_for_recovery_window(secs(15)), 4);
        assert_eq!(b.attempts_for_recovery_window(secs(40)), 5);
        assert_eq!(b.attempts_for_recovery_window(secs(60)), 6);
        assert_eq!(b.attempts_for_recovery_window(secs(300)), 8);
        assert_eq!(b.attempts_for_recovery_window(secs(900)), 10);
        assert_eq!(b.attempts_for_recovery_window(secs(3600)), 14);
        assert_eq!(b.attempts_for_recovery_window(secs(4 * 3600)), 32);
        assert_eq!(b.attempts_for_recovery_window(Duration::ZERO), 1);
    }

    #[test]
    fn a_count_schedule_has_count_minus_one_delays() {
        let b = Backoff::default();
        let s = Schedule::for_attempts(&b, 5);
        assert_eq!(times(&s), [0, 2, 6, 14, 30]);
        assert_eq!(
            s.span_bounds(),
            (secs(30).mul_f64(0.75), secs(30).mul_f64(1.25))
        );
        assert_eq!(Schedule::for_attempts(&b, 0).max_attempts(), 1);
        assert_eq!(
            Schedule::for_attempts(&b, u32::MAX).max_attempts(),
            MAX_ATTEMPTS
        );
    }

    #[test]
    fn a_zero_backoff_still_ends() {
        let zero = Backoff {
            base: Duration::ZERO,
            ..Backoff::default()
        };
        assert_eq!(zero.attempts_for_recovery_window(secs(60)), MAX_ATTEMPTS);
    }
}
