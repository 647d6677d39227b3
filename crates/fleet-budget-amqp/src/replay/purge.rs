//! Removing messages for good (`budgetctl parked purge`): the messages present at the start that
//! a filter selects are acked without a copy; every other one is put back as
//! [`super::inspect`] does. Not a `queue.purge`: that would take messages that arrive meanwhile
//! and could not filter.

use std::collections::BTreeMap;

use fleet_budget::control::DeadLetterIndex;

use super::inspect::{InspectOptions, Look, inspect_queue_with};
use super::peek::QueuedMessage;
use super::report::GroupMoves;
use super::select::ReplayFilter;
use crate::connection::ConnectionConfig;
use crate::dead_letters::{Changes, Counted};
use crate::error::AmqpError;
use crate::headers;

/// What a purge did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Messages in the queue at the start.
    pub total: u64,
    /// Messages read.
    pub seen: u64,
    /// Removed for good.
    pub removed: u64,
    /// Not selected (or whose removal failed): put back.
    pub kept: u64,
    /// Removed, but not counted out of the dead-letter index (Redis failed).
    pub index_unrecorded: u64,
}

/// Where a purge counts what it removes: the dead-letter index of its queue, counted as that
/// queue's kind ([`Counted::DeadLetters`] or [`Counted::Parked`]).
pub type PurgeIndex<'a> = Option<(&'a DeadLetterIndex, Counted)>;

/// Removes the messages of `queue` that `filter` selects ([`QueuedMessage::selected_by`]), at
/// most `limit` of them, and counts them out of `index`.
///
/// The index is changed after the read ends, and only when every selected message was removed:
/// a purge cut off half-way (or one whose acks failed) leaves the index above the queue, which
/// every look then shows as an estimate (`crate::dead_letters::QueueCounts::difference`).
///
/// # Errors
/// The broker cannot be reached, the queue does not exist, or the connection was lost
/// (messages not yet read stay).
pub async fn purge_queue(
    to: impl Into<ConnectionConfig>,
    queue: &str,
    filter: &ReplayFilter,
    limit: Option<u64>,
    index: PurgeIndex<'_>,
) -> Result<PurgeReport, AmqpError> {
    Ok(purge_queue_by_group(to, queue, filter, limit, index)
        .await?
        .0)
}

/// [`purge_queue`], and what it removed by dependency × reason × error class × minute, as the
/// index counted it (nothing without an index; `out` each, `parked` 0): for the audit entry
/// ([`super::audit::with_groups`]), so that an incident report accounts for each purged
/// message.
///
/// # Errors
/// As [`purge_queue`].
pub async fn purge_queue_by_group(
    to: impl Into<ConnectionConfig>,
    queue: &str,
    filter: &ReplayFilter,
    limit: Option<u64>,
    index: PurgeIndex<'_>,
) -> Result<(PurgeReport, Vec<GroupMoves>), AmqpError> {
    let mut chosen = 0u64;
    let mut changes = Changes::default();
    let mut groups: BTreeMap<(String, String, String, u64), u64> = BTreeMap::new();
    let inspection = inspect_queue_with(to, queue, &InspectOptions::default(), |d| {
        if limit.is_none_or(|l| chosen < l) && QueuedMessage::read(d).selected_by(filter) {
            chosen += 1;
            if let Some((_, counted)) = index
                && let Some(row) = counted.row(&headers::table(&d.properties))
            {
                changes.add_row(queue, &row, -1);
                *groups
                    .entry((row.dependency, row.reason, row.error_class, row.minute))
                    .or_default() += 1;
            }
            Look::Remove
        } else {
            Look::Next
        }
    })
    .await?;
    if let Some((index, _)) = index {
        if inspection.removed == chosen {
            changes.apply(Some(index)).await;
        } else {
            tracing::warn!(
                removed = inspection.removed,
                selected = chosen,
                "not every selected message was removed; the dead-letter index is left as it was (`budgetctl dlq stats` shows the difference)"
            );
        }
    }
    let removed_all = inspection.removed == chosen;
    let report = PurgeReport {
        total: inspection.total,
        seen: inspection.seen,
        removed: inspection.removed,
        kept: inspection.put_back + inspection.requeued,
        index_unrecorded: changes.unrecorded,
    };
    // Cut off half-way, which ones went is not known: no breakdown.
    let groups = if removed_all {
        groups
            .into_iter()
            .map(
                |((dependency, reason, error_class, minute), out)| GroupMoves {
                    dependency,
                    reason,
                    error_class,
                    minute,
                    out,
                    parked: 0,
                },
            )
            .collect()
    } else {
        Vec::new()
    };
    Ok((report, groups))
}

impl super::Replayer {
    /// Removes the messages of the source queue that `filter` selects, at most `limit`, and
    /// counts them out of the replayer's index ([`purge_queue`]).
    ///
    /// # Errors
    /// As [`purge_queue`].
    pub async fn purge(
        &self,
        filter: &ReplayFilter,
        limit: Option<u64>,
    ) -> Result<PurgeReport, AmqpError> {
        let counted = self.counted();
        purge_queue(
            self.connection.clone(),
            &self.source_queue,
            filter,
            limit,
            self.index.as_ref().map(|i| (i, counted)),
        )
        .await
    }
}
