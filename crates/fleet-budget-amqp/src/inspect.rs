//! Looking at a queue without consuming it: the one way this crate reads dead-letters and parked
//! messages it does not move (`dlq stats`, `replay --dry-run`, the messages a replay skips,
//! `dlq peek`).
//!
//! Why not read and nack with requeue: every return of a message to a quorum queue raises its
//! delivery count, and RabbitMQ 4.x applies a default delivery limit of 20 to every quorum queue
//! (see `docs/semantics.md`, "Looking is not consuming"). The dead-letter queue has nowhere to
//! dead-letter to, so on 4.x the 21st look at an incident's dead letters would delete them.
//!
//! Instead each message read is **put back as a copy**: republished (confirmed, mandatory) to
//! the same queue through the default exchange, with the same id, body and headers, without
//! `x-delivery-count` and without `expiration` ([`crate::headers::put_back`]); the original is
//! acked only after the copy's `Ack`. To the broker the copy is a fresh message with a delivery
//! count of zero, on every version. A copy not confirmed leaves the original where it was (nack
//! with requeue: that one look counts once, nothing is lost).
//!
//! The cost: a message looked at moves to the tail of the queue (dead-letters have no order the
//! contract promises), and a crash between a copy's confirm and the original's ack leaves both
//! (a duplicate dead-letter, never a loss).
//!
//! The read is bounded to the messages present when it starts (the queue's depth, so it never
//! reads its own copies), and it takes them one `basic.get` at a time: a consumer's prefetch
//! would have the broker push deliveries past the bound, returned unread (and counted) at the
//! close. Copies are pipelined, [`WINDOW`] awaiting their confirm at a time; the originals of
//! each batch are acked together, and one more `basic.get` behind the last acks waits until the
//! quorum queue has applied them, so that the close cannot return them beside their copies
//! (see `behind_the_acks`); the message that get takes is returned, and the look waits until
//! it is ready again (`until_returned`): when a look returns, the queue holds what it held.
//!
//! Each `basic.get` is raced against the loss of the connection ([`ConnectionWatch`]): a message
//! the client cannot read (headers nested past the parser's bound) closes the connection and
//! lapin leaves that get unanswered; the look then fails at once with the connection's error
//! ([`AmqpError::ConnectionLost`]), not at the operation deadline. The message stays where it
//! was.
//!
//! [`inspect_queue_with`] lets the visitor stop the read early (`dlq peek --limit`) or remove a
//! message instead of putting it back (`parked purge`, the one destructive caller: the original
//! is acked without a copy).
//!
//! A module of its own, beside `replay` and `metrics` which both look (the fleet exporter reads
//! the age of the oldest dead letter this way); also reachable as `replay::inspect`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{Acker, Connection};

use crate::connection::{ConnectionConfig, ConnectionWatch, Timeouts, connect};
use crate::error::AmqpError;
use crate::headers;
use crate::publish::{PendingConfirm, PublishError, Publisher, confirmed, fit_copy};
use crate::topology::names::amqp_name;
use crate::topology::queue_depth_within;

/// Copies awaiting their confirmation at a time.
pub const WINDOW: usize = 256;

/// How often [`until_returned`] reads the depth.
const RETURN_POLL: Duration = Duration::from_millis(10);

/// How an inspection reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectOptions {
    /// Read at most this many messages (`None`: every message present at the start).
    pub limit: Option<u64>,
    /// Stop early when the queue answers empty before the bound (another consumer took them);
    /// kept for callers that set it, a `basic.get` answers at once.
    pub idle_timeout: Duration,
}

impl Default for InspectOptions {
    fn default() -> Self {
        Self {
            limit: None,
            idle_timeout: Duration::from_secs(3),
        }
    }
}

/// What an inspection did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inspection {
    /// Messages in the queue at the start.
    pub total: u64,
    /// Messages read (each was shown to the visitor).
    pub seen: u64,
    /// Put back as a confirmed copy, original acked.
    pub put_back: u64,
    /// Copy not confirmed: the original was returned instead (its delivery count rose by one).
    pub requeued: u64,
    /// Removed at the visitor's request (acked without a copy).
    pub removed: u64,
    /// Put back, but the original's ack is not known to have reached the broker (it failed, or
    /// no answer came behind it): the original may stay beside its copy. Each is a possible
    /// duplicate, never a loss.
    pub uncertain: u64,
}

