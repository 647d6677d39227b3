//! The RabbitMQ commands over `fleet-budget-amqp`: `replay`, `dlq stats` and `migrate`.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use fleet_budget::redact::{redact_text, redact_url};
use fleet_budget::{DeadLetterReason, Dependency, FleetBudget};
use fleet_budget_amqp::headers;
use fleet_budget_amqp::{
    AmqpError, Migrations, ReplayFilter, ReplayOptions, ReplayProgress, Replayer, StepState,
    Topology, WorkerConfig,
};
use serde::Serialize;

use crate::cli::{MigrateArgs, ReplayArgs};
use crate::exit::usage;
use crate::output::{print_json, table, thousands};

/// A broker failure as a runtime error (exit 1) that names the URL, password redacted, and
/// how to start a broker when it is a connection failure.
pub(crate) fn broker_error(config: &WorkerConfig, e: &AmqpError) -> anyhow::Error {
    let text = redact_text(&e.to_string());
    if e.is_connection_error() {
        anyhow::anyhow!(
            "RabbitMQ at {} does not answer: {text}. Start one with `docker compose up -d` (repository root) or point --amqp-url / FLEET_BUDGET_AMQP_URL at yours",
            redact_url(&config.amqp.url)
        )
    } else {
        anyhow::anyhow!("RabbitMQ at {}: {text}", redact_url(&config.amqp.url))
    }
}

// --- migrate ------------------------------------------------------------------------------------

#[derive(Debug, Serialize)]
struct MigrateStep {
    version: u32,
    object: String,
    state: &'static str,
}

#[derive(Debug, Serialize)]
struct MigrateReport {
    amqp: String,
    prefix: String,
    dry_run: bool,
    created: usize,
    steps: Vec<MigrateStep>,
}

/// `budgetctl migrate [--dry-run]`: applies the embedded migrations (idempotently).
pub(crate) async fn migrate(config: &WorkerConfig, args: &MigrateArgs) -> anyhow::Result<()> {
    let migrations =
        Migrations::embedded().map_err(|e| anyhow::anyhow!("embedded migrations: {e}"))?;
    let report =
        fleet_budget_amqp::migrate(&config.amqp.url, &config.amqp, &migrations, args.dry_run)
            .await
            .map_err(|e| broker_error(config, &e))?;
    let out = MigrateReport {
        amqp: redact_url(&config.amqp.url),
        prefix: config.amqp.prefix.clone(),
        dry_run: report.dry_run,
        created: report.created(),
        steps: report
            .steps
            .iter()
            .map(|(op, state)| MigrateStep {
                version: op.version,
                object: op.object.to_string(),
                state: state.as_str(),
            })
            .collect(),
    };
    if args.json {
        return print_json(&out);
    }
    outln!("RabbitMQ at {} (names under `{}`)", out.amqp, out.prefix);
    out!("{report}");
    let unchanged = report
        .steps
        .iter()
        .filter(|(_, s)| matches!(s, StepState::Unchanged))
        .count();
    if report.dry_run {
        outln!(
            "{} objects would be created, {unchanged} exist already",
            out.created
        );
    } else {
        outln!(
            "{} objects created, {unchanged} existed already",
            out.created
        );
    }
    Ok(())
}

// --- dlq stats ----------------------------------------------------------------------------------

#[derive(Debug, Default, Serialize)]
struct QueueStats {
    queue: String,
    depth: u64,
    /// Messages read to count them (all of them unless others consumed meanwhile).
    read: u64,
    by_dependency_reason: Vec<DependencyReason>,
    /// Messages without readable dead-letter headers.
    malformed: u64,
    /// Age of the oldest message, by its dead-letter time.
    oldest_age_secs: Option<f64>,
}

#[derive(Debug, Serialize)]
struct DependencyReason {
    dependency: String,
    reason: String,
    count: u64,
}

#[derive(Debug, Serialize)]
struct DlqStats {
    amqp: String,
    dead_letter: QueueStats,
    parked: QueueStats,
}

