//! A replay run: read up to the messages present at the start, move or park each with confirms
//! (pipelined, `window` at a time), ack after the confirm, pace to the rate, and pause while the
//! dependency's budget is exhausted.
//!
//! How a run ends (its last acks applied before the close, what it leaves in the queue ready
//! again before it returns) is the `end` module's.
//!
//! A message that cannot be moved (its original exchange is gone, or the copy is not
//! confirmed) is put back as a copy, like a skipped one, and counted failed: a nack with requeue
//! would raise its delivery count on every run (on RabbitMQ 4.x, deleted at the 21st). Only when
//! that copy fails too is the original held and returned at the end.
//!
//! Which channel a move goes on (pipelined, on a scout of its own, or alone), and why a first move
//! to an exchange must not share its channel's fate with other moves: the `exchanges` module.

use std::collections::HashMap;
use std::time::Duration;

use fleet_budget::Dependency;
use fleet_budget::printable::escape_text;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use lapin::options::{BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Acker, BasicProperties, Channel, ExchangeKind};
use tokio::time::Instant;

use super::Replayer;
use super::end::{stop_consuming, wait_until_ready};
use super::exchanges::{Exchanges, Route, Target};
use super::pacer::Pacer;
use super::select::{Class, ReplayOptions, Selection};
use super::settle::Settler;
use crate::connection::{timeouts, within};
use crate::error::AmqpError;
use crate::headers;
use crate::publish::{PublishError, Publisher, confirmed, fanout_key};
use crate::topology::inspect::exchange_exists;
use crate::topology::names::amqp_name;

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
    /// Of the messages the run left in the source queue (`total` less `moved` and `parked`),
    /// how many the broker did not count ready yet when the run returned: it waits for them up
    /// to `idle_timeout` (see the `end` module). 0 unless another consumer reads the queue or the
    /// broker is slow; meanwhile the queue's depth reads that much short.
    pub not_ready: u64,
}

/// What a copy is: a move back to the original exchange, a park, a skipped message put back
/// into the dead-letter queue (see [`super::inspect`]), or a message that cannot be moved (its
/// original exchange is gone) put back the same way, counted failed.
#[derive(Clone, Copy)]
enum Kind {
    Move,
    Park,
    Keep,
    Return,
}

/// A copy whose confirmation has come: the original's tag and acker, what the copy was, and,
/// for a move or a park, the body and properties to put the message back with if it failed.
struct Done {
    tag: u64,
    acker: Acker,
    kind: Kind,
    result: Result<(), PublishError>,
    kept: Option<(Vec<u8>, BasicProperties)>,
    /// For a move: where to, and whether it went alone (see [`Exchanges`]).
    target: Option<Target>,
}

/// The copies awaiting their confirmation. Nothing in them publishes on a shared channel: a
/// publish waits for the publisher's channel, which a copy polled only by this set could hold (a
/// deadlock). A scout publishes on its own channel, which nothing else holds.
type InFlight = FuturesUnordered<BoxFuture<'static, Done>>;

/// What a copy's confirmation is: [`confirmed`] for a copy sent, or a whole [`scout_move`].
type Confirm = BoxFuture<'static, Result<(), PublishError>>;

/// Awaits the confirmation of a copy.
fn await_copy(
    tag: u64,
    acker: Acker,
    kind: Kind,
    confirm: Confirm,
    kept: Option<(Vec<u8>, BasicProperties)>,
    target: Option<Target>,
) -> BoxFuture<'static, Done> {
    async move {
        let result = confirm.await;
        Done {
            tag,
            acker,
            kind,
            result,
            kept,
            target,
        }
    }
    .boxed()
}

