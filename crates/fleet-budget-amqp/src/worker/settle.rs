//! Step 4 of the worker: carrying an [`Outcome`] out on the broker.
//!
//! A copy (retry, dead-letter, or a delivery that waits a hop in a tier) goes through
//! one [`Settler::publish_then_ack`]: published with confirms, and the original acked only after
//! `Ack` without a return. When the copy is not confirmed the original is nacked with requeue
//! after a pause and comes back: nothing is lost, a duplicate is possible.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use fleet_budget::FleetBudget;
use fleet_budget::printable::escape_text;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::types::FieldTable;

use super::outcome::Outcome;
use super::{Stats, bump};
use crate::headers;
use crate::metrics::{AmqpMetrics, CopyKind};
use crate::publish::{Publisher, fanout_key};
use crate::topology::{RetryTier, Topology};

/// Bytes kept free in a copy's header frame for the headers a park adds (`fb-park-reason` of at
/// most 512 bytes, `fb-parked-ms`).
const PARK_ROOM: usize = 600;

/// What settling the deliveries of one connection needs.
pub(super) struct Settler {
    pub(super) budget: FleetBudget,
    pub(super) topology: Arc<Topology>,
    /// The queue consumed (retries come back to it).
    pub(super) queue: String,
    pub(super) publisher: Publisher,
    pub(super) stats: Arc<Stats>,
    pub(super) unconfirmed_pause: Duration,
    pub(super) metrics: Option<AmqpMetrics>,
}

impl Settler {
    /// Acks, retries, dead-letters or requeues `delivery` as `outcome` says. `table` is the
    /// delivery's headers without the broker's; `task` is counted on success.
    pub(super) async fn carry_out(
        &self,
        delivery: &Delivery,
        table: &FieldTable,
        task: &str,
        outcome: Outcome,
    ) {
        match outcome {
            Outcome::Ack => {
                match delivery.acker.ack(BasicAckOptions::default()).await {
                    Ok(_) => bump(&self.stats.succeeded),
                    Err(e) => {
                        bump(&self.stats.ack_failed);
                        tracing::warn!(error = %e, "ack failed; the broker will redeliver the job");
                    }
                }
                if let Err(e) = self.budget.on_success(task).await {
                    tracing::warn!(error = %escape_text(&e.to_string()), task = %escape_text(task), "success not counted");
                }
            }
            Outcome::Retry { tier, record } => {
                let mut t = table.clone();
                record.write(&mut t);
                self.publish_then_ack(
                    delivery,
                    (&tier.exchange, &self.queue),
                    t,
                    CopyKind::Retry,
                    &self.stats.retried,
                )
                .await;
            }
            Outcome::DeadLetter(record) => {
                let mut t = table.clone();
                record.write(&mut t);
                // The dead-letter exchange is a fanout: an original routing key over 255 bytes
                // (kept in its header) must not make the copy unpublishable.
                let confirmed = self
                    .publish_then_ack(
                        delivery,
                        (
                            &self.topology.dead_exchange,
                            fanout_key(&record.original_routing_key),
                        ),
                        t,
                        CopyKind::DeadLetter,
                        &self.stats.dead_lettered,
                    )
                    .await;
                if let (true, Some(m)) = (confirmed, &self.metrics) {
                    m.dead_letter_published(record.reason);
                }
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
                    &self.stats.waited_again,
                )
                .await;
            }
            Outcome::Hold {
                tier,
                not_before_ms,
                record,
            } => {
                let mut t = table.clone();
                record.write(&mut t);
                self.wait_in(delivery, t, &tier, not_before_ms, &self.stats.held)
                    .await;
            }
            Outcome::Requeue => {
                tracing::error!("no retry tiers configured; requeueing");
                self.requeue(delivery).await;
            }
        }
    }

    /// Sends a copy of `delivery` with the headers `t` through `tier`, back to the queue
    /// consumed, to wait there again until `not_before_ms` (a hop of a longer wait), counting
    /// `done`.
    async fn wait_in(
        &self,
        delivery: &Delivery,
        mut t: FieldTable,
        tier: &RetryTier,
        not_before_ms: u64,
        done: &AtomicU64,
    ) {
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
        .await;
    }

    /// Publishes a persistent copy of `delivery` (same message id and body, `headers`, no
    /// `expiration`: see [`headers::copy`]) and acks the original once the broker confirmed it,
    /// counting `done`. A transient failure requeues the original after a pause; a permanent
    /// one ([`crate::PublishError::is_permanent`]) parks it instead, so it never loops. Whether
    /// the copy reached `(exchange, routing_key)` (a parked one did not).
    async fn publish_then_ack(
        &self,
        delivery: &Delivery,
        (exchange, routing_key): (&str, &str),
        headers: FieldTable,
        kind: CopyKind,
        done: &AtomicU64,
    ) -> bool {
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
        let confirmed = published.is_ok();
        let counted = match published {
            Ok(()) => done,
            Err(e) if e.is_permanent() => {
                tracing::warn!(error = %e, "copy can never be published; the job is parked instead");
                let t = headers::park_headers(
                    &headers::table(&properties),
                    &format!("its copy to {exchange:?} could not be published: {e}"),
                );
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
                    Ok(()) => &self.stats.parked,
                    Err(e) if e.is_permanent() && self.queue == self.topology.work_queue => {
                        // No copy of this message can be published by us (say its body is over
                        // the broker's maximum now): let the broker move it, intact, to the
                        // dead-letter queue through the work queue's dead-letter exchange. It
                        // arrives without fb- headers; replay parks it, saying so.
                        tracing::warn!(error = %e, "no copy can be published; the broker dead-letters the original");
                        self.reject_to_dead_letters(delivery).await;
                        return false;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "parked copy not confirmed; the original is requeued, not acked");
                        self.requeue(delivery).await;
                        return false;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "copy not confirmed; the original is requeued, not acked");
                self.requeue(delivery).await;
                return false;
            }
        };
        match delivery.acker.ack(BasicAckOptions::default()).await {
            Ok(_) => bump(counted),
            Err(e) => {
                bump(&self.stats.ack_failed);
                tracing::warn!(error = %e, "ack after a confirmed copy failed; the broker will redeliver (a duplicate)");
            }
        }
        confirmed
    }

    /// Rejects `delivery` without requeue: the work queue's dead-letter exchange takes it.
    async fn reject_to_dead_letters(&self, delivery: &Delivery) {
        bump(&self.stats.broker_dead_lettered);
        nack(delivery, false).await;
    }

    /// Puts `delivery` back after the pause (nack with requeue).
    async fn requeue(&self, delivery: &Delivery) {
        bump(&self.stats.requeued);
        if let Some(m) = &self.metrics {
            m.requeued();
        }
        tokio::time::sleep(self.unconfirmed_pause).await;
        nack(delivery, true).await;
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