/// `budgetctl dlq stats`: depth, counts by dependency × reason, and the oldest message's age,
/// of the dead-letter and parked queues. Messages are read and put back (nack with requeue).
pub(crate) async fn dlq_stats(config: &WorkerConfig, json: bool) -> anyhow::Result<()> {
    let topology = Topology::new(&config.amqp);
    // The replayer's dry run reads every message once, counts it, and puts it back.
    let options = ReplayOptions::new(config);
    let dead = queue_stats(config, &topology, &topology.dead_queue, &options).await;
    let parked = queue_stats(config, &topology, &topology.parked_queue, &options).await;
    let stats = DlqStats {
        amqp: redact_url(&config.amqp.url),
        dead_letter: dead.map_err(|e| broker_error(config, &e))?,
        parked: parked.map_err(|e| broker_error(config, &e))?,
    };
    if json {
        return print_json(&stats);
    }
    outln!("RabbitMQ at {}", stats.amqp);
    for q in [&stats.dead_letter, &stats.parked] {
        let age = q.oldest_age_secs.map_or_else(|| "-".to_owned(), human_age);
        outln!("{}: {} messages, oldest {age}", q.queue, thousands(q.depth));
        if !q.by_dependency_reason.is_empty() {
            let mut rows = vec![vec![
                "  dependency".to_owned(),
                "reason".to_owned(),
                "count".to_owned(),
            ]];
            for d in &q.by_dependency_reason {
                rows.push(vec![
                    format!("  {}", d.dependency),
                    d.reason.clone(),
                    thousands(d.count),
                ]);
            }
            out!("{}", crate::output::table_aligned(&rows, &[0, 1]));
        }
        if q.malformed > 0 {
            outln!("  malformed (no dead-letter headers): {}", q.malformed);
        }
    }
    Ok(())
}

fn human_age(secs: f64) -> String {
    if secs < 120.0 {
        format!("{secs:.0}s ago")
    } else if secs < 7200.0 {
        format!("{:.0}m ago", secs / 60.0)
    } else {
        format!("{:.1}h ago", secs / 3600.0)
    }
}

async fn queue_stats(
    config: &WorkerConfig,
    topology: &Topology,
    queue: &str,
    options: &ReplayOptions,
) -> Result<QueueStats, AmqpError> {
    let report = Replayer::new(config.amqp.url.clone(), topology.clone(), None)
        .source_queue(queue)
        .dry_run(options)
        .await?;
    let now = headers::now_ms();
    #[allow(clippy::cast_precision_loss)]
    let oldest_age_secs = report
        .oldest_dead_lettered_ms
        .map(|t| now.saturating_sub(t) as f64 / 1000.0);
    Ok(QueueStats {
        queue: queue.to_owned(),
        depth: report.total,
        read: report.seen,
        by_dependency_reason: report
            .by_dependency_reason
            .into_iter()
            .map(|((dependency, reason), count)| DependencyReason {
                dependency,
                reason,
                count,
            })
            .collect(),
        malformed: report.malformed,
        oldest_age_secs,
    })
}

// --- replay -------------------------------------------------------------------------------------

#[derive(Debug, Serialize)]
struct ReplayOutput {
    matched: u64,
    moved: u64,
    parked: u64,
    skipped: u64,
    failed: u64,
    dry_run: bool,
    /// Messages in the dead-letter queue when the run started (the bound).
    total: u64,
    /// Of the parked, those without readable dead-letter headers.
    malformed: u64,
    paused_secs: f64,
}

/// Parses `--since`: Unix seconds, or an age like `90s`, `30m`, `2h`, `1d`. Returns Unix ms.
pub(crate) fn parse_since(text: &str, now_ms: u64) -> Result<u64, String> {
    let t = text.trim();
    let unit = |suffix: char, ms: u64| -> Option<Result<u64, String>> {
        t.strip_suffix(suffix).map(|n| {
            n.parse::<u64>()
                .map_err(|_| format!("`{text}` is not a number of {suffix}"))
                .map(|n| now_ms.saturating_sub(n.saturating_mul(ms)))
        })
    };
    if let Some(r) = unit('s', 1000)
        .or_else(|| unit('m', 60_000))
        .or_else(|| unit('h', 3_600_000))
        .or_else(|| unit('d', 86_400_000))
    {
        return r;
    }
    t.parse::<u64>()
        .map(|secs| secs.saturating_mul(1000))
        .map_err(|_| format!("`{text}` is neither Unix seconds nor an age like 90s, 30m, 2h, 1d"))
}

