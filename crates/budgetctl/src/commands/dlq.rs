//! `budgetctl dlq stats`: what waits in the dead-letter and parked queues.

use clap::Subcommand;
use fleet_budget::clock::now_ms;
use fleet_budget::redact::redact_url;
use fleet_budget_amqp::{AmqpError, ReplayOptions, Replayer, Topology, WorkerConfig};
use serde::Serialize;

use crate::amqp_conn::broker_error;
use crate::args::JsonArg;
use crate::output::{print_json, table_aligned, thousands};

/// `dlq` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// Dead-letter and parked queue depth, counts by dependency × reason, oldest message age.
    Stats(JsonArg),
}

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
pub(crate) async fn stats(config: &WorkerConfig, json: bool) -> anyhow::Result<()> {
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
            out!("{}", table_aligned(&rows, &[0, 1]));
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
    let now = now_ms();
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
