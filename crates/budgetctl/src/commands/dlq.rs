//! `budgetctl dlq stats` and `dlq peek`: what waits in the dead-letter and parked queues, in
//! counts and message by message. Stats read no message: the depths and the dead-letter index
//! (`fleet_budget_amqp::dead_letters`). Peek reads through the non-destructive
//! `fleet_budget_amqp::replay::inspect`: looking never brings a message closer to deletion.

use std::collections::BTreeMap;
use std::sync::Arc;

use clap::{Args, Subcommand};
use fleet_budget::clock::now_ms;
use fleet_budget::control::DeadLetterIndex;
use fleet_budget::redact::redact_url;
use fleet_budget::store::RedisStore;
use fleet_budget::{DeadLetterReason, Dependency};
use fleet_budget_amqp::dead_letters::UNREADABLE;
use fleet_budget_amqp::replay::{Peek, QueuedMessage, SourceQueue, peek_queue};
use fleet_budget_amqp::{AmqpError, ReplayFilter, Replayer, Topology, WorkerConfig};
use serde::Serialize;

use crate::amqp_conn::broker_error;
use crate::args::JsonArg;
use crate::exit::usage;
use crate::output::{print_json, table_aligned, thousands};
use crate::when::rfc3339_ms;

/// The version of `dlq stats`'s `--json` shape (`docs/schemas/dlq-stats.schema.json`).
const STATS_JSON_VERSION: u32 = 1;
/// The version of `dlq reindex`'s `--json` shape (`docs/schemas/dlq-reindex.schema.json`).
const REINDEX_JSON_VERSION: u32 = 1;
/// The version of the message list `dlq peek` and `parked list` print as JSON
/// (`docs/schemas/dlq-peek.schema.json`, `parked-list.schema.json`).
const PEEK_JSON_VERSION: u32 = 1;

/// `dlq` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// Dead-letter and parked queue depth, counts by dependency × reason × error class, oldest
    /// message age: from the dead-letter index, reading no message (an estimate, labelled, when
    /// the index and the queue disagree).
    Stats(JsonArg),
    /// Dead letters one by one: message id, task, dependency, reason, attempts, when, and the
    /// error (redacted). Messages are read and put back as fresh copies: looking never brings
    /// one closer to deletion.
    Peek(PeekArgs),
    /// Rebuild the dead-letter index of the dead-letter and parked queues from the queues
    /// themselves: each message is read once and put back as a copy (about 1 ms a message).
    /// Once after upgrading a topology whose dead letters predate the index, or when `dlq stats`
    /// says the index and a queue disagree.
    Reindex(JsonArg),
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
    /// Only messages of this error class.
    #[arg(long, value_name = "CLASS")]
    pub(crate) error_class: Option<String>,
    /// With another filter, also the messages whose dead-letter headers cannot be read (no
    /// filter selects them otherwise; no filter at all selects everything).
    #[arg(long)]
    pub(crate) include_malformed: bool,
    /// Only messages dead-lettered at or after this time (Unix seconds, RFC 3339, or an age
    /// like `30m`).
    #[arg(long, value_name = "T")]
    pub(crate) since: Option<String>,
    /// Only messages dead-lettered before this time (same forms as `--since`).
    #[arg(long, value_name = "T")]
    pub(crate) until: Option<String>,
    /// Only the message with this id.
    #[arg(long, value_name = "ID")]
    pub(crate) message_id: Option<String>,
}

