//! `budgetctl incident report`: one dependency's incident for the postmortem, from what the
//! fleet recorded: the per-minute counters in Prometheus (denials, amplification, dead letters,
//! breaker transitions; the incidents found as `tune` finds them), the audit trail in Redis
//! (overrides with who and why, replays and purges with their counts), and the dead-letter index
//! (what still waits, by reason and error class). Markdown or HTML, with SVG charts.

mod render;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use fleet_budget::control::AuditEntry;
use fleet_budget::{Dependency, DepositBasis};
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::dead_letters::Row;
use fleet_budget_amqp::topology::Topology;
use fleet_budget_sim::history::{self, Incident, Rules, Sample};
use serde::Serialize;

use crate::commands::tune::Range;
use crate::commands::tune::prometheus::Prometheus;
use crate::exit::usage;
use crate::redis_conn;
use crate::when::{self, When};

/// `incident`.
#[derive(Debug, Subcommand)]
pub(crate) enum IncidentCommand {
    /// A dependency's incident for the postmortem: the budget exhausted and recovered, denials
    /// and amplification per minute, breaker transitions, overrides (who, why), dead letters by
    /// reason and error class, replays and their accounting; Markdown or HTML with charts.
    Report(ReportArgs),
}

/// The format of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Markdown (charts as files in `--chart-dir`, linked).
    Md,
    /// One HTML page, charts inline.
    Html,
}

/// `incident report`.
#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// The dependency.
    #[arg(long, value_name = "NAME")]
    pub(crate) dependency: String,
    /// The start: a duration ago (`2h`) or an RFC 3339 time.
    #[arg(long, value_name = "WHEN", value_parser = when::when)]
    pub(crate) since: When,
    /// The end (default now).
    #[arg(long, value_name = "WHEN", value_parser = when::when)]
    pub(crate) until: Option<When>,
    /// `md` or `html`.
    #[arg(long, value_enum, default_value = "md")]
    pub(crate) format: Format,
    /// Prometheus's URL, for the per-minute figures (without it: the audit trail and the
    /// dead-letter index only, said in the report).
    #[arg(
        long,
        value_name = "URL",
        env = "FLEET_BUDGET_PROMETHEUS_URL",
        hide_env_values = true
    )]
    pub(crate) prometheus: Option<String>,
    /// The step of the per-minute figures (at least twice the scrape interval).
    #[arg(long, value_name = "DURATION", value_parser = when::duration, default_value = "60s")]
    pub(crate) step: Duration,
    /// Deadline of each request to Prometheus.
    #[arg(long, value_name = "DURATION", value_parser = when::duration, default_value = "30s")]
    pub(crate) timeout: Duration,
    /// Write the report here instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
    /// Markdown: write the charts here (`<dependency>-<chart>.svg`) and link them.
    #[arg(long, value_name = "DIR")]
    pub(crate) chart_dir: Option<PathBuf>,
}

/// One step of the per-minute figures.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Minute {
    pub(crate) at_ms: u64,
    pub(crate) first_attempts: f64,
    pub(crate) executions: f64,
    pub(crate) successes: f64,
    pub(crate) retries_granted: f64,
    pub(crate) retries_denied: f64,
    /// Dead-letter decisions by reason.
    pub(crate) dead_letters: BTreeMap<String, f64>,
    /// Breaker transitions by the state entered.
    pub(crate) breaker: BTreeMap<String, f64>,
}

impl Minute {
    /// Executions over first attempts; `None` without first attempts.
    pub(crate) fn amplification(&self) -> Option<f64> {
        (self.first_attempts > 0.0).then(|| self.executions / self.first_attempts)
    }

    fn dead_lettered(&self) -> f64 {
        self.dead_letters.values().sum()
    }
}

/// An event of the timeline.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Event {
    pub(crate) at_ms: u64,
    pub(crate) what: String,
}

/// Dead letters waiting, grouped.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Waiting {
    pub(crate) queue: &'static str,
    pub(crate) reason: String,
    pub(crate) error_class: String,
    pub(crate) count: u64,
}

/// A replay or purge from the audit trail.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ReplayRow {
    pub(crate) at_ms: u64,
    pub(crate) actor: String,
    pub(crate) action: String,
    pub(crate) note: String,
    /// The replay was of every dependency (no `--dependency` filter): its counts are not only
    /// this dependency's.
    pub(crate) all_dependencies: bool,
    pub(crate) moved: u64,
    pub(crate) parked: u64,
    pub(crate) purged: u64,
    pub(crate) skipped: u64,
    pub(crate) failed: u64,
}

