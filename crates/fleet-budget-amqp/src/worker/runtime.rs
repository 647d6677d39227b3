//! The worker's life: the consume loop, reconnecting with backoff, graceful shutdown, and the
//! steps of one delivery up to its [`Outcome`] (settled by [`super::settle`]).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use fleet_budget::{Admission, CallOutcome, DeadLetterReason, Failure};
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::outcome::{JobContext, Outcome};
use super::settle::Settler;
use super::{Job, Worker, WorkerCounts, bump};
use crate::connection::{connect, within};
use crate::error::AmqpError;
use crate::headers::{self, JobHeaders};
use crate::metrics::AmqpMetrics;
use crate::publish::Publisher;
use crate::topology::names::amqp_name;

/// What every delivery of a connection shares.
struct Ctx<H> {
    settler: Arc<Settler>,
    handler: Arc<H>,
}

impl<H> Clone for Ctx<H> {
    fn clone(&self) -> Self {
        Self {
            settler: Arc::clone(&self.settler),
            handler: Arc::clone(&self.handler),
        }
    }
}

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
        let mut delay = self.options.reconnect_min;
        loop {
            if *stop.borrow() {
                break;
            }
            let mut connected = false;
            match self.session(&handler, &mut stop, &mut connected).await {
                Ok(()) => break,
                Err(e) => {
                    if connected {
                        delay = self.options.reconnect_min;
                    }
                    let jittered = delay.mul_f64(rand::rng().random_range(0.5..=1.0));
                    tracing::warn!(error = %e, retry_in = ?jittered, queue = %self.options.queue, "worker lost the broker; reconnecting");
                    tokio::select! {
                        () = tokio::time::sleep(jittered) => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                    delay = (delay * 2).min(self.options.reconnect_max);
                }
            }
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
        connected: &mut bool,
    ) -> Result<(), AmqpError>
    where
        H: Fn(Job) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), Failure>> + Send + 'static,
    {
        let o = &self.options;
        let conn = connect(&o.url, &o.name).await?;
        let channel = within("open a channel", conn.create_channel()).await?;
        within(
            "set prefetch",
            channel.basic_qos(o.prefetch, BasicQosOptions::default()),
        )
        .await?;
        let queue = amqp_name("queue", &o.queue)?;
        let tag = ShortString::from(format!("fleet-budget-{}", headers::new_message_id()));
        let mut consumer = within(
            format!("consume {}", o.queue),
            channel.basic_consume(
                queue,
                tag.clone(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            ),
        )
        .await?;
        *connected = true;
        bump(&self.stats.connections);
        tracing::info!(queue = %o.queue, prefetch = o.prefetch, "worker consuming");
        let ctx = Ctx {
            settler: Arc::new(Settler {
                budget: self.budget.clone(),
                topology: Arc::clone(&self.topology),
                queue: o.queue.clone(),
                publisher: Publisher::on(conn),
                stats: Arc::clone(&self.stats),
                unconfirmed_pause: o.unconfirmed_pause,
                metrics: AmqpMetrics::of(&self.budget),
            }),
            handler: Arc::clone(handler),
        };
        let mut tasks = JoinSet::new();
        let ended = loop {
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break Ok(()),
                next = consumer.next() => match next {
                    Some(Ok(delivery)) => {
                        tasks.spawn(process(ctx.clone(), delivery));
                    }
                    Some(Err(e)) => break Err(AmqpError::broker(format!("consume {}", o.queue), e)),
                    None => break Err(AmqpError::broker(format!("consume {}", o.queue), lapin::ErrorKind::FutureCompleted.into())),
                },
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        };
        match ended {
            Ok(()) => {
                // Graceful: stop deliveries, let in-flight jobs finish and settle, then close.
                let _ = channel
                    .basic_cancel(tag, BasicCancelOptions::default())
                    .await;
                while tasks.join_next().await.is_some() {}
                // A round trip behind the last acks before closing: lapin sends the close ahead
                // of frames still queued, and an ack overtaken by it becomes a redelivery.
                let _ = channel
                    .basic_qos(o.prefetch, BasicQosOptions::default())
                    .await;
                let _ = channel
                    .close(200, ShortString::from("worker shutdown"))
                    .await;
                ctx.settler.publisher.close().await;
                Ok(())
            }
            Err(e) => {
                // The deliveries in flight belong to the lost connection: the broker redelivers.
                tasks.shutdown().await;
                ctx.settler.publisher.close().await;
                Err(e)
            }
        }
    }
}

