//! A queue's counts: its depth (a passive declare, exact) beside its index (one read of Redis),
//! and whether the two agree.
//!
//! The index is exact when every message in the queue entered and will leave through this
//! crate with Redis answering; it is short of the depth after a writer died between the broker's
//! confirm and its count, a Redis that did not answer, or messages published there by someone
//! else; it is above the depth while a replay holds messages unacked, or after a tool died
//! between its ack and its count. [`QueueCounts::exact`] says which case holds, and
//! [`QueueCounts::difference`] by how much, so that every look labels what it shows.

use std::collections::BTreeMap;

use fleet_budget::control::{DeadLetterIndex, IndexRows};
use lapin::Channel;
use serde::Serialize;

use super::Row;
use crate::connection::Timeouts;
use crate::error::AmqpError;
use crate::topology::queue_depth_within;

/// Messages of one dependency × reason × error class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Group {
    /// The dependency.
    pub dependency: String,
    /// Why they were dead-lettered (or parked).
    pub reason: String,
    /// Their error class (empty when none).
    pub error_class: String,
    /// How many the index counts.
    pub messages: u64,
    /// The earliest minute one was dead-lettered in (Unix ms / 60,000), when known.
    pub oldest_minute: Option<u64>,
}

/// A queue's depth and index, read once.
#[derive(Debug, Clone, Default)]
pub struct QueueCounts {
    /// The queue.
    pub queue: String,
    /// Ready messages, from the broker (exact).
    pub depth: u64,
    /// The index's rows this library can read, and their counts.
    pub rows: Vec<(Row, u64)>,
    /// Messages counted past the index's bound of rows (in no row).
    pub beyond: u64,
    /// Rows not written by this library (skipped).
    pub unreadable_rows: u64,
    /// Why the index could not be read (no fleet store, Redis down, a key of another kind):
    /// then only the depth is known.
    pub index_error: Option<String>,
}

impl QueueCounts {
    /// `queue`'s counts from its depth and the rows of its index as read.
    #[must_use]
    pub fn of_index(queue: &str, depth: u64, read: IndexRows) -> Self {
        let mut counts = Self {
            queue: queue.to_owned(),
            depth,
            unreadable_rows: read.unreadable,
            ..Self::default()
        };
        for (text, n) in read.rows {
            if text == "[]" {
                counts.beyond += n;
            } else if let Some(row) = Row::decode(&text) {
                counts.rows.push((row, n));
            } else {
                counts.unreadable_rows += 1;
            }
        }
        counts
    }

    /// Messages the index counts (its rows and those beyond its bound).
    #[must_use]
    pub fn indexed(&self) -> u64 {
        self.rows.iter().map(|(_, n)| n).sum::<u64>() + self.beyond
    }

