//! `budgetctl replay`: the library replayer, with a progress display.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use clap::Args;
use fleet_budget::clock::now_ms;
use fleet_budget::control::AuditEntry;
use fleet_budget::printable::escape_text;
use fleet_budget::{DeadLetterReason, Dependency, FleetBudget};
use fleet_budget_amqp::replay::{Breakers, audit};
use fleet_budget_amqp::{
    ReplayFilter, ReplayOptions, ReplayProgress, Replayer, Topology, WorkerConfig, queue_depths,
};
use serde::Serialize;

use crate::amqp_conn::broker_error;
use crate::commands::audit::{Trail, record};
use crate::commands::dlq::reason;
use crate::exit::usage;
use crate::output::{print_json, table, table_aligned, thousands};

/// The version of the `--json` shape of `replay` and `parked replay`, with or without `--dry-run`
/// (`docs/schemas/replay.schema.json`, `parked-replay.schema.json`).
pub(crate) const JSON_SCHEMA_VERSION: u32 = 1;

/// `replay`.
#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// Replay the dead letters of this dependency (with `--bullmq-queue`: only the jobs of
    /// this dependency; without it there, every job, each paced by its own dependency).
    #[arg(long, required_unless_present = "bullmq_queue")]
    dependency: Option<String>,
    /// Replay the jobs a Node.js worker without `[amqp]` kept in this BullMQ queue's failed set
    /// (moved, paced, to the queue's `ReplayReceiver`), instead of the dead-letter queue.
    #[arg(long, value_name = "QUEUE")]
    bullmq_queue: Option<String>,
    /// Only this reason (`budget_exhausted`, `budget_frozen`, `attempts_exhausted`, `non_retryable`).
    #[arg(long, value_parser = reason)]
    reason: Option<String>,
    /// Only messages dead-lettered at or after this time (Unix seconds, RFC 3339, or an age
    /// like `30m`, `1h30m`).
    #[arg(long, value_name = "T")]
    since: Option<String>,
    /// Only messages dead-lettered before this time (same forms as `--since`).
    #[arg(long, value_name = "T")]
    until: Option<String>,
    /// Only jobs of this task.
    #[arg(long)]
    task: Option<String>,
    /// Only the message with this id.
    #[arg(long)]
    message_id: Option<String>,
    /// Only messages whose (redacted) error text contains this.
    #[arg(long, value_name = "TEXT")]
    error_contains: Option<String>,
    /// Only messages of this error class.
    #[arg(long, value_name = "CLASS")]
    error_class: Option<String>,
    /// Also park the dead letters whose headers cannot be read (a producer's garbage, the
    /// broker's own dead letters): without it a replay leaves them where they are.
    #[arg(long)]
    include_malformed: bool,
    #[command(flatten)]
    pace: PaceArgs,
    #[command(flatten)]
    run: RunArgs,
}

/// How fast and how far every replay command (`replay`, `parked replay`) moves. A negative
/// number is read as the flag's value, so the error names the flag and the value (without
/// `allow_negative_numbers`, clap takes `-5` for an unknown flag).
#[derive(Debug, Args)]
pub(crate) struct PaceArgs {
    /// Messages moved per second at most.
    #[arg(long, default_value_t = 50, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    rate: u32,
    /// Move at most this many messages.
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(1..))]
    limit: Option<u64>,
    /// Move at `--rate` throughout: no slow start, not slowed when the dependency's failures
    /// rise (an open breaker or a frozen budget still hold the run).
    #[arg(long)]
    fixed_rate: bool,
}

impl PaceArgs {
    /// Sets the rate and the limit of `options`.
    pub(crate) fn apply(&self, options: &mut ReplayOptions) {
        options.rate = Some(f64::from(self.rate));
        options.limit = self.limit;
        options.control.enabled = !self.fixed_rate;
    }
}

