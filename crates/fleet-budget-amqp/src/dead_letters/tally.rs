//! A worker's counts of what it dead-letters and parks, sent to the index in batches.
//!
//! During a storm a fleet dead-letters thousands of jobs a second under a few rows (one
//! dependency, one reason, one error class, one minute): counting each with a call of its own
//! would cost Redis what the budget saves it. So each confirmed copy is counted here, in the
//! process, and [`Tally::flush`] sends the sums in one call per queue, every
//! [`Tally::EVERY`] and when the worker stops. A worker that dies loses at most what it counted
//! since the last flush: the index is then short of the queue, and every look says so
//! ([`super::QueueCounts::exact`]).
//!
//! A batch whose answer does not come (Redis passed the deadline under load, the connection
//! dropped) is sent again at the next flush: each is numbered for this process, and
//! `dead_letters.lua` applies a writer's batch once however many times it arrives
//! ([`DeadLetterIndex::change_once`]). Until it is applied, new counts wait in the process (one
//! row each, however many messages), so a Redis that stays away costs a bounded memory; a batch
//! is given up, counted in [`Tally::unrecorded`] and logged, after [`Tally::TRIES`] tries or at
//! the worker's stop.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fleet_budget::control::DeadLetterIndex;

use super::{Changes, Row};

/// Batches sent without an answer, oldest first, and the number of the next one.
#[derive(Debug, Default)]
struct Unsent {
    next: u64,
    batches: VecDeque<Batch>,
}

/// One call's worth of changes to one queue's index, numbered for this writer.
#[derive(Debug)]
struct Batch {
    queue: String,
    seq: u64,
    changes: Vec<(String, i64)>,
    tries: u32,
}

impl Batch {
    fn messages(&self) -> u64 {
        self.changes.iter().map(|(_, d)| d.unsigned_abs()).sum()
    }
}

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
    /// This process as a writer of the index: its batches are numbered under this name.
    writer: Arc<str>,
    pending: Arc<Mutex<Changes>>,
    /// Held through a flush: one flush at a time sends the batches, in order.
    unsent: Arc<tokio::sync::Mutex<Unsent>>,
    unrecorded: Arc<AtomicU64>,
    sent_again: Arc<AtomicU64>,
    /// The ledgers whose expiry this process has set: once per ledger (an hour's), not at every
    /// flush. Bounded: cleared past [`Tally::LEDGERS_REMEMBERED`].
    expiring: Arc<Mutex<HashSet<String>>>,
}

impl Tally {
    /// How often a running worker sends its counts.
    pub const EVERY: Duration = Duration::from_millis(250);

    /// How many times a batch is sent before it is given up (about 5 s of flushes, each try
    /// bounded by the store's deadline).
    pub const TRIES: u32 = 20;

    /// The most ledgers remembered as having their expiry set (a few hours of the topology's
    /// two queues).
    const LEDGERS_REMEMBERED: usize = 64;

    /// Counts kept for `index`.
    #[must_use]
    pub fn new(index: DeadLetterIndex) -> Self {
        Self {
            index,
            writer: format!("{}-{:016x}", std::process::id(), rand::random::<u64>()).into(),
            pending: Arc::default(),
            unsent: Arc::default(),
            unrecorded: Arc::default(),
            sent_again: Arc::default(),
            expiring: Arc::default(),
        }
    }

    /// With [`Tally::unrecorded`] and [`Tally::sent_again`] counted in `unrecorded` and
    /// `sent_again` (a worker's counts).
    #[must_use]
    pub fn counting_in(mut self, unrecorded: Arc<AtomicU64>, sent_again: Arc<AtomicU64>) -> Self {
        self.unrecorded = unrecorded;
        self.sent_again = sent_again;
        self
    }

