//! The worker's life: the consume loop, reconnecting with backoff, graceful shutdown, and the
//! steps of one delivery up to its [`Outcome`] (settled by [`super::settle`]).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
use crate::connection::{ConnectionWatch, connect};
use crate::error::AmqpError;
use crate::headers::{self, JobHeaders};
use crate::metrics::{AmqpMetrics, LossCause};
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
        let metrics = AmqpMetrics::of(&self.budget);
        let mut backoff = Backoff::new(&self.options, &self.stats, metrics);
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
        let lost = ConnectionWatch::new(&conn).with_timeouts(t);
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
        let ctx = Ctx {
            settler: Arc::new(Settler {
                budget: self.budget.clone(),
                topology: Arc::clone(&self.topology),
                queue: o.queue.clone(),
                publisher: Publisher::on(conn, t),
                stats: Arc::clone(&self.stats),
                unconfirmed_pause: o.unconfirmed_pause,
                metrics: AmqpMetrics::of(&self.budget),
            }),
            handler: Arc::clone(handler),
        };
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
                        tasks.spawn(process(ctx.clone(), delivery));
                    }
                    Some(Err(e)) => break Err(AmqpError::broker(format!("consume {}", o.queue), e)),
                    None => break Err(AmqpError::ConnectionLost {
                        step: format!("consume {}", o.queue),
                        source: lost.last_error(),
                    }),
                },
                Some(_) = tasks.join_next(), if !tasks.is_empty() => backoff.check_settled(),
                () = &mut lived, if backoff.is_young() => backoff.lived(),
                // A consumer that goes quiet on a lost connection without its error.
                source = &mut connection_lost => break Err(AmqpError::ConnectionLost {
                    step: format!("consume {}", o.queue),
                    source,
                }),
            }
        };
        match ended {
            Ok(()) => {
                // Graceful: stop deliveries, let in-flight jobs finish and settle, then close.
                let _ = t.within(
                    "cancel the worker's consumer",
                    channel.basic_cancel(tag, BasicCancelOptions::default()),
                )
                .await;
                while tasks.join_next().await.is_some() {}
                // A round trip behind the last acks before closing: lapin sends the close ahead
                // of frames still queued, and an ack overtaken by it becomes a redelivery.
                let _ = t.within(
                    "a round trip behind the last acks",
                    channel.basic_qos(o.prefetch, BasicQosOptions::default()),
                )
                .await;
                t.close_channel(&channel, "worker shutdown").await;
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

/// The reconnect delay: doubles after each failure up to `reconnect_max`, with jitter, and
/// starts again from `reconnect_min` only once a connection has lived: stayed up for
/// `reconnect_reset_after`, or settled a delivery. A connection lost younger counts as a failure
/// like a refused connect: a message that closes every connection that consumes it must not
/// turn the worker into a reconnect loop. Also counts the losses in a row of young connections,
/// for the log and the metrics.
#[derive(Debug)]
struct Backoff {
    min: Duration,
    max: Duration,
    reset_after: Duration,
    delay: Duration,
    stats: Arc<super::Stats>,
    metrics: Option<AmqpMetrics>,
    queue: String,
    /// When the connection consuming now started to consume (`None` between connections).
    since: Option<Instant>,
    /// While that connection has not lived yet: the deliveries settled before it (any settled
    /// after are its progress).
    young: Option<u64>,
    /// Connections lost in a row shortly after connecting.
    short_in_a_row: u64,
}

impl Backoff {
    fn new(
        o: &super::WorkerOptions,
        stats: &Arc<super::Stats>,
        metrics: Option<AmqpMetrics>,
    ) -> Self {
        Self {
            min: o.reconnect_min,
            max: o.reconnect_max,
            reset_after: o.reconnect_reset_after,
            delay: o.reconnect_min,
            stats: Arc::clone(stats),
            metrics,
            queue: o.queue.clone(),
            since: None,
            young: None,
            short_in_a_row: 0,
        }
    }

    /// A connection started consuming.
    fn consuming(&mut self) {
        self.since = Some(Instant::now());
        self.young = Some(self.stats.settled());
    }

    /// Whether the connection consuming now has not lived yet.
    fn is_young(&self) -> bool {
        self.young.is_some()
    }

    /// A delivery ended: a settled one means the connection lives.
    fn check_settled(&mut self) {
        if self
            .young
            .is_some_and(|before| self.stats.settled() > before)
        {
            self.lived();
        }
    }

    /// The connection consuming now has lived: the next loss starts from `reconnect_min`.
    fn lived(&mut self) {
        self.young = None;
        self.delay = self.min;
        self.end_run();
    }

    /// Counts the loss of the session that ended with `e`, logs it, and returns the (jittered)
    /// delay before the next connection.
    fn after_loss(&mut self, e: &AmqpError) -> Duration {
        let cause = LossCause::of(e);
        let lived_for = self.since.take().map(|since| since.elapsed());
        if let Some(lived) = lived_for {
            // Deliveries settled in its last moments count too (the check runs as they end).
            let short = lived < self.reset_after
                && self
                    .young
                    .is_some_and(|before| self.stats.settled() == before);
            if short {
                self.short_in_a_row += 1;
                bump(&self.stats.short_lived_connections);
            } else if self.young.is_some() {
                self.lived();
            }
            self.young = None;
            if let Some(m) = &self.metrics {
                m.connection_lost(short, cause);
                if short {
                    m.short_lived_in_a_row_add(1);
                }
            }
        }
        let retry_in = self.delay.mul_f64(rand::rng().random_range(0.5..=1.0));
        let queue = &self.queue;
        let n = self.short_in_a_row;
        if n >= UNREADABLE_AFTER && cause == LossCause::UnreadableMessage {
            tracing::error!(error = %e, lived = ?lived_for, short_lived_in_a_row = n, retry_in = ?retry_in, queue = %queue,
                "worker connection lost {n} times in a row shortly after connecting: likely a message at the head of {queue} that this client cannot read; take it out by hand (README, Incident runbook, \"A message no client can read\")");
        } else if n > 0 {
            tracing::warn!(error = %e, lived = ?lived_for, short_lived_in_a_row = n, retry_in = ?retry_in, queue = %queue,
                "worker lost the broker {n} times in a row shortly after connecting; reconnecting");
        } else {
            tracing::warn!(error = %e, lived = ?lived_for, retry_in = ?retry_in, queue = %queue, "worker lost the broker; reconnecting");
        }
        self.delay = (self.delay * 2).min(self.max);
        retry_in
    }

    /// Ends the run of short-lived connections (a connection lived, or the worker stops).
    fn end_run(&mut self) {
        if let Some(m) = &self.metrics {
            m.short_lived_in_a_row_add(-i64::try_from(self.short_in_a_row).unwrap_or(i64::MAX));
        }
        self.short_in_a_row = 0;
    }
}

/// Short-lived connections in a row from which a loss on a message the client cannot read is
/// logged as an error that names the likely cause and the runbook.
const UNREADABLE_AFTER: u64 = 3;

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
    let held_since = super::outcome::held_since(h.held_since_ms, now);
    let held_for = held_since.map(|since| Duration::from_millis(now - since));
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
            held_since,
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
