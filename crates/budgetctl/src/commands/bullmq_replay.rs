//! `budgetctl replay --bullmq-queue QUEUE`: the BullMQ jobs the budget refused and a Node.js
//! worker without `[amqp]` kept in BullMQ's failed set, put back on their queue, paced like every
//! replay and audited like every replay.
//!
//! The Node.js client records each job it keeps in a list of the fleet's own,
//! `<prefix>:v1:bullmq-kept:{<queue>}` (newest on the left; one small JSON object each: the job
//! id, its task, dependency, reason, error class and error, when). This command never writes
//! BullMQ's keys (its Lua scripts own them): it moves each selected entry, at its turn
//! ([`PacedMoves`], the pace of the dead-letter replay), with one `LMOVE` into
//! `<prefix>:v1:bullmq-replay:{<queue>}`, which the queue's `ReplayReceiver` drains into BullMQ
//! (a new job `<id>~r<n>`, the original removed from the failed set). An entry is in exactly one
//! list at any instant, so a run killed anywhere neither loses nor doubles one.
//!
//! Entries are read one at a time from the right (the oldest), `total` of them (the list's length
//! at the start, the run's bound): one not selected is rotated to the left end (it stays); one
//! that cannot be read is left so too (counted malformed), or with `--include-malformed` moved to
//! `<prefix>:v1:bullmq-parked:{<queue>}`, as is a job replayed `max_replays` times already.
//! Only this command takes entries from the right: the Node.js client pushes on the left and,
//! when the list is full, drops the entry it just pushed (counted). Two runs on one queue at once
//! would take each other's entries; the second stops at the first it sees taken.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use fleet_budget::FleetBudget;
use fleet_budget::control::AuditEntry;
use fleet_budget::control::bullmq::{KeptJob, queue_problem, read_entry, replays_of};
use fleet_budget::keys::bullmq_key;
use fleet_budget::printable::escape_text;
use fleet_budget::store::RedisStore;
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::replay::{Breakers, PacedMoves, audit};
use fleet_budget_amqp::{ReplayFilter, ReplayOptions};
use serde_json::{Value, json};

use crate::commands::audit::record;
use crate::commands::replay::{
    JSON_SCHEMA_VERSION, ReplayOutput, RunArgs, loop_state, print_holds,
};
use crate::exit::usage;
use crate::output::{print_json, table, thousands};
use crate::redis_conn;

/// The audit action of a replay of a BullMQ queue's kept jobs (its intent: with
/// [`audit::STARTED`]).
pub(crate) const BULLMQ_REPLAY: &str = "bullmq_replay";
/// The parked list's bound (the newest kept): the kept list's default cap.
const PARKED_MAX: i64 = 100_000;
/// Entries read at a time by a dry run.
const PAGE: i64 = 500;

/// Whether `filter` selects `job`.
fn selects(filter: &ReplayFilter, job: &KeptJob) -> bool {
    let same = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
    same(&filter.dependency, &job.dependency)
        && same(&filter.task, &job.task)
        && same(&filter.error_class, &job.error_class)
        && same(&filter.message_id, &job.id)
        && filter.reason.is_none_or(|r| r.as_str() == job.reason)
        && filter
            .error_contains
            .as_deref()
            .is_none_or(|e| job.error.contains(e))
        && filter.since_ms.is_none_or(|t| job.at_ms >= t)
        && filter.until_ms.is_none_or(|t| job.at_ms < t)
}

/// What becomes of one entry.
#[derive(Debug, PartialEq, Eq)]
enum Class {
    /// To its receiver, paced by this dependency.
    Move(String),
    /// To the parked list: why.
    Park(String),
    /// Unreadable and not parked (no `--include-malformed`): stays.
    Malformed,
    /// Not selected: stays.
    Skip,
}

