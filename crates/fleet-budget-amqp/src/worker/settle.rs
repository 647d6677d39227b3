//! Step 4 of the worker: carrying an [`Outcome`] out on the broker.
//!
//! A copy (retry, dead-letter, or a delivery that waits a hop in a tier) goes through
//! one [`Settler::publish_then_ack`]: published with confirms, and the original acked only after
//! `Ack` without a return. When the copy is not confirmed the original is nacked with requeue
//! after a pause and comes back: nothing is lost, a duplicate is possible.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use fleet_budget::FleetBudget;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::types::FieldTable;

use super::outcome::Outcome;
use super::{Stats, bump};
use crate::headers;
use crate::publish::Publisher;
use crate::topology::Topology;

/// What settling the deliveries of one connection needs.
pub(super) struct Settler {
    pub(super) budget: FleetBudget,
    pub(super) topology: Arc<Topology>,
    /// The queue consumed (retries come back to it).
    pub(super) queue: String,
    pub(super) publisher: Publisher,
    pub(super) stats: Arc<Stats>,
    pub(super) unconfirmed_pause: Duration,
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
                    tracing::warn!(error = %e, task, "success not counted");
                }
            }
            Outcome::Retry { tier, record } => {
                let mut t = table.clone();
                record.write(&mut t);
                self.publish_then_ack(
                    delivery,
                    &tier.exchange,
                    &self.queue,
                    t,
                    &self.stats.retried,
                )
                .await;
            }
            Outcome::DeadLetter(record) => {
                let mut t = table.clone();
                record.write(&mut t);
                self.publish_then_ack(
                    delivery,
                    &self.topology.dead_exchange,
                    &record.original_routing_key,
                    t,
                    &self.stats.dead_lettered,
                )
                .await;
            }
            Outcome::Wait {
                tier,
                not_before_ms,
            } => {
                let mut t = table.clone();
                headers::set_u64(&mut t, headers::NOT_BEFORE_MS, not_before_ms);
                headers::set_u64(
                    &mut t,
                    headers::RETRY_TIER_MS,
                    u64::try_from(tier.delay.as_millis()).unwrap_or(u64::MAX),
                );
                self.publish_then_ack(
                    delivery,
                    &tier.exchange,
                    &self.queue,
                    t,
                    &self.stats.waited_again,
                )
                .await;
            }
            Outcome::Requeue => {
                tracing::error!("no retry tiers configured; requeueing");
                self.requeue(delivery).await;
            }
        }
    }

    /// Publishes a persistent copy of `delivery` (same message id and body, `headers`) and acks
    /// the original once the broker confirmed it, counting `done`; requeues it otherwise.
    async fn publish_then_ack(
        &self,
        delivery: &Delivery,
        exchange: &str,
        routing_key: &str,
        headers: FieldTable,
        done: &AtomicU64,
    ) {
        let properties = headers::with_message_id(delivery.properties.clone())
            .with_delivery_mode(2)
            .with_headers(headers);
        match self
            .publisher
            .publish(exchange, routing_key, &delivery.data, properties)
            .await
        {
            Ok(()) => match delivery.acker.ack(BasicAckOptions::default()).await {
                Ok(_) => bump(done),
                Err(e) => {
                    bump(&self.stats.ack_failed);
                    tracing::warn!(error = %e, "ack after a confirmed copy failed; the broker will redeliver (a duplicate)");
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "copy not confirmed; the original is requeued, not acked");
                self.requeue(delivery).await;
            }
        }
    }

    /// Puts `delivery` back after the pause (nack with requeue).
    async fn requeue(&self, delivery: &Delivery) {
        bump(&self.stats.requeued);
        tokio::time::sleep(self.unconfirmed_pause).await;
        if let Err(e) = delivery
            .acker
            .nack(BasicNackOptions {
                requeue: true,
                ..BasicNackOptions::default()
            })
            .await
        {
            tracing::warn!(error = %e, "nack failed; the broker redelivers when the channel closes");
        }
    }
}
