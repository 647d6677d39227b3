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

/// Upper bounds of the confirm-latency buckets, in seconds.
pub const CONFIRM_BUCKETS: [f64; 11] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
];

/// A copy the worker publishes, the `kind` label of the confirm latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyKind {
    Retry,
    DeadLetter,
    WaitAgain,
}

impl CopyKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::DeadLetter => "dead_letter",
            Self::WaitAgain => "wait_again",
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

/// One delivery in flight; the gauge goes down when it is dropped (settled, or its task ended).
pub(crate) struct InFlight(IntGauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}
