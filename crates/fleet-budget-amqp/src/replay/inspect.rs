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
//! close. Copies are pipelined, [`WINDOW`] awaiting their confirm at a time.
//!
//! [`inspect_queue_with`] lets the visitor stop the read early (`dlq peek --limit`) or remove a
//! message instead of putting it back (`parked purge`, the one destructive caller: the original
//! is acked without a copy).

use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lapin::Acker;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::ShortString;

use crate::connection::{connect, within};
use crate::error::AmqpError;
use crate::headers;
use crate::publish::{PendingConfirm, PublishError, Publisher, confirmed};
use crate::topology::names::amqp_name;
use crate::topology::queue_depth;

/// Copies awaiting their confirmation at a time.
pub const WINDOW: usize = 256;

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

/// Reads the messages of `queue` (up to `options.limit`), shows each to `visit`, and puts each
/// back (see the module documentation). Nothing is lost and nothing comes closer to a delivery
/// limit.
///
/// # Errors
/// The broker cannot be reached, the queue does not exist, or the connection was lost (messages
/// not yet put back stay in the queue).
pub async fn inspect_queue(
    url: &str,
    queue: &str,
    options: &InspectOptions,
    mut visit: impl FnMut(&Delivery) + Send,
) -> Result<Inspection, AmqpError> {
    inspect_queue_with(url, queue, options, |d| {
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
    url: &str,
    queue: &str,
    options: &InspectOptions,
    mut visit: impl FnMut(&Delivery) -> Look + Send,
) -> Result<Inspection, AmqpError> {
    let conn = connect(url, "fleet-budget inspect").await?;
    let ch = within("open a channel", conn.create_channel()).await?;
    let publisher = Publisher::on(conn);
    let result = async {
        let total = u64::from(queue_depth(&ch, queue).await?);
        let bound = options.limit.map_or(total, |l| l.min(total));
        let mut report = Inspection {
            total,
            ..Inspection::default()
        };
        let name = amqp_name("queue", queue)?;
        let mut returned: Vec<Acker> = Vec::new();
        let mut inflight = FuturesUnordered::new();
        let mut lost = None;
        while report.seen < bound {
            let got = within(
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
                match d.acker.ack(BasicAckOptions::default()).await {
                    Ok(_) => report.removed += 1,
                    Err(e) => {
                        tracing::warn!(error = %e, "ack of a message to remove failed; it stays");
                        report.put_back += 1;
                    }
                }
                continue;
            }
            let sent = publisher
                .send("", queue, &d.data, headers::put_back(&d.properties))
                .await;
            inflight.push(settle_copy(d.acker, sent));
            while inflight.len() >= WINDOW {
                if let Some(done) = inflight.next().await {
                    finish(done, &mut report, &mut returned).await;
                }
            }
            if look == Look::Stop {
                break;
            }
        }
        while let Some(done) = inflight.next().await {
            finish(done, &mut report, &mut returned).await;
        }
        for acker in returned {
            let _ = acker
                .nack(BasicNackOptions {
                    multiple: false,
                    requeue: true,
                })
                .await;
        }
        // A round trip behind the last acks: lapin sends the close ahead of frames still
        // queued, and an ack overtaken by it would leave the original beside its copy.
        let _ = within(
            "flush the acks",
            ch.basic_qos(1, BasicQosOptions::default()),
        )
        .await;
        match lost {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }
    .await;
    let _ = ch.close(200, ShortString::from("inspected")).await;
    publisher.close().await;
    result
}

/// Awaits a copy's confirmation: the original's acker with whether the copy is safe.
async fn settle_copy(
    acker: Acker,
    sent: Result<PendingConfirm, PublishError>,
) -> (Acker, Result<(), PublishError>) {
    match sent {
        Ok(pending) => (acker, confirmed(pending).await),
        Err(e) => (acker, Err(e)),
    }
}

/// Acks an original whose copy was confirmed; keeps one whose copy failed in `returned`
/// (nacked with requeue at the end, so that it is not read again by this inspection).
async fn finish(
    done: (Acker, Result<(), PublishError>),
    report: &mut Inspection,
    returned: &mut Vec<Acker>,
) {
    let (acker, result) = done;
    match result {
        Ok(()) => {
            report.put_back += 1;
            if acker.ack(BasicAckOptions::default()).await.is_err() {
                tracing::warn!(
                    "ack of an inspected message failed; it stays beside its copy (a duplicate)"
                );
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "copy of an inspected message not confirmed; the original is returned");
            report.requeued += 1;
            returned.push(acker);
        }
    }
}
