//! The worker runtime: consume, run the handler, report to the budget, then ack, retry or
//! dead-letter, never losing a message.
//!
//! For each delivery (at most `prefetch` at a time):
//!
//! 1. read the attempt number ([`headers::ATTEMPT`], 1 when absent) and the task (the AMQP
//!    `type` property, else [`headers::TASK`], else the routing key); report the attempt;
//! 2. run the handler; `Ok` → ack, then count a success;
//! 3. `Err(failure)` → [`FleetBudget::on_failure`] decides (see `docs/semantics.md`):
//!    * retry → publish a copy to the retry tier at or above the delay, with the next attempt
//!      number, to come back to this queue;
//!    * dead-letter → publish a copy to the dead-letter exchange with the headers of
//!      [`DeadLetterRecord`];
//! 4. the original is acked only after the broker confirmed the copy (`Ack`, not returned).
//!    Otherwise it is nacked with requeue after a short pause and comes back: nothing is lost,
//!    duplicates are possible (deduplicate on the message id, which never changes).
//!
//! A handler that panics counts as a retryable failure of class `panic`. A delivery whose
//! headers of this crate are malformed is dead-lettered as `non_retryable` (class
//! `malformed_header`) without running the handler.
//!
//! [`WorkerHandle::shutdown`] stops consuming, lets in-flight jobs finish, closes the channels and
//! flushes the budget's coalesced counters. A lost connection is re-established with exponential
//! backoff (with jitter) and consuming resumes; unacked deliveries of the lost connection are
//! redelivered by the broker.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fleet_budget::{BudgetSource, DeadLetterReason, Decision, Failure, FleetBudget};
use futures::{FutureExt, StreamExt};
use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::types::{FieldTable, ShortString};
use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::WorkerConfig;
use crate::connection::connect;
use crate::error::AmqpError;
use crate::headers::{self, BudgetHeaders, DeadLetterRecord, JobHeaders};
use crate::publish::Publisher;
use crate::topology::Topology;

/// How a worker connects and consumes.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Broker URL.
    pub url: String,
    /// The queue to consume (the topology's work queue by default).
    pub queue: String,
    /// Unacknowledged deliveries at a time (= jobs running concurrently).
    pub prefetch: u16,
    /// First reconnect delay; doubles up to `reconnect_max` (with jitter).
    pub reconnect_min: Duration,
    /// Longest reconnect delay.
    pub reconnect_max: Duration,
    /// Pause before a delivery whose retry or dead-letter copy was not confirmed is requeued
    /// (keeps a broken exchange from turning into a hot loop).
    pub unconfirmed_pause: Duration,
    /// Connection name shown by the broker.
    pub name: String,
}

impl WorkerOptions {
    /// Options from `config.amqp`, consuming `topology`'s work queue.
    #[must_use]
    pub fn new(config: &WorkerConfig, topology: &Topology) -> Self {
        Self {
            url: config.amqp.url.clone(),
            queue: topology.work_queue.clone(),
            prefetch: config.amqp.prefetch,
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(30),
            unconfirmed_pause: Duration::from_millis(250),
            name: "fleet-budget worker".to_owned(),
        }
    }
}

/// One delivery, as the handler sees it.
#[derive(Debug, Clone)]
pub struct Job {
    /// The AMQP message id (never changes across retries, dead-letters and replays).
    pub message_id: Option<String>,
    /// The task.
    pub task: String,
    /// This execution's number (1 = first).
    pub attempt: u32,
    /// Times replayed from the dead-letter queue.
    pub replays: u32,
    /// Whether the broker delivered it before (a worker died or a publish was not confirmed).
    pub redelivered: bool,
    /// The body.
    pub payload: Vec<u8>,
    /// The delivery's exchange.
    pub exchange: String,
    /// The delivery's routing key.
    pub routing_key: String,
    /// All properties, headers included.
    pub properties: BasicProperties,
}