/// The flags that end every replay command (`replay`, `parked replay`): how it runs and prints.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Count what would move, move nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    #[command(flatten)]
    pub(crate) trail: Trail,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct ReplayOutput {
    pub(crate) matched: u64,
    pub(crate) moved: u64,
    pub(crate) parked: u64,
    pub(crate) skipped: u64,
    pub(crate) failed: u64,
    pub(crate) dry_run: bool,
    /// Messages in the queue when the run started (the bound).
    pub(crate) total: u64,
    /// Of the parked (or, replaying the parked queue, of the skipped), those without readable
    /// dead-letter headers.
    pub(crate) malformed: u64,
    /// Deprecated (0.2.0, dropped in 0.3.0): an exhausted budget no longer pauses a replay, so
    /// always 0. See `held_frozen_secs`.
    pub(crate) paused_secs: f64,
    /// Of the messages left in the queue, those the broker did not yet count ready when the run
    /// returned (its depth reads that much short for a moment; nothing is lost).
    pub(crate) not_ready: u64,
    /// Time held while the dependency's breaker was open (0 when it never was).
    pub(crate) held_breaker_secs: f64,
    /// Times the rate was cut because the dependency's failures or denials rose.
    pub(crate) slowdowns: u64,
    /// The lowest rate moves went at, messages per second (`null`: nothing moved).
    pub(crate) lowest_rate: Option<f64>,
    /// A dry run: whether its prediction is exact (`null` for a run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) exact: Option<bool>,
    /// A dry run: messages it could not place, each either moved or skipped (`null` for a run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) uncertain: Option<u64>,
    /// A dry run: why its prediction is an estimate, when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) estimate: Option<String>,
    /// Time held while an operator had frozen the dependency's budget (0 when never).
    pub(crate) held_frozen_secs: f64,
    /// The highest rate moves went at, messages per second (`null`: nothing moved).
    pub(crate) highest_rate: Option<f64>,
    /// Seconds from the start until moves went at `--rate` (`null`: never, or nothing moved).
    pub(crate) reached_rate_secs: Option<f64>,
    /// A run: dead letters dropped, not copied, because an interrupted run had moved them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) already_moved: Option<u64>,
    /// A run: of the parked, those an interrupted run may have delivered (parked for an
    /// operator to decide).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) in_doubt: Option<u64>,
    /// `--bullmq-queue`: the BullMQ queue whose kept jobs were replayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bullmq_queue: Option<String>,
    /// `--bullmq-queue`, a run: jobs moved to the queue's receiver and not yet taken by it when
    /// the run ended (all of them while no receiver runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bullmq_pending: Option<u64>,
}

/// Parses `--since` / `--until`: Unix seconds, an RFC 3339 time (`2026-11-30T04:00:00Z`), or an
/// age (humantime: `90s`, `30m`, `1h30m`, `1d`). Returns Unix ms.
pub(crate) fn parse_since(text: &str, now_ms: u64) -> Result<u64, String> {
    let t = text.trim();
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(secs.saturating_mul(1000));
    }
    if let Ok(at) = humantime::parse_rfc3339_weak(t) {
        return Ok(crate::when::When(at).unix_ms());
    }
    humantime::parse_duration(t)
        .map(|ago| now_ms.saturating_sub(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX)))
        .map_err(|_| {
            format!(
                "`{text}` is neither Unix seconds, an RFC 3339 time (2026-11-30T04:00:00Z) nor an \
                 age like 90s, 30m, 1h30m, 1d"
            )
        })
}

/// `budgetctl replay`: the library replayer, with a progress display.
pub(crate) async fn run(config: &WorkerConfig, args: &ReplayArgs) -> anyhow::Result<()> {
    let dependency = match &args.dependency {
        Some(d) => Some(
            Dependency::new(d)
                .map_err(|e| usage(format!("--dependency {d:?}: a dependency name {e}")))?,
        ),
        None => None,
    };
    let since_ms = match &args.since {
        Some(s) => Some(parse_since(s, now_ms()).map_err(|e| usage(format!("--since {e}")))?),
        None => None,
    };
    let until_ms = match &args.until {
        Some(s) => Some(parse_since(s, now_ms()).map_err(|e| usage(format!("--until {e}")))?),
        None => None,
    };
    let mut options = ReplayOptions::new(config);
    options.filter = ReplayFilter {
        dependency: dependency.map(|d| d.to_string()),
        reason: args.reason.as_deref().and_then(DeadLetterReason::parse),
        since_ms,
        until_ms,
        task: args.task.clone(),
        message_id: args.message_id.clone(),
        error_contains: args.error_contains.clone(),
        error_class: args.error_class.clone(),
        malformed: args.include_malformed,
    };
    args.pace.apply(&mut options);
    if let Some(queue) = &args.bullmq_queue {
        return crate::commands::bullmq_replay::run(config, queue, &options, &args.run).await;
    }
    if options.filter.dependency.is_none() {
        return Err(usage("--dependency is required (unless --bullmq-queue)"));
    }
    replay(config, Source::DeadLetters, &options, &args.run).await
}

