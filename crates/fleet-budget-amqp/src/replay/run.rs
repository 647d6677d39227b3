//! A replay run, the loop: read up to the messages present at the start, sort each (move, park,
//! keep), pace and pause the moves, send each copy on its channel, keep `window` copies in
//! flight and as many originals unsettled as the prefetch allows.
//!
//! The other parts of a run, each in a file of its own: `copies` awaits and counts the copies in
//! flight (a move or a park that failed is put back as a copy, like a skipped one, and counted
//! failed: a nack with requeue would raise its delivery count on every run, and on RabbitMQ 4.x
//! delete it at the 21st); `settle` acks their originals in few commands; `exchanges` decides
//! which channel a move goes on (pipelined, on a `scout` of its own, or alone) and why a first
//! move to an exchange must not share its channel's fate; `pacer` and `pause` hold the moves to
//! the rate and to the budget; `end` stops the run (its last acks applied before the close, what
//! it leaves in the queue ready again before it returns).

use fleet_budget::control::{Claim, DeadLetterIndex, ReplayMoves};
use futures::{FutureExt, StreamExt};
use lapin::options::BasicQosOptions;
use tokio::time::Instant;

use super::Replayer;
use super::copies::{Confirm, InFlight, Kind, await_copy};
use super::end::{stop_consuming, wait_until_ready};
use super::exchanges::{Exchanges, Route, Target};
use super::gate::Gates;
use super::handle::Stop;
use super::pacer::Pacer;
// Also at their old path, `replay::run`.
use super::report::{GroupMoves, Rate};
pub use super::report::{ReplayProgress, ReplayReport};
use super::scout::{open_scout, original_exchange_exists, scout_move};
use super::select::{Class, ReplayOptions, Selection};
use super::settle::{ACK_AFTER, Settler};
use crate::connection::{LOSS_REASON_WAIT, is_state_error};
use crate::dead_letters::Row;
use crate::error::AmqpError;
use crate::headers;
use crate::publish::{PublishError, Publisher, confirmed, fanout_key};
use crate::topology::names::amqp_name;

impl Replayer {
    /// Replays (see the module documentation), calling `progress` after every message and
    /// when pausing.
    ///
    /// # Errors
    /// The broker cannot be reached, the queue does not exist, or the connection was lost
    /// (messages not yet acked stay in the dead-letter queue).
    pub async fn run(
        &self,
        options: &ReplayOptions,
        progress: impl FnMut(&ReplayProgress) + Send,
    ) -> Result<ReplayReport, AmqpError> {
        self.run_until(options, progress, Stop::default()).await
    }