impl Job {
    /// The backoff delay the previous attempt was given (retries only).
    #[must_use]
    pub fn retry_delay(&self) -> Option<Duration> {
        let table = headers::table(&self.properties);
        headers::get_u64(&table, headers::RETRY_DELAY_MS)
            .ok()
            .flatten()
            .map(Duration::from_millis)
    }
}

/// Counters of one worker (all connections of its life).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerCounts {
    /// Deliveries received.
    pub deliveries: u64,
    /// Jobs acked as successes.
    pub succeeded: u64,
    /// Retries published (confirmed) and originals acked.
    pub retried: u64,
    /// Dead-letters published (confirmed) and originals acked.
    pub dead_lettered: u64,
    /// Deliveries requeued because their copy was not confirmed.
    pub requeued: u64,
    /// Acks that failed (the channel closed first): the broker redelivers those.
    pub ack_failed: u64,
    /// Connections established.
    pub connections: u64,
    /// Retries that arrived before their delay (longer than the longest tier) and were sent to
    /// wait in a tier again, without running.
    pub waited_again: u64,
}

#[derive(Debug, Default)]
struct Stats {
    deliveries: AtomicU64,
    succeeded: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    requeued: AtomicU64,
    ack_failed: AtomicU64,
    connections: AtomicU64,
    waited_again: AtomicU64,
}

impl Stats {
    fn counts(&self) -> WorkerCounts {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WorkerCounts {
            deliveries: l(&self.deliveries),
            succeeded: l(&self.succeeded),
            retried: l(&self.retried),
            dead_lettered: l(&self.dead_lettered),
            requeued: l(&self.requeued),
            ack_failed: l(&self.ack_failed),
            connections: l(&self.connections),
            waited_again: l(&self.waited_again),
        }
    }
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// Controls a running worker from elsewhere.
#[derive(Debug, Clone)]
pub struct WorkerHandle {
    stats: Arc<Stats>,
    stop: Arc<watch::Sender<bool>>,
}

impl WorkerHandle {
    /// Asks the worker to stop: no new deliveries, in-flight jobs finish, counters are flushed,
    /// then [`Worker::run`] returns.
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }

    /// The counters so far.
    #[must_use]
    pub fn counts(&self) -> WorkerCounts {
        self.stats.counts()
    }
}

/// A RabbitMQ worker embedding a [`FleetBudget`].
#[derive(Debug)]
pub struct Worker {
    budget: FleetBudget,
    topology: Arc<Topology>,
    options: WorkerOptions,
    stats: Arc<Stats>,
    stop: Arc<watch::Sender<bool>>,
}

struct Ctx<H> {
    budget: FleetBudget,
    topology: Arc<Topology>,
    queue: String,
    publisher: Arc<Publisher>,
    stats: Arc<Stats>,
    handler: Arc<H>,
    unconfirmed_pause: Duration,
}

impl<H> Clone for Ctx<H> {
    fn clone(&self) -> Self {
        Self {
            budget: self.budget.clone(),
            topology: Arc::clone(&self.topology),
            queue: self.queue.clone(),
            publisher: Arc::clone(&self.publisher),
            stats: Arc::clone(&self.stats),
            handler: Arc::clone(&self.handler),
            unconfirmed_pause: self.unconfirmed_pause,
        }
    }
}

impl Worker {
    /// A worker for `topology` reporting to `budget`.
    #[must_use]
    pub fn new(budget: FleetBudget, topology: Topology, options: WorkerOptions) -> Self {
        let (stop, _) = watch::channel(false);
        Self {
            budget,
            topology: Arc::new(topology),
            options,
            stats: Arc::default(),
            stop: Arc::new(stop),
        }
    }

    /// A handle to stop the worker and read its counters.
    #[must_use]
    pub fn handle(&self) -> WorkerHandle {
        WorkerHandle {
            stats: Arc::clone(&self.stats),
            stop: Arc::clone(&self.stop),
        }
    }

