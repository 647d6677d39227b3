//! What waits in the dead-letter and parked queues, counted without reading them.
//!
//! A quorum queue cannot be read without being written (`docs/semantics.md`, "Looking is not
//! consuming"): at 40,000 dead letters a look that reads each message and puts it back as a copy
//! took 40 s, and one cut off half-way left copies beside originals. So every copy this crate puts
//! into one of those queues is counted in the fleet store's dead-letter index
//! ([`fleet_budget::control::DeadLetterIndex`]) once the broker confirmed it, and every message it
//! takes out is counted out once acked; a look is then a passive declare (the depth, exact) and
//! one read of the index (the breakdown), a few milliseconds at any depth.
//!
//! How the parts fit: [`Row`] is what a message is counted under (this file: dependency, reason,
//! error class, task, original exchange, replays, the minute it was dead-lettered), read from its
//! headers the same way when it enters and when it leaves; [`counts`] reads a queue's depth and
//! index into [`QueueCounts`], which says whether the two agree (exact) or by how much they differ
//! (an estimate, and why); [`Changes`] gathers the counts of a batch of moves for one call, and
//! [`Tally`] a worker's, sent every 250 ms.

use std::collections::BTreeMap;

use fleet_budget::control::DeadLetterIndex;
use lapin::types::FieldTable;
use serde::{Deserialize, Serialize};

use crate::headers::{self, DeadLetterRecord};

pub mod counts;
mod tally;

pub use counts::{Group, QueueCounts, count_queue};
pub use tally::{Flusher, Tally};

/// The reason a message is counted under when its dead-letter headers cannot be read (parked
/// messages the broker dead-lettered itself, or damaged ones).
pub const UNREADABLE: &str = "(unreadable)";

/// Longest text of a row's field (bytes): longer ones are cut, so a row stays within the index's
/// 2,048 bytes.
const FIELD_MAX: usize = 256;

/// What one message is counted under in its queue's index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Row {
    /// The dependency (empty when unknown).
    pub dependency: String,
    /// Why it was dead-lettered (`budget_exhausted`, ...), or [`UNREADABLE`].
    pub reason: String,
    /// Its error class (empty when none).
    pub error_class: String,
    /// Its task.
    pub task: String,
    /// Where a replay sends it back.
    pub original_exchange: String,
    /// Times replayed.
    pub replays: u32,
    /// The minute it was dead-lettered in (Unix ms / 60,000; 0 when unknown).
    pub minute: u64,
}

