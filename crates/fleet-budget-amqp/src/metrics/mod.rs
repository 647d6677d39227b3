//! The AMQP crate's metrics, on the registry of the worker's budget
//! (`budget.metrics().registry()`, shared by every worker of the process through
//! [`fleet_budget::Metrics::extension`]), so one `/metrics` shows both.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fleet_budget_amqp_deliveries_in_flight` | gauge | — | deliveries being handled or settled now (at most `prefetch` per worker) |
//! | `fleet_budget_amqp_dead_letters_published_total` | counter | reason | dead-letters the broker confirmed (`non_retryable`, `attempts_exhausted`, `budget_exhausted`) |
//! | `fleet_budget_amqp_publish_confirm_duration_seconds` | histogram | kind | publish to confirm of the worker's copies (`retry`, `dead_letter`, `wait_again`), failed ones included |
//! | `fleet_budget_amqp_requeued_total` | counter | — | deliveries put back because their copy was not confirmed |
//! | `fleet_budget_amqp_replayed_messages_total` | counter | outcome | messages a replay moved back, parked, or failed to move (`moved`, `parked`, `failed`) |
//! | `fleet_budget_amqp_connections_lost_total` | counter | lived, cause | worker connections lost after consuming had started: `lived` is `short` (lost before `reconnect_reset_after` without settling a delivery: the reconnect delay keeps growing) or `long`; `cause` is [`LossCause`] (`unreadable_message`, `broker_closed`, `io`, `heartbeat`, `timeout`, `consumer_timeout`, `other`) |
//! | `fleet_budget_amqp_short_lived_connections_in_a_row` | gauge | — | connections lost in a row shortly after connecting, summed over the process's workers; back to 0 once a connection stays up or settles a delivery |
//! | `fleet_budget_amqp_connection_blocked` | gauge | — | worker connections the broker blocks now (a memory or disk alarm: `connection.blocked`), summed over the process's workers; 0 once unblocked |
//! | `fleet_budget_amqp_connection_blocks_total` | counter | resource | times the broker blocked a worker connection, by the alarm its reason names (`memory`, `disk`, `other`) |
//! | `fleet_budget_amqp_copies_not_confirmed_total` | counter | kind, cause | copies of the worker (`retry`, `dead_letter`, `wait_again`, `parked`) the broker did not confirm, by [`RefusalCause`] (`nacked`: refused, e.g. a `max-length` with `overflow reject-publish`; `returned`; `timeout`; `channel`): the job was kept (requeued) |
//! | `fleet_budget_amqp_consumer_timeouts_total` | counter | — | worker channels the broker closed because a delivery stayed unacked past its `consumer_timeout` (the job comes back) |
//!
//! The queues themselves (depth, oldest message) are the fleet exporter's
//! ([`QueueSource`]): one reading for the fleet rather than one per worker.

mod queues;

use std::time::Duration;

use fleet_budget::{DeadLetterReason, FleetBudget};
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

pub use self::queues::QueueSource;
use crate::error::AmqpError;

/// Upper bounds of the confirm-latency buckets, in seconds.
pub const CONFIRM_BUCKETS: [f64; 11] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
];

/// A copy the worker publishes, the `kind` label of the confirm latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum CopyKind {
    Retry,
    DeadLetter,
    WaitAgain,
    Parked,
}

impl CopyKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::DeadLetter => "dead_letter",
            Self::WaitAgain => "wait_again",
            Self::Parked => "parked",
        }
    }
}

/// Why the broker did not confirm a copy, the `cause` label of
/// `fleet_budget_amqp_copies_not_confirmed_total` (bounded: the error goes to the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RefusalCause {
    /// The broker answered `Nack`: a queue refused it (`max-length` or `max-length-bytes` with
    /// `overflow reject-publish`, a quorum queue without a majority).
    Nacked,
    /// The broker returned it: no queue is bound.
    Returned,
    /// No answer within the deadline (counted only while the connection was not blocked).
    Timeout,
    /// The channel or connection failed first.
    Channel,
}