    /// Consumes until [`WorkerHandle::shutdown`], reconnecting with backoff when the connection
    /// is lost; then flushes the budget's counters and returns the worker's counts.
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
        let channel = conn
            .create_channel()
            .await
            .map_err(|e| AmqpError::broker("open a channel", e))?;
        channel
            .basic_qos(o.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| AmqpError::broker("set prefetch", e))?;
        let queue = ShortString::try_new(o.queue.as_str()).map_err(|e| AmqpError::InvalidName {
            what: "queue",
            name: o.queue.clone(),
            reason: e.to_string(),
        })?;
        let tag = ShortString::from(format!("fleet-budget-{}", headers::new_message_id()));
        let mut consumer = channel
            .basic_consume(
                queue,
                tag.clone(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| AmqpError::broker(format!("consume {}", o.queue), e))?;
        *connected = true;
        bump(&self.stats.connections);
        tracing::info!(queue = %o.queue, prefetch = o.prefetch, "worker consuming");
        let ctx = Ctx {
            budget: self.budget.clone(),
            topology: Arc::clone(&self.topology),
            queue: o.queue.clone(),
            publisher: Arc::new(Publisher::on(conn)),
            stats: Arc::clone(&self.stats),
            handler: Arc::clone(handler),
            unconfirmed_pause: o.unconfirmed_pause,
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
                ctx.publisher.close().await;
                Ok(())
            }
            Err(e) => {
                // The deliveries in flight belong to the lost connection: the broker redelivers.
                tasks.shutdown().await;
                ctx.publisher.close().await;
                Err(e)
            }
        }
    }
}

/// What to do with a delivery once the handler and the budget have spoken.
enum Outcome {
    Success,
    Retry {
        delay: Duration,
        next_attempt: u32,
        failure: Failure,
    },
    DeadLetter {
        reason: DeadLetterReason,
        failure: Failure,
        dependency: Option<String>,
        budget: Option<BudgetHeaders>,
        source: Option<fleet_budget::BudgetSource>,
    },
}

async fn process<H, F>(ctx: Ctx<H>, delivery: Delivery)
where
    H: Fn(Job) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), Failure>> + Send + 'static,
{
    bump(&ctx.stats.deliveries);
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
    let attempt = parsed.as_ref().map_or(1, |h| h.attempt);
    // A retry whose delay is longer than the longest tier comes back early: it waits again.
    if let Ok(JobHeaders {
        not_before_ms: Some(not_before),
        ..
    }) = &parsed
    {
        let now = headers::now_ms();
        if *not_before > now {
            wait_again(
                &ctx,
                &delivery,
                &table,
                Duration::from_millis(not_before - now),
            )
            .await;
            return;
        }
    }
    let outcome = match &parsed {
        Err(e) => Outcome::DeadLetter {
            reason: DeadLetterReason::NonRetryable,
            failure: Failure::non_retryable(e).with_class("malformed_header"),
            dependency: ctx
                .budget
                .dependency(&task)
                .ok()
                .map(|d| d.as_str().to_owned()),
            budget: None,
            source: Some(BudgetSource::NotConsulted),
        },
        Ok(h) => match ctx.budget.on_attempt(&task, h.attempt).await {
            Err(e) => invalid_task(&e),
            Ok(()) => {
                let job = Job {
                    message_id: headers::message_id(&delivery.properties).map(str::to_owned),
                    task: task.clone(),
                    attempt: h.attempt,
                    replays: h.replays,
                    redelivered: delivery.redelivered,
                    payload: delivery.data.clone(),
                    exchange: delivery.exchange.as_str().to_owned(),
                    routing_key: delivery.routing_key.as_str().to_owned(),
                    properties: delivery.properties.clone(),
                };
                let handler = Arc::clone(&ctx.handler);
                let result = match std::panic::catch_unwind(AssertUnwindSafe(|| handler(job))) {
                    Ok(fut) => AssertUnwindSafe(fut).catch_unwind().await,
                    Err(panic) => Err(panic),
                };
                match result {
                    Ok(Ok(())) => Outcome::Success,
                    Ok(Err(failure)) => decide(&ctx, &task, h.attempt, failure).await,
                    Err(_) => {
                        decide(
                            &ctx,
                            &task,
                            h.attempt,
                            Failure::retryable("the handler panicked").with_class("panic"),
                        )
                        .await
                    }
                }
            }
        },
    };
    settle(
        &ctx,
        &delivery,
        &table,
        parsed.ok(),
        &task,
        attempt,
        outcome,
    )
    .await;
}