fn classify(raw: &str, options: &ReplayOptions) -> Class {
    match read_entry(raw) {
        Err(why) if options.filter.selects_malformed() => Class::Park(why),
        Err(_) => Class::Malformed,
        Ok(job) if !selects(&options.filter, &job) => Class::Skip,
        Ok(job) if replays_of(&job.id) >= options.max_replays => Class::Park(format!(
            "job {} replayed {} times already (max_replays)",
            escape_text(&job.id),
            replays_of(&job.id)
        )),
        Ok(job) => Class::Move(job.dependency),
    }
}

/// The three lists of `queue`.
struct Lists {
    kept: String,
    replay: String,
    parked: String,
}

impl Lists {
    async fn lengths(&self, store: &RedisStore) -> anyhow::Result<Value> {
        let len = async |k: &str| -> anyhow::Result<u64> {
            store
                .query_repeatable(redis::cmd("LLEN").arg(k))
                .await
                .map_err(|e| anyhow::anyhow!("LLEN {k}: {e}"))
        };
        Ok(json!({
            "kept": len(&self.kept).await?,
            "pending_replay": len(&self.replay).await?,
            "parked": len(&self.parked).await?,
        }))
    }
}

/// `budgetctl replay --bullmq-queue QUEUE` (see the module's documentation).
pub(crate) async fn run(
    config: &WorkerConfig,
    queue: &str,
    options: &ReplayOptions,
    run: &RunArgs,
) -> anyhow::Result<()> {
    if let Some(problem) = queue_problem(queue) {
        return Err(usage(format!(
            "--bullmq-queue {:?}: a BullMQ queue name {problem}",
            escape_text(queue)
        )));
    }
    let store =
        redis_conn::connect(&config.budget, redis_conn::cli_timeout(&config.budget)).await?;
    let prefix = &config.budget.redis.key_prefix;
    let lists = Lists {
        kept: bullmq_key(prefix, "kept", queue),
        replay: bullmq_key(prefix, "replay", queue),
        parked: bullmq_key(prefix, "parked", queue),
    };
    let predicted = dry_run(&store, &lists, options).await?;
    if run.dry_run {
        let out = ReplayOutput {
            dry_run: true,
            exact: Some(true),
            uncertain: Some(0),
            bullmq_queue: Some(queue.to_owned()),
            ..predicted
        };
        return finish(&out, None, run.json, config, queue).await;
    }
    let before = lists.lengths(&store).await?;
    let run_id = fleet_budget_amqp::headers::new_message_id();
    let mut selected = audit::describe(&options.filter);
    selected.push_str(&format!(" bullmq_queue={queue}"));
    let dependency = options.filter.dependency.as_deref();
    let intent = AuditEntry::new(
        &run.trail.actor(),
        &format!("{BULLMQ_REPLAY}{}", audit::STARTED),
        dependency,
        run.trail.note(),
    )
    .with_before_after(
        &before,
        &json!({
            "run": run_id,
            "selected": selected,
            "expected": { "moved": predicted.moved, "parked": predicted.parked, "exact": true },
        }),
    );
    record(&config.budget, &intent).await.map_err(|e| {
        anyhow::anyhow!("nothing moved: the replay's intent could not be audited: {e:#}")
    })?;
    let budget = FleetBudget::from_config(&config.budget).await?;
    let breakers = Breakers::from_config(&config.budget)?;
    let mut paced = PacedMoves::new(Some(budget.clone()), breakers, options);
    let mut out = ReplayOutput::default();
    let stopped = move_entries(&store, &lists, options, &mut paced, &mut out)
        .await
        .err();
    let _ = budget.shutdown().await;
    let report = paced.report();
    out.held_breaker_secs = report.held_breaker.as_secs_f64();
    out.held_frozen_secs = report.held_frozen.as_secs_f64();
    out.slowdowns = report.slowdowns;
    out.lowest_rate = report.lowest_rate.map(|r| r.per_sec());
    out.highest_rate = report.highest_rate.map(|r| r.per_sec());
    out.reached_rate_secs = report.reached_rate.map(|d| d.as_secs_f64());
    out.bullmq_queue = Some(queue.to_owned());
    out.already_moved = Some(0);
    out.in_doubt = Some(0);
    let after = lists.lengths(&store).await.unwrap_or(Value::Null);
    out.bullmq_pending = after.get("pending_replay").and_then(Value::as_u64);
    let mut after_entry = after.clone();
    if let Some(o) = after_entry.as_object_mut() {
        o.insert("selected".into(), selected.into());
        for (k, v) in [
            ("moved", out.moved),
            ("parked", out.parked),
            ("skipped", out.skipped),
            ("failed", out.failed),
        ] {
            o.insert(k.into(), v.into());
        }
    }
    let how = match &stopped {
        None => "completed".to_owned(),
        Some(e) => format!(
            "failed: {}",
            fleet_budget::redact::redact_text(&format!("{e:#}"))
        ),
    };
    let entry = audit::ended(
        AuditEntry::new(
            &run.trail.actor(),
            BULLMQ_REPLAY,
            dependency,
            run.trail.note(),
        )
        .with_before_after(&before, &after_entry),
        &run_id,
        &how,
    );
    if let Some(e) = stopped {
        if let Err(a) = record(&config.budget, &entry).await {
            eprintln!("budgetctl: {a:#}");
        }
        return Err(e);
    }
    finish(&out, Some(entry), run.json, config, queue).await
}