/// Which queue a replay reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    DeadLetters,
    Parked,
}

impl Source {
    /// The queue's name for people: "the {name} queue".
    fn name(self) -> &'static str {
        match self {
            Self::DeadLetters => "dead-letter",
            Self::Parked => "parked",
        }
    }
}

/// Replays the messages of `source` that `options` select (with `--dry-run`, predicts the
/// replay), then prints its outcome and records it: [`replay_queue`], then [`finish`].
pub(crate) async fn replay(
    config: &WorkerConfig,
    source: Source,
    options: &ReplayOptions,
    run: &RunArgs,
) -> anyhow::Result<()> {
    let (out, entry) =
        replay_queue(config, source, options, run.dry_run, run.json, &run.trail).await?;
    finish(config, &out, entry, run.json, source.name()).await
}

/// Replays (or, with `dry_run`, predicts a replay of) the messages of `source` that `options`
/// select, printing progress on stderr; the dry run prints its table by dependency × reason
/// unless `json`. A run also returns its audit entry (queue depths before and after), to be
/// recorded once its outcome is printed.
async fn replay_queue(
    config: &WorkerConfig,
    source: Source,
    options: &ReplayOptions,
    dry_run: bool,
    json: bool,
    trail: &Trail,
) -> anyhow::Result<(ReplayOutput, Option<AuditEntry>)> {
    let topology = Topology::new(&config.amqp);
    let broker = config.amqp.connection();
    let replayer = |budget: Option<FleetBudget>| match source {
        Source::DeadLetters => Replayer::new(&broker, topology.clone(), budget),
        Source::Parked => Replayer::parked(&broker, topology.clone(), budget),
    };
    if dry_run {
        let r = replayer(None)
            .with_index(crate::commands::dlq::dead_letter_index(config))
            .dry_run(options)
            .await
            .map_err(|e| broker_error(config, &e))?;
        let (parked, skipped) = match source {
            Source::DeadLetters => (r.would_park_looping + r.malformed, r.skipped),
            // From the parked queue, unreadable messages stay where they are.
            Source::Parked => (r.would_park_looping, r.skipped + r.malformed),
        };
        let out = ReplayOutput {
            matched: r.would_move + r.would_park_looping + r.would_fail,
            moved: r.would_move,
            parked,
            skipped,
            failed: r.would_fail,
            dry_run: true,
            total: r.total,
            malformed: r.malformed,
            paused_secs: 0.0,
            not_ready: 0,
            held_breaker_secs: 0.0,
            slowdowns: 0,
            lowest_rate: None,
            exact: Some(r.exact),
            uncertain: Some(r.uncertain),
            estimate: r.estimate.clone(),
            held_frozen_secs: 0.0,
            highest_rate: None,
            reached_rate_secs: None,
            already_moved: None,
            in_doubt: None,
            bullmq_queue: None,
            bullmq_pending: None,
        };
        if !json {
            outln!(
                "dry run: {} messages in the queue, nothing moved, nothing read ({})",
                thousands(r.total),
                if r.exact {
                    "exact: the dead-letter index agrees with the queue"
                } else {
                    "an estimate"
                }
            );
            if let Some(why) = &r.estimate {
                outln!(
                    "estimate: {} messages could not be placed (each is either moved or skipped): {why}",
                    thousands(r.uncertain)
                );
            }
            let mut rows = vec![vec![
                "dependency".to_owned(),
                "reason".to_owned(),
                "matching".to_owned(),
            ]];
            for ((d, reason), n) in &r.by_dependency_reason {
                // Names from message headers: escaped, as everywhere they are printed.
                rows.push(vec![
                    escape_text(d).into_owned(),
                    escape_text(reason).into_owned(),
                    thousands(*n),
                ]);
            }
            if rows.len() > 1 {
                out!("{}", table_aligned(&rows, &[0, 1]));
            }
        }
        return Ok((out, None));
    }
    let before = queue_depths(config.amqp.connection(), &topology)
        .await
        .map_err(|e| broker_error(config, &e))?;
    let action = match source {
        Source::DeadLetters => audit::REPLAY,
        Source::Parked => audit::PARKED_REPLAY,
    };
    // The intent first: who, what selection, how many expected (the dry run, which reads no
    // message). Not recorded (Redis down), nothing moves.
    let run_id = fleet_budget_amqp::headers::new_message_id();
    let expected = replayer(None)
        .with_index(crate::commands::dlq::dead_letter_index(config))
        .dry_run(options)
        .await
        .map(|p| {
            serde_json::json!({
                "moved": p.would_move,
                "parked": p.would_park_looping,
                "failed": p.would_fail,
                "exact": p.exact,
            })
        })
        .unwrap_or(serde_json::Value::Null);
    let intent = audit::intent_entry(
        &trail.actor(),
        action,
        &options.filter,
        trail.note(),
        &run_id,
        &before,
        &expected,
    );
    record(&config.budget, &intent).await.map_err(|e| {
        anyhow::anyhow!("nothing moved: the replay's intent could not be audited: {e:#}")
    })?;
    // The budget's counters pace the replay (a slow start while the jobs succeed, cut when they
    // fail) and its freeze holds it; the breakers hold it while one is open.
    let budget = FleetBudget::from_config(&config.budget).await?;
    let breakers = Breakers::from_config(&config.budget)?;
    // Its moves are claimed and counted with the command line's Redis deadline (at least 1 s),
    // not the workers' (50 ms by default): a loaded Redis slows a replay, it does not fail its
    // moves.
    let index = crate::commands::dlq::dead_letter_index(config)
        .or_else(|| budget.dead_letter_index().cloned());
    let replayer = replayer(Some(budget.clone()))
        .with_breakers(breakers)
        .with_index(index);
    let terminal = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut last_line = Instant::now();
    let mut last_state = None;
    let mut last = ReplayProgress::default();
    // Where the run stands, in the run journal every 2 s: a run killed before its end entry
    // still says where it stopped (`budgetctl audit`).
    let shared = std::sync::Arc::new(std::sync::Mutex::new(ReplayProgress::default()));
    let journal = journal_writer(config, &run_id, std::sync::Arc::clone(&shared)).await;
    let report = replayer
        .run(options, |p: &ReplayProgress| {
            last = p.clone();
            if let Ok(mut s) = shared.lock() {
                *s = p.clone();
            }
            let due = if terminal {
                Duration::from_millis(100)
            } else {
                Duration::from_secs(2)
            };
            // A hold, a resume or a new rate or reason is shown at once: nothing else prints
            // while held.
            let state = Some((p.held.clone(), p.pace, p.rate));
            if last_line.elapsed() < due && p.seen < p.total && state == last_state {
                return;
            }
            last_line = Instant::now();
            let line = format!(
                "replay {:>5.1}s: read {}/{} | moved {} | parked {} | skipped {} | failed {}{}",
                started.elapsed().as_secs_f64(),
                thousands(p.seen),
                thousands(p.total),
                thousands(p.moved),
                thousands(p.parked),
                thousands(p.skipped),
                thousands(p.failed),
                loop_state(p),
            );
            last_state = state;
            let mut err = std::io::stderr().lock();
            let _ = if terminal {
                write!(err, "\r\x1b[2K{line}")
            } else {
                writeln!(err, "{line}")
            };
            let _ = err.flush();
        })
        .await;
    if terminal {
        eprintln!();
    }
    if let Some(journal) = journal {
        journal.abort();
    }
    let _ = budget.shutdown().await;
    let r = match report {
        Ok(r) => r,
        Err(e) => {
            // Where it stopped, in the trail: the depths now (if the broker answers), and the
            // error. What it moved before is in the depths; nothing was moved twice.
            let after = queue_depths(config.amqp.connection(), &topology)
                .await
                .unwrap_or_else(|_| before.clone());
            let entry = audit::ended(
                audit::replay_entry(
                    &trail.actor(),
                    action,
                    &options.filter,
                    trail.note(),
                    &before,
                    &after,
                    &fleet_budget_amqp::ReplayReport {
                        total: last.total,
                        seen: last.seen,
                        moved: last.moved,
                        parked: last.parked,
                        skipped: last.skipped,
                        failed: last.failed,
                        ..fleet_budget_amqp::ReplayReport::default()
                    },
                ),
                &run_id,
                &format!(
                    "failed: {}",
                    fleet_budget::redact::redact_text(&e.to_string())
                ),
            );
            if let Err(a) = record(&config.budget, &entry).await {
                eprintln!("budgetctl: {a:#}");
            }
            return Err(broker_error(config, &e));
        }
    };
    let after = queue_depths(config.amqp.connection(), &topology)
        .await
        .map_err(|e| broker_error(config, &e))?;
    let entry = audit::ended(
        audit::replay_entry(
            &trail.actor(),
            action,
            &options.filter,
            trail.note(),
            &before,
            &after,
            &r,
        ),
        &run_id,
        if r.cancelled {
            "cancelled"
        } else {
            "completed"
        },
    );
    let out = ReplayOutput {
        matched: r.matched,
        moved: r.moved,
        parked: r.parked,
        skipped: r.skipped,
        failed: r.failed,
        dry_run: false,
        total: r.total,
        malformed: r.malformed,
        paused_secs: 0.0,
        not_ready: r.not_ready,
        held_breaker_secs: r.held_breaker.as_secs_f64(),
        slowdowns: r.slowdowns,
        lowest_rate: r.lowest_rate.map(|r| r.per_sec()),
        exact: None,
        uncertain: None,
        estimate: None,
        held_frozen_secs: r.held_frozen.as_secs_f64(),
        highest_rate: r.highest_rate.map(|r| r.per_sec()),
        reached_rate_secs: r.reached_rate.map(|d| d.as_secs_f64()),
        already_moved: Some(r.already_moved),
        in_doubt: Some(r.in_doubt),
        bullmq_queue: None,
        bullmq_pending: None,
    };
    Ok((out, Some(entry)))
}