/// What to do with a message a visitor of [`inspect_queue_with`] has looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// Put it back and read the next one.
    Next,
    /// Put it back and read no more.
    Stop,
    /// Remove it from the queue for good (acked without a copy), and read the next one.
    Remove,
}

/// Reads the messages of `queue` (up to `options.limit`) on the broker of `to` (a
/// [`ConnectionConfig`], or a bare URL), shows each to `visit`, and puts each back (see the
/// module documentation). Nothing is lost and nothing comes closer to a delivery limit.
///
/// # Errors
/// The broker cannot be reached, the queue does not exist, or the connection was lost (messages
/// not yet put back stay in the queue).
pub async fn inspect_queue(
    to: impl Into<ConnectionConfig>,
    queue: &str,
    options: &InspectOptions,
    mut visit: impl FnMut(&Delivery) + Send,
) -> Result<Inspection, AmqpError> {
    inspect_queue_with(to, queue, options, |d| {
        visit(d);
        Look::Next
    })
    .await
}

/// [`inspect_queue`] with a visitor that says, for each message, whether to go on, to stop, or
/// to remove the message (see [`Look`]).
///
/// # Errors
/// As [`inspect_queue`]; a failed ack of a removed message leaves it in the queue (counted as
/// put back, since it stays).
pub async fn inspect_queue_with(
    to: impl Into<ConnectionConfig>,
    queue: &str,
    options: &InspectOptions,
    visit: impl FnMut(&Delivery) -> Look + Send,
) -> Result<Inspection, AmqpError> {
    let to = to.into();
    let conn = connect(&to, "fleet-budget inspect").await?;
    let result = inspect_on(&conn, to.timeouts, queue, options, visit).await;
    to.timeouts.close_connection(&conn, "bye").await;
    result
}

