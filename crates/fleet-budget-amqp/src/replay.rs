//! Replay: moving dead-lettered jobs back to where they came from, after the incident.
//!
//! A run is bounded to the messages the dead-letter queue holds when it starts (its message
//! count, read first): it never chases failures that arrive meanwhile. Each message is read
//! (consumed, not yet acked) and sorted:
//!
//! * headers missing or malformed, or not a dead-letter at all → **parked** with the reason
//!   ([`headers::PARK_REASON`]), whatever the filter: nothing could ever replay it;
//! * not matching the filter (dependency, reason, dead-letter time) → **skipped**: left in the
//!   dead-letter queue (nacked with requeue at the end of the run);
//! * replayed `max_replays` times already → **parked** (loop protection);
//! * otherwise → **moved**: republished to its original exchange and routing key with the same
//!   message id and body, the attempt counter reset and the replay count incremented, at the
//!   requested rate, and only while its dependency's budget is not exhausted (the run pauses
//!   and polls until it is not).
//!
//! Every copy is published with confirms and the dead-letter acked only after `Ack` without a
//! return; a copy not confirmed is counted **failed** and the message stays in the dead-letter
//! queue. Nothing is dropped.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use fleet_budget::{DeadLetterReason, Dependency, FleetBudget};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{Acker, Channel, ExchangeKind};
use tokio::time::Instant;

use crate::config::WorkerConfig;
use crate::connection::connect;
use crate::error::AmqpError;
use crate::headers::{self, DeadLetterRecord};
use crate::publish::{Publisher, confirmed};
use crate::topology::Topology;

/// Which dead-lettered messages a replay is about. Empty fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayFilter {
    /// Only this dependency.
    pub dependency: Option<String>,
    /// Only this reason.
    pub reason: Option<DeadLetterReason>,
    /// Only messages dead-lettered at or after this time (Unix ms).
    pub since_ms: Option<u64>,
    /// Only messages dead-lettered before this time (Unix ms).
    pub until_ms: Option<u64>,
}

impl ReplayFilter {
    /// Whether `record` is selected.
    #[must_use]
    pub fn matches(&self, record: &DeadLetterRecord) -> bool {
        self.dependency
            .as_ref()
            .is_none_or(|d| *d == record.dependency)
            && self.reason.is_none_or(|r| r == record.reason)
            && self.since_ms.is_none_or(|t| record.dead_lettered_ms >= t)
            && self.until_ms.is_none_or(|t| record.dead_lettered_ms < t)
    }
}

/// How a replay runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayOptions {
    /// What to replay.
    pub filter: ReplayFilter,
    /// Messages moved per second; `None` is unpaced.
    pub rate: Option<f64>,
    /// A message already replayed this many times is parked instead (default
    /// `amqp.max_replays`, 3).
    pub max_replays: u32,
    /// How often an exhausted budget is asked again while paused.
    pub budget_poll: Duration,
    /// How long a fresh "not exhausted" answer is trusted before asking again.
    pub budget_cache: Duration,
    /// The run ends early when no message arrives for this long (another consumer took them).
    pub idle_timeout: Duration,
    /// Copies awaiting their confirmation at a time.
    pub window: usize,
    /// Move at most this many messages; further matching ones are left in the dead-letter
    /// queue and counted as skipped (`None`: no limit).
    pub limit: Option<u64>,
}

impl ReplayOptions {
    /// Unfiltered, unpaced, with `config.amqp.max_replays`.
    #[must_use]
    pub fn new(config: &WorkerConfig) -> Self {
        Self {
            filter: ReplayFilter::default(),
            rate: None,
            max_replays: config.amqp.max_replays,
            budget_poll: Duration::from_millis(250),
            budget_cache: Duration::from_millis(100),
            idle_timeout: Duration::from_secs(3),
            window: 256,
            limit: None,
        }
    }
}

/// Where a replay stands; passed to the progress callback after every message and on pauses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayProgress {
    /// Messages in the dead-letter queue when the run started (the bound).
    pub total: u64,
    /// Messages read so far.
    pub seen: u64,
    /// Counts so far (see [`ReplayReport`]).
    pub moved: u64,
    /// Parked so far.
    pub parked: u64,
    /// Skipped so far.
    pub skipped: u64,
    /// Failed so far.
    pub failed: u64,
    /// The dependency whose exhausted budget the run is waiting for, while paused.
    pub paused_on: Option<String>,
}