/// Writes `progress` into the run journal as run `run`'s, every 2 s until aborted (nothing
/// when Redis cannot be used: the intent is recorded already, and the end entry will be).
async fn journal_writer(
    config: &WorkerConfig,
    run: &str,
    progress: std::sync::Arc<std::sync::Mutex<ReplayProgress>>,
) -> Option<tokio::task::JoinHandle<()>> {
    let store = crate::redis_conn::connect(
        &config.budget,
        crate::redis_conn::cli_timeout(&config.budget),
    )
    .await
    .ok()?;
    let journal = fleet_budget::control::RunJournal::new(store);
    let run = run.to_owned();
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        loop {
            tick.tick().await;
            let p = progress.lock().map(|p| p.clone()).unwrap_or_default();
            let at = serde_json::json!({
                "at_ms": now_ms(),
                "total": p.total,
                "seen": p.seen,
                "moved": p.moved,
                "parked": p.parked,
                "skipped": p.skipped,
                "failed": p.failed,
            });
            if let Err(e) = journal.progress(&run, &at).await {
                tracing::debug!(error = %e, "run journal not written");
            }
        }
    }))
}

/// The pace for the progress line: held and why, else the rate, why it is what it is, and the
/// ETA (the library's words, as the console shows them).
pub(crate) fn loop_state(p: &ReplayProgress) -> String {
    let text = p.pace_text();
    if text.is_empty() {
        text
    } else {
        format!(" | {text}")
    }
}

