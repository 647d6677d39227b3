//! Step 4 of the worker: carrying an [`Outcome`] out on the broker, and saying how it ended
//! ([`Settled`]); the delivery counts that ([`super::delivery`]), nothing here counts.
//!
//! A copy (retry, dead-letter, or a delivery that waits a hop in a tier) goes through
//! one [`Settler::publish_then_ack`]: published with confirms, and the original acked only after
//! `Ack` without a return. When the copy is not confirmed the original is nacked with requeue
//! after a pause and comes back: nothing is lost, a duplicate is possible.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::DeadLetterReason;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::types::FieldTable;

use super::outcome::Outcome;
use crate::dead_letters::{Row, Tally};
use crate::headers;
use crate::metrics::{AmqpMetrics, CopyKind};
use crate::publish::{Publisher, fanout_key};
use crate::topology::{RetryTier, Topology};

/// What became of a delivery whose original was acked (or whose ack failed): the job
/// succeeded, or a copy went where its outcome sent it (or to the parked queue instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// The handler succeeded.
    Succeeded,
    /// A retry, confirmed in its tier.
    Retried,
    /// A dead-letter, confirmed on the dead-letter exchange.
    DeadLettered(DeadLetterReason),
    /// A retry that came back early, waiting in a tier again.
    WaitedAgain,
    /// A job held without running, waiting in a tier.
    Held,
    /// A copy that could never be published, parked instead.
    Parked,
}

/// How a delivery left the worker: what the worker counts for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settled {
    /// Acked as `Ended` says.
    Acked(Ended),
    /// Its ack failed after `Ended` (the channel closed first): the broker redelivers it.
    AckFailed(Ended),
    /// Nacked with requeue after the pause: its copy was not confirmed (or there is no tier).
    Requeued,
    /// No copy at all could be published: rejected without requeue, for the broker's
    /// dead-lettering of the work queue.
    Rejected,
}

/// Bytes kept free in a copy's header frame for the headers a park adds (`fb-park-reason` of at
/// most 512 bytes, `fb-parked-ms`).
const PARK_ROOM: usize = 600;

/// What settling the deliveries of one connection needs.
pub(super) struct Settler {
    pub(super) topology: Arc<Topology>,
    /// The queue consumed (retries come back to it).
    pub(super) queue: String,
    pub(super) publisher: Publisher,
    pub(super) unconfirmed_pause: Duration,
    /// For the confirm latency of the copies.
    pub(super) metrics: Option<AmqpMetrics>,
    /// Counts the confirmed dead letters and parked copies for the dead-letter index.
    pub(super) tally: Option<Tally>,
}

impl Settler {
    /// Acks, retries, dead-letters or requeues `delivery` as `outcome` says, and says how it
    /// ended. `table` is the delivery's headers without the broker's.
    pub(super) async fn carry_out(
        &self,
        delivery: &Delivery,
        table: &FieldTable,
        outcome: Outcome,
    ) -> Settled {
        match outcome {
            Outcome::Ack => match delivery.acker.ack(BasicAckOptions::default()).await {
                Ok(_) => Settled::Acked(Ended::Succeeded),
                Err(e) => {
                    tracing::warn!(error = %e, "ack failed; the broker will redeliver the job");
                    Settled::AckFailed(Ended::Succeeded)
                }
            },
            Outcome::Retry { tier, record } => {
                let mut t = table.clone();
                record.write(&mut t);
                self.publish_then_ack(
                    delivery,
                    (&tier.exchange, &self.queue),
                    t,
                    CopyKind::Retry,
                    Ended::Retried,
                )
                .await
            }
            Outcome::DeadLetter(record) => {
                let mut t = table.clone();
                record.write(&mut t);
                // The dead-letter exchange is a fanout: an original routing key over 255 bytes
                // (kept in its header) must not make the copy unpublishable.
                self.publish_then_ack(
                    delivery,
                    (
                        &self.topology.dead_exchange,
                        fanout_key(&record.original_routing_key),
                    ),
                    t,
                    CopyKind::DeadLetter,
                    Ended::DeadLettered(record.reason),
                )
                .await
            }
            Outcome::Wait {
                tier,
                not_before_ms,
            } => {
                self.wait_in(
                    delivery,
                    table.clone(),
                    &tier,
                    not_before_ms,
                    Ended::WaitedAgain,
                )
                .await
            }
            Outcome::Hold {
                tier,
                not_before_ms,
                record,
            } => {
                let mut t = table.clone();
                record.write(&mut t);
                self.wait_in(delivery, t, &tier, not_before_ms, Ended::Held)
                    .await
            }
            Outcome::Requeue => {
                tracing::error!("no retry tiers configured; requeueing");
                self.requeue(delivery).await
            }
        }
    }

