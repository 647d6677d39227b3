//! The dead-letter index: how many messages wait in a dead-letter or parked queue, row by row,
//! kept in Redis beside the budgets (`<prefix>:v1:dead-letters:{<queue>}`, `lua/dead_letters.lua`).
//!
//! Why an index and not a look at the queue: a quorum queue cannot be read without being
//! written. A message read and not acked comes back with its delivery count raised (on RabbitMQ
//! 4.x, deleted at the 21st return); read and put back as a copy, it costs a publish and a
//! confirm each (about 1 ms: 40 s for 40,000 dead letters), and a look cut off half-way leaves
//! copies beside originals. So whatever puts a message into such a queue adds it to the index
//! once the broker confirmed it, whatever takes one out removes it, and a look reads the index
//! (one `HGETALL`) beside the queue's depth (one passive declare, exact).
//!
//! What a row is belongs to its writers (the broker crate's `fleet_budget_amqp::dead_letters`:
//! dependency, reason, error class, task, original exchange, replays, minute); here a row is an
//! opaque text of at most 2,048 bytes. The index is bounded: past [`DeadLetterIndex::max_rows`]
//! rows, new rows are counted on the row `[]` (beyond the bound), so hostile error classes cannot
//! grow it without bound.
//!
//! What it promises, and what it does not (`docs/semantics.md`, "Dead letters at scale"): a
//! count is changed after the broker confirmed the copy, so a writer that dies between the two,
//! or a Redis that does not answer, leaves the index short of the queue; the sum of the rows
//! beside the depth says when they disagree, and tools label what they show as an estimate.

use std::sync::Arc;

use crate::error::StoreError;
use crate::store::RedisStore;

/// Most (row, change) pairs in one call: a batch of a replay is at most this many rows.
const CHUNK: usize = DeadLetterIndex::BATCH_ROWS;

/// A queue's dead-letter index, in the Redis of a [`RedisStore`].
#[derive(Debug, Clone)]
pub struct DeadLetterIndex {
    store: Arc<RedisStore>,
    max_rows: u64,
}

/// A queue's index as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexRows {
    /// Each row and its count (rows at 0 are not kept), in the order Redis gave them.
    pub rows: Vec<(String, u64)>,
    /// Rows that are not this library's (not UTF-8, or a count that is not a positive
    /// integer: written by someone else), skipped.
    pub unreadable: u64,
}

impl IndexRows {
    /// The messages the index counts.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.rows.iter().map(|(_, n)| n).sum()
    }
}

impl DeadLetterIndex {
    /// The bound on rows by default.
    pub const DEFAULT_MAX_ROWS: u64 = 10_000;

    /// The most (row, change) pairs sent in one call.
    pub const BATCH_ROWS: usize = 500;

    /// The index kept in `store`'s Redis, under its key prefix.
    #[must_use]
    pub fn new(store: Arc<RedisStore>) -> Self {
        Self {
            store,
            max_rows: Self::DEFAULT_MAX_ROWS,
        }
    }

    /// With another bound on rows (1 to 100,000).
    #[must_use]
    pub fn with_max_rows(mut self, max_rows: u64) -> Self {
        self.max_rows = max_rows.clamp(1, 100_000);
        self
    }

    /// The bound on rows: past it, new rows are counted on the row `[]`.
    #[must_use]
    pub fn max_rows(&self) -> u64 {
        self.max_rows
    }

    /// The store the index is kept in.
    #[must_use]
    pub fn store(&self) -> &Arc<RedisStore> {
        &self.store
    }