/// The outcome of a replay. `matched = moved + parked_looping + failed`;
/// `seen = moved + parked + skipped + failed`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Messages in the dead-letter queue at the start.
    pub total: u64,
    /// Messages read.
    pub seen: u64,
    /// Messages that matched the filter.
    pub matched: u64,
    /// Republished to their original exchange and acked.
    pub moved: u64,
    /// Moved to the parked queue (looping or malformed).
    pub parked: u64,
    /// Of which malformed.
    pub malformed: u64,
    /// Not matching the filter; left in the dead-letter queue.
    pub skipped: u64,
    /// Copy not confirmed; left in the dead-letter queue.
    pub failed: u64,
    /// Time spent paused on exhausted budgets.
    pub paused: Duration,
    /// Wall time of the run.
    pub elapsed: Duration,
}

/// What a replay would do, without doing it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DryRunReport {
    /// Messages in the dead-letter queue at the start.
    pub total: u64,
    /// Messages read.
    pub seen: u64,
    /// Matching messages by (dependency, reason).
    pub by_dependency_reason: BTreeMap<(String, String), u64>,
    /// Would be moved.
    pub would_move: u64,
    /// Would be parked for looping (replayed `max_replays` times).
    pub would_park_looping: u64,
    /// Would be parked as malformed.
    pub malformed: u64,
    /// Not matching the filter.
    pub skipped: u64,
    /// The earliest dead-letter time among the messages read (Unix ms), for "oldest age".
    pub oldest_dead_lettered_ms: Option<u64>,
}

/// Replays dead-lettered messages (see the module documentation).
#[derive(Debug, Clone)]
pub struct Replayer {
    url: String,
    topology: Topology,
    budget: Option<FleetBudget>,
    source_queue: String,
}

enum Class {
    Malformed(String),
    Skip,
    Looping(DeadLetterRecord),
    Replay(DeadLetterRecord),
}

#[derive(Clone, Copy)]
enum Kind {
    Move,
    Park,
}

impl Replayer {
    /// A replayer of `topology`'s dead-letter queue. With a `budget`, it pauses while a
    /// dependency's budget is exhausted.
    #[must_use]
    pub fn new(url: impl Into<String>, topology: Topology, budget: Option<FleetBudget>) -> Self {
        let source_queue = topology.dead_queue.clone();
        Self {
            url: url.into(),
            topology,
            budget,
            source_queue,
        }
    }

    /// Reads another queue than the topology's dead-letter queue.
    #[must_use]
    pub fn source_queue(mut self, queue: impl Into<String>) -> Self {
        self.source_queue = queue.into();
        self
    }

    fn classify(delivery: &Delivery, options: &ReplayOptions) -> Class {
        let table = headers::table(&delivery.properties);
        match DeadLetterRecord::parse(&table) {
            Err(e) => {
                let broker = headers::get_str(&table, headers::BROKER_FIRST_DEATH_REASON)
                    .ok()
                    .flatten();
                Class::Malformed(match broker {
                    Some(r) => format!(
                        "malformed dead-letter: {e} (dead-lettered by the broker, reason {r})"
                    ),
                    None => format!("malformed dead-letter: {e}"),
                })
            }
            Ok(r) if !options.filter.matches(&r) => Class::Skip,
            Ok(r) if r.replays >= options.max_replays => Class::Looping(r),
            Ok(r) => Class::Replay(r),
        }
    }

    async fn open(&self, what: &str) -> Result<(Publisher, Channel, u64), AmqpError> {
        let conn = connect(&self.url, what).await?;
        let ch = conn
            .create_channel()
            .await
            .map_err(|e| AmqpError::broker("open a channel", e))?;
        let queue = sstr(&self.source_queue)?;
        let q = ch
            .queue_declare(
                queue,
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| AmqpError::broker(format!("inspect queue {}", self.source_queue), e))?;
        Ok((Publisher::on(conn), ch, u64::from(q.message_count())))
    }

    async fn consume(&self, ch: &Channel, tag: &str) -> Result<lapin::Consumer, AmqpError> {
        ch.basic_consume(
            sstr(&self.source_queue)?,
            sstr(tag)?,
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| AmqpError::broker(format!("consume {}", self.source_queue), e))
    }