fn invalid_task(e: &fleet_budget::Error) -> Outcome {
    Outcome::DeadLetter {
        reason: DeadLetterReason::NonRetryable,
        failure: Failure::non_retryable(e).with_class("invalid_task"),
        dependency: None,
        budget: None,
        source: Some(BudgetSource::NotConsulted),
    }
}

async fn decide<H>(ctx: &Ctx<H>, task: &str, attempt: u32, failure: Failure) -> Outcome {
    match ctx.budget.on_failure(task, attempt, &failure).await {
        Ok(Decision::Retry {
            delay,
            next_attempt,
            ..
        }) => Outcome::Retry {
            delay,
            next_attempt,
            failure,
        },
        Ok(Decision::DeadLetter {
            dependency,
            reason,
            snapshot,
            source,
        }) => Outcome::DeadLetter {
            reason,
            failure,
            dependency: Some(dependency.as_str().to_owned()),
            budget: snapshot.as_ref().map(BudgetHeaders::from),
            source: Some(source),
        },
        Err(e) => invalid_task(&e),
    }
}

#[allow(clippy::too_many_lines)]
async fn settle<H>(
    ctx: &Ctx<H>,
    delivery: &Delivery,
    table: &FieldTable,
    parsed: Option<JobHeaders>,
    task: &str,
    attempt: u32,
    outcome: Outcome,
) {
    let original_exchange = parsed
        .as_ref()
        .and_then(|h| h.original_exchange.clone())
        .unwrap_or_else(|| delivery.exchange.as_str().to_owned());
    let original_routing_key = parsed
        .as_ref()
        .and_then(|h| h.original_routing_key.clone())
        .unwrap_or_else(|| delivery.routing_key.as_str().to_owned());
    let now = headers::now_ms();
    let first_failure_ms = parsed
        .as_ref()
        .and_then(|h| h.first_failure_ms)
        .unwrap_or(now);
    let replays = parsed.as_ref().map_or(0, |h| h.replays);
    let properties = headers::with_message_id(delivery.properties.clone()).with_delivery_mode(2);

    let published = match outcome {
        Outcome::Success => {
            match delivery.acker.ack(BasicAckOptions::default()).await {
                Ok(_) => bump(&ctx.stats.succeeded),
                Err(e) => {
                    bump(&ctx.stats.ack_failed);
                    tracing::warn!(error = %e, "ack failed; the broker will redeliver the job");
                }
            }
            if let Err(e) = ctx.budget.on_success(task).await {
                tracing::warn!(error = %e, task, "success not counted");
            }
            return;
        }
        Outcome::Retry {
            delay,
            next_attempt,
            failure,
        } => {
            let Some(tier) = ctx.topology.tier_for(delay) else {
                tracing::error!("no retry tiers configured; requeueing");
                requeue(ctx, delivery).await;
                return;
            };
            let mut t = table.clone();
            headers::set_u64(&mut t, headers::ATTEMPT, u64::from(next_attempt));
            headers::set_u64(
                &mut t,
                headers::RETRY_DELAY_MS,
                u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            );
            headers::set_u64(
                &mut t,
                headers::RETRY_TIER_MS,
                u64::try_from(tier.delay.as_millis()).unwrap_or(u64::MAX),
            );
            if tier.delay < delay {
                let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                headers::set_u64(&mut t, headers::NOT_BEFORE_MS, now.saturating_add(delay_ms));
            } else {
                headers::remove(&mut t, headers::NOT_BEFORE_MS);
            }
            headers::set_str(&mut t, headers::ORIGINAL_EXCHANGE, &original_exchange);
            headers::set_str(&mut t, headers::ORIGINAL_ROUTING_KEY, &original_routing_key);
            headers::set_str(&mut t, headers::ORIGINAL_QUEUE, &ctx.queue);
            headers::set_u64(&mut t, headers::FIRST_FAILURE_MS, first_failure_ms);
            headers::set_str(&mut t, headers::TASK, task);
            headers::set_str(&mut t, headers::ERROR_CLASS, &failure.class);
            headers::set_str(
                &mut t,
                headers::ERROR,
                &headers::error_text(&failure.message),
            );
            let result = ctx
                .publisher
                .publish(
                    &tier.exchange,
                    &ctx.queue,
                    &delivery.data,
                    properties.with_headers(t),
                )
                .await;
            result.map(|()| &ctx.stats.retried)
        }
        Outcome::DeadLetter {
            reason,
            failure,
            dependency,
            budget,
            source,
        } => {
            let record = DeadLetterRecord {
                task: task.to_owned(),
                dependency: dependency.unwrap_or_default(),
                reason,
                original_exchange,
                original_routing_key: original_routing_key.clone(),
                original_queue: ctx.queue.clone(),
                attempts: attempt,
                first_failure_ms,
                dead_lettered_ms: now,
                error_class: failure.class.clone(),
                error: failure.message.clone(),
                budget,
                budget_source: source,
                replays,
            };
            let mut t = table.clone();
            record.write(&mut t);
            let result = ctx
                .publisher
                .publish(
                    &ctx.topology.dead_exchange,
                    &original_routing_key,
                    &delivery.data,
                    properties.with_headers(t),
                )
                .await;
            result.map(|()| &ctx.stats.dead_lettered)
        }
    };
    match published {
        Ok(counter) => match delivery.acker.ack(BasicAckOptions::default()).await {
            Ok(_) => bump(counter),
            Err(e) => {
                bump(&ctx.stats.ack_failed);
                tracing::warn!(error = %e, "ack after a confirmed copy failed; the broker will redeliver (a duplicate)");
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "copy not confirmed; the original is requeued, not acked");
            requeue(ctx, delivery).await;
        }
    }
}