/// Where the dead letters went.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Accounting {
    /// Dead-letter decisions in the range (Prometheus), `None` without it.
    pub(crate) dead_lettered: Option<u64>,
    /// Still in the dead-letter queue, dead-lettered in the range (the index).
    pub(crate) waiting: u64,
    /// Moved back to work by the replays of this dependency.
    pub(crate) replayed: u64,
    /// Parked by those replays (replayed too often).
    pub(crate) parked_by_replay: u64,
    /// Dead letters the above do not account for (decided minus found), `None` without
    /// Prometheus.
    pub(crate) unaccounted: Option<i64>,
}

/// The report, as the renderers read it.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Report {
    pub(crate) dependency: String,
    pub(crate) since_ms: u64,
    pub(crate) until_ms: u64,
    pub(crate) step_ms: u64,
    pub(crate) ratio: f64,
    pub(crate) min_allowance: u64,
    /// What each source gave, or why it could not (no Prometheus, Redis unreachable).
    pub(crate) sources: Vec<String>,
    pub(crate) minutes: Vec<Minute>,
    pub(crate) incidents: Vec<Incident>,
    pub(crate) timeline: Vec<Event>,
    pub(crate) overrides: Vec<AuditEntry>,
    pub(crate) replays: Vec<ReplayRow>,
    pub(crate) waiting: Vec<Waiting>,
    pub(crate) accounting: Accounting,
}

/// Audit actions that are replays or purges (their intents, `*_started`, are left out: the end
/// entry carries the counts).
const REPLAY_ACTIONS: [&str; 3] = ["replay", "parked_replay", "parked_purge"];

/// `budgetctl incident report --dependency D --since T [--until T] [--format md|html]`.
pub(crate) async fn run(config: &WorkerConfig, command: &IncidentCommand) -> anyhow::Result<()> {
    let IncidentCommand::Report(args) = command;
    let dependency =
        Dependency::new(&args.dependency).map_err(|e| usage(format!("--dependency: {e}")))?;
    let range = Range::of(args.since, args.until, Some(args.step))?;
    let policy = config.budget.policy(&dependency);
    let mut report = Report {
        dependency: dependency.as_str().to_owned(),
        since_ms: range.start_ms,
        until_ms: range.end_ms,
        step_ms: range.step_ms,
        ratio: policy.ratio,
        min_allowance: policy.min_allowance,
        ..Report::default()
    };
    match &args.prometheus {
        Some(url) => {
            let prometheus = Prometheus::new(url, args.timeout)?;
            report.minutes = minutes(&prometheus, dependency.as_str(), &range).await?;
            report.sources.push(format!(
                "Prometheus {}: the workers' counters summed over the fleet, a point every {}s",
                prometheus.shown(),
                range.step_ms / 1000
            ));
            let samples: Vec<Sample> = report
                .minutes
                .iter()
                .map(|m| {
                    let deposits = if policy.deposit == DepositBasis::Request {
                        m.first_attempts
                    } else {
                        m.successes
                    };
                    Sample {
                        at_ms: m.at_ms,
                        deposits,
                        retries: m.retries_granted + m.retries_denied,
                        denied: m.retries_denied,
                        breaker_open: m.breaker.get("open").is_some_and(|n| *n > 0.0),
                        ..Sample::default()
                    }
                })
                .collect();
            report.incidents =
                history::incidents(&samples, range.step_ms, policy.ratio, &Rules::default());
        }
        None => report.sources.push(
            "no Prometheus (--prometheus): no per-minute figures, incidents or breaker \
             transitions; fleet-budget keeps no traffic history of its own"
                .to_owned(),
        ),
    }
    match redis_conn::connect(&config.budget, redis_conn::cli_timeout(&config.budget)).await {
        Ok(store) => {
            let log = config.budget.audit.log();
            match log
                .read(
                    &store,
                    Some(range.start_ms),
                    Some(range.end_ms),
                    None,
                    10_000,
                )
                .await
            {
                Ok(entries) => {
                    read_audit(&mut report, entries);
                    report.sources.push(format!(
                        "the audit trail in Redis ({}): {} overrides, {} replays and purges",
                        config.budget.redis_display(),
                        report.overrides.len(),
                        report.replays.len()
                    ));
                }
                Err(e) => report.sources.push(format!(
                    "the audit trail could not be read: {}",
                    fleet_budget::redact::redact_text(&e.to_string())
                )),
            }
            let topology = Topology::new(&config.amqp);
            let index = fleet_budget::control::DeadLetterIndex::new(store);
            for (queue, name) in [
                ("dead-letter", &topology.dead_queue),
                ("parked", &topology.parked_queue),
            ] {
                match index.read(name).await {
                    Ok(rows) => read_index(&mut report, queue, &rows.rows),
                    Err(e) => report.sources.push(format!(
                        "the dead-letter index of {} could not be read: {}",
                        fleet_budget::printable::escape_text(name),
                        fleet_budget::redact::redact_text(&e.to_string())
                    )),
                }
            }
            report.sources.push(format!(
                "the dead-letter index (queues {} and {}): what waits now",
                fleet_budget::printable::escape_text(&topology.dead_queue),
                fleet_budget::printable::escape_text(&topology.parked_queue)
            ));
        }
        Err(e) => report.sources.push(format!(
            "Redis could not be reached, no audit trail or dead-letter index: {}",
            fleet_budget::redact::redact_text(&format!("{e:#}"))
        )),
    }
    timeline(&mut report);
    account(&mut report);
    let text = match args.format {
        Format::Md => render::markdown(&report, args.chart_dir.as_deref())?,
        Format::Html => render::html(&report),
    };
    match &args.output {
        Some(path) => std::fs::write(path, text)
            .map_err(|e| anyhow::anyhow!("--output {}: {e}", path.display()))?,
        None => out!("{text}"),
    }
    Ok(())
}

