//! Step 4 of the worker: carrying an [`Outcome`] out on the broker, and saying how it ended
//! ([`Settled`]); the delivery counts that ([`super::delivery`]), nothing here counts.
//!
//! A copy (retry, dead-letter, or a delivery that waits a hop in a tier) goes through
//! one [`Settler::publish_then_ack`]: published with confirms, and the original acked only after
//! `Ack` without a return. When the copy is not confirmed the original is nacked with requeue
//! after a pause and comes back: nothing is lost, a duplicate is possible.
//!
//! While the broker blocks the connection (a resource alarm) nothing of this is written, and
//! nothing here times out: the publisher waits out the block ([`Publisher::waiting_out_blocks`])
//! and so do the ack and the requeue ([`unless_blocked`]), so a copy lapin still holds is never
//! followed by a requeue of its job (which made a second copy, the duplicates measured
//! 2026-12-06). A copy the broker refuses (`Nack`: a queue over a `max-length` with `overflow
//! reject-publish`) keeps its job, requeued; each cause is said once ([`Refusals`]) and counted
//! every time (`fleet_budget_amqp_copies_not_confirmed_total`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_budget::DeadLetterReason;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::types::FieldTable;

use super::outcome::Outcome;
use crate::connection::unless_blocked;
use crate::dead_letters::{Row, Tally};
use crate::headers;
use crate::metrics::{AmqpMetrics, CopyKind, RefusalCause};
use crate::publish::{PublishError, Publisher, fanout_key};
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

/// The longest pause before a job whose copies keep being refused is requeued.
const REFUSED_PAUSE_MAX: Duration = Duration::from_secs(10);

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
    /// The causes of copies not confirmed, said once each (shared by the worker's sessions).
    pub(super) refusals: Arc<Refusals>,
}

/// Copies the broker did not confirm, by kind and cause, since a copy of that kind was last
/// confirmed: the first of each cause is logged as a warning with what it likely means, the
/// next ones at debug level only, until a copy of the kind is confirmed again (then one line
/// says how many were not). The counter counts each.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    since_confirmed: Mutex<BTreeMap<(CopyKind, RefusalCause), u64>>,
}

impl Refusals {
    /// A copy of `kind` was not confirmed (`e`): counted, and said when its cause is new. Returns
    /// how many copies of the kind were not confirmed for this cause since one was last
    /// confirmed (1 for the first).
    fn refused(&self, kind: CopyKind, e: &PublishError, metrics: Option<&AmqpMetrics>) -> u64 {
        let cause = RefusalCause::of(e);
        if let Some(m) = metrics {
            m.not_confirmed(kind, cause);
        }
        let n = {
            let mut said = self
                .since_confirmed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let n = said.entry((kind, cause)).or_default();
            *n += 1;
            *n
        };
        let first = n == 1;
        let (kind, why) = (kind.as_str(), cause.as_str());
        if first {
            tracing::warn!(error = %e, kind, cause = why, "{}; the job is kept: requeued, not acked, and runs again (said once per cause until a copy is confirmed again; counted in fleet_budget_amqp_copies_not_confirmed_total)", explain(cause));
        } else {
            tracing::debug!(error = %e, kind, cause = why, "copy not confirmed; the job is requeued");
        }
        n
    }

    /// A copy of `kind` was confirmed: the causes said for the kind are cleared.
    fn confirmed(&self, kind: CopyKind) {
        let mut said = self
            .since_confirmed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if said.is_empty() {
            return;
        }
        let mut cleared = 0;
        said.retain(|(k, _), n| {
            if *k == kind {
                cleared += *n;
                false
            } else {
                true
            }
        });
        if cleared > 0 {
            tracing::info!(
                kind = kind.as_str(),
                not_confirmed = cleared,
                "copies confirmed again after {cleared} not confirmed"
            );
        }
    }
}

