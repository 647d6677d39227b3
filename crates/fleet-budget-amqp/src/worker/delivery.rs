//! One delivery, from its headers to its counts: read the headers and the task, hold a retry
//! that is not due yet, ask the budget whether the job may run, run the handler, map a failure
//! to an [`Outcome`] through the budget's decision, hand the outcome to the [`Settler`], and
//! count how it ended, in one place ([`Deliveries::count`]). The task is mapped to its
//! dependency once per delivery ([`FleetBudget::route`]); every budget call of the delivery
//! speaks of that [`Route`].
//!
//! The steps are those of the module documentation of [`super`]; the consume loop
//! (`super::consume`) spawns [`process`] once per delivery.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_budget::printable::escape_text;
use fleet_budget::{Admission, CallOutcome, DeadLetterReason, Error, Failure, FleetBudget, Route};
use futures::FutureExt;
use lapin::message::Delivery;

use super::outcome::{JobContext, Outcome, held_since};
use super::settle::{Ended, Settled, Settler};
use super::{Job, Stats, bump};
use crate::connection::until_unblocked;
use crate::headers::{self, JobHeaders};
use crate::metrics::AmqpMetrics;

/// What every delivery of a connection shares.
pub(super) struct Deliveries<H> {
    pub(super) budget: FleetBudget,
    pub(super) handler: Arc<H>,
    pub(super) settler: Settler,
    pub(super) stats: Arc<Stats>,
    pub(super) metrics: Option<AmqpMetrics>,
    /// The deliveries of the connection not settled yet, to name the one the broker's
    /// `consumer_timeout` ended.
    pub(super) running: Running,
}

/// The deliveries in flight on a connection, by delivery tag: their message id, task, and
/// when they arrived.
#[derive(Debug, Default)]
pub(super) struct Running(Mutex<HashMap<u64, Arrived>>);

/// A delivery in flight: its message id, task, and when it arrived.
type Arrived = (Option<String>, String, Instant);

impl Running {
    fn add(&self, tag: u64, message_id: Option<String>, task: String) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(tag, (message_id, task, Instant::now()));
    }

    fn remove(&self, tag: u64) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&tag);
    }

    /// The deliveries unsettled for at least `at_least`, the longest first (the one the broker
    /// timed out among them): message id, task, and for how long.
    pub(super) fn older_than(&self, at_least: Duration) -> Vec<(Option<String>, String, Duration)> {
        let mut old: Vec<_> = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .map(|(id, task, since)| (id.clone(), task.clone(), since.elapsed()))
            .filter(|(_, _, age)| *age >= at_least)
            .collect();
        old.sort_by_key(|b| std::cmp::Reverse(b.2));
        old
    }
}

/// Takes a delivery out of [`Running`] when its task ends, however it ends.
struct Unsettled<'a>(&'a Running, u64);

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        self.0.remove(self.1);
    }
}

/// Steps 1–4 of one delivery (see the module documentation of [`super`]), then its count.
pub(super) async fn process<H, F>(d: Arc<Deliveries<H>>, delivery: Delivery)
where
    H: Fn(Job) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), Failure>> + Send + 'static,
{
    let _in_flight = d.metrics.as_ref().map(AmqpMetrics::delivery_started);
    bump(&d.stats.deliveries);
    let table = headers::without_broker_headers(&headers::table(&delivery.properties));
    let parsed = JobHeaders::parse(&table);
    let task = task_of(&delivery, parsed.as_ref().ok());
    d.running.add(
        delivery.delivery_tag,
        headers::message_id(&delivery.properties).map(str::to_owned),
        task.clone(),
    );
    let _unsettled = Unsettled(&d.running, delivery.delivery_tag);
    // No job starts on a connection the broker blocks (a resource alarm): its outcome could
    // not be published before the alarm clears. It waits unacked; at most `prefetch` do.
    if let Some(conn) = d.settler.publisher.connection() {
        until_unblocked(conn.status()).await;
    }
    let route = d.budget.route(&task);
    let mut job = job_context(&delivery, parsed.as_ref().ok(), &task, &d.settler.queue);
    let outcome = match &parsed {
        Err(e) => {
            job.now_ms = headers::now_ms();
            Outcome::malformed_headers(&job, e, dependency_name(&route))
        }
        Ok(h) => match not_due(&d, &mut job, h, &route) {
            Some(outcome) => outcome,
            None => match &route {
                Ok(route) => d.run(&delivery, &mut job, h, route).await,
                Err(e) => {
                    job.now_ms = headers::now_ms();
                    Outcome::invalid_task(&job, e)
                }
            },
        },
    };
    let settled = d.settler.carry_out(&delivery, &table, outcome).await;
    d.count(route.as_ref().ok(), &task, settled).await;
}