    /// Counts what [`Replayer::run`] would do with `options`, changing nothing (messages are
    /// read and put back).
    ///
    /// # Errors
    /// The broker cannot be reached or the queue does not exist.
    pub async fn dry_run(&self, options: &ReplayOptions) -> Result<DryRunReport, AmqpError> {
        let (publisher, ch, total) = self.open("fleet-budget replay (dry run)").await?;
        let mut report = DryRunReport {
            total,
            ..DryRunReport::default()
        };
        if total > 0 {
            let tag = format!("fleet-budget-dry-run-{}", headers::new_message_id());
            let mut consumer = self.consume(&ch, &tag).await?;
            let mut last: Option<Acker> = None;
            while report.seen < total {
                let Ok(Some(Ok(d))) =
                    tokio::time::timeout(options.idle_timeout, consumer.next()).await
                else {
                    break;
                };
                report.seen += 1;
                let at =
                    headers::get_u64(&headers::table(&d.properties), headers::DEAD_LETTERED_MS)
                        .ok()
                        .flatten();
                if let Some(at) = at {
                    report.oldest_dead_lettered_ms =
                        Some(report.oldest_dead_lettered_ms.map_or(at, |o| o.min(at)));
                }
                match Self::classify(&d, options) {
                    Class::Malformed(_) => report.malformed += 1,
                    Class::Skip => report.skipped += 1,
                    Class::Looping(r) => {
                        report.would_park_looping += 1;
                        *report
                            .by_dependency_reason
                            .entry((r.dependency, r.reason.to_string()))
                            .or_default() += 1;
                    }
                    Class::Replay(_) if options.limit.is_some_and(|l| report.would_move >= l) => {
                        report.skipped += 1;
                    }
                    Class::Replay(r) => {
                        report.would_move += 1;
                        *report
                            .by_dependency_reason
                            .entry((r.dependency, r.reason.to_string()))
                            .or_default() += 1;
                    }
                }
                last = Some(d.acker);
            }
            let _ = ch
                .basic_cancel(sstr(&tag)?, BasicCancelOptions::default())
                .await;
            if let Some(acker) = last {
                let _ = acker
                    .nack(BasicNackOptions {
                        multiple: true,
                        requeue: true,
                    })
                    .await;
            }
        }
        let _ = ch.close(200, ShortString::from("dry run done")).await;
        publisher.close().await;
        Ok(report)
    }

