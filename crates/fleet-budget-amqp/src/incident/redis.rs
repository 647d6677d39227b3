//! What a report reads from Redis: the audit trail (this dependency's overrides, and the replays
//! and purges that concern it, with their breakdown by reason and error class when their entry
//! recorded one), the dead-letter index (what waits now) and the dead-letter ledger (what the
//! workers dead-lettered, hour by hour). What cannot be read is said, not fatal.

use std::collections::BTreeMap;

use fleet_budget::control::{AuditEntry, AuditLog, DeadLetterIndex};
use fleet_budget::store::RedisStore;
use serde::Serialize;

use super::{Report, in_range};
use crate::dead_letters::{Row, ledger_queue};
use crate::replay::GroupMoves;
use crate::replay::audit::{PARKED_PURGE, PARKED_REPLAY, REPLAY};
use crate::topology::Topology;

/// Most audit entries a report reads.
const AUDIT_LIMIT: usize = 10_000;
/// Most hours of the ledger a report reads (its 14 days).
const LEDGER_HOURS_MAX: u64 = 14 * 24 + 1;
/// Reads of the ledger's hours in flight at once.
const LEDGER_READS_IN_FLIGHT: usize = 64;

/// Dead letters waiting, grouped.
#[derive(Debug, Clone, Serialize)]
pub struct Waiting {
    /// `dead-letter` or `parked`.
    pub queue: &'static str,
    /// Why they were dead-lettered.
    pub reason: String,
    /// Their error class.
    pub error_class: String,
    /// How many the index counts.
    pub count: u64,
}

/// A replay or purge from the audit trail.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayRow {
    /// When it ended (Unix ms).
    pub at_ms: u64,
    /// Who.
    pub actor: String,
    /// `replay`, `parked_replay` or `parked_purge`.
    pub action: String,
    /// Why.
    pub note: String,
    /// The replay was of every dependency (no `--dependency` filter): its counts are not only
    /// this dependency's.
    pub all_dependencies: bool,
    /// Moved back to work (a replay) or to the work queue from parked.
    pub moved: u64,
    /// Parked.
    pub parked: u64,
    /// Purged.
    pub purged: u64,
    /// Left alone (not matching the selection).
    pub skipped: u64,
    /// Copy not confirmed, left where it was.
    pub failed: u64,
    /// What it took out, by reason × error class × minute, this dependency's; `None` when its
    /// audit entry recorded no breakdown (written before replays and purges recorded one) though
    /// it moved messages: the report says "breakdown not recorded", never zeros.
    pub by_group: Option<Vec<GroupMoves>>,
}

/// What a report shows of a replay or purge whose audit entry recorded no breakdown.
pub const BREAKDOWN_NOT_RECORDED: &str = "breakdown not recorded";