/// The task of a delivery: the AMQP `type` property, else [`headers::TASK`], else the routing
/// key.
fn task_of(delivery: &Delivery, known: Option<&JobHeaders>) -> String {
    delivery
        .properties
        .kind()
        .as_ref()
        .map(|k| k.as_str().to_owned())
        .filter(|k| !k.is_empty())
        .or_else(|| known.and_then(|h| h.task.clone()))
        .unwrap_or_else(|| delivery.routing_key.as_str().to_owned())
}

/// The name of the dependency the task spends, for an outcome decided without the budget (a
/// malformed header, a wait past `max_delay`); `None` when the task maps to none.
fn dependency_name(route: &Result<Route, Error>) -> Option<String> {
    route
        .as_ref()
        .ok()
        .map(|r| r.dependency().as_str().to_owned())
}

/// A delivery not due yet (a retry between hops of its delay): it waits in the next tier,
/// unless it asks to wait longer than its task's `max_delay`: then it is dead-lettered, not
/// held. `None` when it is due.
fn not_due<H>(
    d: &Deliveries<H>,
    job: &mut JobContext,
    h: &JobHeaders,
    route: &Result<Route, Error>,
) -> Option<Outcome> {
    let not_before = h.not_before_ms?;
    let now = headers::now_ms();
    // A task that maps to no dependency still has a ceiling (the defaults, or its own).
    let ceiling = match route {
        Ok(route) => *route.ceiling(),
        Err(_) => d.budget.ceiling(&job.task),
    };
    if ceiling.allows_wait(Duration::from_millis(not_before.saturating_sub(now))) {
        return Outcome::wait(&d.settler.topology, now, not_before);
    }
    job.now_ms = now;
    let dependency = dependency_name(route);
    Some(Outcome::not_before_too_far(
        job,
        not_before,
        ceiling.max_delay.unwrap_or_default(),
        dependency.as_deref(),
    ))
}

impl<H> Deliveries<H> {
    /// A due job with readable headers: admitted by the budget, run, its call finished, and a
    /// failure decided.
    async fn run<F>(
        &self,
        delivery: &Delivery,
        job: &mut JobContext,
        h: &JobHeaders,
        route: &Route,
    ) -> Outcome
    where
        H: Fn(Job) -> F,
        F: Future<Output = Result<(), Failure>>,
    {
        let call = match self.admit(job, h, route).await {
            Ok(call) => call,
            Err(outcome) => return outcome,
        };
        self.budget.on_attempt_routed(route, h.attempt).await;
        match run_handler(&*self.handler, delivery, &job.task, h).await {
            Ok(()) => {
                self.budget.finish(call, CallOutcome::Succeeded).await;
                Outcome::Ack
            }
            Err(failure) => {
                let elsewhere = failure
                    .dependency
                    .as_deref()
                    .is_some_and(|d| d != call.dependency().as_str());
                // A failure of another dependency the job calls says nothing about this one's
                // health.
                let ended = if failure.is_retryable() && !elsewhere {
                    CallOutcome::Failed
                } else {
                    CallOutcome::Inconclusive
                };
                self.budget.finish(call, ended).await;
                self.decide(job, &failure, route).await
            }
        }
    }