    /// Replays (see the module documentation), calling `progress` after every message and
    /// when pausing.
    ///
    /// # Errors
    /// The broker cannot be reached, the queue does not exist, or the connection was lost
    /// (messages not yet acked stay in the dead-letter queue).
    #[allow(clippy::too_many_lines)]
    pub async fn run(
        &self,
        options: &ReplayOptions,
        mut progress: impl FnMut(&ReplayProgress) + Send,
    ) -> Result<ReplayReport, AmqpError> {
        let started = Instant::now();
        let (publisher, ch, total) = self.open("fleet-budget replay").await?;
        let mut p = ReplayProgress {
            total,
            ..ReplayProgress::default()
        };
        let mut report = ReplayReport {
            total,
            ..ReplayReport::default()
        };
        progress(&p);
        if total == 0 {
            let _ = ch.close(200, ShortString::from("nothing to replay")).await;
            publisher.close().await;
            report.elapsed = started.elapsed();
            return Ok(report);
        }
        let tag = format!("fleet-budget-replay-{}", headers::new_message_id());
        let mut consumer = self.consume(&ch, &tag).await?;
        let mut pacer = Pacer::new(options.rate);
        let mut held: Vec<Acker> = Vec::new();
        let mut inflight = FuturesUnordered::new();
        let mut acks = FuturesUnordered::new();
        let mut exchanges: HashMap<String, bool> = HashMap::new();
        let mut budgets: HashMap<String, Instant> = HashMap::new();
        let mut lost = None;
        let mut moves = 0u64;
        while p.seen < total {
            let d = match tokio::time::timeout(options.idle_timeout, consumer.next()).await {
                Err(_) => break,
                Ok(Some(Ok(d))) => d,
                Ok(Some(Err(e))) => {
                    lost = Some(AmqpError::broker(
                        format!("consume {}", self.source_queue),
                        e,
                    ));
                    break;
                }
                Ok(None) => break,
            };
            p.seen += 1;
            let props = headers::with_message_id(d.properties.clone());
            let table = headers::table(&props);
            let (kind, exchange, routing_key, new_table) = match Self::classify(&d, options) {
                Class::Skip => {
                    p.skipped += 1;
                    held.push(d.acker);
                    progress(&p);
                    continue;
                }
                Class::Malformed(reason) => {
                    report.malformed += 1;
                    (
                        Kind::Park,
                        self.topology.parked_exchange.clone(),
                        d.routing_key.as_str().to_owned(),
                        headers::park_headers(&table, &reason),
                    )
                }
                Class::Looping(r) => {
                    report.matched += 1;
                    let reason = format!(
                        "replayed {} times; max_replays is {}",
                        r.replays, options.max_replays
                    );
                    (
                        Kind::Park,
                        self.topology.parked_exchange.clone(),
                        r.original_routing_key,
                        headers::park_headers(&table, &reason),
                    )
                }
                Class::Replay(_) if options.limit.is_some_and(|l| moves >= l) => {
                    p.skipped += 1;
                    held.push(d.acker);
                    progress(&p);
                    continue;
                }
                Class::Replay(r) => {
                    report.matched += 1;
                    moves += 1;
                    if !self
                        .exchange_exists(&publisher, &r.original_exchange, &mut exchanges)
                        .await
                    {
                        tracing::warn!(exchange = %r.original_exchange, "original exchange does not exist; message left in the dead-letter queue");
                        p.failed += 1;
                        held.push(d.acker);
                        progress(&p);
                        continue;
                    }
                    let paused = self
                        .wait_for_budget(
                            &r.dependency,
                            options,
                            &mut budgets,
                            &mut p,
                            &mut progress,
                        )
                        .await;
                    if !paused.is_zero() {
                        report.paused += paused;
                        pacer.reset();
                    }
                    pacer.wait().await;
                    (
                        Kind::Move,
                        r.original_exchange,
                        r.original_routing_key,
                        headers::replay_headers(&table, r.replays),
                    )
                }
            };
            let acker = d.acker;
            match publisher
                .send(
                    &exchange,
                    &routing_key,
                    &d.data,
                    props.with_headers(new_table),
                )
                .await
            {
                Ok(pending) => {
                    inflight.push(async move { (acker, kind, confirmed(pending).await) });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "replay publish failed; message left in the dead-letter queue");
                    p.failed += 1;
                    held.push(acker);
                }
            }
            while inflight.len() >= options.window.max(1) {
                if let Some(done) = inflight.next().await
                    && let Some(acker) = settle(done, &mut p, &mut held)
                {
                    acks.push(ack(acker));
                }
            }
            // Settle the confirms that have already arrived, so progress is current.
            while let Some(Some(done)) = inflight.next().now_or_never() {
                if let Some(acker) = settle(done, &mut p, &mut held) {
                    acks.push(ack(acker));
                }
            }
            while let Some(Some(())) = acks.next().now_or_never() {}
            progress(&p);
        }
        while let Some(done) = inflight.next().await {
            if let Some(acker) = settle(done, &mut p, &mut held) {
                acks.push(ack(acker));
            }
        }
        while acks.next().await.is_some() {}
        // The cancel is a round trip behind the acks: lapin sends a channel close ahead of
        // frames still queued, and an ack overtaken by it would become a duplicate replay.
        let _ = ch
            .basic_cancel(sstr(&tag)?, BasicCancelOptions::default())
            .await;
        for acker in held {
            let _ = acker
                .nack(BasicNackOptions {
                    multiple: false,
                    requeue: true,
                })
                .await;
        }
        // Deliveries pushed after the bound are unacked: closing the channel requeues them.
        let _ = ch.close(200, ShortString::from("replay done")).await;
        publisher.close().await;
        p.paused_on = None;
        progress(&p);
        report.seen = p.seen;
        report.moved = p.moved;
        report.parked = p.parked;
        report.skipped = p.skipped;
        report.failed = p.failed;
        report.elapsed = started.elapsed();
        match lost {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    async fn exchange_exists(
        &self,
        publisher: &Publisher,
        name: &str,
        known: &mut HashMap<String, bool>,
    ) -> bool {
        if name.is_empty() || name.starts_with("amq.") {
            return true;
        }
        if let Some(exists) = known.get(name) {
            return *exists;
        }
        // A publish to a missing exchange would close the channel under every pipelined copy:
        // ask once per exchange, on a throwaway channel.
        let Some(conn) = publisher.connection() else {
            return true;
        };
        let Ok(probe) = conn.create_channel().await else {
            return true;
        };
        let Ok(ex) = ShortString::try_new(name) else {
            return false;
        };
        let opts = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        let exists = probe
            .exchange_declare(ex, ExchangeKind::Direct, opts, FieldTable::default())
            .await
            .is_ok();
        if exists {
            let _ = probe.close(200, ShortString::from("probed")).await;
        }
        known.insert(name.to_owned(), exists);
        exists
    }

    /// Waits while `dependency`'s budget has no headroom; returns the time paused.
    async fn wait_for_budget(
        &self,
        dependency: &str,
        options: &ReplayOptions,
        checked: &mut HashMap<String, Instant>,
        p: &mut ReplayProgress,
        progress: &mut (impl FnMut(&ReplayProgress) + Send),
    ) -> Duration {
        let Some(budget) = &self.budget else {
            return Duration::ZERO;
        };
        let Ok(dep) = Dependency::new(dependency) else {
            return Duration::ZERO;
        };
        if checked
            .get(dependency)
            .is_some_and(|t| t.elapsed() < options.budget_cache)
        {
            return Duration::ZERO;
        }
        let start = Instant::now();
        loop {
            let (snapshot, _) = budget.status(&dep).await;
            if snapshot.remaining() > 0 {
                checked.insert(dependency.to_owned(), Instant::now());
                if p.paused_on.take().is_some() {
                    tracing::info!(dependency, "budget has headroom again; replay resumes");
                    progress(p);
                }
                return start.elapsed();
            }
            if p.paused_on.is_none() {
                tracing::info!(dependency, "budget exhausted; replay paused");
                p.paused_on = Some(dependency.to_owned());
                progress(p);
            }
            tokio::time::sleep(options.budget_poll).await;
        }
    }
}

/// Counts a finished copy; returns the ack to send when it was confirmed.
fn settle(
    done: (Acker, Kind, Result<(), crate::publish::PublishError>),
    p: &mut ReplayProgress,
    held: &mut Vec<Acker>,
) -> Option<Acker> {
    let (acker, kind, result) = done;
    match result {
        Ok(()) => {
            match kind {
                Kind::Move => p.moved += 1,
                Kind::Park => p.parked += 1,
            }
            Some(acker)
        }
        Err(e) => {
            tracing::warn!(error = %e, "copy not confirmed; message left in the dead-letter queue");
            p.failed += 1;
            held.push(acker);
            None
        }
    }
}

/// Acks a dead-letter whose copy was confirmed. Acks are pipelined rather than awaited one by
/// one; a failed ack leaves the message in the dead-letter queue (a possible duplicate later).
async fn ack(acker: Acker) {
    if let Err(e) = acker.ack(BasicAckOptions::default()).await {
        tracing::warn!(error = %e, "ack of a replayed dead-letter failed; it stays and may be replayed again (a duplicate)");
    }
}

fn sstr(s: &str) -> Result<ShortString, AmqpError> {
    ShortString::try_new(s).map_err(|e| AmqpError::InvalidName {
        what: "name",
        name: s.to_owned(),
        reason: e.to_string(),
    })
}

/// Spaces sends `1 / rate` apart on a fixed schedule (late sends catch up, up to one second).
struct Pacer {
    interval: Option<Duration>,
    next: Instant,
}

impl Pacer {
    fn new(rate: Option<f64>) -> Self {
        let interval = rate
            .filter(|r| r.is_finite() && *r > 0.0)
            .map(|r| Duration::from_secs_f64(1.0 / r));
        Self {
            interval,
            next: Instant::now(),
        }
    }

    fn reset(&mut self) {
        self.next = Instant::now();
    }

    async fn wait(&mut self) {
        let Some(interval) = self.interval else {
            return;
        };
        let now = Instant::now();
        if self.next > now {
            tokio::time::sleep_until(self.next).await;
        } else if now.duration_since(self.next) > Duration::from_secs(1) {
            self.next = now;
        }
        self.next += interval;
    }
}