impl ReplayRow {
    /// What it took out of this dependency, by reason × error class (out of the queue and not
    /// parked, summed over the minutes), as one cell: `budget_exhausted / http_503: 7, ...`,
    /// `-` for none, or [`BREAKDOWN_NOT_RECORDED`].
    #[must_use]
    pub fn breakdown(&self) -> String {
        let Some(groups) = &self.by_group else {
            return BREAKDOWN_NOT_RECORDED.to_owned();
        };
        let mut sums: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for g in groups {
            *sums.entry((&g.reason, &g.error_class)).or_default() += g.out.saturating_sub(g.parked);
        }
        if sums.is_empty() {
            return "-".to_owned();
        }
        sums.iter()
            .map(|((reason, class), n)| {
                let class = if class.is_empty() { "-" } else { class };
                format!("{reason} / {class}: {n}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Report {
    /// Reads what Redis keeps: the audit trail of `log`, the dead-letter index and ledger of
    /// `topology`'s queues. What cannot be read is said in [`Report::sources`].
    pub async fn read_redis(
        &mut self,
        store: &std::sync::Arc<RedisStore>,
        log: &AuditLog,
        topology: &Topology,
        shown: &str,
    ) {
        // Only this dependency's entries and the replays of every dependency cross the
        // network: the rest of the trail (up to 10,000 entries) is passed over in Redis.
        let r = log
            .read_where(
                store,
                self.since_ms,
                self.until_ms,
                &self.dependency,
                &[REPLAY, PARKED_REPLAY, PARKED_PURGE],
                AUDIT_LIMIT,
            )
            .await;
        match r {
            Ok(entries) => {
                self.read_audit(entries);
                self.sources.push(format!(
                    "the audit trail in Redis ({shown}): {} overrides, {} replays and purges",
                    self.overrides.len(),
                    self.replays.len()
                ));
            }
            Err(e) => self.sources.push(format!(
                "the audit trail could not be read: {}",
                fleet_budget::redact::redact_text(&e.to_string())
            )),
        }
        let index = DeadLetterIndex::new(std::sync::Arc::clone(store));
        for (queue, name) in [
            ("dead-letter", &topology.dead_queue),
            ("parked", &topology.parked_queue),
        ] {
            match index.read(name).await {
                Ok(rows) => self.read_index(queue, &rows.rows),
                Err(e) => self.sources.push(format!(
                    "the dead-letter index of {} could not be read: {}",
                    fleet_budget::printable::escape_text(name),
                    fleet_budget::redact::redact_text(&e.to_string())
                )),
            }
        }
        self.sources.push(format!(
            "the dead-letter index (queues {} and {}): what waits now",
            fleet_budget::printable::escape_text(&topology.dead_queue),
            fleet_budget::printable::escape_text(&topology.parked_queue)
        ));
        let first = self.since_ms / 3_600_000;
        let last = (self.until_ms / 3_600_000).min(first + LEDGER_HOURS_MAX);
        // The hours' reads in flight together (the store's connection pipelines them), in
        // order, at most `LEDGER_READS_IN_FLIGHT` at a time: one round trip for a day's 50.
        let reads: Vec<(u64, &'static str, String)> = (first..=last)
            .flat_map(|hour| {
                [
                    ("dead-letter", &topology.dead_queue),
                    ("parked", &topology.parked_queue),
                ]
                .map(|(queue, name)| (hour, queue, ledger_queue(name, hour)))
            })
            .collect();
        for chunk in reads.chunks(LEDGER_READS_IN_FLIGHT) {
            let read = futures::future::join_all(chunk.iter().map(|(_, _, key)| index.read(key)));
            for ((hour, queue, _), rows) in chunk.iter().zip(read.await) {
                match rows {
                    Ok(rows) => self.read_ledger(queue, &rows.rows),
                    Err(e) => {
                        self.accounting.ledger_incomplete = true;
                        self.sources.push(format!(
                            "the dead-letter ledger of hour {hour} could not be read: {}",
                            fleet_budget::redact::redact_text(&e.to_string())
                        ));
                    }
                }
            }
        }
        let hours = last - first + 1;
        self.sources.push(format!(
            "the dead-letter ledger ({hours} hours): what the workers dead-lettered, kept 14 days"
        ));
    }

    /// Keeps the entries of the trail that concern this dependency: replays and purges (of it
    /// or of every dependency), and its overrides. Intents (`*_started`) are left out: the end
    /// entry carries the counts.
    pub fn read_audit(&mut self, entries: Vec<AuditEntry>) {
        for e in entries {
            let ours = e.dependency.as_deref() == Some(self.dependency.as_str());
            let replay = [REPLAY, PARKED_REPLAY, PARKED_PURGE].contains(&e.action.as_str());
            if replay && (ours || e.dependency.is_none()) {
                let after = e.after.clone().unwrap_or_default();
                let n = |k: &str| {
                    after
                        .get(k)
                        .and_then(serde_json::Value::as_u64)
                        .unwrap_or(0)
                };
                // Entries written before the breakdown existed have none; so do new ones that
                // moved nothing (nothing to break down). One that cannot be read is not one.
                let by_group = match after.get("by_group") {
                    Some(g) => serde_json::from_value::<Vec<GroupMoves>>(g.clone())
                        .ok()
                        .map(|groups| {
                            groups
                                .into_iter()
                                .filter(|g| g.dependency == self.dependency)
                                .collect()
                        }),
                    None if n("moved") + n("parked") + n("purged") == 0 => Some(Vec::new()),
                    None => None,
                };
                self.replays.push(ReplayRow {
                    at_ms: e.at_ms,
                    actor: e.actor.clone(),
                    action: e.action.clone(),
                    note: e.reason.clone(),
                    all_dependencies: e.dependency.is_none(),
                    moved: n("moved"),
                    parked: n("parked"),
                    purged: n("purged"),
                    skipped: n("skipped"),
                    failed: n("failed"),
                    by_group,
                });
            } else if ours && !e.action.ends_with("_started") {
                self.overrides.push(e);
            }
        }
    }

    /// Keeps the rows of a queue's index (`dead-letter` or `parked`) that are this
    /// dependency's, dead-lettered in the range, grouped by reason × error class.
    pub fn read_index(&mut self, queue: &'static str, rows: &[(String, u64)]) {
        let mut groups: BTreeMap<(String, String), u64> = BTreeMap::new();
        for (text, count) in rows {
            let Some(row) = Row::decode(text) else {
                continue;
            };
            if row.dependency != self.dependency
                || !in_range(row.minute, self.since_ms, self.until_ms)
            {
                continue;
            }
            *groups.entry((row.reason, row.error_class)).or_default() += count;
        }
        for ((reason, error_class), count) in groups {
            self.waiting.push(Waiting {
                queue,
                reason,
                error_class,
                count,
            });
        }
    }

    /// Adds the rows of a queue's ledger hour that are this dependency's, in the range.
    pub fn read_ledger(&mut self, queue: &'static str, rows: &[(String, u64)]) {
        for (text, count) in rows {
            let Some(row) = Row::decode(text) else {
                continue;
            };
            if row.dependency == self.dependency
                && in_range(row.minute, self.since_ms, self.until_ms)
            {
                *self
                    .ledger
                    .entry((queue, row.reason, row.error_class))
                    .or_default() += count;
            }
        }
    }
}