    /// Counts one message as entering `queue` under `row` (a copy the broker confirmed there),
    /// in the queue's index and in its ledger for the hour ([`super::ledger_queue`]).
    pub fn entered(&self, queue: &str, row: &Row) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.add_row(queue, row, 1);
        pending.add_row(&super::ledger_queue(queue, row.minute / 60), row, 1);
    }

    /// Sends what was counted since the last flush (one call per queue and 500 rows), after the
    /// batches still unanswered, in order. A batch that failed for want of an answer is sent
    /// again at the next flush (the script applies it once), up to [`Tally::TRIES`] times; one
    /// Redis refused, or past its tries, is logged and counted in [`Tally::unrecorded`].
    pub async fn flush(&self) {
        let mut unsent = self.unsent.lock().await;
        if unsent.batches.is_empty() {
            // New counts are numbered only once the earlier batches are settled: a later batch
            // applied first would make an earlier one's retry look applied.
            let taken =
                std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
            for (queue, rows) in taken.by_queue {
                let changes: Vec<(String, i64)> =
                    rows.into_iter().filter(|(_, d)| *d != 0).collect();
                for chunk in changes.chunks(DeadLetterIndex::BATCH_ROWS) {
                    unsent.next += 1;
                    let seq = unsent.next;
                    unsent.batches.push_back(Batch {
                        queue: queue.clone(),
                        seq,
                        changes: chunk.to_vec(),
                        tries: 0,
                    });
                }
            }
        }
        let mut applied = Vec::new();
        while let Some(batch) = unsent.batches.front_mut() {
            if batch.tries > 0 {
                self.sent_again.fetch_add(1, Ordering::Relaxed);
            }
            batch.tries += 1;
            match self
                .index
                .change_once(&batch.queue, &self.writer, batch.seq, &batch.changes)
                .await
            {
                Ok(_) => {
                    applied.push(batch.queue.clone());
                    unsent.batches.pop_front();
                }
                Err(e)
                    if (e.is_timeout() || e.is_connection_error()) && batch.tries < Self::TRIES =>
                {
                    tracing::debug!(queue = %batch.queue, tries = batch.tries, error = %e, "dead-letter index batch unanswered; sent again at the next flush");
                    break;
                }
                Err(e) => {
                    let n = batch.messages();
                    if super::is_ledger_queue(&batch.queue) {
                        tracing::warn!(queue = %batch.queue, messages = n, tries = batch.tries, error = %e, "dead-letter ledger not updated; incident reports count fewer dead letters for this hour");
                    } else {
                        self.unrecorded.fetch_add(n, Ordering::Relaxed);
                        tracing::warn!(queue = %batch.queue, messages = n, tries = batch.tries, error = %e, "dead-letter index not updated; `budgetctl dlq stats` shows an estimate until `budgetctl dlq reindex`");
                    }
                    unsent.batches.pop_front();
                }
            }
        }
        drop(unsent);
        self.expire_ledgers(applied).await;
    }

    /// Flushes until nothing waits (at a worker's stop): the batches still unanswered are sent
    /// again a few times, 100 ms apart, then given up ([`Tally::unrecorded`]).
    pub async fn flush_last(&self) {
        for _ in 0..10 {
            self.flush().await;
            let settled = self.unsent.lock().await.batches.is_empty()
                && self
                    .pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .is_empty();
            if settled {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut unsent = self.unsent.lock().await;
        let mut left = Changes::default();
        std::mem::swap(
            &mut left,
            &mut self.pending.lock().unwrap_or_else(PoisonError::into_inner),
        );
        // What the index misses (the ledgers' copies of the same messages are not counted twice).
        let n: u64 = unsent
            .batches
            .drain(..)
            .filter(|b| !super::is_ledger_queue(&b.queue))
            .map(|b| b.messages())
            .sum::<u64>()
            + left
                .by_queue
                .iter()
                .filter(|(queue, _)| !super::is_ledger_queue(queue))
                .flat_map(|(_, rows)| rows.values())
                .map(|d| d.unsigned_abs())
                .sum::<u64>();
        if n > 0 {
            self.unrecorded.fetch_add(n, Ordering::Relaxed);
            tracing::warn!(
                messages = n,
                "dead-letter index not updated at the worker's stop (Redis did not answer); `budgetctl dlq stats` shows an estimate until `budgetctl dlq reindex`"
            );
        }
    }

    /// Sets the expiry of the ledgers among `queues` this process has not set yet.
    async fn expire_ledgers(&self, queues: Vec<String>) {
        let ledgers: Vec<String> = {
            let expiring = self.expiring.lock().unwrap_or_else(PoisonError::into_inner);
            let mut l: Vec<String> = queues
                .into_iter()
                .filter(|q| super::is_ledger_queue(q) && !expiring.contains(q))
                .collect();
            l.dedup();
            l
        };
        for ledger in ledgers {
            match self.index.expire(&ledger, super::LEDGER_KEEP_SECS).await {
                Ok(()) => {
                    let mut expiring = self.expiring.lock().unwrap_or_else(PoisonError::into_inner);
                    if expiring.len() >= Self::LEDGERS_REMEMBERED {
                        expiring.clear();
                    }
                    expiring.insert(ledger);
                }
                Err(e) => {
                    tracing::warn!(queue = %ledger, error = %e, "the dead-letter ledger's expiry was not set");
                }
            }
        }
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

    /// Batches sent again because the answer to an earlier try did not come (each applied once).
    #[must_use]
    pub fn sent_again(&self) -> u64 {
        self.sent_again.load(Ordering::Relaxed)
    }
}