/// Prints a replay's outcome (JSON or the table), records its audit entry, and turns copies
/// that failed into exit 1, the same in both modes: a script reading the JSON must not take a
/// partial replay for success.
async fn finish(
    config: &WorkerConfig,
    out: &ReplayOutput,
    entry: Option<AuditEntry>,
    json: bool,
    queue: &str,
) -> anyhow::Result<()> {
    if json {
        print_json(JSON_SCHEMA_VERSION, out)?;
    } else {
        print_replay(out, queue);
    }
    if let Some(entry) = entry {
        record(&config.budget, &entry).await?;
    }
    if out.failed > 0 && !out.dry_run {
        anyhow::bail!(
            "{} messages were not moved (a copy not confirmed by the broker, its exchange missing, or its move not recorded in Redis: see the warnings); they stay in the {queue} queue",
            out.failed
        );
    }
    Ok(())
}

pub(crate) fn print_replay(out: &ReplayOutput, queue: &str) {
    let verb = if out.dry_run { "would be " } else { "" };
    let rows = vec![
        vec![format!("in the {queue} queue"), thousands(out.total)],
        vec!["matched".to_owned(), thousands(out.matched)],
        vec![format!("{verb}moved back"), thousands(out.moved)],
        vec![
            format!("{verb}parked (looping or malformed)"),
            thousands(out.parked),
        ],
        vec!["skipped (filter)".to_owned(), thousands(out.skipped)],
        vec![
            if out.dry_run {
                "would fail (exchange missing)".to_owned()
            } else {
                "failed (not confirmed)".to_owned()
            },
            thousands(out.failed),
        ],
    ];
    out!("{}", table(&rows));
    // What an earlier run cut off half-way left behind, settled by this one.
    if let Some(n) = out.already_moved.filter(|n| *n > 0) {
        outln!(
            "{} dead letters had been moved by an interrupted replay: dropped, not copied again",
            thousands(n)
        );
    }
    if let Some(n) = out.in_doubt.filter(|n| *n > 0) {
        outln!(
            "{} of the parked may have been delivered by an interrupted replay (its copy was sent, the broker's answer never seen): check whether their jobs ran before `budgetctl parked replay`",
            thousands(n)
        );
    }
    print_holds(out);
    if out.slowdowns > 0 {
        let lowest = out
            .lowest_rate
            .map(|r| format!("; lowest rate {r:.1}/s"))
            .unwrap_or_default();
        outln!(
            "slowed {} times as the dependency's failures rose{lowest}",
            thousands(out.slowdowns)
        );
    }
    if let Some(secs) = out.reached_rate_secs {
        outln!("at the asked rate {secs:.1}s after the start");
    }
    if out.not_ready > 0 {
        outln!(
            "{} messages left in the {queue} queue were not yet counted ready by the broker when the run ended: its depth reads that much short for a moment (nothing is lost)",
            thousands(out.not_ready)
        );
    }
}