/// Counts what a run would do, reading the kept list a page at a time (oldest first, as a run
/// reads it), changing nothing.
async fn dry_run(
    store: &RedisStore,
    lists: &Lists,
    options: &ReplayOptions,
) -> anyhow::Result<ReplayOutput> {
    let total: i64 = store
        .query_repeatable(redis::cmd("LLEN").arg(&lists.kept))
        .await
        .map_err(|e| anyhow::anyhow!("LLEN {}: {e}", lists.kept))?;
    let mut out = ReplayOutput {
        total: u64::try_from(total).unwrap_or(0),
        ..ReplayOutput::default()
    };
    let limit = options.limit.unwrap_or(u64::MAX);
    // From the right end: index -1 is the oldest.
    let mut end = -1_i64;
    while -end <= total {
        let start = (end - PAGE + 1).max(-total);
        let page: Vec<String> = store
            .query_repeatable(redis::cmd("LRANGE").arg(&lists.kept).arg(start).arg(end))
            .await
            .map_err(|e| anyhow::anyhow!("LRANGE {}: {e}", lists.kept))?;
        if page.is_empty() {
            break;
        }
        for raw in page.iter().rev() {
            match classify(raw, options) {
                Class::Move(_) if out.moved < limit => {
                    out.matched += 1;
                    out.moved += 1;
                }
                Class::Move(_) | Class::Skip => out.skipped += 1,
                Class::Park(_) => {
                    out.matched += 1;
                    out.parked += 1;
                    if read_entry(raw).is_err() {
                        out.malformed += 1;
                    }
                }
                Class::Malformed => {
                    out.skipped += 1;
                    out.malformed += 1;
                }
            }
        }
        end = start - 1;
    }
    Ok(out)
}