/// Cuts `text` to [`FIELD_MAX`] bytes at a character boundary: a field as a row keeps it, and as
/// a filter compares it (`ReplayFilter`), so that what a dry run counts by row is what a run
/// selects by message.
pub(crate) fn bounded(text: &str) -> String {
    let mut end = text.len().min(FIELD_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

impl Row {
    /// The row of a readable dead-letter record.
    #[must_use]
    pub fn of_record(r: &DeadLetterRecord) -> Self {
        Self {
            dependency: bounded(&r.dependency),
            reason: r.reason.as_str().to_owned(),
            error_class: bounded(&r.error_class),
            task: bounded(&r.task),
            original_exchange: bounded(&r.original_exchange),
            replays: r.replays,
            minute: r.dead_lettered_ms / 60_000,
        }
    }

    /// The row of a message in a dead-letter queue: only readable dead letters are counted there
    /// (what the broker dead-letters itself carries no record and is never counted).
    #[must_use]
    pub fn in_dead_letters(table: &FieldTable) -> Option<Self> {
        DeadLetterRecord::parse(table)
            .ok()
            .map(|r| Self::of_record(&r))
    }

    /// The row of a message in a parked queue: every parked message is counted, one whose
    /// record cannot be read under [`UNREADABLE`] with what its headers still say.
    #[must_use]
    pub fn in_parked(table: &FieldTable) -> Self {
        Self::in_dead_letters(table).unwrap_or_else(|| {
            let text = |name: &str| {
                headers::get_str(table, name)
                    .ok()
                    .flatten()
                    .map(|s| bounded(&s))
                    .unwrap_or_default()
            };
            Self {
                dependency: text(headers::DEPENDENCY),
                reason: UNREADABLE.to_owned(),
                error_class: String::new(),
                task: text(headers::TASK),
                original_exchange: String::new(),
                replays: 0,
                minute: headers::get_u64(table, headers::DEAD_LETTERED_MS)
                    .ok()
                    .flatten()
                    .map_or(0, |ms| ms / 60_000),
            }
        })
    }

    /// The row as the index holds it: a JSON array, `[dependency, reason, error_class, task,
    /// original_exchange, replays, minute]` (`lua/README.md`, "Dead-letter index").
    #[must_use]
    pub fn encode(&self) -> String {
        serde_json::to_string(&(
            &self.dependency,
            &self.reason,
            &self.error_class,
            &self.task,
            &self.original_exchange,
            self.replays,
            self.minute,
        ))
        .unwrap_or_default()
    }

    /// A row read back from the index; `None` for one this library did not write (and for the
    /// row `[]`, counts beyond the index's bound).
    #[must_use]
    pub fn decode(text: &str) -> Option<Self> {
        let (dependency, reason, error_class, task, original_exchange, replays, minute) =
            serde_json::from_str::<(String, String, String, String, String, u32, u64)>(text)
                .ok()?;
        Some(Self {
            dependency,
            reason,
            error_class,
            task,
            original_exchange,
            replays,
            minute,
        })
    }
}

/// How long the dead-letter ledger keeps an hour (14 days): `budgetctl incident report` reads
/// it for ranges within that.
pub const LEDGER_KEEP_SECS: u64 = 14 * 24 * 3600;

/// The dead-letter ledger of `queue` for `hour` (Unix ms / 3,600,000), an index of its own
/// beside the queue's: every message a worker put into `queue` in that hour, counted under its
/// row when the broker confirmed it and never counted out (the queue's index says what still
/// waits; the ledger what entered). Kept [`LEDGER_KEEP_SECS`], so it stays bounded; an incident
/// report accounts for each of its messages (replayed, purged, or still waiting).
#[must_use]
pub fn ledger_queue(queue: &str, hour: u64) -> String {
    format!("{queue}{LEDGER_MARK}{hour}")
}

/// What [`ledger_queue`] puts between a queue's name and the hour.
const LEDGER_MARK: &str = ":entered:";

/// Whether `name` is a ledger's ([`ledger_queue`]) rather than a queue's.
pub(crate) fn is_ledger_queue(name: &str) -> bool {
    name.contains(LEDGER_MARK)
}

/// Which queue of the topology a change counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Counted {
    /// A dead-letter queue (only readable dead letters are counted).
    DeadLetters,
    /// The parked queue (every message is counted).
    Parked,
}

impl Counted {
    /// The row `table` counts under in such a queue, if it is counted there.
    #[must_use]
    pub fn row(self, table: &FieldTable) -> Option<Row> {
        match self {
            Self::DeadLetters => Row::in_dead_letters(table),
            Self::Parked => Some(Row::in_parked(table)),
        }
    }
}

/// Changes to the index gathered over a batch (a replay's acks), applied in one call per queue.
#[derive(Debug, Default)]
pub struct Changes {
    by_queue: BTreeMap<String, BTreeMap<String, i64>>,
    /// Messages whose change could not be recorded (Redis failed): the index is off by this
    /// many until rebuilt.
    pub unrecorded: u64,
    /// This gatherer as a writer of the index (named at its first call) and its last batch's
    /// number: a batch whose answer was lost is sent again, applied once.
    writer: Option<String>,
    sent: u64,
}

impl Changes {
    /// Counts `delta` messages of `table` in or out of `queue`, if it is counted there.
    pub fn add(&mut self, queue: &str, counted: Counted, table: &FieldTable, delta: i64) {
        if let Some(row) = counted.row(table) {
            self.add_row(queue, &row, delta);
        }
    }

    /// Counts `delta` messages of `row` in or out of `queue`.
    pub fn add_row(&mut self, queue: &str, row: &Row, delta: i64) {
        *self
            .by_queue
            .entry(queue.to_owned())
            .or_default()
            .entry(row.encode())
            .or_default() += delta;
    }

    /// Rows waiting to be applied.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_queue.values().map(BTreeMap::len).sum()
    }

    /// Whether nothing waits.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies what waits to `index` (nothing without one), a call per queue (and 500 rows).
    /// A call that Redis did not answer in time is sent again, up to three tries in all: each
    /// is numbered for this gatherer, so the script applies it once ([`DeadLetterIndex::change_once`]).
    /// A failure past that is logged and counted in [`Changes::unrecorded`].
    pub async fn apply(&mut self, index: Option<&DeadLetterIndex>) {
        const TRIES: u32 = 3;
        let by_queue = std::mem::take(&mut self.by_queue);
        let Some(index) = index else { return };
        let writer = self
            .writer
            .get_or_insert_with(|| format!("{}-{:016x}", std::process::id(), rand::random::<u64>()))
            .clone();
        for (queue, rows) in by_queue {
            let changes: Vec<(String, i64)> = rows.into_iter().filter(|(_, d)| *d != 0).collect();
            for chunk in changes.chunks(DeadLetterIndex::BATCH_ROWS) {
                self.sent += 1;
                let mut tries = 0;
                let failed = loop {
                    tries += 1;
                    match index.change_once(&queue, &writer, self.sent, chunk).await {
                        Ok(_) => break None,
                        Err(e) if (e.is_timeout() || e.is_connection_error()) && tries < TRIES => {
                            tokio::time::sleep(std::time::Duration::from_millis(
                                50 * u64::from(tries),
                            ))
                            .await;
                        }
                        Err(e) => break Some(e),
                    }
                };
                if let Some(e) = failed {
                    let n: u64 = chunk.iter().map(|(_, d)| d.unsigned_abs()).sum();
                    self.unrecorded += n;
                    tracing::warn!(queue = %queue, messages = n, tries, error = %e, "dead-letter index not updated; `budgetctl dlq stats` shows an estimate until `budgetctl dlq reindex`");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_survives_the_index_and_hostile_text_stays_bounded() {
        let row = Row {
            dependency: "search".into(),
            reason: "budget_exhausted".into(),
            error_class: "timeout \"quoted\" \u{202e}".into(),
            task: "index".into(),
            original_exchange: "fleet.work".into(),
            replays: 2,
            minute: 29_000_000,
        };
        assert_eq!(Row::decode(&row.encode()), Some(row));
        assert_eq!(Row::decode("[]"), None);
        assert_eq!(Row::decode("not json"), None);
        let long = "é".repeat(1000);
        assert!(bounded(&long).len() <= FIELD_MAX);
        let wide = Row {
            dependency: bounded(&long),
            reason: UNREADABLE.into(),
            error_class: bounded(&long),
            task: bounded(&long),
            original_exchange: bounded(&long),
            replays: u32::MAX,
            minute: u64::MAX,
        };
        assert!(wide.encode().len() <= 2048, "{}", wide.encode().len());
    }
}