/// The holds of a run that happened (a freeze, an open breaker), one line each: a hold that did
/// not happen is not reported. Shared with `replay --bullmq-queue`.
pub(crate) fn print_holds(out: &ReplayOutput) {
    if out.held_frozen_secs > 0.0 {
        outln!(
            "held {:.1}s while the budget was frozen",
            out.held_frozen_secs
        );
    }
    if out.held_breaker_secs > 0.0 {
        outln!(
            "held {:.1}s while the breaker was open",
            out.held_breaker_secs
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_accepts_unix_seconds_and_ages() {
        let now = 10_000_000;
        assert_eq!(parse_since("90s", now), Ok(now - 90_000));
        assert_eq!(parse_since("30m", now), Ok(now - 1_800_000));
        assert_eq!(parse_since("2h", now), Ok(now - 7_200_000));
        assert_eq!(parse_since("1d", 100), Ok(0));
        assert_eq!(parse_since("1700000000", now), Ok(1_700_000_000_000));
        assert_eq!(parse_since("1h30m", now), Ok(now - 5_400_000));
        assert_eq!(
            parse_since("2026-11-30T04:00:00Z", now),
            Ok(1_796_011_200_000)
        );
        assert!(parse_since("yesterday", now).is_err());
        assert!(parse_since("-5m", now).is_err());
    }
}
