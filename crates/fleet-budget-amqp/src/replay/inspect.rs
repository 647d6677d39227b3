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
//! The read is bounded twice: to the messages present when it starts (the queue's depth, so it
//! never reads its own copies) and by the prefetch. Acks are held back so the broker can never
//! push a delivery beyond the bound: a pushed delivery that is not read would be returned when
//! the channel closes and counted.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lapin::Acker;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::types::{FieldTable, ShortString};

use crate::connection::{connect, within};
use crate::error::AmqpError;
use crate::headers;
use crate::publish::{PendingConfirm, PublishError, Publisher, confirmed};
use crate::topology::names::amqp_name;
use crate::topology::queue_depth;

/// Most deliveries held unacked at a time (the consumer's prefetch).
const PREFETCH: u16 = 256;

/// How an inspection reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectOptions {
    /// Read at most this many messages (`None`: every message present at the start).
    pub limit: Option<u64>,
    /// Stop early when no message arrives for this long (another consumer took them).
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
        if bound == 0 {
            return Ok(report);
        }
        let prefetch = u16::try_from(bound).unwrap_or(PREFETCH).min(PREFETCH);
        within(
            "set the prefetch",
            ch.basic_qos(prefetch, BasicQosOptions::default()),
        )
        .await?;
        let tag = format!("fleet-budget-inspect-{}", headers::new_message_id());
        let mut consumer = within(
            format!("consume {queue}"),
            ch.basic_consume(
                amqp_name("queue", queue)?,
                amqp_name("consumer tag", &tag)?,
                BasicConsumeOptions::default(),
                FieldTable::default(),
            ),
        )
        .await?;
        // Acks allowed before the consumer is cancelled: with `prefetch` unacked at most, the
        // broker then never pushes more than `bound` deliveries.
        let ack_budget = bound - u64::from(prefetch);
        let mut acked = 0_u64;
        let mut held: Vec<Acker> = Vec::new();
        let mut returned: Vec<Acker> = Vec::new();
        let mut inflight = FuturesUnordered::new();
        let mut lost = None;
        while report.seen < bound {
            let d = match tokio::time::timeout(options.idle_timeout, consumer.next()).await {
                Err(_) | Ok(None) => break,
                Ok(Some(Err(e))) => {
                    lost = Some(AmqpError::broker(format!("consume {queue}"), e));
                    break;
                }
                Ok(Some(Ok(d))) => d,
            };
            report.seen += 1;
            visit(&d);
            let sent = publisher
                .send("", queue, &d.data, headers::put_back(&d.properties))
                .await;
            inflight.push(settle_copy(d.acker, sent));
            while inflight.len() >= usize::from(prefetch) {
                if let Some(done) = inflight.next().await {
                    finish(
                        done,
                        &mut report,
                        &mut acked,
                        ack_budget,
                        &mut held,
                        &mut returned,
                    )
                    .await;
                }
            }
        }
        while let Some(done) = inflight.next().await {
            finish(
                done,
                &mut report,
                &mut acked,
                ack_budget,
                &mut held,
                &mut returned,
            )
            .await;
        }
        let _ = ch
            .basic_cancel(
                amqp_name("consumer tag", &tag)?,
                BasicCancelOptions::default(),
            )
            .await;
        for acker in held {
            if acker.ack(BasicAckOptions::default()).await.is_err() {
                tracing::warn!(
                    "ack of an inspected message failed; it stays beside its copy (a duplicate)"
                );
            }
        }
        for acker in returned {
            let _ = acker
                .nack(BasicNackOptions {
                    multiple: false,
                    requeue: true,
                })
                .await;
        }
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

/// Acks an original whose copy was confirmed (or holds the ack until the consumer is
/// cancelled); keeps an original whose copy failed in `returned` (nacked with requeue after
/// the cancel, so that it is not read again).
async fn finish(
    done: (Acker, Result<(), PublishError>),
    report: &mut Inspection,
    acked: &mut u64,
    ack_budget: u64,
    held: &mut Vec<Acker>,
    returned: &mut Vec<Acker>,
) {
    let (acker, result) = done;
    match result {
        Ok(()) => {
            report.put_back += 1;
            if *acked < ack_budget {
                *acked += 1;
                if acker.ack(BasicAckOptions::default()).await.is_err() {
                    tracing::warn!(
                        "ack of an inspected message failed; it stays beside its copy (a duplicate)"
                    );
                }
            } else {
                held.push(acker);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "copy of an inspected message not confirmed; the original is returned");
            report.requeued += 1;
            returned.push(acker);
        }
    }
}
