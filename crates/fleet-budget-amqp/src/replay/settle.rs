//! Settling the originals of a replay run: acked in as few commands as possible once their copies
//! are confirmed, held ones returned at the end (see [`super::run`] for why the number of
//! commands matters on a quorum queue).

use std::collections::{BTreeMap, BTreeSet};

use lapin::Acker;
use lapin::options::{BasicAckOptions, BasicNackOptions};

use crate::dead_letters::{Changes, Row};

/// Originals confirmed before the run acks them in one command (unless nothing is in flight).
pub(super) const ACK_EVERY: usize = 64;

/// The longest a confirmed original waits for its ack: a slow replay (a few messages a second)
/// never gathers [`ACK_EVERY`], and a run killed meanwhile leaves every original it moved
/// beside its copy (a duplicate each). Bounded by this, a kill duplicates at most what was
/// confirmed in the last 200 ms and what was in flight.
const ACK_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// The originals of a run between their read and their settlement, by delivery tag.
///
/// One `basic.ack` with `multiple` on tag `T` settles every original of the channel up to `T`,
/// so it is sent only over originals that are all confirmed: below the lowest tag whose copy is
/// still in flight, and below the lowest held one (held originals stay unsettled until the end
/// of the run, when they are returned: returning them earlier would have the consumer read them
/// again). Originals confirmed above a held one are acked one by one (rare: a copy failed).
/// Deliveries pushed past the run's bound are never read, so their tags are above every tag
/// acked.
#[derive(Default)]
pub(super) struct Settler {
    /// Tags whose copy awaits its confirmation.
    inflight: BTreeSet<u64>,
    /// Confirmed, not yet acked.
    confirmed: BTreeMap<u64, Acker>,
    /// Copy failed or not attempted: returned at the end of the run.
    held: BTreeMap<u64, Acker>,
    /// What each move or park changes in the dead-letter index once its original is acked
    /// (queue, row, delta): out of the source queue, into the parked queue.
    notes: BTreeMap<u64, Vec<(String, Row, i64)>>,
    /// Index changes of acked originals, not yet sent.
    pub(super) changes: Changes,
    /// Originals acked (the ack sent without error).
    pub(super) acked: u64,
    /// When the oldest original waiting for its ack was confirmed.
    waiting_since: Option<std::time::Instant>,
}

impl Settler {
    /// Originals read and not yet settled.
    pub(super) fn unsettled(&self) -> usize {
        self.inflight.len() + self.confirmed.len() + self.held.len()
    }

    pub(super) fn sent(&mut self, tag: u64) {
        self.inflight.insert(tag);
    }

    /// What the move or park of `tag` changes in the index, applied once its original is acked.
    pub(super) fn note(&mut self, tag: u64, changes: Vec<(String, Row, i64)>) {
        if !changes.is_empty() {
            self.notes.insert(tag, changes);
        }
    }

    /// `tag`'s copy was confirmed; `counts` whether it was the move or park noted (a copy put
    /// back in the source queue changes nothing in the index).
    pub(super) fn confirmed(&mut self, tag: u64, acker: Acker, counts: bool) {
        self.inflight.remove(&tag);
        if !counts {
            self.notes.remove(&tag);
        }
        self.waiting_since
            .get_or_insert_with(std::time::Instant::now);
        self.confirmed.insert(tag, acker);
    }

    pub(super) fn hold(&mut self, tag: u64, acker: Acker) {
        self.inflight.remove(&tag);
        self.notes.remove(&tag);
        self.held.insert(tag, acker);
    }

    /// Moves the notes of the acked `tags` into [`Settler::changes`].
    fn acked_notes(&mut self, tags: impl Iterator<Item = u64>) {
        for tag in tags {
            for (queue, row, delta) in self.notes.remove(&tag).unwrap_or_default() {
                self.changes.add_row(&queue, &row, delta);
            }
        }
    }

    /// Acks the confirmed originals that can be: every one below the lowest copy in flight,
    /// once [`ACK_EVERY`] are waiting, the oldest has waited [`ACK_AFTER`], nothing is in
    /// flight, or `now` (the window or the prefetch is full, or the run ends).
    pub(super) async fn ack(&mut self, now: bool) {
        let waited = self.waiting_since.is_some_and(|t| t.elapsed() >= ACK_AFTER);
        if !(now || waited || self.inflight.is_empty() || self.confirmed.len() >= ACK_EVERY) {
            return;
        }
        let below = self.inflight.first().copied().unwrap_or(u64::MAX);
        let mut ready = self.confirmed.split_off(&below);
        std::mem::swap(&mut ready, &mut self.confirmed);
        // What stays waits from now (a tag above one in flight).
        self.waiting_since = (!self.confirmed.is_empty()).then(std::time::Instant::now);
        let first_held = self.held.keys().next().copied().unwrap_or(u64::MAX);
        let one_by_one = ready.split_off(&first_held);
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        if let Some((_, last)) = ready.last_key_value() {
            let n = count(ready.len());
            match last.ack(BasicAckOptions { multiple: true }).await {
                Ok(true) => {
                    self.acked += n;
                    self.acked_notes(ready.keys().copied());
                }
                _ => {
                    tracing::warn!(
                        originals = n,
                        "ack of replayed dead-letters failed; they stay and may be replayed again (duplicates)"
                    );
                    for tag in ready.keys() {
                        self.notes.remove(tag);
                    }
                }
            }
        }
        for (tag, acker) in &one_by_one {
            match acker.ack(BasicAckOptions::default()).await {
                Ok(true) => {
                    self.acked += 1;
                    self.acked_notes(std::iter::once(*tag));
                }
                _ => {
                    tracing::warn!(
                        "ack of a replayed dead-letter failed; it stays and may be replayed again (a duplicate)"
                    );
                    self.notes.remove(tag);
                }
            }
        }
    }

    /// Returns the held originals to the queue (nack with requeue), once nothing is consumed.
    pub(super) async fn return_held(&mut self) {
        for acker in std::mem::take(&mut self.held).into_values() {
            let returned = acker
                .nack(BasicNackOptions {
                    multiple: false,
                    requeue: true,
                })
                .await;
            if !matches!(returned, Ok(true)) {
                tracing::warn!("nack of a dead-letter not replayed failed; the close returns it");
            }
        }
    }
}