impl RefusalCause {
    /// The cause of `e`.
    #[must_use]
    pub fn of(e: &crate::PublishError) -> Self {
        match e {
            crate::PublishError::Nacked { .. } => Self::Nacked,
            crate::PublishError::Returned { .. } => Self::Returned,
            crate::PublishError::Timeout { .. } => Self::Timeout,
            _ => Self::Channel,
        }
    }

    /// The label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nacked => "nacked",
            Self::Returned => "returned",
            Self::Timeout => "timeout",
            Self::Channel => "channel",
        }
    }
}

/// Why a worker's connection was lost, the `cause` label of
/// `fleet_budget_amqp_connections_lost_total` (bounded: the error text goes to the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossCause {
    /// The client could not read what the broker sent (a parse error, a frame over
    /// `frame_max`): most likely a message at the head of the queue, redelivered on every
    /// connection until it is taken out.
    UnreadableMessage,
    /// The broker closed the connection or a channel (an AMQP error code).
    BrokerClosed,
    /// The socket failed (reset, refused, broken pipe).
    Io,
    /// The broker's heartbeats stopped.
    Heartbeat,
    /// A step did not finish within its deadline.
    Timeout,
    /// The broker closed the channel: a delivery stayed unacked past its `consumer_timeout`.
    ConsumerTimeout,
    /// Anything else.
    Other,
}

impl LossCause {
    /// The cause of `e`.
    #[must_use]
    pub fn of(e: &AmqpError) -> Self {
        if e.is_unreadable_message() {
            return Self::UnreadableMessage;
        }
        if e.is_timeout() {
            return Self::Timeout;
        }
        if e.is_consumer_timeout() {
            return Self::ConsumerTimeout;
        }
        match e.lapin_error().map(lapin::Error::kind) {
            Some(lapin::ErrorKind::ProtocolError(_)) => Self::BrokerClosed,
            Some(lapin::ErrorKind::IOError(_)) => Self::Io,
            Some(lapin::ErrorKind::MissingHeartbeatError) => Self::Heartbeat,
            _ => Self::Other,
        }
    }

    /// The label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnreadableMessage => "unreadable_message",
            Self::BrokerClosed => "broker_closed",
            Self::Io => "io",
            Self::Heartbeat => "heartbeat",
            Self::Timeout => "timeout",
            Self::ConsumerTimeout => "consumer_timeout",
            Self::Other => "other",
        }
    }
}

/// The AMQP crate's metrics (module docs).
#[derive(Debug, Clone)]
pub struct AmqpMetrics {
    in_flight: IntGauge,
    dead_letters_published: IntCounterVec,
    confirm_duration: HistogramVec,
    requeued: IntCounter,
    replayed: IntCounterVec,
    connections_lost: IntCounterVec,
    short_lived_in_a_row: IntGauge,
    blocked: IntGauge,
    blocks: IntCounterVec,
    not_confirmed: IntCounterVec,
    consumer_timeouts: IntCounter,
}

