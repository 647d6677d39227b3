//! Where every dead letter went: per reason × error class, what the workers dead-lettered in the
//! range against what the replays moved back to work, what was purged and what still waits; the
//! difference is 0 when every dead letter is accounted for.

use std::collections::BTreeMap;

use serde::Serialize;

use super::redis::BREAKDOWN_NOT_RECORDED;
use super::{Minute, Report, in_range, whole};
use crate::replay::audit::PARKED_PURGE;

/// One reason × error class of the accounting.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct GroupAccount {
    /// Why they were dead-lettered.
    pub reason: String,
    /// Their error class.
    pub error_class: String,
    /// Dead-lettered in the range (the ledger: into the dead-letter queue, or parked by a
    /// worker).
    pub dead_lettered: u64,
    /// Moved back to work by a replay (from either queue).
    pub replayed: u64,
    /// Purged from the parked queue.
    pub purged: u64,
    /// Still in the dead-letter queue.
    pub dead_letter_queue: u64,
    /// Still in the parked queue.
    pub parked_queue: u64,
    /// `dead_lettered - (replayed + purged + dead_letter_queue + parked_queue)`: 0 when every
    /// dead letter is accounted for.
    pub difference: i64,
}

/// Where the dead letters went.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Accounting {
    /// By reason × error class.
    pub groups: Vec<GroupAccount>,
    /// What this dependency's replays and purges whose audit entries recorded no breakdown
    /// moved back to work and purged, in no reason × error class (its reason is
    /// [`BREAKDOWN_NOT_RECORDED`]; dead-lettered 0, so its difference is negative and the
    /// groups' positive ones are netted in the total). `None` when every entry recorded one.
    pub unrecorded: Option<GroupAccount>,
    /// Replays and purges of every dependency whose entries recorded no breakdown: what they
    /// took of this dependency cannot be known, and is in no figure.
    pub unrecorded_all_dependencies: usize,
    /// Their sums (reason and error class empty).
    pub total: GroupAccount,
    /// Dead-letter decisions in the range by the workers' counters (Prometheus), when the
    /// per-minute figures were given.
    pub decisions: Option<u64>,
    /// The ledger could not be read whole (Redis failed on an hour): the accounting is short.
    pub ledger_incomplete: bool,
}

impl Accounting {
    /// The lines that state it: one per reason × error class, then the total; each ends with the
    /// difference (`... difference 0`).
    #[must_use]
    pub fn lines(&self) -> Vec<String> {
        let line = |g: &GroupAccount, name: &str| {
            format!(
                "{name}: dead-lettered {} = replayed {} + purged {} + dead-letter queue {} + parked {}; difference {}",
                g.dead_lettered,
                g.replayed,
                g.purged,
                g.dead_letter_queue,
                g.parked_queue,
                g.difference
            )
        };
        let mut out: Vec<String> = self
            .groups
            .iter()
            .map(|g| {
                let class = if g.error_class.is_empty() {
                    "-"
                } else {
                    &g.error_class
                };
                line(g, &format!("{} / {class}", g.reason))
            })
            .collect();
        if let Some(u) = &self.unrecorded {
            out.push(line(u, BREAKDOWN_NOT_RECORDED));
        }
        out.push(line(&self.total, "total"));
        out
    }
}

