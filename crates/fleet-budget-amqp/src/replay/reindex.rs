//! Rebuilding a queue's dead-letter index from the queue itself (`budgetctl dlq reindex`, and
//! `budgetctl migrate` for a topology whose dead letters predate the index): every message is
//! read once and put back as a copy ([`super::inspect`]), counted under its row, and the index
//! replaced by what was counted.
//!
//! The one look that reads: slow (about 1 ms a message) and the queue is rewritten, so it is
//! run once, on upgrade, or when `dlq stats` says the index disagrees. Dead letters that arrive
//! while it reads are counted by their workers; one confirmed just before the rebuild replaces
//! the index may be missed, which the next `dlq stats` shows as a difference.

use std::collections::BTreeMap;

use super::Replayer;
use super::inspect::{InspectOptions, inspect_queue};
use crate::error::AmqpError;
use crate::headers;

/// What a rebuild found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reindexed {
    /// Messages in the queue at the start.
    pub total: u64,
    /// Messages read (and put back).
    pub seen: u64,
    /// Messages counted in the new index.
    pub indexed: u64,
    /// Rows of the new index.
    pub rows: u64,
    /// Put back, but possibly left beside their copy (see [`super::Inspection::uncertain`]).
    pub uncertain: u64,
}

impl Replayer {
    /// Reads the source queue once and replaces its index with what it holds (see the module
    /// documentation).
    ///
    /// # Errors
    /// The broker failed (the index is left as it was), or Redis did (the error names it; the
    /// index may be empty: run it again).
    pub async fn reindex(&self) -> Result<Reindexed, AmqpError> {
        let Some(index) = self.index() else {
            return Err(AmqpError::DeadLetterIndex {
                queue: self.source_queue.clone(),
                detail: "it is kept in the fleet store, and none is configured ([redis])"
                    .to_owned(),
            });
        };
        let counted = self.counted();
        let mut rows: BTreeMap<String, i64> = BTreeMap::new();
        let inspection = inspect_queue(
            &self.connection,
            &self.source_queue,
            &InspectOptions::default(),
            |d| {
                if let Some(row) = counted.row(&headers::table(&d.properties)) {
                    *rows.entry(row.encode()).or_default() += 1;
                }
            },
        )
        .await?;
        let changes: Vec<(String, i64)> = rows.into_iter().collect();
        let store_error = |e: fleet_budget::StoreError| AmqpError::DeadLetterIndex {
            queue: self.source_queue.clone(),
            detail: format!("could not be written (run the rebuild again): {e}"),
        };
        index.clear(&self.source_queue).await.map_err(store_error)?;
        let applied = index
            .change(&self.source_queue, &changes)
            .await
            .map_err(store_error)?;
        Ok(Reindexed {
            total: inspection.total,
            seen: inspection.seen,
            indexed: applied.iter().map(|n| n.unsigned_abs()).sum(),
            rows: u64::try_from(changes.len()).unwrap_or(u64::MAX),
            uncertain: inspection.uncertain,
        })
    }
}
