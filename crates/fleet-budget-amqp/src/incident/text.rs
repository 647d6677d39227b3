//! The report in words: the timeline (the budget's turns, breaker transitions, incidents,
//! overrides, replays) and the text of the summary and of each section, unescaped, for every
//! renderer.

use std::collections::BTreeMap;

use super::accounting::GroupAccount;
use super::charts::BudgetTurn;
use super::redis::BREAKDOWN_NOT_RECORDED;
use super::{Event, Report, rfc3339_ms};

impl Report {
    /// The timeline: the budget exhausted (the first step with denials) and recovered (the
    /// first without again), breaker transitions, incidents, overrides, replays.
    pub(super) fn timeline(&mut self) {
        let mut events: Vec<Event> = self
            .budget_turns()
            .into_iter()
            .map(|turn| Event {
                at_ms: turn.at_ms(),
                what: match turn {
                    BudgetTurn::Exhausted { denied, .. } => {
                        format!("budget exhausted: {denied:.0} retries denied in the step")
                    }
                    BudgetTurn::Recovered { .. } => {
                        "budget recovered: no retry denied in the step".to_owned()
                    }
                },
            })
            .collect();
        for m in &self.minutes {
            for (to, n) in &m.breaker {
                events.push(Event {
                    at_ms: m.at_ms,
                    what: format!("breaker to {to} ({n:.0} transitions)"),
                });
            }
        }
        for i in &self.incidents {
            events.push(Event {
                at_ms: i.start_ms,
                what: format!(
                    "incident starts: the retry fraction above the ratio {} for {}s",
                    self.ratio,
                    i.duration_ms / 1000
                ),
            });
        }
        for o in &self.overrides {
            events.push(Event {
                at_ms: o.at_ms,
                what: format!("{} by {}: {}", o.action, o.actor, o.reason),
            });
        }
        for r in &self.replays {
            events.push(Event {
                at_ms: r.at_ms,
                what: format!(
                    "{} by {}: {} moved, {} parked, {} purged ({}){}",
                    r.action,
                    r.actor,
                    r.moved,
                    r.parked,
                    r.purged,
                    r.note,
                    if r.by_group.is_none() {
                        format!("; {BREAKDOWN_NOT_RECORDED}")
                    } else {
                        String::new()
                    }
                ),
            });
        }
        events.sort_by_key(|e| e.at_ms);
        self.timeline = events;
    }