    /// Asks the budget whether the job may run now ([`FleetBudget::admit`]): the
    /// call to give back when it may, else the outcome (held in a tier, or dead-lettered) with
    /// the time set.
    async fn admit(
        &self,
        job: &mut JobContext,
        h: &JobHeaders,
        route: &Route,
    ) -> Result<fleet_budget::Call, Outcome> {
        let now = headers::now_ms();
        let held_since = held_since(h.held_since_ms, now);
        let held_for = held_since.map(|since| Duration::from_millis(now - since));
        let admission = self.budget.admit_routed(route, h.attempt, held_for).await;
        job.now_ms = now;
        let topology = &self.settler.topology;
        match admission {
            Admission::Run(call) => Ok(call),
            Admission::Wait(hold) => Err(Outcome::hold(
                topology,
                job,
                hold.as_str(),
                hold.pause(),
                held_since,
            )),
            Admission::DeadLetter(decision) => {
                let reason = decision
                    .dead_letter_reason()
                    .map_or("refused", DeadLetterReason::as_str);
                let failure = Failure::retryable(format!(
                    "not run: the concurrency budget refused the retry ({reason})"
                ))
                .with_class(reason);
                Err(Outcome::of_decision(topology, job, &failure, &decision))
            }
        }
    }

    /// Asks the budget about `failure` and maps its decision to an outcome. The time since the
    /// job's first failure (zero when this is the first) holds a task with a recovery window to
    /// it.
    async fn decide(&self, job: &mut JobContext, failure: &Failure, route: &Route) -> Outcome {
        let failed_ms = headers::now_ms();
        let since_first_failure = Duration::from_millis(
            failed_ms.saturating_sub(job.first_failure_ms.unwrap_or(failed_ms)),
        );
        let decision = self
            .budget
            .on_failure_routed(route, job.attempt, failure, Some(since_first_failure))
            .await;
        job.now_ms = headers::now_ms();
        match decision {
            Ok(decision) => Outcome::of_decision(&self.settler.topology, job, failure, &decision),
            Err(e) => Outcome::invalid_task(job, &e),
        }
    }

    /// Counts how the delivery of `task` ended: the worker's counters ([`super::WorkerCounts`]),
    /// the AMQP metrics, and a success reported to the budget (through the delivery's `route`;
    /// a task that maps to none never ran). The one place an outcome is counted.
    async fn count(&self, route: Option<&Route>, task: &str, settled: Settled) {
        let s = &self.stats;
        let ended = match settled {
            Settled::Acked(ended) => {
                bump(match ended {
                    Ended::Succeeded => &s.succeeded,
                    Ended::Retried => &s.retried,
                    Ended::DeadLettered(_) => &s.dead_lettered,
                    Ended::WaitedAgain => &s.waited_again,
                    Ended::Held => &s.held,
                    Ended::Parked => &s.parked,
                });
                ended
            }
            Settled::AckFailed(ended) => {
                bump(&s.ack_failed);
                ended
            }
            Settled::Requeued => {
                bump(&s.requeued);
                if let Some(m) = &self.metrics {
                    m.requeued();
                }
                return;
            }
            Settled::Rejected => {
                bump(&s.broker_dead_lettered);
                return;
            }
        };
        match ended {
            Ended::DeadLettered(reason) => {
                if let Some(m) = &self.metrics {
                    m.dead_letter_published(reason);
                }
            }
            Ended::Succeeded => match route {
                Some(route) => self.budget.on_success_routed(route).await,
                None => {
                    tracing::warn!(task = %escape_text(task), "success not counted: the task maps to no dependency");
                }
            },
            Ended::Retried | Ended::WaitedAgain | Ended::Held | Ended::Parked => {}
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
