//! The consume loop: [`Worker::run`] connects, consumes with the prefetch, spawns one
//! [`process`] per delivery, reconnects after a loss (with the [`Backoff`]), and on shutdown
//! lets the jobs in flight finish before it closes.

use std::future::Future;
use std::sync::Arc;

use fleet_budget::Failure;
use futures::StreamExt;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::backoff::Backoff;
use super::delivery::{Deliveries, Running, process};
use super::settle::Settler;
use super::{Job, Worker, WorkerCounts, bump};
use crate::connection::{ConnectionWatch, LOSS_REASON_WAIT, connect, is_state_error};
use crate::dead_letters::Tally;
use crate::error::{AmqpError, consumer_timeout_of};
use crate::headers;
use crate::metrics::AmqpMetrics;
use crate::publish::Publisher;
use crate::topology::names::amqp_name;

impl Worker {
    /// Consumes until [`super::WorkerHandle::shutdown`], reconnecting with backoff when the
    /// connection is lost; then flushes the budget's counters and returns the worker's counts.
    ///
    /// `handler` runs once per delivery; its error says how the failure is to be treated
    /// ([`Failure::retryable`], [`Failure::non_retryable`], [`Failure::retry_after`],
    /// [`Failure::poison`]).
    ///
    /// # Errors
    /// None today: connection failures are retried until shutdown. (Kept for future fatal
    /// errors.)
    pub async fn run<H, F>(self, handler: H) -> Result<WorkerCounts, AmqpError>
    where
        H: Fn(Job) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), Failure>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        if let Some(addr) = self.options.metrics_listen {
            // A worker that cannot serve its metrics still does its work: the failure is logged.
            match self.budget.metrics().serve(addr) {
                Ok(at) => tracing::info!(%at, "worker metrics on /metrics"),
                Err(e) => tracing::error!(error = %e, "worker metrics not served"),
            }
        }
        let mut stop = self.stop.subscribe();
        let metrics = AmqpMetrics::of(&self.budget);
        let mut backoff = Backoff::new(&self.options, &self.stats, metrics);
        let flusher = self.tally.as_ref().map(Tally::flush_every);
        loop {
            if *stop.borrow() {
                break;
            }
            match self.session(&handler, &mut stop, &mut backoff).await {
                Ok(()) => break,
                Err(e) => {
                    let retry_in = backoff.after_loss(&e);
                    tokio::select! {
                        () = tokio::time::sleep(retry_in) => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                }
            }
        }
        backoff.end_run();
        if let Some(flusher) = flusher {
            flusher.stop().await;
        }
        if let Some(tally) = &self.tally {
            tally.flush_last().await;
        }
        if let Err(e) = self.budget.flush().await {
            tracing::warn!(error = %e, "could not flush budget counters at shutdown; they stay pending");
        }
        Ok(self.stats.counts())
    }

    async fn session<H, F>(
        &self,
        handler: &Arc<H>,
        stop: &mut watch::Receiver<bool>,
        backoff: &mut Backoff,
    ) -> Result<(), AmqpError>
    where
        H: Fn(Job) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), Failure>> + Send + 'static,
    {
        let o = &self.options;
        // The configuration is the options', kept for every reconnect.
        let to = o.connection();
        let t = to.timeouts;
        let conn = connect(&to, &o.name).await?;
        let metrics = AmqpMetrics::of(&self.budget);
        // The watch also says when the broker blocks the connection (a resource alarm), once,
        // with its reason, and counts it: it reads lapin's events as `lost` below polls it.
        let lost = ConnectionWatch::new(&conn)
            .with_timeouts(t)
            .with_metrics(metrics.clone());
        let channel = lost.within("open a channel", conn.create_channel()).await?;
        lost.within(
            "set prefetch",
            channel.basic_qos(o.prefetch, BasicQosOptions::default()),
        )
        .await?;
        let queue = amqp_name("queue", &o.queue)?;
        let tag = ShortString::from(format!("fleet-budget-{}", headers::new_message_id()));
        let mut consumer = lost
            .within(
                format!("consume {}", o.queue),
                channel.basic_consume(
                    queue,
                    tag.clone(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                ),
            )
            .await?;
        backoff.consuming();
        bump(&self.stats.connections);
        tracing::info!(queue = %o.queue, prefetch = o.prefetch, "worker consuming");
        let deliveries = Arc::new(Deliveries {
            budget: self.budget.clone(),
            handler: Arc::clone(handler),
            settler: Settler {
                topology: Arc::clone(&self.topology),
                queue: o.queue.clone(),
                // A copy is not timed out while the broker blocks the connection: lapin would
                // write it once unblocked, after its job was requeued (a second copy).
                publisher: Publisher::on(conn, t).waiting_out_blocks(),
                unconfirmed_pause: o.unconfirmed_pause,
                metrics: metrics.clone(),
                tally: self.tally.clone(),
                refusals: Arc::clone(&self.refusals),
            },
            stats: Arc::clone(&self.stats),
            metrics,
            running: Running::default(),
        });
        let mut tasks = JoinSet::new();
        let connection_lost = lost.lost();
        tokio::pin!(connection_lost);
        let lived = tokio::time::sleep(o.reconnect_reset_after);
        tokio::pin!(lived);
        let ended = loop {
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break Ok(()),
                next = consumer.next() => match next {
                    Some(Ok(delivery)) => {
                        tasks.spawn(process(Arc::clone(&deliveries), delivery));
                    }
                    // A channel's state as the consumer's error: the connection went, and lapin
                    // kept that in place of its reason. The watch names it (`None`: below), or
                    // leaves it unnamed.
                    Some(Err(e)) if is_state_error(&e) => break Err(None),
                    Some(Err(e)) => break Err(Some(AmqpError::broker(format!("consume {}", o.queue), e))),
                    None => break Err(Some(AmqpError::ConnectionLost {
                        step: format!("consume {}", o.queue),
                        source: lost.last_error(),
                    })),
                },
                Some(_) = tasks.join_next(), if !tasks.is_empty() => backoff.check_settled(),
                () = &mut lived, if backoff.is_young() => backoff.lived(),
                // A consumer that goes quiet on a lost connection without its error.
                source = &mut connection_lost => break Err(Some(AmqpError::ConnectionLost {
                    step: format!("consume {}", o.queue),
                    source,
                })),
            }
        };
        if let Err(Some(e)) = &ended
            && let Some(e) = e.lapin_error()
        {
            self.consumer_timed_out(e, &deliveries.running);
        }
        let ended = match ended {
            Ok(()) => Ok(()),
            Err(Some(e)) => Err(e),
            Err(None) => Err(AmqpError::ConnectionLost {
                step: format!("consume {}", o.queue),
                source: lost.reason_within(LOSS_REASON_WAIT).await,
            }),
        };
        match ended {
            Ok(()) => {
                // Graceful: stop deliveries, let in-flight jobs finish and settle, then close.
                let _ = t
                    .within(
                        "cancel the worker's consumer",
                        channel.basic_cancel(tag, BasicCancelOptions::default()),
                    )
                    .await;
                while tasks.join_next().await.is_some() {}
                // A round trip behind the last acks before closing: lapin sends the close ahead
                // of frames still queued, and an ack overtaken by it becomes a redelivery.
                let _ = t
                    .within(
                        "a round trip behind the last acks",
                        channel.basic_qos(o.prefetch, BasicQosOptions::default()),
                    )
                    .await;
                t.close_channel(&channel, "worker shutdown").await;
                deliveries.settler.publisher.close().await;
                Ok(())
            }
            Err(e) => {
                // The deliveries in flight belong to the lost connection: the broker redelivers.
                tasks.shutdown().await;
                deliveries.settler.publisher.close().await;
                Err(e)
            }
        }
    }
}

