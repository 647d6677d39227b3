//! The simulated dependency of the drill: a service that serves a limited number of calls per
//! second, browns out to a fifth of that for a while, then recovers.

use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Capacity is enforced in slots of this length (capacity / 10 calls per 100 ms), so that a
/// burst at the start of a second cannot take the whole second's capacity.
const SLOT: Duration = Duration::from_millis(100);
const SLOTS_PER_SEC: u64 = 10;

/// When the dependency is degraded, relative to the start of a run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    /// Calls per second served when healthy.
    pub(crate) capacity: u64,
    /// Calls per second served while degraded (a fifth of `capacity` in the demo).
    pub(crate) degraded_capacity: u64,
    /// When the brownout starts.
    pub(crate) degraded_from: Duration,
    /// When it ends.
    pub(crate) degraded_until: Duration,
}

impl Schedule {
    /// The capacity in force `elapsed` after the start.
    pub(crate) fn capacity_at(&self, elapsed: Duration) -> u64 {
        if elapsed >= self.degraded_from && elapsed < self.degraded_until {
            self.degraded_capacity
        } else {
            self.capacity
        }
    }

    /// The phase name at `elapsed`.
    pub(crate) fn phase_at(&self, elapsed: Duration) -> &'static str {
        if elapsed < self.degraded_from {
            "healthy"
        } else if elapsed < self.degraded_until {
            "DEGRADED"
        } else {
            "recovered"
        }
    }
}

/// Why a call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallError {
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

/// The dependency. Counts every call, per second of the run.
#[derive(Debug)]
pub(crate) struct Upstream {
    started: Instant,
    schedule: Schedule,
    slot: Mutex<SlotState>,
    per_second: Mutex<Vec<u64>>,
    calls: AtomicU64,
}

impl Upstream {
    /// A dependency whose run starts now.
    pub(crate) fn new(schedule: Schedule) -> Self {
        Self {
            started: Instant::now(),
            schedule,
            slot: Mutex::new(SlotState::default()),
            per_second: Mutex::new(Vec::new()),
            calls: AtomicU64::new(0),
        }
    }

    /// Time since the start of the run.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The schedule.
    pub(crate) fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// One call: served if capacity remains in this 100 ms slot, else 503. `bad_input` jobs get
    /// a 400 whatever the load.
    pub(crate) async fn call(&self, bad_input: bool) -> Result<(), CallError> {
        let elapsed = self.elapsed();
        self.calls.fetch_add(1, Ordering::Relaxed);
        {
            let second = usize::try_from(elapsed.as_secs())
                .unwrap_or(usize::MAX)
                .min(100_000);
            let mut per_second = self
                .per_second
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if per_second.len() <= second {
                per_second.resize(second + 1, 0);
            }
            if let Some(c) = per_second.get_mut(second) {
                *c += 1;
            }
        }
        // A call costs a little time, as a real one would.
        tokio::time::sleep(Duration::from_millis(1)).await;
        if bad_input {
            return Err(CallError::BadInput);
        }
        let slot = u64::try_from(elapsed.as_millis() / SLOT.as_millis()).unwrap_or(u64::MAX);
        let per_slot = self.schedule.capacity_at(elapsed).div_ceil(SLOTS_PER_SEC);
        let mut state = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
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
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Calls in the last whole second (for progress).
    pub(crate) fn last_second(&self) -> u64 {
        let second = usize::try_from(self.elapsed().as_secs()).unwrap_or(0);
        let per_second = self
            .per_second
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        second
            .checked_sub(1)
            .and_then(|s| per_second.get(s).copied())
            .unwrap_or(0)
    }

    /// The busiest second's calls.
    pub(crate) fn peak_per_second(&self) -> u64 {
        let per_second = self
            .per_second
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        per_second.iter().copied().max().unwrap_or(0)
    }

    /// Calls per second of the run.
    pub(crate) fn per_second(&self) -> Vec<u64> {
        self.per_second
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
