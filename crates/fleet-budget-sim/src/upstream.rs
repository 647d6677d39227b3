//! A dependency that serves a limited number of calls per second, browns out to less for a
//! while, then recovers: the simulated service of the incident drill.
//!
//! It is handed the time of each call (since the start of the run) instead of reading a clock,
//! so a test can walk it through a brownout in microseconds, and a drill can run it on real time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Capacity is enforced in slots of this length (capacity / 10 calls per 100 ms), so that a
/// burst at the start of a second cannot take the whole second's capacity.
const SLOT: Duration = Duration::from_millis(100);
const SLOTS_PER_SEC: u64 = 10;

/// Calls are counted per second for this many seconds of a run at most (about 28 hours); later
/// calls count in the last second.
const MAX_SECONDS: usize = 100_000;

/// When the dependency is degraded, relative to the start of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Calls per second served when healthy.
    pub capacity: u64,
    /// Calls per second served while degraded.
    pub degraded_capacity: u64,
    /// When the brownout starts.
    pub degraded_from: Duration,
    /// When it ends.
    pub degraded_until: Duration,
}

/// Where a run is in its schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before the brownout.
    Healthy,
    /// During the brownout.
    Degraded,
    /// After it.
    Recovered,
}

impl Phase {
    /// The phase's name as the drill prints it (`DEGRADED` stands out).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "DEGRADED",
            Self::Recovered => "recovered",
        }
    }
}

impl Schedule {
    /// The phase at `elapsed` since the start.
    #[must_use]
    pub fn phase_at(&self, elapsed: Duration) -> Phase {
        if elapsed < self.degraded_from {
            Phase::Healthy
        } else if elapsed < self.degraded_until {
            Phase::Degraded
        } else {
            Phase::Recovered
        }
    }

    /// The capacity in force `elapsed` after the start, in calls per second.
    #[must_use]
    pub fn capacity_at(&self, elapsed: Duration) -> u64 {
        match self.phase_at(elapsed) {
            Phase::Degraded => self.degraded_capacity,
            Phase::Healthy | Phase::Recovered => self.capacity,
        }
    }
}

/// Why a call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// Over capacity: the dependency answered 503 (retryable).
    Overloaded,
    /// The job's input is bad: the dependency answered 400 (not retryable).
    BadInput,
}

#[derive(Debug, Default)]
struct SlotState {
    slot: u64,
    served: u64,
}

/// The dependency. Counts every call, per second of the run. Shared by concurrent workers.
#[derive(Debug)]
pub struct Upstream {
    schedule: Schedule,
    slot: Mutex<SlotState>,
    per_second: Mutex<Vec<u64>>,
    calls: AtomicU64,
}

impl Upstream {
    /// A dependency following `schedule`.
    #[must_use]
    pub fn new(schedule: Schedule) -> Self {
        Self {
            schedule,
            slot: Mutex::new(SlotState::default()),
            per_second: Mutex::new(Vec::new()),
            calls: AtomicU64::new(0),
        }
    }

    /// The schedule.
    #[must_use]
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// One call made `at` after the start: served if capacity remains in its 100 ms slot, else
    /// [`CallError::Overloaded`]. `bad_input` jobs get [`CallError::BadInput`] whatever the load.
    ///
    /// # Errors
    /// How the dependency answered when it did not serve the call.
    pub fn call(&self, at: Duration, bad_input: bool) -> Result<(), CallError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        {
            let second = second_of(at);
            let mut per_second = lock(&self.per_second);
            if per_second.len() <= second {
                per_second.resize(second + 1, 0);
            }
            if let Some(c) = per_second.get_mut(second) {
                *c += 1;
            }
        }
        if bad_input {
            return Err(CallError::BadInput);
        }
        let slot = u64::try_from(at.as_millis() / SLOT.as_millis()).unwrap_or(u64::MAX);
        let per_slot = self.schedule.capacity_at(at).div_ceil(SLOTS_PER_SEC);
        let mut state = lock(&self.slot);
        if state.slot != slot {
            *state = SlotState { slot, served: 0 };
        }
        if state.served < per_slot {
            state.served += 1;
            Ok(())
        } else {
            Err(CallError::Overloaded)
        }
    }

    /// Calls so far.
    #[must_use]
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Calls in the last whole second before `now` (for progress).
    #[must_use]
    pub fn last_second(&self, now: Duration) -> u64 {
        let per_second = lock(&self.per_second);
        second_of(now)
            .checked_sub(1)
            .and_then(|s| per_second.get(s).copied())
            .unwrap_or(0)
    }

    /// The busiest second's calls.
    #[must_use]
    pub fn peak_per_second(&self) -> u64 {
        lock(&self.per_second).iter().copied().max().unwrap_or(0)
    }

    /// Calls in each second of the run so far.
    #[must_use]
    pub fn per_second(&self) -> Vec<u64> {
        lock(&self.per_second).clone()
    }
}

fn second_of(at: Duration) -> usize {
    usize::try_from(at.as_secs())
        .unwrap_or(usize::MAX)
        .min(MAX_SECONDS)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule() -> Schedule {
        Schedule {
            capacity: 100,
            degraded_capacity: 20,
            degraded_from: Duration::from_secs(1),
            degraded_until: Duration::from_secs(2),
        }
    }

    fn served_in_slot(u: &Upstream, at: Duration) -> usize {
        (0..50).filter(|_| u.call(at, false).is_ok()).count()
    }

    #[test]
    fn capacity_is_enforced_per_slot_and_drops_while_degraded() {
        let u = Upstream::new(schedule());
        assert_eq!(served_in_slot(&u, Duration::from_millis(50)), 10);
        assert_eq!(served_in_slot(&u, Duration::from_millis(150)), 10);
        assert_eq!(served_in_slot(&u, Duration::from_millis(1050)), 2);
        assert_eq!(served_in_slot(&u, Duration::from_millis(2050)), 10);
        assert_eq!(
            u.call(Duration::from_millis(2950), true),
            Err(CallError::BadInput)
        );
        assert_eq!(u.calls(), 201);
        assert_eq!(u.per_second(), [100, 50, 51]);
        assert_eq!(u.peak_per_second(), 100);
        assert_eq!(u.last_second(Duration::from_millis(2500)), 50);
        assert_eq!(u.last_second(Duration::from_millis(500)), 0);
    }

    #[test]
    fn phases_follow_the_schedule() {
        let s = schedule();
        let at = |ms| s.phase_at(Duration::from_millis(ms)).as_str();
        assert_eq!(
            [at(999), at(1000), at(1999), at(2000)],
            ["healthy", "DEGRADED", "DEGRADED", "recovered"]
        );
        assert_eq!(s.capacity_at(Duration::from_millis(1500)), 20);
    }

    #[test]
    fn a_call_far_in_the_future_is_counted_in_the_last_second_kept() {
        let u = Upstream::new(schedule());
        let _ = u.call(Duration::from_secs(u64::MAX / 2), false);
        assert_eq!(u.per_second().len(), MAX_SECONDS + 1);
    }
}