/// Steps 1–3 of one delivery (see the module documentation of [`super`]), then settles it.
async fn process<H, F>(ctx: Ctx<H>, delivery: Delivery)
where
    H: Fn(Job) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), Failure>> + Send + 'static,
{
    let s = &ctx.settler;
    let _in_flight = s.metrics.as_ref().map(AmqpMetrics::delivery_started);
    bump(&s.stats.deliveries);
    let table = headers::without_broker_headers(&headers::table(&delivery.properties));
    let parsed = JobHeaders::parse(&table);
    let task = delivery
        .properties
        .kind()
        .as_ref()
        .map(|k| k.as_str().to_owned())
        .filter(|k| !k.is_empty())
        .or_else(|| parsed.as_ref().ok().and_then(|h| h.task.clone()))
        .unwrap_or_else(|| delivery.routing_key.as_str().to_owned());
    let mut job = job_context(&delivery, parsed.as_ref().ok(), &task, &s.queue);
    // A delivery not due yet (a retry between hops of its delay) waits in the next tier, unless
    // it asks to wait longer than its task's max_delay: then it is dead-lettered, not held.
    if let Ok(JobHeaders {
        not_before_ms: Some(not_before),
        ..
    }) = &parsed
    {
        let now = headers::now_ms();
        let ceiling = s.budget.ceiling(&task);
        let outcome = if ceiling.allows_wait(Duration::from_millis(not_before.saturating_sub(now)))
        {
            Outcome::wait(&s.topology, now, *not_before)
        } else {
            job.now_ms = now;
            let dependency = s.budget.dependency(&task).ok();
            Some(Outcome::not_before_too_far(
                &job,
                *not_before,
                ceiling.max_delay.unwrap_or_default(),
                dependency.as_ref().map(fleet_budget::Dependency::as_str),
            ))
        };
        if let Some(outcome) = outcome {
            s.carry_out(&delivery, &table, &task, outcome).await;
            return;
        }
    }
    let outcome = match &parsed {
        Err(e) => {
            let dependency = s
                .budget
                .dependency(&task)
                .ok()
                .map(|d| d.as_str().to_owned());
            job.now_ms = headers::now_ms();
            Outcome::malformed_headers(&job, e, dependency)
        }
        Ok(h) => match admit(s, &mut job, h).await {
            Err(outcome) => outcome,
            Ok(call) => match s.budget.on_attempt(&task, h.attempt).await {
                Err(e) => {
                    s.budget.finish(call, CallOutcome::Inconclusive).await;
                    job.now_ms = headers::now_ms();
                    Outcome::invalid_task(&job, &e)
                }
                Ok(()) => match run_handler(&*ctx.handler, &delivery, &task, h).await {
                    Ok(()) => {
                        s.budget.finish(call, CallOutcome::Succeeded).await;
                        Outcome::Ack
                    }
                    Err(failure) => {
                        let elsewhere = failure
                            .dependency
                            .as_deref()
                            .is_some_and(|d| d != call.dependency().as_str());
                        // A failure of another dependency the job calls says nothing about
                        // this one's health.
                        let ended = if failure.is_retryable() && !elsewhere {
                            CallOutcome::Failed
                        } else {
                            CallOutcome::Inconclusive
                        };
                        s.budget.finish(call, ended).await;
                        decide(s, &mut job, &failure).await
                    }
                },
            },
        },
    };
    s.carry_out(&delivery, &table, &task, outcome).await;
}

