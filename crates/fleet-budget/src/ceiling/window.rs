//! Ceilings by time: a task with a recovery window retries until the window since its first
//! failure has passed, and its last attempt runs when the window ends.
//!
//! Each delay is the backoff's (jittered) delay, with two adjustments near the end of the window,
//! both pure functions of the time since the first failure:
//!
//! * a delay that would end past the window is shortened to end at it, so the last attempt runs
//!   at the window's end and its failure dead-letters the job there (not one long delay later);
//! * a delay that would leave less than half of the next nominal delay before the window ends
//!   is lengthened to end at the window instead, so the schedule does not end with a short,
//!   wasted gap (15 s, base 2 s: attempts at 0, 2, 6, 15 rather than 0, 2, 6, 14, 15).
//!
//! A failure at or after the window's end is final (`attempts_exhausted`).

use std::time::Duration;

use super::backoff::Backoff;

/// No task runs more executions than this, whatever its ceiling (the largest `max_attempts` the
/// configuration accepts): a window task with a tiny backoff still stops.
pub const MAX_ATTEMPTS: u32 = 1000;

/// The delay after attempt `failed_attempt` failed `elapsed` after the job's first failure,
/// when the job's retries end `window` after that failure; `drawn` is the backoff's jittered
/// delay. `None` when the window has passed (the failure is final).
#[must_use]
pub fn delay_within_window(
    backoff: &Backoff,
    failed_attempt: u32,
    elapsed: Duration,
    window: Duration,
    drawn: Duration,
) -> Option<Duration> {
    let remaining = window.checked_sub(elapsed).filter(|r| !r.is_zero())?;
    if drawn >= remaining {
        return Some(remaining);
    }
    let next = backoff.nominal(failed_attempt.saturating_add(1));
    if remaining - drawn < next / 2 {
        Some(remaining)
    } else {
        Some(drawn)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_last_delay_ends_at_the_window() {
        let b = Backoff::default();
        // Well inside the window: the drawn delay.
        assert_eq!(
            delay_within_window(&b, 1, secs(0), secs(60), secs(2)),
            Some(secs(2))
        );
        // Past the window's end: shortened to end at it.
        assert_eq!(
            delay_within_window(&b, 5, secs(30), secs(60), secs(32)),
            Some(secs(30))
        );
        // Would leave 1 s, less than half of the next 16 s: lengthened to the window's end.
        assert_eq!(
            delay_within_window(&b, 3, secs(6), secs(15), secs(8)),
            Some(secs(9))
        );
        // The window has passed, or ends now: final.
        assert_eq!(
            delay_within_window(&b, 4, secs(15), secs(15), secs(16)),
            None
        );
        assert_eq!(
            delay_within_window(&b, 4, secs(99), secs(15), secs(16)),
            None
        );
    }

    proptest! {
        /// Whatever the draw, a delay never ends past the window, and the window's end is
        /// always reached: the delay is the draw, or ends exactly at the window.
        #[test]
        fn delays_never_end_past_the_window(
            attempt in 1u32..40,
            elapsed_ms in 0u64..100_000,
            window_ms in 1u64..100_000,
            drawn_ms in 0u64..200_000,
        ) {
            let b = Backoff::default();
            let (elapsed, window, drawn) = (
                Duration::from_millis(elapsed_ms),
                Duration::from_millis(window_ms),
                Duration::from_millis(drawn_ms),
            );
            match delay_within_window(&b, attempt, elapsed, window, drawn) {
                None => prop_assert!(elapsed >= window),
                Some(d) => {
                    prop_assert!(elapsed < window);
                    prop_assert!(elapsed + d <= window);
                    prop_assert!(d == drawn || elapsed + d == window);
                    prop_assert!(d >= drawn.min(window - elapsed));
                }
            }
        }
    }
}