/// [`inspect_queue_with`] on a connection already open (the fleet exporter's, kept across its
/// scrapes): the look's two channels (the reads, the confirmed copies) are its own and closed
/// when it returns, each within the operation deadline of `t` (the connection's); the
/// connection stays open.
///
/// # Errors
/// As [`inspect_queue_with`].
pub(crate) async fn inspect_on(
    conn: &Connection,
    t: Timeouts,
    queue: &str,
    options: &InspectOptions,
    mut visit: impl FnMut(&Delivery) -> Look + Send,
) -> Result<Inspection, AmqpError> {
    let watch = ConnectionWatch::new(conn).with_timeouts(t);
    let ch = t.within("open a channel", conn.create_channel()).await?;
    let copies = match confirm_channel(conn, t).await {
        Ok(copies) => copies,
        Err(e) => {
            t.close_channel(&ch, "bye").await;
            return Err(e);
        }
    };
    let publisher = Publisher::on_channel(copies.clone(), t);
    let frame_max = usize::try_from(conn.configuration().frame_max()).unwrap_or(usize::MAX);
    let result = async {
        let total = u64::from(queue_depth_within(&ch, queue, t).await?);
        let bound = options.limit.map_or(total, |l| l.min(total));
        let mut report = Inspection {
            total,
            ..Inspection::default()
        };
        let name = amqp_name("queue", queue)?;
        let mut held: Vec<Held> = Vec::new();
        let mut inflight = FuturesUnordered::new();
        let mut lost = None;
        while report.seen < bound {
            let got = watch
                .within(
                    format!("get from {queue}"),
                    ch.basic_get(name.clone(), BasicGetOptions::default()),
                )
                .await;
            let d = match got {
                Ok(Some(m)) => m.delivery,
                Ok(None) => break,
                Err(e) => {
                    lost = Some(e);
                    break;
                }
            };
            report.seen += 1;
            let look = visit(&d);
            if look == Look::Remove {
                held.push(Held {
                    tag: d.delivery_tag,
                    acker: d.acker,
                    fate: Fate::Remove,
                });
            } else {
                // Fitted: the copy carries `expiration` and `user_id` in headers, and can
                // outgrow the frame its original fitted.
                let copy = fit_copy(headers::put_back(&d.properties), frame_max);
                let sent = publisher.send("", queue, &d.data, copy).await;
                inflight.push(settle_copy(d.delivery_tag, d.acker, sent));
            }
            if held.len() + inflight.len() >= WINDOW {
                while let Some(done) = inflight.next().await {
                    held.push(done);
                }
                settle(std::mem::take(&mut held), &mut report).await;
            }
            if look == Look::Stop {
                break;
            }
        }
        while let Some(done) = inflight.next().await {
            held.push(done);
        }
        let last = settle(held, &mut report).await;
        // On a lost connection there is nothing to wait behind: the broker returns what it held.
        if !watch.is_lost() {
            report.uncertain += behind_the_acks(&watch, &ch, &name, queue, last).await;
        }
        match lost {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }
    .await;
    t.close_channel(&ch, "inspected").await;
    t.close_channel(&copies, "bye").await;
    result
}

/// A channel in confirm mode on `conn`, for the copies.
async fn confirm_channel(conn: &Connection, t: Timeouts) -> Result<lapin::Channel, AmqpError> {
    let ch = t.within("open a channel", conn.create_channel()).await?;
    t.within(
        "select publisher confirms",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await?;
    Ok(ch)
}

/// Waits until the queue has applied the look's settlements, before the close. Returns the
/// originals whose ack is not known to be applied (possible duplicates): 0 unless the broker
/// does not answer.
///
/// The broker applies an ack to a quorum queue as a command of the queue's log, sent without
/// waiting; the channel's close returns every message it still holds, and that return can reach
/// the log ahead of acks sent just before it: the originals come back beside their copies (the
/// duplicates of the messages read last). A `basic.get` on the same channel is a synchronous
/// command of the same log, answered once applied, so once it answers every ack sent before it
/// is applied too.
///
/// The message it takes, when the queue is not empty, is returned (nack with requeue) to the
/// head of the queue: its delivery count rises by one, but never past one, since the next look
/// reads the head first and replaces it with a fresh copy. The return is applied by the queue
/// after the nack is sent, like the acks; [`until_returned`] waits for it.
async fn behind_the_acks(
    watch: &ConnectionWatch,
    ch: &lapin::Channel,
    name: &ShortString,
    queue: &str,
    last: u64,
) -> u64 {
    let got = watch
        .within(
            format!("get from {queue} behind the acks"),
            ch.basic_get(name.clone(), BasicGetOptions::default()),
        )
        .await;
    match got {
        Ok(Some(m)) => {
            let returned = m
                .delivery
                .acker
                .nack(BasicNackOptions {
                    multiple: false,
                    requeue: true,
                })
                .await;
            if matches!(returned, Ok(true)) {
                until_returned(ch, queue, m.message_count, watch.timeouts()).await;
            } else {
                tracing::warn!("nack of the message behind the acks failed; the close returns it");
            }
            0
        }
        Ok(None) => 0,
        Err(e) => {
            tracing::warn!(error = %e, originals = last, "no answer behind the last acks; those originals may stay beside their copies");
            last
        }
    }
}

/// Waits until the message returned behind the acks is ready in the queue again, so that a look
/// leaves the queue as it found it when it returns (`dlq stats` right after a peek reads the
/// same depth). `left` is the ready count the `basic.get` answered, without the message it took.
///
/// A nack with requeue is sent without an answer, and no AMQP command waits for it without
/// taking another message (which would need returning in turn), so the wait reads the ready
/// count (a passive declare) until it is above `left`: until then the returned message is
/// neither ready nor gone, and the depth reads one short. (The queue's consumer count cannot
/// tell whether anyone else takes messages: the `basic.get` counts as a consumer until its
/// message is back.)
///
/// A count below `left` but above 0 means another consumer (a replay running) takes messages
/// meanwhile: the look then promises nothing about the depth and stops waiting. A count of 0
/// is not trusted (a quorum queue's leader that does not answer the count within 250 ms is
/// reported as 0 messages). Bounded by the operation deadline; past it the look ends anyway,
/// and the message still comes back (it is never lost).
async fn until_returned(ch: &lapin::Channel, queue: &str, left: u32, t: Timeouts) {
    let deadline = Instant::now() + t.operation;
    loop {
        match queue_depth_within(ch, queue, t).await {
            Ok(ready) if ready > left || (1..left).contains(&ready) => return,
            Ok(_) if Instant::now() < deadline => {}
            Ok(ready) => {
                tracing::warn!(
                    ready,
                    left,
                    "the message returned behind the acks is not back yet; the look ends anyway"
                );
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the depth after the look; the look ends anyway");
                return;
            }
        }
        tokio::time::sleep(RETURN_POLL).await;
    }
}

/// An original read and not yet settled: its delivery tag, its acker, and what to do with it.
struct Held {
    tag: u64,
    acker: Acker,
    fate: Fate,
}

/// What settling a [`Held`] original does.
enum Fate {
    /// Its copy is confirmed: ack it.
    PutBack,
    /// Removed at the visitor's request: ack it without a copy.
    Remove,
    /// Its copy is not confirmed: return it (nack with requeue).
    Return(PublishError),
}

/// Awaits a copy's confirmation: the original, to be acked when the copy is safe.
async fn settle_copy(tag: u64, acker: Acker, sent: Result<PendingConfirm, PublishError>) -> Held {
    let result = match sent {
        Ok(pending) => confirmed(pending).await,
        Err(e) => Err(e),
    };
    let fate = match result {
        Ok(()) => Fate::PutBack,
        Err(e) => Fate::Return(e),
    };
    Held { tag, acker, fate }
}

/// Settles the originals of a batch with as few commands as possible: one `basic.ack` with
/// `multiple` per run of tags to ack, and a `basic.nack` with requeue for each original whose
/// copy was not confirmed (sent before the next run's ack, which would otherwise cover it).
///
/// Why not one ack per message: a quorum queue's client in the broker's channel holds back
/// settlements once 32 are awaiting the queue's log (its soft limit), and drops what it holds
/// back when the channel closes; the queue then returns those originals beside their copies.
/// A burst of one ack per message does exactly that (1,000 dead letters, idle broker: 223
/// duplicates on the second look); a batch of [`WINDOW`] is one command, plus two per failed
/// copy. Returns the copies whose originals were acked.
async fn settle(mut batch: Vec<Held>, report: &mut Inspection) -> u64 {
    batch.sort_by_key(|h| h.tag);
    let mut run: Vec<Held> = Vec::new();
    let mut acked = 0;
    for held in batch {
        match held.fate {
            Fate::Return(e) => {
                acked += ack_run(std::mem::take(&mut run), report).await;
                tracing::warn!(error = %e, "copy of an inspected message not confirmed; the original is returned");
                report.requeued += 1;
                let returned = held
                    .acker
                    .nack(BasicNackOptions {
                        multiple: false,
                        requeue: true,
                    })
                    .await;
                if !matches!(returned, Ok(true)) {
                    tracing::warn!(
                        "nack of an inspected message failed; the broker returns it at the close"
                    );
                }
            }
            Fate::PutBack | Fate::Remove => run.push(held),
        }
    }
    acked + ack_run(run, report).await
}

/// Acks a run of originals with one `basic.ack` (`multiple`) on the last one's tag; counts them.
/// Returns the copies whose originals were acked.
async fn ack_run(run: Vec<Held>, report: &mut Inspection) -> u64 {
    let Some(last) = run.last() else {
        return 0;
    };
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    let copies = count(
        run.iter()
            .filter(|h| matches!(h.fate, Fate::PutBack))
            .count(),
    );
    let removals = count(run.len()).saturating_sub(copies);
    let acked = last.acker.ack(BasicAckOptions { multiple: true }).await;
    report.put_back += copies;
    if matches!(acked, Ok(true)) {
        report.removed += removals;
        copies
    } else {
        tracing::warn!(
            copies,
            removals,
            "ack of inspected messages failed; they stay (beside their copies: duplicates)"
        );
        report.put_back += removals;
        report.uncertain += copies;
        0
    }
}