    /// Sends a copy of `delivery` with the headers `t` through `tier`, back to the queue
    /// consumed, to wait there again until `not_before_ms` (a hop of a longer wait); `done`
    /// once confirmed.
    async fn wait_in(
        &self,
        delivery: &Delivery,
        mut t: FieldTable,
        tier: &RetryTier,
        not_before_ms: u64,
        done: Ended,
    ) -> Settled {
        headers::set_u64(&mut t, headers::NOT_BEFORE_MS, not_before_ms);
        headers::set_u64(
            &mut t,
            headers::RETRY_TIER_MS,
            u64::try_from(tier.delay.as_millis()).unwrap_or(u64::MAX),
        );
        self.publish_then_ack(
            delivery,
            (&tier.exchange, &self.queue),
            t,
            CopyKind::WaitAgain,
            done,
        )
        .await
    }

    /// Publishes a persistent copy of `delivery` (same message id and body, `headers`, no
    /// `expiration`: see [`headers::copy`]) and acks the original once the broker confirmed it
    /// (`done`). A transient failure requeues the original after a pause; a permanent one
    /// ([`crate::PublishError::is_permanent`]) parks it instead ([`Ended::Parked`]), so it
    /// never loops.
    async fn publish_then_ack(
        &self,
        delivery: &Delivery,
        (exchange, routing_key): (&str, &str),
        headers: FieldTable,
        kind: CopyKind,
        done: Ended,
    ) -> Settled {
        let mut properties = headers::without_expiration(
            &headers::with_message_id(delivery.properties.clone()),
            headers,
        )
        .with_delivery_mode(2);
        if let Some(frame_max) = self.publisher.frame_max() {
            // Room for the park headers, should the copy have to be parked.
            properties = headers::fit_frame(properties, frame_max.saturating_sub(PARK_ROOM));
        }
        let started = Instant::now();
        let published = self
            .publisher
            .publish(exchange, routing_key, &delivery.data, properties.clone())
            .await;
        if let Some(m) = &self.metrics {
            m.confirmed(kind, started.elapsed());
        }
        let ended = match published {
            Ok(()) => {
                if let (Some(tally), CopyKind::DeadLetter) = (&self.tally, kind) {
                    // Read back from the headers as sent, the way a replay will read them.
                    if let Some(row) = Row::in_dead_letters(&headers::table(&properties)) {
                        tally.entered(&self.topology.dead_queue, &row);
                    }
                }
                done
            }
            Err(e) if e.is_permanent() => {
                tracing::warn!(error = %e, "copy can never be published; the job is parked instead");
                let t = headers::park_headers(
                    &headers::table(&properties),
                    &format!("its copy to {exchange:?} could not be published: {e}"),
                );
                let parked_row = Row::in_parked(&t);
                match self
                    .publisher
                    .publish(
                        &self.topology.parked_exchange,
                        "",
                        &delivery.data,
                        properties.with_headers(t),
                    )
                    .await
                {
                    Ok(()) => {
                        if let Some(tally) = &self.tally {
                            tally.entered(&self.topology.parked_queue, &parked_row);
                        }
                        Ended::Parked
                    }
                    Err(e) if e.is_permanent() && self.queue == self.topology.work_queue => {
                        // No copy of this message can be published by us (say its body is over
                        // the broker's maximum now): let the broker move it, intact, to the
                        // dead-letter queue through the work queue's dead-letter exchange. It
                        // arrives without fb- headers; replay parks it, saying so.
                        tracing::warn!(error = %e, "no copy can be published; the broker dead-letters the original");
                        nack(delivery, false).await;
                        return Settled::Rejected;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "parked copy not confirmed; the original is requeued, not acked");
                        return self.requeue(delivery).await;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "copy not confirmed; the original is requeued, not acked");
                return self.requeue(delivery).await;
            }
        };
        match delivery.acker.ack(BasicAckOptions::default()).await {
            Ok(_) => Settled::Acked(ended),
            Err(e) => {
                tracing::warn!(error = %e, "ack after a confirmed copy failed; the broker will redeliver (a duplicate)");
                Settled::AckFailed(ended)
            }
        }
    }

    /// Puts `delivery` back after the pause (nack with requeue).
    async fn requeue(&self, delivery: &Delivery) -> Settled {
        tokio::time::sleep(self.unconfirmed_pause).await;
        nack(delivery, true).await;
        Settled::Requeued
    }
}

/// Nacks `delivery`, with `requeue` or without (a reject). A failure only logs: the broker
/// redelivers what a closed channel left unsettled.
async fn nack(delivery: &Delivery, requeue: bool) {
    let options = BasicNackOptions {
        requeue,
        ..BasicNackOptions::default()
    };
    if let Err(e) = delivery.acker.nack(options).await {
        let what = if requeue { "nack" } else { "reject" };
        tracing::warn!(error = %e, "{what} failed; the broker redelivers when the channel closes");
    }
}