impl MessageFilterArgs {
    /// The library's filter; a bad dependency name is a usage error.
    pub(crate) fn filter(&self) -> anyhow::Result<ReplayFilter> {
        if let Some(d) = &self.dependency {
            Dependency::new(d)
                .map_err(|e| usage(format!("--dependency {d:?}: a dependency name {e}")))?;
        }
        let time = |t: &Option<String>, flag: &str| -> anyhow::Result<Option<u64>> {
            t.as_deref()
                .map(|t| {
                    crate::commands::replay::parse_since(t, now_ms())
                        .map_err(|e| usage(format!("{flag} {e}")))
                })
                .transpose()
        };
        Ok(ReplayFilter {
            since_ms: time(&self.since, "--since")?,
            until_ms: time(&self.until, "--until")?,
            message_id: self.message_id.clone(),
            dependency: self.dependency.clone(),
            reason: self.reason.as_deref().and_then(DeadLetterReason::parse),
            task: self.task.clone(),
            error_class: self.error_class.clone(),
            malformed: self.include_malformed,
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
    /// Ready messages, from the broker (exact).
    depth: u64,
    /// Messages read to count them: 0, the counts come from the dead-letter index.
    read: u64,
    by_dependency_reason: Vec<DependencyReason>,
    /// Messages without readable dead-letter headers (parked ones the index counts; in the
    /// dead-letter queue they are among `difference`).
    malformed: u64,
    /// Age of the oldest message, by its dead-letter time (to the minute).
    oldest_age_secs: Option<f64>,
    /// Messages the dead-letter index counts.
    indexed: u64,
    /// `depth - indexed`: messages the index does not know (positive), or counts of messages
    /// no longer ready (negative).
    difference: i64,
    /// Whether every count below is exact (the index agrees with the depth).
    exact: bool,
    /// Why the counts are an estimate, when they are.
    estimate: Option<String>,
    /// Counts by dependency × reason × error class, largest first.
    groups: Vec<GroupStats>,
}

#[derive(Debug, Serialize)]
struct DependencyReason {
    dependency: String,
    reason: String,
    count: u64,
}

#[derive(Debug, Serialize)]
struct GroupStats {
    dependency: String,
    reason: String,
    error_class: String,
    count: u64,
    oldest_age_secs: Option<f64>,
}

#[derive(Debug, Serialize)]
struct DlqStats {
    amqp: String,
    dead_letter: QueueStats,
    parked: QueueStats,
}

/// `budgetctl dlq stats`: depth, counts by dependency × reason × error class, and the oldest
/// message's age, of the dead-letter and parked queues, from their depths (passive declares)
/// and the dead-letter index in Redis: no message is read, at any depth. Labelled an estimate,
/// with the difference and why, when the index and the queue disagree.
pub(crate) async fn stats(config: &WorkerConfig, json: bool) -> anyhow::Result<()> {
    let topology = Topology::new(&config.amqp);
    let index = dead_letter_index(config);
    let dead = queue_stats(config, &topology, false, index.clone()).await;
    let parked = queue_stats(config, &topology, true, index).await;
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
        let exact = if q.exact { "exact" } else { "estimate" };
        outln!(
            "{}: {} messages, oldest {age} ({exact}: {} counted by the index)",
            q.queue,
            thousands(q.depth),
            thousands(q.indexed)
        );
        if let Some(why) = &q.estimate {
            outln!("  estimate: {why}");
        }
        if !q.groups.is_empty() {
            let mut rows = vec![vec![
                "  dependency".to_owned(),
                "reason".to_owned(),
                "error class".to_owned(),
                "count".to_owned(),
                "oldest".to_owned(),
            ]];
            for g in &q.groups {
                rows.push(vec![
                    format!("  {}", printable(&g.dependency, 200)),
                    printable(&g.reason, 40),
                    printable(
                        if g.error_class.is_empty() {
                            "-"
                        } else {
                            &g.error_class
                        },
                        60,
                    ),
                    thousands(g.count),
                    g.oldest_age_secs.map_or_else(|| "-".to_owned(), human_age),
                ]);
            }
            out!("{}", table_aligned(&rows, &[0, 1, 2]));
        }
        if q.malformed > 0 {
            outln!("  malformed (no dead-letter headers): {}", q.malformed);
        }
    }
    Ok(())
}

/// The dead-letter index in the configured fleet store, without a round trip (a Redis that
/// does not answer shows in the counts as an estimate, with its error); `None` for a
/// configuration it cannot be made from (said in the counts too).
pub(crate) fn dead_letter_index(config: &WorkerConfig) -> Option<DeadLetterIndex> {
    let budget = &config.budget;
    RedisStore::new_with_tls(
        crate::redis_conn::target(budget),
        &budget.redis.key_prefix,
        crate::redis_conn::cli_timeout(budget),
        &budget.redis.tls,
    )
    .ok()
    .map(|store| DeadLetterIndex::new(Arc::new(store)))
}

/// What `dlq reindex` (and `migrate`) prints as JSON, per queue.
#[derive(Debug, Serialize)]
pub(crate) struct ReindexedQueue {
    pub(crate) queue: String,
    /// Messages in the queue at the start.
    total: u64,
    /// Messages read and put back.
    read: u64,
    /// Messages the new index counts.
    pub(crate) indexed: u64,
    /// Rows of the new index.
    rows: u64,
    /// Put back, but possibly left beside their copy (the broker did not answer behind the acks).
    uncertain: u64,
}

#[derive(Debug, Serialize)]
struct ReindexOutput {
    dead_letter: ReindexedQueue,
    parked: ReindexedQueue,
}

/// For `budgetctl migrate`: indexes the dead-letter and parked queues that hold messages and
/// have no index yet (dead letters of a topology older than the index), once. Nothing when
/// Redis cannot be used (said on stderr: `dlq stats` then labels its counts an estimate).
pub(crate) async fn index_unindexed(config: &WorkerConfig) -> Vec<ReindexedQueue> {
    let topology = Topology::new(&config.amqp);
    let Some(index) = dead_letter_index(config) else {
        return Vec::new();
    };
    let mut done = Vec::new();
    for queue in SourceQueue::BOTH {
        let replayer = Replayer::of(queue, config.amqp.connection(), topology.clone(), None)
            .with_index(Some(index.clone()));
        let counts = match replayer.counts().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("budgetctl: dead-letter index not checked: {e}");
                continue;
            }
        };
        if let Some(e) = &counts.index_error {
            eprintln!(
                "budgetctl: the dead-letter index of {} cannot be read ({e}); run `budgetctl dlq reindex` once Redis answers",
                counts.queue
            );
            continue;
        }
        if counts.depth == 0 || counts.indexed() > 0 {
            continue;
        }
        match replayer.reindex().await {
            Ok(r) => done.push(ReindexedQueue {
                queue: counts.queue.clone(),
                total: r.total,
                read: r.seen,
                indexed: r.indexed,
                rows: r.rows,
                uncertain: r.uncertain,
            }),
            Err(e) => eprintln!(
                "budgetctl: the dead letters of {} were not indexed ({e}); run `budgetctl dlq reindex`",
                counts.queue
            ),
        }
    }
    done
}

