//! `budgetctl dlq stats` and `dlq peek`: what waits in the dead-letter and parked queues, in
//! counts and message by message. Both read through the non-destructive
//! `fleet_budget_amqp::replay::inspect`: looking never brings a message closer to deletion.

use clap::{Args, Subcommand};
use fleet_budget::clock::now_ms;
use fleet_budget::redact::redact_url;
use fleet_budget::{DeadLetterReason, Dependency};
use fleet_budget_amqp::replay::{Peek, QueuedMessage, peek_queue};
use fleet_budget_amqp::{AmqpError, ReplayFilter, ReplayOptions, Replayer, Topology, WorkerConfig};
use serde::Serialize;

use crate::amqp_conn::broker_error;
use crate::args::JsonArg;
use crate::exit::usage;
use crate::output::{print_json, table_aligned, thousands};
use crate::when::rfc3339_ms;

/// The version of `dlq stats`'s `--json` shape (`docs/schemas/dlq-stats.schema.json`).
const STATS_JSON_VERSION: u32 = 1;
/// The version of the message list `dlq peek` and `parked list` print as JSON
/// (`docs/schemas/dlq-peek.schema.json`, `parked-list.schema.json`).
const PEEK_JSON_VERSION: u32 = 1;

/// `dlq` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// Dead-letter and parked queue depth, counts by dependency × reason, oldest message age.
    Stats(JsonArg),
    /// Dead letters one by one: message id, task, dependency, reason, attempts, when, and the
    /// error (redacted). Messages are read and put back as fresh copies: looking never brings
    /// one closer to deletion.
    Peek(PeekArgs),
}

/// Which messages a `dlq peek` or `parked` command is about; empty selects all of them.
#[derive(Debug, Args)]
pub(crate) struct MessageFilterArgs {
    /// Only this dependency.
    #[arg(long)]
    pub(crate) dependency: Option<String>,
    /// Only this reason (`budget_exhausted`, `budget_frozen`, `attempts_exhausted`,
    /// `non_retryable`).
    #[arg(long, value_parser = reason)]
    pub(crate) reason: Option<String>,
    /// Only jobs of this task.
    #[arg(long)]
    pub(crate) task: Option<String>,
}

impl MessageFilterArgs {
    /// The library's filter; a bad dependency name is a usage error.
    pub(crate) fn filter(&self) -> anyhow::Result<ReplayFilter> {
        if let Some(d) = &self.dependency {
            Dependency::new(d)
                .map_err(|e| usage(format!("--dependency {d:?}: a dependency name {e}")))?;
        }
        Ok(ReplayFilter {
            dependency: self.dependency.clone(),
            reason: self.reason.as_deref().and_then(DeadLetterReason::parse),
            task: self.task.clone(),
            ..ReplayFilter::default()
        })
    }
}

/// Parses `--reason`.
pub(crate) fn reason(s: &str) -> Result<String, String> {
    match DeadLetterReason::parse(s) {
        Some(r) => Ok(r.as_str().to_owned()),
        None => Err(format!(
            "`{s}` is not a dead-letter reason (budget_exhausted, budget_frozen, attempts_exhausted, non_retryable)"
        )),
    }
}