    /// Applies `changes` (row, delta; a delta of 0 is left out) to `queue`'s index, in
    /// batches of 500 rows. Returns the change applied to each, in order: an increase whole,
    /// a decrease at most what the row (or the row beyond the bound) held.
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline, or the key is not an index; batches before
    /// the failing one are applied.
    pub async fn change(
        &self,
        queue: &str,
        changes: &[(String, i64)],
    ) -> Result<Vec<i64>, StoreError> {
        let mut applied = Vec::with_capacity(changes.len());
        let wanted: Vec<(String, i64)> = changes
            .iter()
            .filter(|(_, d)| *d != 0)
            .map(|(r, d)| (r.clone(), (*d).clamp(-1_000_000, 1_000_000)))
            .collect();
        for chunk in wanted.chunks(CHUNK) {
            applied.extend(
                self.store
                    .dead_letters_change(queue, self.max_rows, chunk)
                    .await?,
            );
        }
        Ok(applied)
    }

    /// Applies `changes` (row, delta; a delta of 0 is left out) to `queue`'s index as batch
    /// `seq` of writer `writer`, in one call: only if `seq` is above the last batch that writer
    /// applied to `queue` (kept 10 minutes after its last write, [`crate::keys::dead_letters_writer_key`]).
    /// So a batch whose answer was lost (a timeout) may be sent again without being counted
    /// twice, as long as the writer sends a queue's batches in the order of their numbers and a
    /// later one only once an earlier one is applied or given up. Returns `None` when the batch
    /// was applied before, else the change applied to each pair. Send at most
    /// [`DeadLetterIndex::BATCH_ROWS`] pairs.
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline (the batch may or may not be applied: send
    /// it again), or a key is not what it should be.
    pub async fn change_once(
        &self,
        queue: &str,
        writer: &str,
        seq: u64,
        changes: &[(String, i64)],
    ) -> Result<Option<Vec<i64>>, StoreError> {
        let wanted: Vec<(String, i64)> = changes
            .iter()
            .filter(|(_, d)| *d != 0)
            .map(|(r, d)| (r.clone(), (*d).clamp(-1_000_000, 1_000_000)))
            .collect();
        if wanted.is_empty() {
            return Ok(Some(Vec::new()));
        }
        self.store
            .dead_letters_change_once(queue, writer, seq, self.max_rows, &wanted)
            .await
    }

    /// `queue`'s index.
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline, the key is not a hash, or it holds more
    /// rows than twice the bound (written by someone else: not read whole).
    pub async fn read(&self, queue: &str) -> Result<IndexRows, StoreError> {
        let raw = self
            .store
            .dead_letters_read(queue, self.max_rows.saturating_mul(2))
            .await?
            .map_err(|rows| StoreError::BadReply {
                script: "dead_letters",
                detail: format!(
                    "the dead-letter index of {queue:?} holds {rows} rows, more than twice its bound of {}: not written by this library; delete the key and rebuild it with `budgetctl dlq reindex`",
                    self.max_rows
                ),
            })?;
        let mut out = IndexRows::default();
        for (row, count) in raw {
            let count = std::str::from_utf8(&count)
                .ok()
                .and_then(|c| c.parse::<u64>().ok())
                .filter(|c| *c > 0);
            match (String::from_utf8(row), count) {
                (Ok(row), Some(count)) => out.rows.push((row, count)),
                _ => out.unreadable += 1,
            }
        }
        Ok(out)
    }

    /// Lets `queue`'s index expire `secs` seconds from now (the dead-letter ledger's hours,
    /// `fleet_budget_amqp::dead_letters::ledger_queue`, are kept that long).
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub async fn expire(&self, queue: &str, secs: u64) -> Result<(), StoreError> {
        let key = crate::keys::dead_letters_key(self.store.prefix(), queue);
        let _: i64 = self
            .store
            // PEXPIRE: what the worker's ACL grants (`lua/README.md`).
            .query(
                redis::cmd("PEXPIRE")
                    .arg(key)
                    .arg(secs.clamp(1, u64::MAX / 1000) * 1000),
            )
            .await?;
        Ok(())
    }

    /// Deletes `queue`'s index (before a rebuild).
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub async fn clear(&self, queue: &str) -> Result<(), StoreError> {
        let key = crate::keys::dead_letters_key(self.store.prefix(), queue);
        let _: i64 = self.store.query(redis::cmd("DEL").arg(key)).await?;
        Ok(())
    }
}