/// `budgetctl dlq reindex`: rebuilds the index of both queues (see [`DlqCommand::Reindex`]).
pub(crate) async fn reindex(config: &WorkerConfig, json: bool) -> anyhow::Result<()> {
    let topology = Topology::new(&config.amqp);
    let store = crate::redis_conn::connect(
        &config.budget,
        crate::redis_conn::cli_timeout(&config.budget),
    )
    .await?;
    let index = Some(DeadLetterIndex::new(store));
    let mut done = Vec::new();
    for source in SourceQueue::BOTH {
        let queue = source.name(&topology);
        let r = Replayer::of(source, config.amqp.connection(), topology.clone(), None)
            .with_index(index.clone())
            .reindex()
            .await
            .map_err(|e| broker_error(config, &e))?;
        if !json {
            outln!(
                "{queue}: {} messages read and put back; the index now counts {} in {} rows",
                thousands(r.seen),
                thousands(r.indexed),
                thousands(r.rows)
            );
            if r.uncertain > 0 {
                outln!(
                    "warning: the broker did not answer behind the acks; {} messages may now be there twice",
                    thousands(r.uncertain)
                );
            }
        }
        done.push(ReindexedQueue {
            queue: queue.to_owned(),
            total: r.total,
            read: r.seen,
            indexed: r.indexed,
            rows: r.rows,
            uncertain: r.uncertain,
        });
    }
    if json {
        let mut done = done.into_iter();
        if let (Some(dead_letter), Some(parked)) = (done.next(), done.next()) {
            return print_json(
                REINDEX_JSON_VERSION,
                &ReindexOutput {
                    dead_letter,
                    parked,
                },
            );
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
    parked: bool,
    index: Option<DeadLetterIndex>,
) -> Result<QueueStats, AmqpError> {
    let replayer = Replayer::of(
        SourceQueue::parked_if(parked),
        config.amqp.connection(),
        topology.clone(),
        None,
    );
    let counts = replayer.with_index(index).counts().await?;
    let now = now_ms();
    #[allow(clippy::cast_precision_loss)]
    let age = |minute: Option<u64>| {
        minute.map(|m| now.saturating_sub(m.saturating_mul(60_000)) as f64 / 1000.0)
    };
    let groups = counts.groups();
    let mut by_dependency_reason: BTreeMap<(String, String), u64> = BTreeMap::new();
    for g in &groups {
        *by_dependency_reason
            .entry((g.dependency.clone(), g.reason.clone()))
            .or_default() += g.messages;
    }
    let malformed = counts.matching(|r| r.reason == UNREADABLE);
    let mut by_dependency_reason: Vec<DependencyReason> = by_dependency_reason
        .into_iter()
        .map(|((dependency, reason), count)| DependencyReason {
            dependency,
            reason,
            count,
        })
        .collect();
    by_dependency_reason.sort_by_key(|d| std::cmp::Reverse(d.count));
    Ok(QueueStats {
        queue: counts.queue.clone(),
        depth: counts.depth,
        read: 0,
        by_dependency_reason,
        malformed,
        oldest_age_secs: age(counts.oldest_minute()),
        indexed: counts.indexed(),
        difference: counts.difference(),
        exact: counts.exact(),
        estimate: counts.why_estimate(),
        groups: groups
            .into_iter()
            .map(|g| GroupStats {
                dependency: g.dependency,
                reason: g.reason,
                error_class: g.error_class,
                count: g.messages,
                oldest_age_secs: age(g.oldest_minute),
            })
            .collect(),
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