    /// The lines of the summary, unescaped.
    #[must_use]
    pub fn summary(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "{} from {} to {}; policy in force: ratio {}, min_allowance {}.",
            self.dependency,
            rfc3339_ms(self.since_ms),
            rfc3339_ms(self.until_ms),
            self.ratio,
            self.min_allowance
        )];
        if !self.minutes.is_empty() {
            lines.push(format!(
                "{} incident(s) found (stretches of 2+ steps with the retry fraction above the \
                 ratio or the breaker open, as `budgetctl tune` finds them).",
                self.incidents.len()
            ));
        }
        let a = &self.accounting;
        match a.total.difference {
            0 if !a.ledger_incomplete => lines.push(format!(
                "Every dead letter is accounted for: {} dead-lettered, {} replayed, {} purged, {} \
                 still waiting.",
                a.total.dead_lettered,
                a.total.replayed,
                a.total.purged,
                a.total.dead_letter_queue + a.total.parked_queue
            )),
            n => lines.push(format!(
                "{n} dead letters are not accounted for (positive: dead-lettered but neither \
                 replayed, purged nor waiting; negative: found more than dead-lettered in the \
                 range){}.",
                if a.ledger_incomplete {
                    "; the ledger could not be read whole"
                } else {
                    ""
                }
            )),
        }
        if let Some(u) = &a.unrecorded {
            lines.push(format!(
                "{} replayed and {} purged by replays and purges whose audit entries recorded no \
                 breakdown by reason and error class (written before replays recorded one): in \
                 the total only, as \"{BREAKDOWN_NOT_RECORDED}\".",
                u.replayed, u.purged
            ));
        }
        if a.unrecorded_all_dependencies > 0 {
            lines.push(format!(
                "{} replays or purges of every dependency recorded no breakdown: what they took of \
                 {} is not known and is in no figure.",
                a.unrecorded_all_dependencies, self.dependency
            ));
        }
        if let Some(d) = a.decisions
            && d != a.total.dead_lettered
        {
            lines.push(format!(
                "The workers' counters (Prometheus) count {d} dead-letter decisions in the range, \
                 the ledger {}: workers without Redis, or steps at the range's edges.",
                a.total.dead_lettered
            ));
        }
        lines.extend(self.sources.iter().map(|s| format!("Source: {s}.")));
        lines
    }

    /// The sections as (heading, rows of cells, unescaped); the first row is the header.
    #[must_use]
    pub fn sections(&self) -> Vec<(String, Vec<Vec<String>>)> {
        let mut out = Vec::new();
        let mut timeline = vec![vec!["time".to_owned(), "event".to_owned()]];
        timeline.extend(
            self.timeline
                .iter()
                .map(|e| vec![rfc3339_ms(e.at_ms), e.what.clone()]),
        );
        out.push(("Timeline".to_owned(), timeline));

        let mut minutes = vec![
            [
                "time",
                "first attempts",
                "executions",
                "amplification",
                "retries granted",
                "retries denied",
                "dead letters",
                "breaker",
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        let pairs = |m: &BTreeMap<String, f64>| {
            m.iter()
                .map(|(k, v)| format!("{k} {v:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for m in &self.minutes {
            #[allow(clippy::cast_precision_loss)] // a handful of reasons
            let busy =
                m.first_attempts + m.executions + m.retries_denied + m.dead_letters.len() as f64;
            if busy <= 0.0 && m.breaker.is_empty() {
                continue;
            }
            minutes.push(vec![
                rfc3339_ms(m.at_ms),
                format!("{:.0}", m.first_attempts),
                format!("{:.0}", m.executions),
                m.amplification().map_or("-".into(), |a| format!("{a:.2}")),
                format!("{:.0}", m.retries_granted),
                format!("{:.0}", m.retries_denied),
                pairs(&m.dead_letters),
                pairs(&m.breaker),
            ]);
        }
        out.push((format!("Per {}s", self.step_ms / 1000), minutes));

        let mut overrides = vec![
            ["time", "action", "who", "why", "before", "after"]
                .map(str::to_owned)
                .to_vec(),
        ];
        for o in &self.overrides {
            let json = |v: &Option<serde_json::Value>| {
                v.as_ref().map_or(String::new(), ToString::to_string)
            };
            overrides.push(vec![
                rfc3339_ms(o.at_ms),
                o.action.clone(),
                o.actor.clone(),
                o.reason.clone(),
                json(&o.before),
                json(&o.after),
            ]);
        }
        out.push(("Overrides (audit trail)".to_owned(), overrides));

        let mut waiting = vec![
            ["queue", "reason", "error class", "messages"]
                .map(str::to_owned)
                .to_vec(),
        ];
        waiting.extend(self.waiting.iter().map(|w| {
            vec![
                w.queue.to_owned(),
                w.reason.clone(),
                w.error_class.clone(),
                w.count.to_string(),
            ]
        }));
        out.push((
            "Dead letters waiting, by reason and error class (dead-letter index)".to_owned(),
            waiting,
        ));

        let mut replays = vec![
            [
                "time",
                "action",
                "who",
                "why",
                "moved",
                "parked",
                "purged",
                "skipped",
                "failed",
                "by reason and error class",
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        for p in &self.replays {
            replays.push(vec![
                rfc3339_ms(p.at_ms),
                if p.all_dependencies {
                    format!("{} (every dependency)", p.action)
                } else {
                    p.action.clone()
                },
                p.actor.clone(),
                p.note.clone(),
                p.moved.to_string(),
                p.parked.to_string(),
                p.purged.to_string(),
                p.skipped.to_string(),
                p.failed.to_string(),
                p.breakdown(),
            ]);
        }
        out.push(("Replays and purges (audit trail)".to_owned(), replays));

        let mut accounting = vec![
            [
                "reason",
                "error class",
                "dead-lettered",
                "replayed",
                "purged",
                "dead-letter queue",
                "parked",
                "difference",
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        let a = &self.accounting;
        let row = |reason: &str, g: &GroupAccount| {
            vec![
                reason.to_owned(),
                g.error_class.clone(),
                g.dead_lettered.to_string(),
                g.replayed.to_string(),
                g.purged.to_string(),
                g.dead_letter_queue.to_string(),
                g.parked_queue.to_string(),
                g.difference.to_string(),
            ]
        };
        for g in &a.groups {
            accounting.push(row(&g.reason, g));
        }
        if let Some(u) = &a.unrecorded {
            accounting.push(row(BREAKDOWN_NOT_RECORDED, u));
        }
        accounting.push(row("total", &a.total));
        out.push((
            "Accounting: where every dead letter went".to_owned(),
            accounting,
        ));
        out
    }
}