/// `dlq peek`.
#[derive(Debug, Args)]
pub(crate) struct PeekArgs {
    /// Show at most this many messages (the read stops there).
    #[arg(long, allow_negative_numbers = true, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(crate) limit: u64,
    #[command(flatten)]
    pub(crate) filter: MessageFilterArgs,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// One message as `dlq peek` and `parked list` print it.
#[derive(Debug, Serialize)]
pub(crate) struct MessageView {
    message_id: Option<String>,
    task: Option<String>,
    dependency: Option<String>,
    reason: Option<String>,
    attempts: Option<u32>,
    replays: u32,
    /// Dead-lettered at, RFC 3339.
    dead_lettered_at: Option<String>,
    dead_lettered_ms: Option<u64>,
    error_class: Option<String>,
    /// The error text, secrets redacted.
    error: Option<String>,
    park_reason: Option<String>,
    parked_at: Option<String>,
    /// Why the dead-letter headers cannot be read, when they cannot.
    unreadable: Option<String>,
}

impl From<QueuedMessage> for MessageView {
    fn from(m: QueuedMessage) -> Self {
        Self {
            message_id: m.message_id,
            task: m.task,
            dependency: m.dependency,
            reason: m.reason,
            attempts: m.attempts,
            replays: m.replays,
            dead_lettered_at: m.dead_lettered_ms.map(rfc3339_ms),
            dead_lettered_ms: m.dead_lettered_ms,
            error_class: m.error_class,
            error: m.error,
            park_reason: m.park_reason,
            parked_at: m.parked_ms.map(rfc3339_ms),
            unreadable: m.unreadable,
        }
    }
}

/// What `dlq peek` and `parked list` print as JSON.
#[derive(Debug, Serialize)]
pub(crate) struct PeekOutput {
    queue: String,
    /// Messages in the queue.
    depth: u64,
    /// Messages read to find these (the read stops at `--limit`).
    read: u64,
    /// Put back, but the broker did not confirm the original's removal: possible duplicates.
    uncertain: u64,
    messages: Vec<MessageView>,
}

/// `budgetctl dlq peek`.
pub(crate) async fn peek(config: &WorkerConfig, args: &PeekArgs) -> anyhow::Result<()> {
    let topology = Topology::new(&config.amqp);
    show_messages(config, &topology.dead_queue, args).await
}

/// Shows up to `--limit` selected messages of `queue` (read and put back).
pub(crate) async fn show_messages(
    config: &WorkerConfig,
    queue: &str,
    args: &PeekArgs,
) -> anyhow::Result<()> {
    let filter = args.filter.filter()?;
    let Peek {
        total,
        seen,
        messages,
        uncertain,
    } = peek_queue(config.amqp.connection(), queue, &filter, args.limit)
        .await
        .map_err(|e| broker_error(config, &e))?;
    let out = PeekOutput {
        queue: queue.to_owned(),
        depth: total,
        read: seen,
        uncertain,
        messages: messages.into_iter().map(MessageView::from).collect(),
    };
    if args.json {
        return print_json(PEEK_JSON_VERSION, &out);
    }
    outln!(
        "{}: {} messages; {} shown (of {} read, put back)",
        out.queue,
        thousands(out.depth),
        out.messages.len(),
        thousands(out.read)
    );
    if out.uncertain > 0 {
        outln!(
            "warning: the broker did not answer behind the acks; {} of the messages read may now be there twice",
            thousands(out.uncertain)
        );
    }
    if out.messages.is_empty() {
        return Ok(());
    }
    let parked = out.messages.iter().any(|m| m.park_reason.is_some());
    let mut header = vec![
        "message id",
        "task",
        "dependency",
        "reason",
        "attempts",
        "dead-lettered",
    ];
    if parked {
        header.push("parked because");
    }
    header.push("error");
    let mut rows = vec![header.into_iter().map(str::to_owned).collect::<Vec<_>>()];
    let now = now_ms();
    for m in &out.messages {
        let cell = |v: &Option<String>| printable(v.as_deref().unwrap_or("-"), 40);
        let mut row = vec![
            cell(&m.message_id),
            cell(&m.task),
            cell(&m.dependency),
            cell(&m.reason),
            m.attempts.map_or_else(|| "-".to_owned(), |a| a.to_string()),
            m.dead_lettered_ms.map_or_else(
                || "-".to_owned(),
                #[allow(clippy::cast_precision_loss)]
                |t| human_age(now.saturating_sub(t) as f64 / 1000.0),
            ),
        ];
        if parked {
            row.push(printable(m.park_reason.as_deref().unwrap_or("-"), 60));
        }
        let error = match (&m.error_class, &m.error, &m.unreadable) {
            (_, _, Some(why)) => format!("(unreadable headers: {why})"),
            (Some(class), Some(text), None) => format!("{class}: {text}"),
            (None, Some(text), None) => text.clone(),
            (Some(class), None, None) => class.clone(),
            (None, None, None) => "-".to_owned(),
        };
        row.push(printable(&error, 80));
        rows.push(row);
    }
    let left: Vec<usize> = (0..rows.first().map_or(0, Vec::len)).collect();
    out!("{}", table_aligned(&rows, &left));
    Ok(())
}

/// Text from a message as a table cell: control and bidirectional control characters shown as
/// `\u{…}` (a hostile producer must not drive the terminal or reorder what it shows), at most
/// `max` characters.
fn printable(text: &str, max: usize) -> String {
    let clean = fleet_budget::printable::escape_text(text);
    if clean.chars().count() > max {
        let mut short: String = clean.chars().take(max.saturating_sub(1)).collect();
        short.push('…');
        short
    } else {
        clean.into_owned()
    }
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
/// of the dead-letter and parked queues. Messages are read and put back as fresh copies.
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
        return print_json(STATS_JSON_VERSION, &stats);
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
                    format!("  {}", printable(&d.dependency, 200)),
                    printable(&d.reason, 40),
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

pub(crate) fn human_age(secs: f64) -> String {
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
    let report = Replayer::new(config.amqp.connection(), topology.clone(), None)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_hides_control_characters_and_shortens() {
        assert_eq!(printable("a\x1b[2Jb\n", 40), "a\\u{1b}[2Jb\\u{a}");
        assert_eq!(printable("pay\u{202E}lanoitan", 40), "pay\\u{202e}lanoitan");
        assert_eq!(printable("abcdef", 4), "abc…");
        assert_eq!(printable("abcd", 4), "abcd");
    }
}