/// Sends an early retry to wait in a tier again (no handler, no budget), confirm then ack.
async fn wait_again<H>(ctx: &Ctx<H>, delivery: &Delivery, table: &FieldTable, remaining: Duration) {
    let Some(tier) = ctx.topology.tier_for(remaining) else {
        requeue(ctx, delivery).await;
        return;
    };
    let mut t = table.clone();
    headers::set_u64(
        &mut t,
        headers::RETRY_TIER_MS,
        u64::try_from(tier.delay.as_millis()).unwrap_or(u64::MAX),
    );
    let properties = headers::with_message_id(delivery.properties.clone())
        .with_delivery_mode(2)
        .with_headers(t);
    match ctx
        .publisher
        .publish(&tier.exchange, &ctx.queue, &delivery.data, properties)
        .await
    {
        Ok(()) => match delivery.acker.ack(BasicAckOptions::default()).await {
            Ok(_) => bump(&ctx.stats.waited_again),
            Err(e) => {
                bump(&ctx.stats.ack_failed);
                tracing::warn!(error = %e, "ack after a confirmed copy failed; the broker will redeliver (a duplicate)");
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "copy not confirmed; the original is requeued, not acked");
            requeue(ctx, delivery).await;
        }
    }
}

async fn requeue<H>(ctx: &Ctx<H>, delivery: &Delivery) {
    bump(&ctx.stats.requeued);
    tokio::time::sleep(ctx.unconfirmed_pause).await;
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
