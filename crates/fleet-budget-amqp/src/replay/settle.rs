//! Settling the originals of a replay run: acked in as few commands as possible once their copies
//! are confirmed, held ones returned at the end (see [`super::run`] for why the number of
//! commands matters on a quorum queue).

use std::collections::{BTreeMap, BTreeSet};

use fleet_budget::control::ReplayMoves;
use lapin::Acker;
use lapin::options::{BasicAckOptions, BasicNackOptions};

use crate::dead_letters::{Changes, Row};

/// Originals confirmed before the run acks them in one command (unless nothing is in flight).
pub(super) const ACK_EVERY: usize = 64;

/// The longest a confirmed original waits for its ack: a slow replay (a few messages a second)
/// never gathers [`ACK_EVERY`], and a run killed meanwhile leaves every original it moved
/// beside its copy (a duplicate each). Bounded by this, a kill duplicates at most what was
/// confirmed in the last 200 ms and what was in flight.
pub(super) const ACK_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

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
    /// What the run took out of its source queue, by dependency × reason × error class × the
    /// minute they were dead-lettered in (the rows its acked originals were counted under), and
    /// how many of those it parked.
    pub(super) by_group: BTreeMap<(String, String, String, u64), (u64, u64)>,
    /// Originals acked (the ack sent without error).
    pub(super) acked: u64,
    /// When the oldest original waiting for its ack was confirmed.
    waiting_since: Option<std::time::Instant>,
    /// Where the run claims what it moves (`None`: no Redis, nothing claimed).
    moves: Option<ReplayMoves>,
    /// The claim of each original read and not yet acked, by tag, and whether it is to say
    /// "confirmed" before the ack (a move; a park of an uncertain one only deletes it after).
    claims: BTreeMap<u64, (String, bool)>,
    /// Claims that could not be written or deleted, warned about once.
    claim_errors: u64,
}

impl Settler {
    /// A settler whose run claims its moves in `moves` (see [`ReplayMoves`]).
    pub(super) fn new(moves: Option<ReplayMoves>) -> Self {
        Self {
            moves,
            ..Self::default()
        }
    }

    /// Where the run claims its moves.
    pub(super) fn moves(&self) -> Option<&ReplayMoves> {
        self.moves.as_ref()
    }

    /// `tag`'s original holds the claim `dead_letter`: recorded "confirmed" before its ack when
    /// `confirm` (its copy is a move), deleted after it.
    pub(super) fn claimed(&mut self, tag: u64, dead_letter: String, confirm: bool) {
        self.claims.insert(tag, (dead_letter, confirm));
    }

    /// `tag`'s copy went wrong in a way that says nothing of whether it was delivered (no
    /// answer, a channel closed): its claim stays as it is, "sent", so the next run parks it.
    pub(super) fn keep_claim(&mut self, tag: u64) {
        self.claims.remove(&tag);
    }

    /// `tag`'s copy was refused or returned by the broker: certainly not delivered, its claim
    /// deleted now so the next run moves it again.
    pub(super) async fn release_claim(&mut self, tag: u64) {
        if let (Some((dead_letter, _)), Some(moves)) = (self.claims.remove(&tag), &self.moves)
            && moves.forget(&[dead_letter]).await.is_err()
        {
            self.claim_failed("delete");
        }
    }

    fn claim_failed(&mut self, what: &str) {
        self.claim_errors += 1;
        if self.claim_errors == 1 {
            tracing::warn!(
                what,
                "a replay claim could not be written in Redis; a run cut off now parks these dead letters instead of moving them again (see budgetctl dlq stats)"
            );
        }
    }

    /// Before the ack of `tags`: their moves' claims say "confirmed".
    async fn confirm_claims(&mut self, tags: &[u64]) {
        let Some(moves) = &self.moves else { return };
        let confirmed: Vec<String> = tags
            .iter()
            .filter_map(|t| self.claims.get(t))
            .filter(|(_, confirm)| *confirm)
            .map(|(d, _)| d.clone())
            .collect();
        if moves.confirmed(&confirmed).await.is_err() {
            self.claim_failed("confirm");
        }
    }

    /// After the ack of `tags` (`acked`) or its failure: the claims are deleted, or kept as they
    /// are for the next run to settle.
    async fn end_claims(&mut self, tags: &[u64], acked: bool) {
        let ended: Vec<String> = tags
            .iter()
            .filter_map(|t| self.claims.remove(t))
            .map(|(d, _)| d)
            .collect();
        if acked
            && let Some(moves) = &self.moves
            && moves.forget(&ended).await.is_err()
        {
            self.claim_failed("delete");
        }
    }

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
        self.claims.remove(&tag);
        self.notes.remove(&tag);
        self.held.insert(tag, acker);
    }

    /// Moves the notes of the acked `tags` into [`Settler::changes`].
    fn acked_notes(&mut self, tags: impl Iterator<Item = u64>) {
        for tag in tags {
            let notes = self.notes.remove(&tag).unwrap_or_default();
            // The group is the row it left the source queue under (the parked row's when it was
            // not counted there).
            let out = notes.iter().find(|(_, _, d)| *d < 0);
            let parked = notes.iter().find(|(_, _, d)| *d > 0);
            if let Some((_, row, _)) = out.or(parked) {
                let group = self
                    .by_group
                    .entry((
                        row.dependency.clone(),
                        row.reason.clone(),
                        row.error_class.clone(),
                        row.minute,
                    ))
                    .or_default();
                group.0 += u64::from(out.is_some());
                group.1 += u64::from(parked.is_some());
            }
            for (queue, row, delta) in notes {
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
        let tags: Vec<u64> = ready.keys().chain(one_by_one.keys()).copied().collect();
        self.confirm_claims(&tags).await;
        if let Some((_, last)) = ready.last_key_value() {
            let n = count(ready.len());
            let tags: Vec<u64> = ready.keys().copied().collect();
            match last.ack(BasicAckOptions { multiple: true }).await {
                Ok(true) => {
                    self.acked += n;
                    self.acked_notes(ready.keys().copied());
                    self.end_claims(&tags, true).await;
                }
                _ => {
                    self.end_claims(&tags, false).await;
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
                    self.end_claims(&[*tag], true).await;
                }
                _ => {
                    self.end_claims(&[*tag], false).await;
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
