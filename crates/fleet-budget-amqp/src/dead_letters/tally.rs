//! A worker's counts of what it dead-letters and parks, sent to the index in batches.
//!
//! During a storm a fleet dead-letters thousands of jobs a second under a few rows (one
//! dependency, one reason, one error class, one minute): counting each with a call of its own
//! would cost Redis what the budget saves it. So each confirmed copy is counted here, in the
//! process, and [`Tally::flush`] sends the sums in one call per queue, every
//! [`Tally::EVERY`] and when the worker stops. A worker that dies loses at most what it counted
//! since the last flush: the index is then short of the queue, and every look says so
//! ([`super::QueueCounts::exact`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fleet_budget::control::DeadLetterIndex;

use super::{Changes, Row};

/// The task of [`Tally::flush_every`].
#[derive(Debug)]
pub struct Flusher {
    stop: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Flusher {
    /// Stops the task once a flush under way (if any) has ended.
    pub async fn stop(self) {
        self.stop.notify_one();
        let _ = self.task.await;
    }
}

/// Counts waiting for the index, shared by a worker's deliveries.
#[derive(Debug, Clone)]
pub struct Tally {
    index: DeadLetterIndex,
    pending: Arc<Mutex<Changes>>,
    unrecorded: Arc<AtomicU64>,
}

impl Tally {
    /// How often a running worker sends its counts.
    pub const EVERY: Duration = Duration::from_millis(250);

    /// Counts kept for `index`.
    #[must_use]
    pub fn new(index: DeadLetterIndex) -> Self {
        Self {
            index,
            pending: Arc::default(),
            unrecorded: Arc::default(),
        }
    }

    /// Counts one message as entering `queue` under `row` (a copy the broker confirmed there).
    pub fn entered(&self, queue: &str, row: &Row) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add_row(queue, row, 1);
    }

    /// Sends what was counted since the last flush (one call per queue). A failure is logged
    /// and counted in [`Tally::unrecorded`], never sent again (a retry after a timeout could
    /// count twice).
    pub async fn flush(&self) {
        let mut batch =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
        if batch.is_empty() {
            return;
        }
        batch.apply(Some(&self.index)).await;
        self.unrecorded
            .fetch_add(batch.unrecorded, Ordering::Relaxed);
    }

    /// Flushes every [`Tally::EVERY`] until the returned [`Flusher`] is stopped (which waits
    /// for a flush under way: a flush cut off would lose the counts it took).
    #[must_use]
    pub fn flush_every(&self) -> Flusher {
        let tally = self.clone();
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Self::EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => tally.flush().await,
                    () = stopped.notified() => break,
                }
            }
        });
        Flusher { stop, task }
    }

    /// Messages whose count could not be sent (Redis failed): the index is short by this many.
    #[must_use]
    pub fn unrecorded(&self) -> u64 {
        self.unrecorded.load(Ordering::Relaxed)
    }
}