    /// [`Replayer::run`], stopping early when `stop` is requested (`handle`).
    #[allow(clippy::too_many_lines)]
    pub(super) async fn run_until(
        &self,
        options: &ReplayOptions,
        mut progress: impl FnMut(&ReplayProgress) + Send,
        mut stop: Stop,
    ) -> Result<ReplayReport, AmqpError> {
        let options = &self.effective(options);
        let started = Instant::now();
        let (publisher, ch, total, watch) = self.open("fleet-budget replay").await?;
        // Through a resource alarm the copies wait, their deadline counting only unblocked
        // time: a copy timed out while lapin still holds it would be written after the alarm
        // all the same, and its dead letter, claimed "sent", parked in doubt by the next run.
        let publisher = publisher.waiting_out_blocks();
        // Parks and put-back copies go out on a connection of their own: a copy the broker
        // refuses (a body over its maximum) closes the channel it was sent on, and every copy in
        // flight there ends with an unknown outcome; moves must not be among them.
        let t = self.connection.timeouts;
        let keeper = match Publisher::connect(&self.connection).await {
            Ok(k) => k.waiting_out_blocks(),
            Err(e) => {
                t.close_channel(&ch, "replay not started").await;
                publisher.close().await;
                return Err(e);
            }
        };
        let mut p = ReplayProgress {
            total,
            rate: options.rate.and_then(Rate::new),
            ..ReplayProgress::default()
        };
        let mut report = ReplayReport {
            total,
            ..ReplayReport::default()
        };
        progress(&p);
        if total == 0 {
            t.close_channel(&ch, "nothing to replay").await;
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
        t.within(
            "set the prefetch",
            ch.basic_qos(prefetch, BasicQosOptions::default()),
        )
        .await?;
        let tag = format!("fleet-budget-replay-{}", headers::new_message_id());
        let mut consumer = self.consume(&ch, &tag).await?;
        let mut pacer = Pacer::new(options.rate);
        // The run's claims (`ReplayMoves`): without Redis, none (a run cut off may then leave
        // originals beside their copies, as `docs/semantics.md` says).
        let run = headers::new_message_id();
        let mut settler =
            Settler::new(self.index().map(|index| {
                ReplayMoves::new(index.store().clone(), &self.source_queue, &run[..12])
            }));
        let mut inflight = InFlight::new();
        let mut exchanges = Exchanges::default();
        let mut gates = Gates::default();
        let mut lost = None;
        let mut ended_idle = false;
        let mut selection = Selection::new(options);
        while p.seen < total {
            if stop.is_requested() {
                report.cancelled = true;
                break;
            }
            let next = tokio::select! {
                next = tokio::time::timeout(options.idle_timeout, consumer.next()) => next,
                () = stop.requested() => {
                    report.cancelled = true;
                    break;
                }
            };
            let d = match next {
                // Idle: fewer messages came than were counted at the start (another consumer
                // took some, which the end checks: see `ended_idle`), unless the channel is gone.
                // lapin can leave the channel reporting itself connected after its connection
                // failed (a delivery it could not parse), so the connection is asked too.
                Err(_) if ch.status().connected() && !watch.is_lost() => {
                    ended_idle = true;
                    break;
                }
                Err(_) if watch.is_lost() => {
                    lost = Some(AmqpError::ConnectionLost {
                        step: format!(
                            "consume {} (after {} of {total} messages)",
                            self.source_queue, p.seen
                        ),
                        source: watch.last_error(),
                    });
                    break;
                }
                Ok(Some(Ok(d))) => d,
                // A channel's state in place of the lost connection's reason (see the worker).
                Ok(Some(Err(e))) if is_state_error(&e) => {
                    lost = Some(AmqpError::ConnectionLost {
                        step: format!(
                            "consume {} (after {} of {total} messages)",
                            self.source_queue, p.seen
                        ),
                        source: watch.reason_within(LOSS_REASON_WAIT).await,
                    });
                    break;
                }
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
            // What a message that is not moved or parked is sent as: a copy back into the
            // source queue, its headers unchanged.
            let stays = |kind: Kind| {
                (
                    kind,
                    String::new(),
                    self.source_queue.clone(),
                    table.clone(),
                )
            };
            let (kind, exchange, routing_key, new_table) = match selection.sort(&d) {
                Class::Skip => {
                    p.skipped += 1;
                    stays(Kind::Keep)
                }
                Class::Malformed(_) if self.from_parked => {
                    // Already parked: it stays where it is.
                    report.malformed += 1;
                    p.skipped += 1;
                    stays(Kind::Keep)
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
                    // A slow pace would hold the copies in flight unsettled for its whole wait
                    // (their claims "sent", their originals unacked): a kill then parks them in
                    // doubt although they were delivered. Settled first.
                    if pacer.ahead() >= ACK_AFTER {
                        self.settle_all(
                            &mut p,
                            &mut settler,
                            (&keeper, &mut exchanges),
                            &mut inflight,
                        )
                        .await;
                        settler.ack(true).await;
                    }
                    if exchanges.refused.contains_key(&r.original_exchange) {
                        // Refused earlier in this run: not sent again (the broker would
                        // refuse it again).
                        p.failed += 1;
                        stays(Kind::Return)
                    } else if exchanges.careful
                        && !original_exchange_exists(
                            &publisher,
                            &r.original_exchange,
                            &mut exchanges.exists,
                        )
                        .await
                    {
                        tracing::warn!(exchange = %r.original_exchange, "original exchange does not exist; message left in the dead-letter queue");
                        p.failed += 1;
                        stays(Kind::Return)
                    } else if !self
                        .pace(
                            &r.dependency,
                            options,
                            (&mut gates, &mut pacer),
                            &mut report,
                            &mut p,
                            &mut progress,
                            &mut stop,
                        )
                        .await
                    {
                        // Cancelled while it waited: back where it was, not moved.
                        report.matched -= 1;
                        p.skipped += 1;
                        stays(Kind::Keep)
                    } else {
                        match claim_move(&mut settler, d.delivery_tag, &d.properties, &r).await {
                            Claimed::Go => {
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
                            Claimed::Moved => {
                                p.already_moved += 1;
                                stays(Kind::Drop)
                            }
                            Claimed::Uncertain(run) => {
                                report.in_doubt += 1;
                                let reason = format!(
                                    "an interrupted replay (run {run}) sent a copy of it and never saw the broker's answer: it may have been delivered; replay it from the parked queue only if its job did not run"
                                );
                                (
                                    Kind::Park,
                                    self.topology.parked_exchange.clone(),
                                    fanout_key(&r.original_routing_key).to_owned(),
                                    headers::park_headers(&table, &reason),
                                )
                            }
                            Claimed::Twice => {
                                report.matched -= 1;
                                p.skipped += 1;
                                stays(Kind::Keep)
                            }
                            Claimed::Keep => {
                                p.failed += 1;
                                stays(Kind::Keep)
                            }
                        }
                    }
                }
            };
            let notes = self.index_notes(kind, &table, &new_table);
            let (tag, acker) = (d.delivery_tag, d.acker);
            if matches!(kind, Kind::Drop) {
                // Its copy was delivered by the run that claimed it: the original goes, no
                // copy (acked with the others, below).
                settler.note(tag, notes);
                settler.confirmed(tag, acker, true);
            } else {
                let via = if matches!(kind, Kind::Move) {
                    &publisher
                } else {
                    &keeper
                };
                // A copy can outgrow the frame its original fitted (an id given, `expiration` and
                // `user_id` moved into headers, replay and park headers added).
                let copy = via.fit(match kind {
                    Kind::Keep | Kind::Return | Kind::Drop => headers::put_back(&props),
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
                        Ok(scout_move(
                            t,
                            publisher.connection().map(|c| c.status().clone()),
                            ch,
                            exchange.clone(),
                            routing_key,
                            d.data.clone(),
                            copy,
                        )
                        .boxed())
                    }
                    None => via
                        .send(&exchange, &routing_key, &d.data, copy)
                        .await
                        .map(|pending| confirmed(pending).boxed()),
                };
                match sent {
                    Ok(confirm) => {
                        settler.sent(tag);
                        settler.note(tag, notes);
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
                if settler.changes.len() >= INDEX_BATCH {
                    settler.changes.apply(self.index()).await;
                }
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
        stop_consuming(t, &ch, amqp_name("consumer tag", &tag)?, &mut settler).await;
        settler.changes.apply(self.index()).await;
        if settler.changes.unrecorded > 0 {
            tracing::warn!(
                messages = settler.changes.unrecorded,
                "the dead-letter index missed some of this run's moves: `budgetctl dlq stats` shows an estimate until `budgetctl dlq reindex`"
            );
        }
        if lost.is_none() {
            // What the run leaves in the queue: all it read, less what it moved or parked.
            let leaves = total.saturating_sub(p.moved + p.parked + p.already_moved);
            // Read on the keeper's connection: the run's own may be the one that failed.
            let ready = wait_until_ready(
                t,
                keeper.connection(),
                &self.source_queue,
                leaves,
                options.idle_timeout,
            )
            .await;
            report.not_ready = ready.unwrap_or(0);
            // A run that went quiet short of its bound is finished only if another reader took
            // what it did not see. If every message it did not see is back in the queue, nobody
            // did: they reached this run's connection and never its consumer (lapin, on a
            // message it could not read, has kept its connection open and said nothing). If the
            // depth could not be read, that cannot be told, and success would be a guess.
            if ended_idle && p.seen < total {
                match ready {
                    Some(0) => {
                        lost = Some(AmqpError::Undelivered {
                            queue: self.source_queue.clone(),
                            unseen: total - p.seen,
                            total,
                            idle: options.idle_timeout,
                        });
                    }
                    None => {
                        lost = Some(AmqpError::ConnectionLost {
                            step: format!(
                                "replay of {}: the consumer went quiet after {} of {total} messages, and the queue's depth could not be read to tell whether another reader took the rest",
                                self.source_queue, p.seen
                            ),
                            source: watch.last_error(),
                        });
                    }
                    Some(_) => {}
                }
            }
        }
        publisher.close().await;
        keeper.close().await;
        p.paused_on = None;
        p.held = None;
        progress(&p);
        report.by_group = settler
            .by_group
            .iter()
            .map(
                |((dependency, reason, error_class, minute), (out, parked))| GroupMoves {
                    dependency: dependency.clone(),
                    reason: reason.clone(),
                    error_class: error_class.clone(),
                    minute: *minute,
                    out: *out,
                    parked: *parked,
                },
            )
            .collect();
        report.seen = p.seen;
        report.moved = p.moved;
        report.parked = p.parked;
        report.skipped = p.skipped;
        report.failed = p.failed;
        report.already_moved = p.already_moved;
        report.slowdowns = p.slowdowns;
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
}

/// What the claim of a move says to do with it (see [`ReplayMoves`]).
enum Claimed {
    /// Claimed by this run (or nothing to claim in: no Redis, no message id): copy it.
    Go,
    /// An interrupted run delivered its copy: drop the original.
    Moved,
    /// An interrupted run may have delivered its copy (its run named): park it.
    Uncertain(String),
    /// A second copy of a dead letter this run claimed: left in the queue, counted skipped.
    Twice,
    /// The claim could not be written: left in the queue, counted failed.
    Keep,
}

/// Claims the dead letter `record` (tag `tag`, properties `props`) before its copy is sent.
async fn claim_move(
    settler: &mut Settler,
    tag: u64,
    props: &lapin::BasicProperties,
    record: &crate::headers::DeadLetterRecord,
) -> Claimed {
    let Some(moves) = settler.moves() else {
        return Claimed::Go;
    };
    // Its message id (given by its producer, or by the worker that dead-lettered it), its
    // replays and when it was dead-lettered: a job dead-lettered again after a replay is
    // another dead letter. Without an id nothing names it from one run to the next.
    let Some(id) = headers::message_id(props) else {
        return Claimed::Go;
    };
    let name = format!("{id} {} {}", record.replays, record.dead_lettered_ms);
    // A claim that passed its deadline may have landed all the same: tried again, "this run"
    // then means it did. Three tries, 50 ms apart: a loaded Redis, not one that is down.
    let mut claim = moves.claim(&name).await;
    for _ in 0..2 {
        if claim.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        claim = moves.claim(&name).await.map(|c| match c {
            Claim::ThisRun => Claim::Mine,
            other => other,
        });
    }
    match claim {
        Ok(Claim::Mine) => {
            settler.claimed(tag, name, true);
            Claimed::Go
        }
        Ok(Claim::Moved { run }) => {
            tracing::info!(%run, "dead letter already moved by an interrupted replay; its leftover original is dropped, not copied again");
            settler.claimed(tag, name, true);
            Claimed::Moved
        }
        Ok(Claim::Uncertain { run }) => {
            tracing::warn!(%run, "dead letter whose copy an interrupted replay may have delivered; parked, not copied again");
            settler.claimed(tag, name, false);
            Claimed::Uncertain(run)
        }
        Ok(Claim::ThisRun) => {
            tracing::warn!("a second copy of a dead letter this run is moving; left in the queue");
            Claimed::Twice
        }
        Err(e) => {
            tracing::warn!(error = %e, "the move of a dead letter could not be claimed in Redis; left in the queue (a run cut off could otherwise copy it twice)");
            Claimed::Keep
        }
    }
}

/// Most deliveries a run holds unacked (its prefetch).
const PREFETCH: u16 = 256;

/// Rows of index changes a run gathers before sending them (and at its end).
const INDEX_BATCH: usize = 256;

impl Replayer {
    /// The dead-letter index the run counts its moves in.
    pub(super) fn index(&self) -> Option<&DeadLetterIndex> {
        self.index.as_ref()
    }

    /// What moving (`kind`) the message with the headers `table` (and, parked, `new_table`)
    /// changes in the index once its original is acked: out of the source queue, and into the
    /// parked queue when parked.
    fn index_notes(
        &self,
        kind: Kind,
        table: &lapin::types::FieldTable,
        new_table: &lapin::types::FieldTable,
    ) -> Vec<(String, Row, i64)> {
        let counted = self.counted();
        let mut notes = Vec::new();
        if matches!(kind, Kind::Move | Kind::Park | Kind::Drop)
            && let Some(row) = counted.row(table)
        {
            notes.push((self.source_queue.clone(), row, -1));
        }
        if matches!(kind, Kind::Park) {
            notes.push((
                self.topology.parked_queue.clone(),
                Row::in_parked(new_table),
                1,
            ));
        }
        notes
    }
}
