//! What a replay reports: where it stands while it runs ([`ReplayProgress`], to the progress
//! callback, the copies' accounting and the pauses) and how it ended ([`ReplayReport`]). Apart
//! from the run's loop, which fills them, so that the parts of a run count without importing
//! the loop.

use std::time::Duration;

/// Where a replay stands; passed to the progress callback after every message and on pauses.
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
    /// The dependency whose exhausted budget the run is waiting for, while paused.
    pub paused_on: Option<String>,
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
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Of the messages the run left in the source queue (`total` less `moved` and `parked`),
    /// how many the broker did not count ready yet when the run returned: it waits for them up
    /// to `idle_timeout` (see the `end` module). 0 unless another consumer reads the queue or the
    /// broker is slow; meanwhile the queue's depth reads that much short.
    pub not_ready: u64,
}