/// What a copy not confirmed for `cause` most likely means.
fn explain(cause: RefusalCause) -> &'static str {
    match cause {
        RefusalCause::Nacked => {
            "the broker refused the copy (nack): most likely a queue it routes to is full under a max-length or max-length-bytes policy with overflow reject-publish (budgetctl doctor names such policies)"
        }
        RefusalCause::Returned => {
            "the broker returned the copy: no queue is bound to its exchange (run budgetctl migrate)"
        }
        RefusalCause::Timeout => {
            "the broker did not confirm the copy in time on a connection it did not block"
        }
        _ => "the copy's channel failed before the broker confirmed it",
    }
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
            Outcome::Ack => match self
                .bounded("ack", delivery.acker.ack(BasicAckOptions::default()))
                .await
            {
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
                self.refusals.confirmed(kind);
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
                        self.nack(delivery, false).await;
                        return Settled::Rejected;
                    }
                    Err(e) => {
                        let n = self
                            .refusals
                            .refused(CopyKind::Parked, &e, self.metrics.as_ref());
                        return self.requeue_after(delivery, n).await;
                    }
                }
            }
            Err(e) => {
                let n = self.refusals.refused(kind, &e, self.metrics.as_ref());
                return self.requeue_after(delivery, n).await;
            }
        };
        let acking = delivery.acker.ack(BasicAckOptions::default());
        match self.bounded("ack", acking).await {
            Ok(()) => Settled::Acked(ended),
            Err(e) => {
                tracing::warn!(error = %e, "ack after a confirmed copy failed; the broker will redeliver (a duplicate)");
                Settled::AckFailed(ended)
            }
        }
    }

    /// Puts `delivery` back after the pause (nack with requeue).
    async fn requeue(&self, delivery: &Delivery) -> Settled {
        self.requeue_after(delivery, 1).await
    }

    /// Puts `delivery` back after its copy was the `n`th in a row not confirmed for one cause:
    /// the pause doubles with each, up to [`REFUSED_PAUSE_MAX`]. A queue that keeps refusing
    /// (full under `reject-publish`) then holds the worker's deliveries unacked, a few at a
    /// time, instead of running their handlers again every `unconfirmed_pause` and spending the
    /// work queue's delivery limit.
    async fn requeue_after(&self, delivery: &Delivery, n: u64) -> Settled {
        let doublings = u32::try_from(n.saturating_sub(1).min(16)).unwrap_or(16);
        let pause = self
            .unconfirmed_pause
            .saturating_mul(1_u32 << doublings)
            .min(REFUSED_PAUSE_MAX.max(self.unconfirmed_pause));
        tokio::time::sleep(pause).await;
        self.nack(delivery, true).await;
        Settled::Requeued
    }

    /// Nacks `delivery`, with `requeue` or without (a reject), within the operation deadline
    /// (not counting time blocked). A failure only logs: the broker redelivers what a closed
    /// channel left unsettled.
    async fn nack(&self, delivery: &Delivery, requeue: bool) {
        let options = BasicNackOptions {
            requeue,
            ..BasicNackOptions::default()
        };
        if let Err(e) = self.bounded("nack", delivery.acker.nack(options)).await {
            let what = if requeue { "requeue (nack)" } else { "reject" };
            tracing::warn!(error = %e, "{what} failed; the broker redelivers when the channel closes");
        }
    }

    /// An ack or nack of a delivery: lapin resolves it once written, which a blocked
    /// connection puts off until the alarm clears (not counted against the deadline; the
    /// delivery stays unacked meanwhile); a connection that does not take it within the
    /// deadline otherwise is given up on (the broker redelivers when the channel closes).
    async fn bounded(
        &self,
        step: &'static str,
        settling: impl std::future::Future<Output = Result<bool, lapin::Error>>,
    ) -> Result<(), String> {
        let after = self.publisher.timeouts().operation;
        let answer = match self.publisher.connection() {
            Some(conn) => unless_blocked(conn.status(), after, settling).await,
            None => tokio::time::timeout(after, settling).await.ok(),
        };
        match answer {
            Some(Ok(_)) => Ok(()),
            Some(Err(e)) => Err(e.to_string()),
            None => Err(format!("{step} not written within {after:?}")),
        }
    }
}
