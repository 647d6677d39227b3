//! What becomes of a delivery once the handler and the budget have spoken: a pure mapping from
//! a [`Decision`] (and the delivery's context) to an [`Outcome`], with no broker and no clock.
//!
//! The worker runtime carries the outcome out (step 4 of [`super`]); anything else that
//! follows the worker's rules without RabbitMQ (`budgetctl demo`'s in-process queue, a test)
//! calls the same functions.

use std::time::Duration;

use fleet_budget::{BudgetSource, DeadLetterReason, Decision, Failure};

use crate::headers::{BudgetHeaders, DeadLetterRecord, HeaderError, HoldRecord, RetryRecord};
use crate::topology::{RetryTier, Topology};

/// The delivery an outcome is about: what its retry or dead-letter copy records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobContext {
    /// The task.
    pub task: String,
    /// The execution that just ran (1 = first).
    pub attempt: u32,
    /// Times replayed so far.
    pub replays: u32,
    /// Where the job was first published.
    pub original_exchange: String,
    /// The routing key it was first published with.
    pub original_routing_key: String,
    /// The queue it was consumed from.
    pub queue: String,
    /// The first failure of this life of the job, when an earlier attempt failed (Unix ms).
    pub first_failure_ms: Option<u64>,
    /// The time of the outcome (Unix ms).
    pub now_ms: u64,
}

impl JobContext {
    fn first_failure_ms(&self) -> u64 {
        self.first_failure_ms.unwrap_or(self.now_ms)
    }

    fn dead_letter(
        &self,
        reason: DeadLetterReason,
        failure: &Failure,
        dependency: String,
        budget: Option<BudgetHeaders>,
        source: BudgetSource,
    ) -> DeadLetterRecord {
        DeadLetterRecord {
            task: self.task.clone(),
            dependency,
            reason,
            original_exchange: self.original_exchange.clone(),
            original_routing_key: self.original_routing_key.clone(),
            original_queue: self.queue.clone(),
            attempts: self.attempt,
            first_failure_ms: self.first_failure_ms(),
            dead_lettered_ms: self.now_ms,
            error_class: failure.class.clone(),
            error: failure.message.clone(),
            budget,
            budget_source: Some(source),
            replays: self.replays,
        }
    }
}

/// What to do with a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The job succeeded: ack it, then count the success.
    Ack,
    /// Publish a copy with `record`'s headers to `tier`, to come back after the tier's delay;
    /// ack the original once the copy is confirmed. A delay longer than the tier has the
    /// record's `not_before_ms`: the copy comes back early and waits again ([`Outcome::Wait`]).
    Retry {
        /// The first hop of its delay ([`Topology::next_hop`]).
        tier: RetryTier,
        /// The headers of the copy.
        record: RetryRecord,
    },
    /// Publish a copy with the record's headers to the dead-letter exchange; ack the original
    /// once the copy is confirmed.
    DeadLetter(DeadLetterRecord),
    /// Send the delivery to wait in `tier` without running it, spending an attempt or asking
    /// the budget: publish a copy with every header kept, [`crate::headers::NOT_BEFORE_MS`]
    /// set to `not_before_ms` and [`crate::headers::RETRY_TIER_MS`] to the tier; ack the
    /// original once the copy is confirmed. Back from the tier before `not_before_ms`, it
    /// waits again, hop by hop, until its time ([`Outcome::wait`]).
    Wait {
        /// The next hop.
        tier: RetryTier,
        /// When it may run (Unix ms).
        not_before_ms: u64,
    },
    /// Hold the delivery without running it, spending an attempt or asking the rate budget
    /// ([`fleet_budget::Admission::Wait`]: a primary at the concurrency cap, a circuit open):
    /// publish a copy with `record`'s headers, [`crate::headers::NOT_BEFORE_MS`] and
    /// [`crate::headers::RETRY_TIER_MS`] to `tier`; ack the original once the copy is
    /// confirmed. Back from the tier, it is admitted again.
    Hold {
        /// The tier it waits in.
        tier: RetryTier,
        /// When it may be admitted again (Unix ms).
        not_before_ms: u64,
        /// Why, since when, and the job's identity.
        record: HoldRecord,
    },
    /// A retry was granted but the topology has no tier to wait in: put the delivery back.
    Requeue,
}

impl Outcome {
    /// The outcome of a failed attempt that the budget decided on.
    #[must_use]
    pub fn of_decision(
        topology: &Topology,
        job: &JobContext,
        failure: &Failure,
        decision: &Decision,
    ) -> Self {
        match decision {
            Decision::Retry {
                delay,
                next_attempt,
                shadow_denied,
                ..
            } => match first_hop(topology, *delay) {
                None => Self::Requeue,
                Some(tier) => Self::Retry {
                    tier: tier.clone(),
                    record: RetryRecord {
                        task: job.task.clone(),
                        attempt: *next_attempt,
                        delay_ms: millis(*delay),
                        tier_ms: millis(tier.delay),
                        not_before_ms: (tier.delay < *delay)
                            .then(|| not_before(job.now_ms, *delay)),
                        original_exchange: job.original_exchange.clone(),
                        original_routing_key: job.original_routing_key.clone(),
                        original_queue: job.queue.clone(),
                        first_failure_ms: job.first_failure_ms(),
                        error_class: failure.class.clone(),
                        error: failure.message.clone(),
                        shadow_denied: shadow_denied.map(DeadLetterReason::as_str),
                    },
                },
            },
            Decision::DeadLetter {
                dependency,
                reason,
                snapshot,
                source,
            } => Self::DeadLetter(job.dead_letter(
                *reason,
                failure,
                dependency.as_str().to_owned(),
                snapshot.as_ref().map(BudgetHeaders::from),
                *source,
            )),
        }
    }

