//! What a replay reports: where it stands while it runs ([`ReplayProgress`], to the progress
//! callback, the copies' accounting and the pauses) and how it ended ([`ReplayReport`]). Apart
//! from the run's loop, which fills them, so that the parts of a run count without importing
//! the loop.

use std::time::Duration;

use super::control::{HoldReason, SlowReason};

/// Where a replay stands; passed to the progress callback after every message, on holds and
/// when the rate changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayProgress {
    /// Messages in the dead-letter queue when the run started (the bound).
    pub total: u64,
    /// Messages read so far.
    pub seen: u64,
    /// Counts so far (see [`ReplayReport`]).
    pub moved: u64,
    /// Parked so far.
    pub parked: u64,
    /// Skipped so far.
    pub skipped: u64,
    /// Failed so far.
    pub failed: u64,
    /// The dependency the run is waiting for, while held (its budget exhausted, or its breaker
    /// open: `held` says which).
    pub paused_on: Option<String>,
    /// Why the run is waiting, while held.
    pub held: Option<Held>,
    /// The rate moves go at now (messages per second; `None`: unpaced, or nothing decided
    /// yet).
    pub rate: Option<Rate>,
    /// What holds `rate` below the configured maximum, if anything.
    pub slowed: Option<SlowReason>,
    /// Times the rate was cut after failures or denials rose.
    pub slowdowns: u64,
}

/// A held run: which dependency, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The dependency whose moves wait.
    pub dependency: String,
    /// Why.
    pub reason: HoldReason,
}

/// A rate in messages per second: always finite and above 0 (so it compares, and a report
/// holding one can be `Eq`).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Rate(f64);

impl Eq for Rate {}

impl Rate {
    /// `per_sec` if it is finite and above 0.
    #[must_use]
    pub fn new(per_sec: f64) -> Option<Self> {
        (per_sec.is_finite() && per_sec > 0.0).then_some(Self(per_sec))
    }

    /// Messages per second.
    #[must_use]
    pub fn per_sec(self) -> f64 {
        self.0
    }
}

/// The outcome of a replay. `matched = moved + parked_looping + failed`;
/// `seen = moved + parked + skipped + failed`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Messages in the dead-letter queue at the start.
    pub total: u64,
    /// Messages read.
    pub seen: u64,
    /// Messages that matched the filter.
    pub matched: u64,
    /// Republished to their original exchange and acked.
    pub moved: u64,
    /// Moved to the parked queue (looping or malformed).
    pub parked: u64,
    /// Of which malformed.
    pub malformed: u64,
    /// Not matching the filter; left in the dead-letter queue.
    pub skipped: u64,
    /// Copy not confirmed; left in the dead-letter queue.
    pub failed: u64,
    /// Time spent paused on exhausted budgets.
    pub paused: Duration,
    /// Time spent held while a dependency's breaker was open.
    pub held_breaker: Duration,
    /// Times the rate was cut after failures or denials rose.
    pub slowdowns: u64,
    /// The lowest rate moves went at (`None`: unpaced throughout, or nothing moved).
    pub lowest_rate: Option<Rate>,
    /// The run was cancelled ([`super::ReplayHandle::cancel`]): it stopped reading, and what it
    /// had not moved stays in the queue.
    pub cancelled: bool,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Of the messages the run left in the source queue (`total` less `moved` and `parked`),
    /// how many the broker did not count ready yet when the run returned: it waits for them up
    /// to `idle_timeout` (see the `end` module). 0 unless another consumer reads the queue or the
    /// broker is slow; meanwhile the queue's depth reads that much short.
    pub not_ready: u64,
}