impl Report {
    /// The accounting of what was read (in [`Report::finish`]).
    pub(super) fn account(&mut self) {
        fn group<'a>(
            groups: &'a mut BTreeMap<(String, String), GroupAccount>,
            reason: &str,
            class: &str,
        ) -> &'a mut GroupAccount {
            groups
                .entry((reason.to_owned(), class.to_owned()))
                .or_insert_with(|| GroupAccount {
                    reason: reason.to_owned(),
                    error_class: class.to_owned(),
                    ..GroupAccount::default()
                })
        }
        let mut groups: BTreeMap<(String, String), GroupAccount> = BTreeMap::new();
        for ((_, reason, class), n) in &self.ledger {
            group(&mut groups, reason, class).dead_lettered += n;
        }
        for w in &self.waiting {
            let g = group(&mut groups, &w.reason, &w.error_class);
            match w.queue {
                "parked" => g.parked_queue += w.count,
                _ => g.dead_letter_queue += w.count,
            }
        }
        let mut unrecorded: Option<GroupAccount> = None;
        let mut unrecorded_all_dependencies = 0;
        for r in &self.replays {
            let Some(by_group) = &r.by_group else {
                if r.all_dependencies {
                    unrecorded_all_dependencies += 1;
                    continue;
                }
                // A replay's `moved` went back to work, its `parked` is in the parked queue
                // (counted there); a purge's `purged` went away.
                let u = unrecorded.get_or_insert_with(|| GroupAccount {
                    reason: BREAKDOWN_NOT_RECORDED.to_owned(),
                    ..GroupAccount::default()
                });
                if r.action == PARKED_PURGE {
                    u.purged += r.purged;
                } else {
                    u.replayed += r.moved;
                }
                continue;
            };
            for m in by_group {
                if !in_range(m.minute, self.since_ms, self.until_ms) {
                    continue;
                }
                let g = group(&mut groups, &m.reason, &m.error_class);
                // Taken out of its queue: a park moves it to the parked queue (where it is
                // counted now, or later replayed or purged); the rest went back to work, or,
                // purged, away.
                let left = m.out.saturating_sub(m.parked);
                if r.action == PARKED_PURGE {
                    g.purged += left;
                } else {
                    g.replayed += left;
                }
            }
        }
        let mut total = GroupAccount::default();
        let mut add = |g: &mut GroupAccount| {
            let found = g.replayed + g.purged + g.dead_letter_queue + g.parked_queue;
            g.difference = i64::try_from(g.dead_lettered).unwrap_or(i64::MAX)
                - i64::try_from(found).unwrap_or(i64::MAX);
            total.dead_lettered += g.dead_lettered;
            total.replayed += g.replayed;
            total.purged += g.purged;
            total.dead_letter_queue += g.dead_letter_queue;
            total.parked_queue += g.parked_queue;
            total.difference += g.difference;
        };
        let mut out: Vec<GroupAccount> = groups.into_values().collect();
        out.iter_mut().for_each(&mut add);
        if let Some(u) = unrecorded.as_mut() {
            add(u);
        }
        let decisions = (!self.minutes.is_empty()).then(|| {
            // Counts over steps are whole but for `increase`'s extrapolation: rounded.
            let sum: f64 = self.minutes.iter().map(Minute::dead_lettered).sum();
            whole(sum)
        });
        self.accounting = Accounting {
            groups: out,
            unrecorded,
            unrecorded_all_dependencies,
            total,
            decisions,
            ledger_incomplete: self.accounting.ledger_incomplete,
        };
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use fleet_budget::control::AuditEntry;

    use super::*;
    use crate::dead_letters::Row;
    use crate::incident::{ReplayRow, rfc3339_ms};
    use crate::replay::GroupMoves;
    use crate::replay::audit::{PARKED_REPLAY, REPLAY};

    fn row(reason: &str, class: &str, minute: u64) -> String {
        Row {
            dependency: "search".into(),
            reason: reason.into(),
            error_class: class.into(),
            task: "t".into(),
            original_exchange: "x".into(),
            replays: 0,
            minute,
        }
        .encode()
    }

    #[test]
    fn every_dead_letter_is_found_where_it_went_and_a_missing_one_shows() {
        let minute = 29_000_000;
        let since = minute * 60_000;
        let mut r = Report::new("search", since, since + 600_000);
        r.read_ledger(
            "dead-letter",
            &[
                (row("budget_exhausted", "http_503", minute), 10),
                (row("non_retryable", "http_400", minute + 1), 2),
                // Before the range: not this incident's.
                (row("budget_exhausted", "http_503", minute - 5), 7),
            ],
        );
        r.read_index(
            "dead-letter",
            &[(row("budget_exhausted", "http_503", minute), 1)],
        );
        r.read_index(
            "parked",
            &[(row("budget_exhausted", "http_503", minute), 2)],
        );
        r.replays.push(ReplayRow {
            at_ms: since + 300_000,
            actor: "drill".into(),
            action: REPLAY.into(),
            note: String::new(),
            all_dependencies: false,
            moved: 7,
            parked: 2,
            purged: 0,
            skipped: 0,
            failed: 0,
            by_group: Some(vec![GroupMoves {
                dependency: "search".into(),
                reason: "budget_exhausted".into(),
                error_class: "http_503".into(),
                minute,
                out: 9,
                parked: 2,
            }]),
        });
        r.finish();
        let a = &r.accounting;
        assert_eq!(a.groups.len(), 2);
        assert_eq!(a.groups[0].replayed, 7);
        assert_eq!(a.groups[0].difference, 0);
        // The two non-retryable ones are nowhere: said.
        assert_eq!(a.groups[1].difference, 2);
        assert_eq!(a.total.difference, 2);
        assert!(
            a.lines().last().unwrap().ends_with("difference 2"),
            "{:?}",
            a.lines()
        );
        assert!(r.summary()[1].starts_with("2 dead letters are not accounted for"));
        assert_eq!(rfc3339_ms(since), "2025-02-19T21:20:00Z");
        assert_eq!(
            rfc3339_ms(u64::MAX),
            format!("{} ms after the epoch (past the year 9999)", u64::MAX)
        );
    }

    /// A replay's audit entry as replays wrote it before they recorded `by_group` (0.1's shape:
    /// the queues' depths, the selection and the counts).
    fn old_replay_entry(
        action: &str,
        dependency: Option<&str>,
        at_ms: u64,
        after: &serde_json::Value,
    ) -> AuditEntry {
        let mut e = AuditEntry::new("bob", action, dependency, "INC-7 replay");
        e.at_ms = at_ms;
        e.after = Some(after.clone());
        e
    }

    #[test]
    fn a_replay_written_before_the_breakdown_says_breakdown_not_recorded_and_is_in_the_total() {
        let minute = 29_000_000;
        let since = minute * 60_000;
        let mut r = Report::new("search", since, since + 600_000);
        r.read_ledger(
            "dead-letter",
            &[(row("budget_exhausted", "http_503", minute), 10)],
        );
        r.read_index(
            "dead-letter",
            &[(row("budget_exhausted", "http_503", minute), 2)],
        );
        let at = since + 120_000;
        r.read_audit(vec![
            // This dependency's, 0.1's shape: moved 6 back to work, parked 0.
            old_replay_entry(
                REPLAY,
                Some("search"),
                at,
                &serde_json::json!({
                    "work_queue": 0, "dead_letter_queue": 2, "parked_queue": 0,
                    "selected": "dependency=search", "moved": 6, "parked": 0,
                    "skipped": 0, "failed": 0
                }),
            ),
            // A purge of this dependency's parked, 0.1's shape.
            old_replay_entry(
                PARKED_PURGE,
                Some("search"),
                at + 1,
                &serde_json::json!({ "selected": "dependency=search", "purged": 2, "kept": 0 }),
            ),
            // Every dependency's, old: cannot be attributed.
            old_replay_entry(
                REPLAY,
                None,
                at + 2,
                &serde_json::json!({ "moved": 40, "parked": 0, "skipped": 0, "failed": 0 }),
            ),
            // A new replay that moved nothing records no breakdown and needs none.
            old_replay_entry(
                REPLAY,
                Some("search"),
                at + 3,
                &serde_json::json!({ "moved": 0, "parked": 0, "skipped": 3, "failed": 0 }),
            ),
            // A breakdown that is not one: not recorded, no panic.
            old_replay_entry(
                PARKED_REPLAY,
                Some("search"),
                at + 4,
                &serde_json::json!({ "moved": 0, "parked": 0, "by_group": "<b>garbage</b>" }),
            ),
        ]);
        r.finish();
        let breakdowns: Vec<String> = r.replays.iter().map(ReplayRow::breakdown).collect();
        assert_eq!(
            breakdowns,
            [
                BREAKDOWN_NOT_RECORDED,
                BREAKDOWN_NOT_RECORDED,
                BREAKDOWN_NOT_RECORDED,
                "-",
                BREAKDOWN_NOT_RECORDED
            ]
        );
        let a = &r.accounting;
        let u = a.unrecorded.as_ref().expect("the unrecorded row");
        assert_eq!((u.replayed, u.purged, u.difference), (6, 2, -8));
        assert_eq!(a.unrecorded_all_dependencies, 1);
        // The group shows what it cannot say (8 not found in it); the total nets it: 10
        // dead-lettered = 6 replayed + 2 purged + 2 waiting.
        assert_eq!(a.groups[0].difference, 8);
        assert_eq!(
            (a.total.replayed, a.total.purged, a.total.difference),
            (6, 2, 0)
        );
        let lines = a.lines();
        assert_eq!(
            lines[1],
            "breakdown not recorded: dead-lettered 0 = replayed 6 + purged 2 + dead-letter queue \
             0 + parked 0; difference -8"
        );
        let summary = r.summary().join("\n");
        assert!(
            summary.contains("Every dead letter is accounted for"),
            "{summary}"
        );
        assert!(
            summary.contains("as \"breakdown not recorded\"")
                && summary.contains("1 replays or purges of every dependency"),
            "{summary}"
        );
        let sections = r.sections();
        let replays = &sections
            .iter()
            .find(|(h, _)| h.starts_with("Replays"))
            .unwrap()
            .1;
        assert_eq!(replays[1].last().unwrap(), BREAKDOWN_NOT_RECORDED);
        assert!(
            replays
                .iter()
                .all(|row| !row.iter().any(|c| c.contains("<b>")))
        );
        assert!(
            r.timeline
                .iter()
                .any(|e| e.what.ends_with("; breakdown not recorded")),
        );
    }
}