    /// Depth minus what the index counts: positive when messages are in the queue that the
    /// index does not know (it under-counts), negative when it counts messages that are gone or
    /// held unacked by a replay.
    #[must_use]
    pub fn difference(&self) -> i64 {
        i64::try_from(self.depth)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(self.indexed()).unwrap_or(i64::MAX))
    }

    /// Whether every breakdown is exact: the index was read, whole (nothing beyond its bound,
    /// no foreign rows), and counts exactly the depth.
    #[must_use]
    pub fn exact(&self) -> bool {
        self.index_error.is_none()
            && self.beyond == 0
            && self.unreadable_rows == 0
            && self.difference() == 0
    }

    /// Why the counts are an estimate, in a sentence; `None` when [`QueueCounts::exact`].
    #[must_use]
    pub fn why_estimate(&self) -> Option<String> {
        if let Some(e) = &self.index_error {
            return Some(format!(
                "the dead-letter index could not be read ({e}): only the depth is known"
            ));
        }
        let mut why = Vec::new();
        match self.difference() {
            0 => {}
            d if d > 0 => why.push(format!(
                "{d} messages in the queue are not in the index (dead-lettered while Redis did not answer, by a worker that died before counting, or published by something else)"
            )),
            d => why.push(format!(
                "the index counts {} messages the queue does not show as ready (held unacked by a replay or consumer, or removed by a tool that died before counting)",
                d.unsigned_abs()
            )),
        }
        if self.beyond > 0 {
            why.push(format!(
                "{} messages are counted past the index's bound of rows, in no group",
                self.beyond
            ));
        }
        if self.unreadable_rows > 0 {
            why.push(format!(
                "{} rows of the index were not written by this library",
                self.unreadable_rows
            ));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// The counts by dependency × reason × error class, largest first.
    #[must_use]
    pub fn groups(&self) -> Vec<Group> {
        let mut by: BTreeMap<(&str, &str, &str), (u64, Option<u64>)> = BTreeMap::new();
        for (row, n) in &self.rows {
            let entry = by
                .entry((&row.dependency, &row.reason, &row.error_class))
                .or_default();
            entry.0 += n;
            if row.minute > 0 {
                entry.1 = Some(entry.1.map_or(row.minute, |m| m.min(row.minute)));
            }
        }
        let mut groups: Vec<Group> = by
            .into_iter()
            .map(|((d, r, c), (messages, oldest_minute))| Group {
                dependency: d.to_owned(),
                reason: r.to_owned(),
                error_class: c.to_owned(),
                messages,
                oldest_minute,
            })
            .collect();
        groups.sort_by_key(|g| std::cmp::Reverse(g.messages));
        groups
    }

    /// The earliest minute any counted message was dead-lettered in (Unix ms / 60,000).
    #[must_use]
    pub fn oldest_minute(&self) -> Option<u64> {
        self.rows
            .iter()
            .map(|(r, _)| r.minute)
            .filter(|m| *m > 0)
            .min()
    }

    /// The messages of the rows `keep` selects.
    #[must_use]
    pub fn matching(&self, keep: impl Fn(&Row) -> bool) -> u64 {
        self.rows
            .iter()
            .filter(|(r, _)| keep(r))
            .map(|(_, n)| n)
            .sum()
    }
}

/// Reads `queue`'s depth on `channel` (a passive declare within `timeouts`) and its index (when
/// there is one; a failure to read it is kept in [`QueueCounts::index_error`], not returned).
/// Neither reads a message.
///
/// # Errors
/// The queue does not exist (the broker then closes `channel`) or the channel failed.
pub async fn count_queue(
    channel: &Channel,
    queue: &str,
    timeouts: Timeouts,
    index: Option<&DeadLetterIndex>,
) -> Result<QueueCounts, AmqpError> {
    let depth = u64::from(queue_depth_within(channel, queue, timeouts).await?);
    let mut counts = QueueCounts {
        queue: queue.to_owned(),
        depth,
        ..QueueCounts::default()
    };
    let Some(index) = index else {
        counts.index_error = Some("no fleet store is configured".to_owned());
        return Ok(counts);
    };
    match index.read(queue).await {
        Ok(read) => Ok(QueueCounts::of_index(queue, depth, read)),
        Err(e) => {
            counts.index_error = Some(e.to_string());
            Ok(counts)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(dep: &str, class: &str, minute: u64) -> Row {
        Row {
            dependency: dep.into(),
            reason: "budget_exhausted".into(),
            error_class: class.into(),
            task: "t".into(),
            original_exchange: "x".into(),
            replays: 0,
            minute,
        }
    }

    #[test]
    fn groups_sum_rows_and_exactness_names_each_difference() {
        let mut c = QueueCounts {
            queue: "q".into(),
            depth: 6,
            rows: vec![
                (row("search", "timeout", 5), 2),
                (row("search", "timeout", 3), 3),
                (row("mail", "http_503", 0), 1),
            ],
            ..QueueCounts::default()
        };
        assert!(c.exact());
        assert_eq!(c.why_estimate(), None);
        let g = c.groups();
        assert_eq!(g[0].messages, 5);
        assert_eq!(g[0].oldest_minute, Some(3));
        assert_eq!(g[1].oldest_minute, None);
        assert_eq!(c.oldest_minute(), Some(3));
        c.depth = 8;
        assert_eq!(c.difference(), 2);
        assert!(
            c.why_estimate()
                .unwrap()
                .contains("2 messages in the queue")
        );
        c.depth = 4;
        assert!(c.why_estimate().unwrap().contains("counts 2 messages"));
        c.depth = 7;
        c.beyond = 1;
        assert!(!c.exact());
        assert!(c.why_estimate().unwrap().contains("past the index's bound"));
    }
}
