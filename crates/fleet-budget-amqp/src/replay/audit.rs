//! The audit entries of what moves or deletes messages (a replay of the dead-letter or the parked
//! queue, a purge), so that any tool that runs them leaves the same trail as `budgetctl`:
//! record them with `fleet_budget::control::AuditLog::record`.
//!
//! `before` holds the queue depths when the action started; `after` the depths when it ended,
//! what it did, and what it selected.

use fleet_budget::control::AuditEntry;
use serde_json::{Value, json};

use super::purge::PurgeReport;
use super::report::{GroupMoves, ReplayReport};
use super::select::ReplayFilter;
use crate::topology::QueueDepths;

/// The audit action of a replay of the dead-letter queue.
pub const REPLAY: &str = "replay";
/// The audit action of a replay of the parked queue.
pub const PARKED_REPLAY: &str = "parked_replay";
/// The audit action of a purge of the parked queue.
pub const PARKED_PURGE: &str = "parked_purge";

/// A replay's entry: `action` is [`REPLAY`] or [`PARKED_REPLAY`]; `note` is the operator's why.
#[must_use]
pub fn replay_entry(
    actor: &str,
    action: &str,
    filter: &ReplayFilter,
    note: &str,
    before: &QueueDepths,
    after: &QueueDepths,
    report: &ReplayReport,
) -> AuditEntry {
    let mut after = depths(after);
    extend(
        &mut after,
        json!({
            "selected": describe(filter),
            "moved": report.moved,
            "parked": report.parked,
            "skipped": report.skipped,
            "failed": report.failed,
        }),
    );
    if !report.by_group.is_empty() {
        // What it took out, by dependency × reason × error class: an incident report accounts
        // for each dead letter with these.
        extend(&mut after, json!({ "by_group": report.by_group }));
    }
    AuditEntry::new(actor, action, filter.dependency.as_deref(), note)
        .with_before_after(&depths(before), &after)
}

/// A purge's entry ([`PARKED_PURGE`]).
#[must_use]
pub fn purge_entry(
    actor: &str,
    filter: &ReplayFilter,
    note: &str,
    before: &QueueDepths,
    after: &QueueDepths,
    report: &PurgeReport,
) -> AuditEntry {
    let mut after = depths(after);
    extend(
        &mut after,
        json!({ "selected": describe(filter), "purged": report.removed, "kept": report.kept }),
    );
    AuditEntry::new(actor, PARKED_PURGE, filter.dependency.as_deref(), note)
        .with_before_after(&depths(before), &after)
}

/// `entry` (a purge's) with what it removed by dependency × reason × error class × minute
/// ([`super::purge_queue_by_group`]), so that an incident report accounts for each purged
/// message; unchanged when `groups` is empty.
#[must_use]
pub fn with_groups(mut entry: AuditEntry, groups: &[GroupMoves]) -> AuditEntry {
    if groups.is_empty() {
        return entry;
    }
    let more = json!({ "by_group": groups });
    match entry.after.as_mut() {
        Some(after) => extend(after, more),
        None => entry.after = Some(more),
    }
    entry
}

/// The suffix of an intent's action (`replay_started`, `parked_purge_started`): recorded before
/// the first message moves, so that an action cut off (a tool killed, a deadline, a lost
/// connection) leaves in the trail who started what, on which selection, expecting how many.
pub const STARTED: &str = "_started";

/// An action's intent ([`STARTED`]): `action` is the end entry's ([`REPLAY`], ...), `run` an id
/// the end entry repeats ([`ended`]), `expected` what the dry run predicted.
#[must_use]
pub fn intent_entry(
    actor: &str,
    action: &str,
    filter: &ReplayFilter,
    note: &str,
    run: &str,
    before: &QueueDepths,
    expected: &Value,
) -> AuditEntry {
    AuditEntry::new(
        actor,
        &format!("{action}{STARTED}"),
        filter.dependency.as_deref(),
        note,
    )
    .with_before_after(
        &depths(before),
        &json!({ "run": run, "selected": describe(filter), "expected": expected }),
    )
}

/// `entry` (an end entry) tied to its intent's `run`, and how the action ended: `completed`,
/// `cancelled`, or `failed: <why>` (then its counts are what was done before it stopped).
#[must_use]
pub fn ended(mut entry: AuditEntry, run: &str, how: &str) -> AuditEntry {
    let more = json!({ "run": run, "ended": how });
    match entry.after.as_mut() {
        Some(after) => extend(after, more),
        None => entry.after = Some(more),
    }
    entry
}

/// The depths of the three queues an operator acts on.
fn depths(d: &QueueDepths) -> Value {
    json!({ "work_queue": d.work, "dead_letter_queue": d.dead, "parked_queue": d.parked })
}

fn extend(into: &mut Value, more: Value) {
    if let (Some(into), Value::Object(more)) = (into.as_object_mut(), more) {
        into.extend(more);
    }
}

/// The filter in words: `dependency=search reason=budget_exhausted`, or `all`.
#[must_use]
pub fn describe(filter: &ReplayFilter) -> String {
    let mut parts = Vec::new();
    let mut push = |name: &str, value: Option<String>| {
        if let Some(v) = value {
            parts.push(format!("{name}={v}"));
        }
    };
    push("dependency", filter.dependency.clone());
    push("reason", filter.reason.map(|r| r.as_str().to_owned()));
    push("task", filter.task.clone());
    push("message_id", filter.message_id.clone());
    push("since_ms", filter.since_ms.map(|t| t.to_string()));
    push("until_ms", filter.until_ms.map(|t| t.to_string()));
    push("error_contains", filter.error_contains.clone());
    push("error_class", filter.error_class.clone());
    push("malformed", filter.malformed.then(|| "included".to_owned()));
    if parts.is_empty() {
        "all".to_owned()
    } else {
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use fleet_budget::DeadLetterReason;

    use super::*;

    #[test]
    fn a_replay_entry_has_the_counts_before_and_after() {
        let filter = ReplayFilter {
            dependency: Some("search".into()),
            reason: Some(DeadLetterReason::BudgetExhausted),
            ..ReplayFilter::default()
        };
        let before = QueueDepths {
            work: 0,
            dead: 3,
            parked: 0,
            retry: Vec::new(),
        };
        let after = QueueDepths {
            work: 2,
            dead: 1,
            ..before.clone()
        };
        let report = ReplayReport {
            moved: 2,
            skipped: 1,
            ..ReplayReport::default()
        };
        let e = replay_entry("ann@h", REPLAY, &filter, "INC-1", &before, &after, &report);
        assert_eq!(e.action, "replay");
        assert_eq!(e.dependency.as_deref(), Some("search"));
        assert_eq!(e.reason, "INC-1");
        let (b, a) = (e.before.unwrap(), e.after.unwrap());
        assert_eq!(b["dead_letter_queue"], 3);
        assert_eq!(a["dead_letter_queue"], 1);
        assert_eq!(a["moved"], 2);
        assert_eq!(a["selected"], "dependency=search reason=budget_exhausted");
        assert_eq!(describe(&ReplayFilter::default()), "all");
    }
}