impl Replayer {
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
        let options = &self.effective(options);
        let started = Instant::now();
        let (publisher, ch, total) = self.open("fleet-budget replay").await?;
        // Parks and put-back copies go out on a connection of their own: a copy the broker
        // refuses (a body over its maximum) closes the channel it was sent on, and every copy in
        // flight there ends with an unknown outcome; moves must not be among them.
        let keeper = match Publisher::connect(&self.url).await {
            Ok(k) => k,
            Err(e) => {
                let _ = ch.close(200, ShortString::from("replay not started")).await;
                publisher.close().await;
                return Err(e);
            }
        };
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
            keeper.close().await;
            report.elapsed = started.elapsed();
            return Ok(report);
        }
        // A bounded prefetch: at most `prefetch` deliveries past the bound (new dead letters,
        // the copies of skipped messages) are pushed and returned unread at the close, each
        // counted once; the next run reads them and puts fresh copies back, so no message's
        // delivery count grows from run to run.
        let prefetch = u16::try_from(total).unwrap_or(u16::MAX).min(PREFETCH);
        within(
            "set the prefetch",
            ch.basic_qos(prefetch, BasicQosOptions::default()),
        )
        .await?;
        let tag = format!("fleet-budget-replay-{}", headers::new_message_id());
        let mut consumer = self.consume(&ch, &tag).await?;
        let mut pacer = Pacer::new(options.rate);
        let mut settler = Settler::default();
        let mut inflight = InFlight::new();
        let mut exchanges = Exchanges::default();
        let mut budgets: HashMap<String, Instant> = HashMap::new();
        let mut lost = None;
        let mut selection = Selection::new(options);
        while p.seen < total {
            let d = match tokio::time::timeout(options.idle_timeout, consumer.next()).await {
                // Idle: fewer messages came than were counted at the start (another consumer
                // took some), unless the channel is gone.
                Err(_) if ch.status().connected() => break,
                Ok(Some(Ok(d))) => d,
                Ok(Some(Err(e))) => {
                    lost = Some(AmqpError::broker(
                        format!("consume {}", self.source_queue),
                        e,
                    ));
                    break;
                }
                // The consumer ended, or went idle on a closed channel, before the messages
                // counted at the start were seen: its channel or connection closed (a frame the
                // client could not parse, the queue deleted, the broker stopping). Not a
                // finished run.
                Err(_) | Ok(None) => {
                    lost = Some(AmqpError::broker(
                        format!(
                            "consume {} (the consumer ended after {} of {total} messages: its channel or connection closed)",
                            self.source_queue, p.seen
                        ),
                        lapin::ErrorKind::InvalidChannelState(
                            lapin::ChannelState::Closed,
                            "consume",
                        )
                        .into(),
                    ));
                    break;
                }
            };
            p.seen += 1;
            let props = headers::with_message_id(d.properties.clone());
            let table = headers::table(&props);
            let (kind, exchange, routing_key, new_table) = match selection.sort(&d) {
                Class::Skip => {
                    p.skipped += 1;
                    (
                        Kind::Keep,
                        String::new(),
                        self.source_queue.clone(),
                        table.clone(),
                    )
                }
                Class::Malformed(_) if self.from_parked => {
                    // Already parked: it stays where it is.
                    report.malformed += 1;
                    p.skipped += 1;
                    (
                        Kind::Keep,
                        String::new(),
                        self.source_queue.clone(),
                        table.clone(),
                    )
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
                        fanout_key(&r.original_routing_key).to_owned(),
                        headers::park_headers(&table, &reason),
                    )
                }
                Class::Replay(r) => {
                    report.matched += 1;
                    // A scout to its exchange in flight: its outcome says how this one goes.
                    while exchanges.scouting.contains(&r.original_exchange) {
                        let Some(done) = inflight.next().await else {
                            exchanges.scouting.remove(&r.original_exchange);
                            break;
                        };
                        self.count_confirmed(
                            done,
                            &mut p,
                            &mut settler,
                            (&keeper, &mut exchanges),
                            &mut inflight,
                        )
                        .await;
                    }
                    if exchanges.refused.contains_key(&r.original_exchange) {
                        // Refused earlier in this run: not sent again (the broker would
                        // refuse it again).
                        p.failed += 1;
                        (
                            Kind::Return,
                            String::new(),
                            self.source_queue.clone(),
                            table.clone(),
                        )
                    } else if exchanges.careful
                        && !Self::original_exchange_exists(
                            &publisher,
                            &r.original_exchange,
                            &mut exchanges.exists,
                        )
                        .await
                    {
                        tracing::warn!(exchange = %r.original_exchange, "original exchange does not exist; message left in the dead-letter queue");
                        p.failed += 1;
                        (
                            Kind::Return,
                            String::new(),
                            self.source_queue.clone(),
                            table.clone(),
                        )
                    } else {
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
                        let mut moved = headers::replay_headers(&table, r.replays);
                        // A parked job goes back as a job, not as a parked message.
                        headers::fields::remove(&mut moved, headers::PARK_REASON);
                        headers::fields::remove(&mut moved, headers::PARKED_MS);
                        (
                            Kind::Move,
                            r.original_exchange,
                            r.original_routing_key,
                            moved,
                        )
                    }
                }
            };
            let (tag, acker) = (d.delivery_tag, d.acker);
            let via = if matches!(kind, Kind::Move) {
                &publisher
            } else {
                &keeper
            };
            // A copy can outgrow the frame its original fitted (an id given, `expiration` and
            // `user_id` moved into headers, replay and park headers added).
            let copy = via.fit(match kind {
                Kind::Keep | Kind::Return => headers::put_back(&props),
                Kind::Move | Kind::Park => headers::without_expiration(&props, new_table),
            });
            let mut route = matches!(kind, Kind::Move).then(|| exchanges.route(&exchange));
            let scout = match route {
                Some(Route::Scout) => {
                    let scout = open_scout(&publisher).await;
                    if scout.is_none() {
                        // Alone on the moves' channel instead, as safe and slower.
                        route = Some(Route::Alone);
                    }
                    scout
                }
                _ => None,
            };
            let target = route.map(|r| Target {
                alone: r != Route::Pipelined,
                exchange: exchange.clone(),
            });
            let alone = route == Some(Route::Alone);
            if alone {
                // No other move may share its channel's fate: settle every copy in flight.
                self.settle_all(
                    &mut p,
                    &mut settler,
                    (&keeper, &mut exchanges),
                    &mut inflight,
                )
                .await;
            }
            let sent: Result<Confirm, PublishError> = match scout {
                Some(ch) => {
                    exchanges.scouting.insert(exchange.clone());
                    Ok(scout_move(ch, exchange.clone(), routing_key, d.data.clone(), copy).boxed())
                }
                None => via
                    .send(&exchange, &routing_key, &d.data, copy)
                    .await
                    .map(|pending| confirmed(pending).boxed()),
            };
            match sent {
                Ok(confirm) => {
                    settler.sent(tag);
                    let kept = matches!(kind, Kind::Move | Kind::Park).then(|| (d.data, props));
                    inflight.push(await_copy(tag, acker, kind, confirm, kept, target));
                    if alone {
                        // Its outcome decides whether the moves after it may be pipelined.
                        self.settle_all(
                            &mut p,
                            &mut settler,
                            (&keeper, &mut exchanges),
                            &mut inflight,
                        )
                        .await;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "replay publish failed; message left in the dead-letter queue");
                    // A Return was counted failed when its exchange was found missing.
                    if !matches!(kind, Kind::Keep | Kind::Return) {
                        p.failed += 1;
                    }
                    settler.hold(tag, acker);
                }
            }
            loop {
                // Settle the confirms that have already arrived, so progress is current.
                while let Some(Some(done)) = inflight.next().now_or_never() {
                    self.count_confirmed(
                        done,
                        &mut p,
                        &mut settler,
                        (&keeper, &mut exchanges),
                        &mut inflight,
                    )
                    .await;
                }
                // A full window, or as many originals unsettled as the prefetch lets the
                // broker push: nothing more to read until some are confirmed and acked.
                let full = inflight.len() >= options.window.max(1)
                    || settler.unsettled() >= usize::from(prefetch);
                settler.ack(full).await;
                if !(inflight.len() >= options.window.max(1)
                    || settler.unsettled() >= usize::from(prefetch))
                {
                    break;
                }
                match inflight.next().await {
                    Some(done) => {
                        self.count_confirmed(
                            done,
                            &mut p,
                            &mut settler,
                            (&keeper, &mut exchanges),
                            &mut inflight,
                        )
                        .await;
                    }
                    None => break,
                }
            }
            progress(&p);
        }
        self.settle_all(
            &mut p,
            &mut settler,
            (&keeper, &mut exchanges),
            &mut inflight,
        )
        .await;
        stop_consuming(&ch, amqp_name("consumer tag", &tag)?, &mut settler).await;
        if lost.is_none() {
            // What the run leaves in the queue: all it read, less what it moved or parked.
            let leaves = total.saturating_sub(p.moved + p.parked);
            report.not_ready = wait_until_ready(
                publisher.connection(),
                &self.source_queue,
                leaves,
                options.idle_timeout,
            )
            .await;
        }
        publisher.close().await;
        keeper.close().await;
        p.paused_on = None;
        progress(&p);
        report.seen = p.seen;
        report.moved = p.moved;
        report.parked = p.parked;
        report.skipped = p.skipped;
        report.failed = p.failed;
        report.elapsed = started.elapsed();
        if let Some(m) = self
            .budget
            .as_ref()
            .and_then(crate::metrics::AmqpMetrics::of)
        {
            m.replayed(p.moved, p.parked, p.failed);
        }
        match lost {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Waits for every copy in flight and counts each as [`Self::count_confirmed`] does.
    async fn settle_all(
        &self,
        p: &mut ReplayProgress,
        settler: &mut Settler,
        (keeper, exchanges): (&Publisher, &mut Exchanges),
        inflight: &mut InFlight,
    ) {
        while let Some(done) = inflight.next().await {
            self.count_confirmed(done, p, settler, (keeper, &mut *exchanges), inflight)
                .await;
        }
    }

    /// Counts a copy whose confirmation has come, and hands its original to the settler: to ack
    /// when the copy was confirmed, else to hold (returned at the end of the run). A move or a
    /// park that failed is counted failed and the message put back in the source queue as a
    /// copy (like a skipped one), so that its original can be acked without a nack raising its
    /// delivery count; only if that copy fails too is the original held. What a move's outcome
    /// says of its exchange goes to `exchanges`.
    async fn count_confirmed(
        &self,
        done: Done,
        p: &mut ReplayProgress,
        settler: &mut Settler,
        (keeper, exchanges): (&Publisher, &mut Exchanges),
        inflight: &mut InFlight,
    ) {
        let Done {
            tag,
            acker,
            kind,
            result,
            kept,
            target,
        } = done;
        if let Some(target) = &target {
            exchanges.learn(target, &result);
        }
        let e = match result {
            Ok(()) => {
                match kind {
                    Kind::Move => p.moved += 1,
                    Kind::Park => p.parked += 1,
                    Kind::Keep | Kind::Return => {}
                }
                settler.confirmed(tag, acker);
                return;
            }
            Err(e) => e,
        };
        let Some((data, props)) = kept else {
            tracing::warn!(error = %e, "copy not confirmed; message left in the dead-letter queue");
            settler.hold(tag, acker);
            return;
        };
        p.failed += 1;
        tracing::warn!(error = %e, "copy not confirmed; the message is put back in the dead-letter queue");
        let sent = keeper
            .send(
                "",
                &self.source_queue,
                &data,
                keeper.fit(headers::put_back(&props)),
            )
            .await;
        match sent {
            Ok(pending) => {
                let confirm = confirmed(pending).boxed();
                inflight.push(await_copy(tag, acker, Kind::Return, confirm, None, None));
            }
            Err(e) => {
                tracing::warn!(error = %e, "put-back copy not sent; message left in the dead-letter queue");
                settler.hold(tag, acker);
            }
        }
    }

    /// Whether the original exchange `name` exists, asked once per exchange and run.
    async fn original_exchange_exists(
        publisher: &Publisher,
        name: &str,
        known: &mut HashMap<String, bool>,
    ) -> bool {
        if let Some(exists) = known.get(name) {
            return *exists;
        }
        // A publish to a missing exchange would close the channel under every pipelined copy:
        // ask on a throwaway channel (a missing exchange closes it).
        let Some(conn) = publisher.connection() else {
            return true;
        };
        let Ok(probe) = within("open a channel to probe an exchange", conn.create_channel()).await
        else {
            return true;
        };
        let exists = exchange_exists(&probe, name).await.unwrap_or(false);
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
                    tracing::info!(dependency = %escape_text(dependency), "budget has headroom again; replay resumes");
                    progress(p);
                    return start.elapsed();
                }
                // Asking is not pausing: a run that never waited reports no pause.
                return Duration::ZERO;
            }
            if p.paused_on.is_none() {
                tracing::info!(dependency = %escape_text(dependency), "budget exhausted; replay paused");
                p.paused_on = Some(dependency.to_owned());
                progress(p);
            }
            tokio::time::sleep(options.budget_poll).await;
        }
    }
}