/// Moves the selected entries (see the module's documentation), counting in `out`; on an
/// error, `out` holds what was done before it.
async fn move_entries(
    store: &RedisStore,
    lists: &Lists,
    options: &ReplayOptions,
    paced: &mut PacedMoves,
    out: &mut ReplayOutput,
) -> anyhow::Result<()> {
    let total: u64 = store
        .query_repeatable(redis::cmd("LLEN").arg(&lists.kept))
        .await
        .map_err(|e| anyhow::anyhow!("LLEN {}: {e}", lists.kept))?;
    out.total = total;
    let limit = options.limit.unwrap_or(u64::MAX);
    let terminal = std::io::stderr().is_terminal();
    let every = if terminal {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(2)
    };
    let started = Instant::now();
    let mut last_line = Instant::now();
    let mut seen = 0_u64;
    while seen < total {
        if out.moved >= limit {
            out.skipped += total - seen;
            break;
        }
        let raw: Option<String> = store
            .query_repeatable(redis::cmd("LINDEX").arg(&lists.kept).arg(-1))
            .await
            .map_err(|e| anyhow::anyhow!("LINDEX {}: {e}", lists.kept))?;
        // Emptied by another run (or by hand) meanwhile.
        let Some(raw) = raw else { break };
        seen += 1;
        let class = classify(&raw, options);
        let to = match &class {
            Class::Move(dependency) => {
                let dependency = dependency.clone();
                paced.turn(&dependency, |_| {}).await;
                &lists.replay
            }
            Class::Park(why) => {
                tracing::warn!(why = %why, "a kept BullMQ job is parked, not replayed");
                &lists.parked
            }
            Class::Malformed | Class::Skip => &lists.kept,
        };
        // The move itself: never repeated (a move whose answer was lost may have happened).
        let moved: Result<Option<String>, _> = store
            .query(
                redis::cmd("LMOVE")
                    .arg(&lists.kept)
                    .arg(to)
                    .arg("RIGHT")
                    .arg("LEFT"),
            )
            .await;
        match moved {
            Ok(Some(m)) if m == raw => {}
            Ok(Some(_)) => {
                out.failed += 1;
                anyhow::bail!(
                    "another replay of this BullMQ queue took its entries meanwhile (one at a time): stopped; what this run moved is counted"
                );
            }
            Ok(None) => break,
            Err(e) => {
                out.failed += 1;
                anyhow::bail!(
                    "LMOVE {} {to}: {e} (its entry is in one of the two lists, not both)",
                    lists.kept
                );
            }
        }
        match class {
            Class::Move(_) => {
                out.matched += 1;
                out.moved += 1;
            }
            Class::Park(_) => {
                out.matched += 1;
                out.parked += 1;
                if read_entry(&raw).is_err() {
                    out.malformed += 1;
                }
                // Bounded: the newest kept. Repeatable.
                let _: Result<(), _> = store
                    .query_repeatable(
                        redis::cmd("LTRIM")
                            .arg(&lists.parked)
                            .arg(0)
                            .arg(PARKED_MAX - 1),
                    )
                    .await;
            }
            Class::Malformed => {
                out.skipped += 1;
                out.malformed += 1;
            }
            Class::Skip => out.skipped += 1,
        }
        if last_line.elapsed() >= every || seen == total {
            last_line = Instant::now();
            eprintln!(
                "replay {:>5.1}s: read {}/{} | moved {} | parked {} | skipped {}{}",
                started.elapsed().as_secs_f64(),
                thousands(seen),
                thousands(total),
                thousands(out.moved),
                thousands(out.parked),
                thousands(out.skipped),
                loop_state(paced.progress()),
            );
        }
    }
    Ok(())
}

/// Prints the outcome (JSON or the table) and records its end entry.
async fn finish(
    out: &ReplayOutput,
    entry: Option<AuditEntry>,
    json: bool,
    config: &WorkerConfig,
    queue: &str,
) -> anyhow::Result<()> {
    if json {
        print_json(JSON_SCHEMA_VERSION, out)?;
    } else {
        let verb = if out.dry_run { "would be " } else { "" };
        let rows = vec![
            vec![
                format!("kept jobs of BullMQ queue {}", escape_text(queue)),
                thousands(out.total),
            ],
            vec!["matched".to_owned(), thousands(out.matched)],
            vec![
                format!("{verb}moved to the queue's receiver"),
                thousands(out.moved),
            ],
            vec![
                format!("{verb}parked (looping or malformed)"),
                thousands(out.parked),
            ],
            vec!["skipped (filter)".to_owned(), thousands(out.skipped)],
        ];
        out!("{}", table(&rows));
        if let Some(n) = out.bullmq_pending.filter(|n| *n > 0) {
            outln!(
                "{} jobs wait for the queue's receiver (`ReplayReceiver`, or `npx fleet-budget-bullmq receive`) to put them back",
                thousands(n)
            );
        }
        print_holds(out);
    }
    if let Some(entry) = entry {
        record(&config.budget, &entry).await?;
    }
    Ok(())
}