/// Asks the budget whether the job may run now ([`fleet_budget::FleetBudget::admit`]): the call to give back
/// when it may, else the outcome (held in a tier, or dead-lettered) with the time set.
async fn admit(
    s: &Settler,
    job: &mut JobContext,
    h: &JobHeaders,
) -> Result<fleet_budget::Call, Outcome> {
    let now = headers::now_ms();
    let held_for = h
        .held_since_ms
        .map(|since| Duration::from_millis(now.saturating_sub(since)));
    let admission = s.budget.admit(&job.task, h.attempt, held_for).await;
    job.now_ms = now;
    match admission {
        Err(e) => Err(Outcome::invalid_task(job, &e)),
        Ok(Admission::Run(call)) => Ok(call),
        Ok(Admission::Wait(hold)) => Err(Outcome::hold(
            &s.topology,
            job,
            hold.as_str(),
            hold.pause(),
            h.held_since_ms,
        )),
        Ok(Admission::DeadLetter(decision)) => {
            let reason = decision
                .dead_letter_reason()
                .map_or("refused", DeadLetterReason::as_str);
            let failure = Failure::retryable(format!(
                "not run: the concurrency budget refused the retry ({reason})"
            ))
            .with_class(reason);
            Err(Outcome::of_decision(&s.topology, job, &failure, &decision))
        }
    }
}

/// The context of a delivery's outcome: its headers where it has them, else the delivery's own
/// exchange and routing key (a first attempt). The time is set when the outcome is decided.
fn job_context(
    delivery: &Delivery,
    known: Option<&JobHeaders>,
    task: &str,
    queue: &str,
) -> JobContext {
    JobContext {
        task: task.to_owned(),
        attempt: known.map_or(1, |h| h.attempt),
        replays: known.map_or(0, |h| h.replays),
        original_exchange: known
            .and_then(|h| h.original_exchange.clone())
            .unwrap_or_else(|| delivery.exchange.as_str().to_owned()),
        original_routing_key: known
            .and_then(|h| h.original_routing_key.clone())
            .unwrap_or_else(|| delivery.routing_key.as_str().to_owned()),
        queue: queue.to_owned(),
        first_failure_ms: known.and_then(|h| h.first_failure_ms),
        now_ms: 0,
    }
}

/// Runs the handler on the job of `delivery`; a panic is a retryable failure of class `panic`.
async fn run_handler<H, F>(
    handler: &H,
    delivery: &Delivery,
    task: &str,
    h: &JobHeaders,
) -> Result<(), Failure>
where
    H: Fn(Job) -> F,
    F: Future<Output = Result<(), Failure>>,
{
    let job = Job {
        message_id: headers::message_id(&delivery.properties).map(str::to_owned),
        task: task.to_owned(),
        attempt: h.attempt,
        replays: h.replays,
        redelivered: delivery.redelivered,
        payload: delivery.data.clone(),
        exchange: delivery.exchange.as_str().to_owned(),
        routing_key: delivery.routing_key.as_str().to_owned(),
        properties: delivery.properties.clone(),
    };
    let result = match std::panic::catch_unwind(AssertUnwindSafe(|| handler(job))) {
        Ok(fut) => AssertUnwindSafe(fut).catch_unwind().await,
        Err(panic) => Err(panic),
    };
    result.unwrap_or_else(|_| Err(Failure::retryable("the handler panicked").with_class("panic")))
}

/// Asks the budget about `failure` and maps its decision to an outcome. The time since the
/// job's first failure (zero when this is the first) holds a task with a recovery window to it.
async fn decide(s: &Settler, job: &mut JobContext, failure: &Failure) -> Outcome {
    let failed_ms = headers::now_ms();
    let since_first_failure =
        Duration::from_millis(failed_ms.saturating_sub(job.first_failure_ms.unwrap_or(failed_ms)));
    let decision = s
        .budget
        .on_failure_since(&job.task, job.attempt, failure, Some(since_first_failure))
        .await;
    job.now_ms = headers::now_ms();
    match decision {
        Ok(decision) => Outcome::of_decision(&s.topology, job, failure, &decision),
        Err(e) => Outcome::invalid_task(job, &e),
    }
}
