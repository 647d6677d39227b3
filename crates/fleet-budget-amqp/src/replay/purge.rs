//! Removing messages for good (`budgetctl parked purge`): the messages present at the start that
//! a filter selects are acked without a copy; every other one is put back as
//! [`super::inspect`] does. Not a `queue.purge`: that would take messages that arrive meanwhile
//! and could not filter.

use super::inspect::{InspectOptions, Look, inspect_queue_with};
use super::peek::QueuedMessage;
use super::select::ReplayFilter;
use crate::connection::ConnectionConfig;
use crate::error::AmqpError;

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
}

/// Removes the messages of `queue` that `filter` selects ([`QueuedMessage::selected_by`]), at
/// most `limit` of them.
///
/// # Errors
/// The broker cannot be reached, the queue does not exist, or the connection was lost
/// (messages not yet read stay).
pub async fn purge_queue(
    to: impl Into<ConnectionConfig>,
    queue: &str,
    filter: &ReplayFilter,
    limit: Option<u64>,
) -> Result<PurgeReport, AmqpError> {
    let mut chosen = 0u64;
    let inspection = inspect_queue_with(to, queue, &InspectOptions::default(), |d| {
        if limit.is_none_or(|l| chosen < l) && QueuedMessage::read(d).selected_by(filter) {
            chosen += 1;
            Look::Remove
        } else {
            Look::Next
        }
    })
    .await?;
    Ok(PurgeReport {
        total: inspection.total,
        seen: inspection.seen,
        removed: inspection.removed,
        kept: inspection.put_back + inspection.requeued,
    })
}