/// `budgetctl replay`: the library replayer, with a progress display.
pub(crate) async fn replay(config: &WorkerConfig, args: &ReplayArgs) -> anyhow::Result<()> {
    let dependency = Dependency::new(&args.dependency).map_err(|e| {
        usage(format!(
            "--dependency {:?}: a dependency name {e}",
            args.dependency
        ))
    })?;
    let since_ms = match &args.since {
        Some(s) => {
            Some(parse_since(s, headers::now_ms()).map_err(|e| usage(format!("--since {e}")))?)
        }
        None => None,
    };
    let mut options = ReplayOptions::new(config);
    options.filter = ReplayFilter {
        dependency: Some(dependency.to_string()),
        reason: args.reason.as_deref().and_then(DeadLetterReason::parse),
        since_ms,
        ..ReplayFilter::default()
    };
    options.rate = Some(f64::from(args.rate));
    options.limit = args.limit;
    let topology = Topology::new(&config.amqp);
    if args.dry_run {
        let r = Replayer::new(config.amqp.url.clone(), topology, None)
            .dry_run(&options)
            .await
            .map_err(|e| broker_error(config, &e))?;
        let out = ReplayOutput {
            matched: r.would_move + r.would_park_looping,
            moved: r.would_move,
            parked: r.would_park_looping + r.malformed,
            skipped: r.skipped,
            failed: 0,
            dry_run: true,
            total: r.total,
            malformed: r.malformed,
            paused_secs: 0.0,
        };
        if args.json {
            return print_json(&out);
        }
        outln!(
            "dry run: {} dead letters in the queue, nothing moved",
            thousands(r.total)
        );
        let mut rows = vec![vec![
            "dependency".to_owned(),
            "reason".to_owned(),
            "matching".to_owned(),
        ]];
        for ((d, reason), n) in &r.by_dependency_reason {
            rows.push(vec![d.clone(), reason.clone(), thousands(*n)]);
        }
        if rows.len() > 1 {
            out!("{}", crate::output::table_aligned(&rows, &[0, 1]));
        }
        print_replay(&out);
        return Ok(());
    }
    // The budget lets the replayer pause while the dependency's budget is exhausted again.
    let budget = FleetBudget::from_config(&config.budget).await?;
    let replayer = Replayer::new(config.amqp.url.clone(), topology, Some(budget.clone()));
    let terminal = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut last_line = Instant::now();
    let report = replayer
        .run(&options, |p: &ReplayProgress| {
            let due = if terminal { Duration::from_millis(100) } else { Duration::from_secs(2) };
            if last_line.elapsed() < due && p.seen < p.total {
                return;
            }
            last_line = Instant::now();
            let paused = p.paused_on.as_ref().map(|d| format!(" | PAUSED: budget of {d} exhausted")).unwrap_or_default();
            let line = format!(
                "replay {:>5.1}s: read {}/{} | moved {} | parked {} | skipped {} | failed {}{paused}",
                started.elapsed().as_secs_f64(),
                thousands(p.seen),
                thousands(p.total),
                thousands(p.moved),
                thousands(p.parked),
                thousands(p.skipped),
                thousands(p.failed)
            );
            let mut err = std::io::stderr().lock();
            let _ = if terminal { write!(err, "\r\x1b[2K{line}") } else { writeln!(err, "{line}") };
            let _ = err.flush();
        })
        .await;
    if terminal {
        eprintln!();
    }
    let _ = budget.shutdown().await;
    let r = report.map_err(|e| broker_error(config, &e))?;
    let out = ReplayOutput {
        matched: r.matched,
        moved: r.moved,
        parked: r.parked,
        skipped: r.skipped,
        failed: r.failed,
        dry_run: false,
        total: r.total,
        malformed: r.malformed,
        paused_secs: r.paused.as_secs_f64(),
    };
    if args.json {
        return print_json(&out);
    }
    print_replay(&out);
    if out.failed > 0 {
        anyhow::bail!(
            "{} copies were not confirmed by the broker; they stay in the dead-letter queue",
            out.failed
        );
    }
    Ok(())
}

fn print_replay(out: &ReplayOutput) {
    let verb = if out.dry_run { "would be " } else { "" };
    let rows = vec![
        vec!["in the dead-letter queue".to_owned(), thousands(out.total)],
        vec!["matched".to_owned(), thousands(out.matched)],
        vec![format!("{verb}moved back"), thousands(out.moved)],
        vec![
            format!("{verb}parked (looping or malformed)"),
            thousands(out.parked),
        ],
        vec!["skipped (filter)".to_owned(), thousands(out.skipped)],
        vec!["failed (not confirmed)".to_owned(), thousands(out.failed)],
    ];
    out!("{}", table(&rows));
    if out.paused_secs > 0.0 {
        outln!(
            "paused {:.1}s while the budget was exhausted",
            out.paused_secs
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
        assert!(parse_since("yesterday", now).is_err());
        assert!(parse_since("-5m", now).is_err());
    }
}