/// The per-step counters of `dependency`.
async fn minutes(
    prometheus: &Prometheus,
    dependency: &str,
    range: &Range,
) -> anyhow::Result<Vec<Minute>> {
    let step = range.step_ms;
    // The dependency is a label value: a PromQL string with its quotes and backslashes escaped.
    let label = dependency.replace('\\', "\\\\").replace('"', "\\\"");
    let sel = format!("{{dependency=\"{label}\"}}");
    let get = async |query: String| {
        prometheus
            .range(&query, range.start_ms, range.end_ms, step)
            .await
            .map_err(anyhow::Error::msg)
    };
    let sum = |metric: &str| format!("sum by (dependency) (increase({metric}{sel}[{step}ms]))");
    let first = get(sum("fleet_budget_first_attempts_total")).await?;
    let executions = get(sum("fleet_budget_executions_total")).await?;
    let successes = get(sum("fleet_budget_successes_total")).await?;
    let granted = get(sum("fleet_budget_retries_granted_total")).await?;
    let denied = get(sum("fleet_budget_retries_denied_total")).await?;
    // By reason and by state entered: the label is put in `dependency`'s place, so that the
    // answer reads like the others (bounded by the enums of the metrics).
    let by = |metric: &str, label: &str| {
        format!(
            "label_replace(sum by ({label}) (increase({metric}{sel}[{step}ms])), \
             \"dependency\", \"$1\", \"{label}\", \"(.*)\")"
        )
    };
    let dead = get(by("fleet_budget_dead_letters_total", "reason")).await?;
    let breaker = get(by("fleet_budget_breaker_transitions_total", "to")).await?;
    let at = |s: &super::tune::prometheus::Series, t: u64| {
        s.get(dependency)
            .and_then(|p| p.get(&t))
            .copied()
            .unwrap_or(0.0)
    };
    let by_label = |s: &super::tune::prometheus::Series, t: u64| {
        s.iter()
            .filter_map(|(k, p)| p.get(&t).filter(|v| **v > 0.0).map(|v| (k.clone(), *v)))
            .collect::<BTreeMap<String, f64>>()
    };
    Ok((0..=(range.end_ms - range.start_ms) / step)
        .map(|k| {
            let t = range.start_ms + k * step;
            Minute {
                at_ms: t,
                first_attempts: at(&first, t),
                executions: at(&executions, t),
                successes: at(&successes, t),
                retries_granted: at(&granted, t),
                retries_denied: at(&denied, t),
                dead_letters: by_label(&dead, t),
                breaker: by_label(&breaker, t),
            }
        })
        .collect())
}