impl Worker {
    /// When `e` is the broker's close of the consuming channel for its `consumer_timeout`:
    /// names the jobs unsettled past the timeout (the longest first: the one the broker timed
    /// out, and any other that would have been next) and counts it. They go back to the queue
    /// with the channel, and run again on the next connection.
    fn consumer_timed_out(&self, e: &lapin::Error, running: &Running) {
        let Some(timeout) = consumer_timeout_of(e) else {
            return;
        };
        if let Some(m) = AmqpMetrics::of(&self.budget) {
            m.consumer_timed_out();
        }
        let late = running.older_than(timeout);
        if late.is_empty() {
            tracing::error!(error = %e, consumer_timeout = ?timeout, queue = %self.options.queue,
                "the broker closed the worker's channel for its consumer_timeout: a job stayed unacked longer; it goes back to the queue and runs again (size consumer_timeout above the longest task: docs/guides/operations.md)");
        }
        for (message_id, task, ran_for) in late {
            let message_id = message_id
                .as_deref()
                .map(fleet_budget::printable::escape_text);
            tracing::error!(
                message_id = message_id.as_deref().unwrap_or("-"),
                task = %fleet_budget::printable::escape_text(&task),
                ran_for = ?ran_for,
                consumer_timeout = ?timeout,
                queue = %self.options.queue,
                "job ran past the broker's consumer_timeout: the broker closed the worker's channel; the job goes back to the queue and runs again (size consumer_timeout above the longest task: docs/guides/operations.md)"
            );
        }
    }
}