    /// A delivery that is to wait until `not_before_ms` (Unix ms) before it runs, at `now_ms`:
    /// the next hop through the tiers (a retry that came back early, or any job told to wait).
    /// `None` when its time has come (run it now); [`Outcome::Requeue`] without tiers.
    #[must_use]
    pub fn wait(topology: &Topology, now_ms: u64, not_before_ms: u64) -> Option<Self> {
        let remaining = Duration::from_millis(not_before_ms.checked_sub(now_ms)?);
        if remaining.is_zero() {
            return None;
        }
        Some(match topology.next_hop(remaining) {
            None => Self::Requeue,
            Some(tier) => Self::Wait {
                tier: tier.clone(),
                not_before_ms,
            },
        })
    }

    /// A delivery that [`fleet_budget::FleetBudget::admit`] holds for `reason` (`primary_at_cap`,
    /// `circuit_open`): it waits `pause` in a tier and is admitted again. `held_since_ms` is
    /// when an earlier hold began (kept), `None` for its first.
    #[must_use]
    pub fn hold(
        topology: &Topology,
        job: &JobContext,
        reason: &str,
        pause: Duration,
        held_since_ms: Option<u64>,
    ) -> Self {
        match first_hop(topology, pause) {
            None => Self::Requeue,
            Some(tier) => Self::Hold {
                tier: tier.clone(),
                not_before_ms: not_before(job.now_ms, pause),
                record: HoldRecord {
                    task: job.task.clone(),
                    reason: reason.to_owned(),
                    held_since_ms: held_since_ms.unwrap_or(job.now_ms),
                    original_exchange: job.original_exchange.clone(),
                    original_routing_key: job.original_routing_key.clone(),
                    original_queue: job.queue.clone(),
                },
            },
        }
    }

    /// A task the budget cannot map to a dependency: dead-lettered as `non_retryable`, without
    /// a dependency, class `unmapped_task` when unmapped tasks are refused
    /// (`[unmapped_tasks] policy = "reject"`), else `invalid_task` (a name that cannot be a
    /// dependency name).
    #[must_use]
    pub fn invalid_task(job: &JobContext, error: &fleet_budget::Error) -> Self {
        let class = if matches!(
            error,
            fleet_budget::Error::UnmappedTask { .. }
                | fleet_budget::Error::UnmappedDependency { .. }
        ) {
            "unmapped_task"
        } else {
            "invalid_task"
        };
        let failure = Failure::non_retryable(error).with_class(class);
        Self::DeadLetter(job.dead_letter(
            DeadLetterReason::NonRetryable,
            &failure,
            String::new(),
            None,
            BudgetSource::NotConsulted,
        ))
    }

    /// A delivery whose `fb-not-before-ms` is further away than its task's `max_delay`
    /// (`now_ms` in `job`): dead-lettered `delay_exceeded`, class `not_before`, without running
    /// it or asking the budget, instead of cycling through the delay tiers for as long as the
    /// header says.
    #[must_use]
    pub fn not_before_too_far(
        job: &JobContext,
        not_before_ms: u64,
        max_delay: Duration,
        dependency: Option<&str>,
    ) -> Self {
        let failure = Failure::non_retryable(format!(
            "fb-not-before-ms {not_before_ms} is {} ms away, past the task's max_delay of {} ms",
            not_before_ms.saturating_sub(job.now_ms),
            millis(max_delay)
        ))
        .with_class("not_before");
        Self::DeadLetter(job.dead_letter(
            DeadLetterReason::DelayExceeded,
            &failure,
            dependency.unwrap_or_default().to_owned(),
            None,
            BudgetSource::NotConsulted,
        ))
    }

    /// A delivery whose headers of this crate cannot be read: dead-lettered as
    /// `non_retryable`, class `malformed_header`, without running the handler.
    #[must_use]
    pub fn malformed_headers(
        job: &JobContext,
        error: &HeaderError,
        dependency: Option<String>,
    ) -> Self {
        let failure = Failure::non_retryable(error).with_class("malformed_header");
        Self::DeadLetter(job.dead_letter(
            DeadLetterReason::NonRetryable,
            &failure,
            dependency.unwrap_or_default(),
            None,
            BudgetSource::NotConsulted,
        ))
    }
}

/// The first hop of a retry's `delay`; a zero delay still goes through the shortest tier, so
/// that the retry is a new delivery with its new attempt number.
fn first_hop(topology: &Topology, delay: Duration) -> Option<&RetryTier> {
    topology
        .next_hop(delay)
        .or_else(|| topology.retry_tiers.first())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Since when a job has been held, from its `fb-held-since-ms` header: a time after `now_ms` (a
/// producer's header, or a worker whose clock ran ahead) counts from now, so that a job cannot
/// be held past the limit for ever, its hold never seeming to start.
pub(super) fn held_since(header: Option<u64>, now_ms: u64) -> Option<u64> {
    header.map(|since| since.min(now_ms))
}

/// When a job that waits `delay` from `now_ms` may run. `now_ms` is the wall clock truncated to
/// the ms, up to 1 ms behind the instant it was read; one more ms keeps the job from running
/// before its delay has passed (it was seen 32 µs early over several hops otherwise).
fn not_before(now_ms: u64, delay: Duration) -> u64 {
    now_ms.saturating_add(millis(delay)).saturating_add(1)
}

#[cfg(test)]
mod tests;