impl AmqpMetrics {
    /// The metrics, registered on `registry`.
    ///
    /// # Errors
    /// The registry already holds metrics of these names.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self::unregistered()?;
        registry.register(Box::new(m.in_flight.clone()))?;
        registry.register(Box::new(m.dead_letters_published.clone()))?;
        registry.register(Box::new(m.confirm_duration.clone()))?;
        registry.register(Box::new(m.requeued.clone()))?;
        registry.register(Box::new(m.replayed.clone()))?;
        registry.register(Box::new(m.connections_lost.clone()))?;
        registry.register(Box::new(m.short_lived_in_a_row.clone()))?;
        registry.register(Box::new(m.blocked.clone()))?;
        registry.register(Box::new(m.blocks.clone()))?;
        registry.register(Box::new(m.not_confirmed.clone()))?;
        registry.register(Box::new(m.consumer_timeouts.clone()))?;
        Ok(m)
    }

    fn unregistered() -> Result<Self, prometheus::Error> {
        Ok(Self {
            in_flight: IntGauge::new(
                "fleet_budget_amqp_deliveries_in_flight",
                "Deliveries being handled or settled now.",
            )?,
            dead_letters_published: IntCounterVec::new(
                Opts::new(
                    "fleet_budget_amqp_dead_letters_published_total",
                    "Dead-letters published and confirmed by the broker, by reason.",
                ),
                &["reason"],
            )?,
            confirm_duration: HistogramVec::new(
                HistogramOpts::new(
                    "fleet_budget_amqp_publish_confirm_duration_seconds",
                    "Publish to broker confirm of the worker's copies, by kind.",
                )
                .buckets(CONFIRM_BUCKETS.to_vec()),
                &["kind"],
            )?,
            requeued: IntCounter::new(
                "fleet_budget_amqp_requeued_total",
                "Deliveries put back because their copy was not confirmed.",
            )?,
            replayed: IntCounterVec::new(
                Opts::new(
                    "fleet_budget_amqp_replayed_messages_total",
                    "Messages replays moved back, parked, or failed to move.",
                ),
                &["outcome"],
            )?,
            connections_lost: IntCounterVec::new(
                Opts::new(
                    "fleet_budget_amqp_connections_lost_total",
                    "Worker connections lost after consuming had started, by how long they lived \
                     (short: before reconnect_reset_after, nothing settled) and cause.",
                ),
                &["lived", "cause"],
            )?,
            short_lived_in_a_row: IntGauge::new(
                "fleet_budget_amqp_short_lived_connections_in_a_row",
                "Worker connections lost in a row shortly after connecting (summed over the \
                 process's workers; 0 once a connection stays up or settles a delivery).",
            )?,
            blocked: IntGauge::new(
                "fleet_budget_amqp_connection_blocked",
                "Worker connections the broker blocks now (a memory or disk alarm), summed over \
                 the process's workers.",
            )?,
            blocks: IntCounterVec::new(
                Opts::new(
                    "fleet_budget_amqp_connection_blocks_total",
                    "Times the broker blocked a worker connection, by the alarm its reason names.",
                ),
                &["resource"],
            )?,
            not_confirmed: IntCounterVec::new(
                Opts::new(
                    "fleet_budget_amqp_copies_not_confirmed_total",
                    "Copies of the worker the broker did not confirm (the job was requeued), by \
                     kind and cause.",
                ),
                &["kind", "cause"],
            )?,
            consumer_timeouts: IntCounter::new(
                "fleet_budget_amqp_consumer_timeouts_total",
                "Worker channels the broker closed for a delivery unacked past consumer_timeout.",
            )?,
        })
    }

    /// The metrics on `budget`'s registry, registered there by the first worker of the process
    /// and shared by the others. If that registry already holds these names from elsewhere, the
    /// metrics are counted but not exposed (logged once).
    #[must_use]
    pub fn of(budget: &FleetBudget) -> Option<Self> {
        match budget.metrics().extension(Self::register) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(error = %e, "AMQP metrics not registered on the budget's registry");
                Self::unregistered().ok()
            }
        }
    }

    pub(crate) fn delivery_started(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    pub(crate) fn confirmed(&self, kind: CopyKind, took: Duration) {
        self.confirm_duration
            .with_label_values(&[kind.as_str()])
            .observe(took.as_secs_f64());
    }

    pub(crate) fn dead_letter_published(&self, reason: DeadLetterReason) {
        self.dead_letters_published
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    pub(crate) fn requeued(&self) {
        self.requeued.inc();
    }

    pub(crate) fn replayed(&self, moved: u64, parked: u64, failed: u64) {
        for (outcome, n) in [("moved", moved), ("parked", parked), ("failed", failed)] {
            self.replayed.with_label_values(&[outcome]).inc_by(n);
        }
    }

    /// A worker's connection was lost: `short` when it died young (see the module docs).
    pub(crate) fn connection_lost(&self, short: bool, cause: LossCause) {
        let lived = if short { "short" } else { "long" };
        self.connections_lost
            .with_label_values(&[lived, cause.as_str()])
            .inc();
    }

    /// A worker's run of short-lived connections grew by one, or (`by` negative) ended.
    pub(crate) fn short_lived_in_a_row_add(&self, by: i64) {
        self.short_lived_in_a_row.add(by);
    }

    /// Worker connections lost so far, `short`-lived or not, for `cause`.
    #[must_use]
    pub fn connections_lost(&self, short: bool, cause: LossCause) -> u64 {
        let lived = if short { "short" } else { "long" };
        self.connections_lost
            .with_label_values(&[lived, cause.as_str()])
            .get()
    }

    /// The broker blocked a connection for `resource`: counted, and in the gauge until the
    /// guard is dropped (unblocked, or the connection gone).
    pub(crate) fn connection_blocked(
        &self,
        resource: crate::connection::BlockedBy,
    ) -> BlockedGauge {
        self.blocks.with_label_values(&[resource.as_str()]).inc();
        self.blocked.inc();
        BlockedGauge(self.blocked.clone())
    }

    /// A copy of `kind` was not confirmed, for `cause`.
    pub(crate) fn not_confirmed(&self, kind: CopyKind, cause: RefusalCause) {
        self.not_confirmed
            .with_label_values(&[kind.as_str(), cause.as_str()])
            .inc();
    }

    /// The broker closed a worker channel for its `consumer_timeout`.
    pub(crate) fn consumer_timed_out(&self) {
        self.consumer_timeouts.inc();
    }

    /// Worker connections blocked by the broker now.
    #[must_use]
    pub fn connections_blocked(&self) -> i64 {
        self.blocked.get()
    }

    /// Times the broker blocked a worker connection for `resource` so far.
    #[must_use]
    pub fn connection_blocks(&self, resource: crate::connection::BlockedBy) -> u64 {
        self.blocks.with_label_values(&[resource.as_str()]).get()
    }

    /// Copies the broker did not confirm so far: of the dead-letter kind when `dead_letter`,
    /// else retries, for `cause`.
    #[must_use]
    pub fn copies_not_confirmed(&self, dead_letter: bool, cause: RefusalCause) -> u64 {
        let kind = if dead_letter {
            CopyKind::DeadLetter
        } else {
            CopyKind::Retry
        };
        self.not_confirmed
            .with_label_values(&[kind.as_str(), cause.as_str()])
            .get()
    }

    /// Worker channels closed by the broker's `consumer_timeout` so far.
    #[must_use]
    pub fn consumer_timeouts(&self) -> u64 {
        self.consumer_timeouts.get()
    }

    /// Connections lost in a row shortly after connecting, summed over the workers.
    #[must_use]
    pub fn short_lived_connections_in_a_row(&self) -> i64 {
        self.short_lived_in_a_row.get()
    }

    /// Dead-letters published and confirmed for `reason` so far.
    #[must_use]
    pub fn dead_letters_published(&self, reason: DeadLetterReason) -> u64 {
        self.dead_letters_published
            .with_label_values(&[reason.as_str()])
            .get()
    }

    /// Deliveries in flight now.
    #[must_use]
    pub fn in_flight(&self) -> i64 {
        self.in_flight.get()
    }
}

/// A blocked connection in `fleet_budget_amqp_connection_blocked`, until dropped.
#[derive(Debug)]
pub(crate) struct BlockedGauge(IntGauge);

impl Drop for BlockedGauge {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One delivery in flight; the gauge goes down when it is dropped (settled, or its task ended).
pub(crate) struct InFlight(IntGauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}