/// A scout's channel: a channel of its own on the moves' connection, for the first move to an
/// exchange not proven yet (see `exchanges`). `None` when it cannot be opened (logged).
async fn open_scout(publisher: &Publisher) -> Option<Channel> {
    let conn = publisher.connection()?;
    match within("open a channel for a first move", conn.create_channel()).await {
        Ok(ch) => Some(ch),
        Err(e) => {
            tracing::warn!(error = %e, "no channel of its own for a first move; it goes alone on the moves' channel");
            None
        }
    }
}

/// A scout: the first move to `exchange`, alone on `ch`. Asks whether the exchange exists (a
/// passive declare: `404` when it does not, which closes `ch` and is learnt as a refusal), selects
/// confirms, publishes, awaits the confirm, and closes `ch` (unless the broker closed it). Every
/// step is bounded by the operation timeout.
async fn scout_move(
    ch: Channel,
    exchange: String,
    routing_key: String,
    data: Vec<u8>,
    properties: BasicProperties,
) -> Result<(), PublishError> {
    let after = timeouts().operation;
    let moved = async {
        // The default exchange and `amq.` names are taken on trust, as the existence check does.
        if !(exchange.is_empty() || exchange.starts_with("amq.")) {
            let passive = ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            };
            let name = ShortString::try_new(exchange.as_str())
                .map_err(|e| PublishError::InvalidName(e.to_string()))?;
            let declared =
                ch.exchange_declare(name, ExchangeKind::Direct, passive, FieldTable::default());
            bounded(&exchange, after, declared).await?;
        }
        bounded(
            &exchange,
            after,
            ch.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        let pending = Publisher::on_channel(ch.clone())
            .send(&exchange, &routing_key, &data, properties)
            .await?;
        confirmed(pending).await
    }
    .await;
    if ch.status().connected() {
        let _ =
            tokio::time::timeout(after, ch.close(200, ShortString::from("first move done"))).await;
    }
    moved
}

/// `step` on a scout's channel, bounded by `after`, its failure a [`PublishError`] of `exchange`.
async fn bounded(
    exchange: &str,
    after: Duration,
    step: impl Future<Output = lapin::Result<()>>,
) -> Result<(), PublishError> {
    match tokio::time::timeout(after, step).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(PublishError::Channel {
            exchange: exchange.to_owned(),
            source,
        }),
        Err(_) => Err(PublishError::Timeout {
            exchange: exchange.to_owned(),
            after,
        }),
    }
}

/// Most deliveries a run holds unacked (its prefetch).
const PREFETCH: u16 = 256;
