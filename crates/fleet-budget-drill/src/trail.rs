//! What a run on Redis and RabbitMQ leaves behind, as a real incident does, so that
//! `budgetctl incident report` accounts for each of its dead letters: the workers count them in
//! the dead-letter index and ledger (the library's `Worker`, as in production); the replays after
//! recovery go through the library's `Replayer` with that index, each audited as `budgetctl
//! replay` audits it (an intent, then the end entry with its counts by reason and error class);
//! and what is still parked at the end is purged the way `budgetctl parked purge` does it,
//! audited, before the run's queues are deleted. The trail stays in Redis under the run's key
//! prefix ([`RunTrail`] names it) until its keys expire or are deleted.

use std::sync::Arc;

use fleet_budget::FleetBudget;
use fleet_budget::control::{AuditEntry, AuditLog};
use fleet_budget::store::RedisStore;
use fleet_budget_amqp::dead_letters::Counted;
use fleet_budget_amqp::replay::{ReplayFilter, audit, purge_queue_by_group};
use fleet_budget_amqp::{Topology, WorkerConfig};
use serde::Serialize;

use crate::DrillError;
use crate::broker::Depths;

/// Who the drill's entries name.
pub(crate) const ACTOR: &str = "budgetctl demo";

/// Where a run left its trail: a configuration with these names (`[redis] key_prefix`, `[amqp]
/// prefix`) reads it with `budgetctl incident report --dependency <dependency> --since
/// <since_ms> --until <until_ms>`.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct RunTrail {
    /// The run's Redis key prefix (its budget, audit trail, dead-letter index and ledger).
    pub key_prefix: String,
    /// The run's AMQP prefix (the names of its queues, deleted at its end).
    pub amqp_prefix: String,
    /// The dependency its jobs call.
    pub dependency: String,
    /// When the run started (Unix ms).
    pub since_ms: u64,
    /// When its last entry was recorded (Unix ms).
    pub until_ms: u64,
    /// Dead-letter decisions of its workers, the replay's included (their counters).
    pub dead_letter_decisions: u64,
}

/// The audit trail of a run on Redis.
#[derive(Clone)]
pub(crate) struct Audit {
    store: Arc<RedisStore>,
    log: AuditLog,
    note: String,
}

impl Audit {
    /// The trail of `budget`'s Redis (`None` without one: nothing is recorded), its entries
    /// giving `note` as the why.
    pub(crate) fn of(c: &WorkerConfig, budget: &FleetBudget, note: &str) -> Option<Self> {
        let index = budget.dead_letter_index()?;
        Some(Self {
            store: Arc::clone(index.store()),
            log: c.budget.audit.log(),
            note: note.to_owned(),
        })
    }

    pub(crate) fn note(&self) -> &str {
        &self.note
    }

    /// Records `entry`.
    ///
    /// # Errors
    /// Redis failed: the run stops, as `budgetctl replay` does not move what it cannot audit.
    pub(crate) async fn record(&self, entry: &AuditEntry) -> Result<(), DrillError> {
        self.log
            .record(&self.store, entry)
            .await
            .map(|_| ())
            .map_err(DrillError::Audit)
    }
}

/// Purges what waits in `topology`'s parked queue at the run's end, counted out of `budget`'s
/// dead-letter index and audited as `budgetctl parked purge` does it (the intent, then the end
/// entry with what it removed by reason and error class). Returns how many were purged.
pub(crate) async fn purge_parked(
    c: &WorkerConfig,
    budget: &FleetBudget,
    topology: &Topology,
    depths: &Depths,
    trail: &Audit,
    filter: &ReplayFilter,
) -> Result<u64, DrillError> {
    let before = depths.read().await?;
    if before.parked == 0 {
        return Ok(0);
    }
    let run = fleet_budget_amqp::headers::new_message_id();
    trail
        .record(&audit::intent_entry(
            ACTOR,
            audit::PARKED_PURGE,
            filter,
            trail.note(),
            &run,
            &before,
            &serde_json::json!({ "purged": before.parked }),
        ))
        .await?;
    let index = budget.dead_letter_index();
    let (r, groups) = purge_queue_by_group(
        c.amqp.connection(),
        &topology.parked_queue,
        filter,
        None,
        index.map(|i| (i, Counted::Parked)),
    )
    .await?;
    let after = depths.read().await?;
    trail
        .record(&audit::ended(
            audit::with_groups(
                audit::purge_entry(ACTOR, filter, trail.note(), &before, &after, &r),
                &groups,
            ),
            &run,
            "completed",
        ))
        .await?;
    Ok(r.removed)
}