fn read_audit(report: &mut Report, entries: Vec<AuditEntry>) {
    let dependency = report.dependency.clone();
    for e in entries {
        let ours = e.dependency.as_deref() == Some(dependency.as_str());
        if REPLAY_ACTIONS.contains(&e.action.as_str()) && (ours || e.dependency.is_none()) {
            let after = e.after.clone().unwrap_or_default();
            let n = |k: &str| {
                after
                    .get(k)
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0)
            };
            report.replays.push(ReplayRow {
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
            });
        } else if ours && !e.action.ends_with("_started") {
            report.overrides.push(e);
        }
    }
}

fn read_index(report: &mut Report, queue: &'static str, rows: &[(String, u64)]) {
    let mut groups: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (text, count) in rows {
        let Some(row) = Row::decode(text) else {
            continue;
        };
        if row.dependency != report.dependency {
            continue;
        }
        let at_ms = row.minute.saturating_mul(60_000);
        // A row's minute is when it was dead-lettered; those of the range (its first minute
        // included) are this incident's.
        if at_ms + 60_000 <= report.since_ms || at_ms > report.until_ms {
            continue;
        }
        *groups.entry((row.reason, row.error_class)).or_default() += count;
    }
    for ((reason, error_class), count) in groups {
        report.waiting.push(Waiting {
            queue,
            reason,
            error_class,
            count,
        });
    }
}

/// The timeline: the budget exhausted (the first step with denials) and recovered (the first
/// without again), breaker transitions, incidents, overrides, replays.
fn timeline(report: &mut Report) {
    let mut events = Vec::new();
    let mut exhausted = false;
    for m in &report.minutes {
        let denying = m.retries_denied > 0.0;
        if denying && !exhausted {
            events.push(Event {
                at_ms: m.at_ms,
                what: format!(
                    "budget exhausted: {:.0} retries denied in the step",
                    m.retries_denied
                ),
            });
        } else if !denying && exhausted {
            events.push(Event {
                at_ms: m.at_ms,
                what: "budget recovered: no retry denied in the step".to_owned(),
            });
        }
        exhausted = denying;
        for (to, n) in &m.breaker {
            events.push(Event {
                at_ms: m.at_ms,
                what: format!("breaker to {to} ({n:.0} transitions)"),
            });
        }
    }
    for i in &report.incidents {
        events.push(Event {
            at_ms: i.start_ms,
            what: format!(
                "incident starts: the retry fraction above the ratio {} for {}s",
                report.ratio,
                i.duration_ms / 1000
            ),
        });
    }
    for o in &report.overrides {
        events.push(Event {
            at_ms: o.at_ms,
            what: format!("{} by {}: {}", o.action, o.actor, o.reason),
        });
    }
    for r in &report.replays {
        events.push(Event {
            at_ms: r.at_ms,
            what: format!(
                "{} by {}: {} moved, {} parked, {} purged ({})",
                r.action, r.actor, r.moved, r.parked, r.purged, r.note
            ),
        });
    }
    events.sort_by_key(|e| e.at_ms);
    report.timeline = events;
}

fn account(report: &mut Report) {
    let waiting = report
        .waiting
        .iter()
        .filter(|w| w.queue == "dead-letter")
        .map(|w| w.count)
        .sum();
    let replayed = report
        .replays
        .iter()
        .filter(|r| r.action == "replay")
        .map(|r| r.moved)
        .sum();
    let parked_by_replay = report
        .replays
        .iter()
        .filter(|r| r.action == "replay")
        .map(|r| r.parked)
        .sum();
    let dead_lettered = (!report.minutes.is_empty()).then(|| {
        // Counts over steps are whole but for `increase`'s extrapolation: rounded.
        let sum: f64 = report.minutes.iter().map(Minute::dead_lettered).sum();
        fleet_budget_sim::history::whole(sum - 0.5)
    });
    let found = waiting + replayed + parked_by_replay;
    report.accounting = Accounting {
        dead_lettered,
        waiting,
        replayed,
        parked_by_replay,
        unaccounted: dead_lettered.map(|d| {
            i64::try_from(d).unwrap_or(i64::MAX) - i64::try_from(found).unwrap_or(i64::MAX)
        }),
    };
}
