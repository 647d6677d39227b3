//! The metrics of calls in flight (the concurrency budget), hedges, and the circuit breaker
//! (issue 13). Kept apart from the rate budget's counters in `mod.rs`; registered with them.

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::concurrency::InFlight;
use crate::dependency::Dependency;

#[derive(Debug, Clone)]
pub(super) struct CallMetrics {
    in_flight: IntGaugeVec,
    retry_fraction: GaugeVec,
    hedges: IntCounterVec,
    breaker_transitions: IntCounterVec,
    leases_lost: IntCounterVec,
    breaker_state: IntGaugeVec,
}

impl CallMetrics {
    pub(super) fn build() -> Result<Self, prometheus::Error> {
        Ok(Self {
            in_flight: IntGaugeVec::new(
                Opts::new(
                    "fleet_budget_calls_in_flight",
                    "Calls in flight fleet-wide (leases of the concurrency budget) at this process's last lease call.",
                ),
                &["dependency", "kind"],
            )?,
            retry_fraction: GaugeVec::new(
                Opts::new(
                    "fleet_budget_retry_fraction",
                    "Retries in flight over primary calls in flight, fleet-wide, at this process's last lease call.",
                ),
                &["dependency"],
            )?,
            hedges: IntCounterVec::new(
                Opts::new(
                    "fleet_budget_hedges_total",
                    "Hedged requests asked for, by outcome (granted, refused); never counted as retries.",
                ),
                &["dependency", "outcome"],
            )?,
            leases_lost: IntCounterVec::new(
                Opts::new(
                    "fleet_budget_leases_lost_total",
                    "Leases given back that were gone from Redis before their expiry (evicted, flushed): their slots were free meanwhile.",
                ),
                &["dependency"],
            )?,
            breaker_transitions: IntCounterVec::new(
                Opts::new(
                    "fleet_budget_breaker_transitions_total",
                    "Circuit breaker state changes this process made, by the state entered.",
                ),
                &["dependency", "to"],
            )?,
            breaker_state: IntGaugeVec::new(
                Opts::new(
                    "fleet_budget_breaker_state",
                    "Circuit breaker state at this process's last breaker call: 0 closed, 1 open, 2 half-open.",
                ),
                &["dependency"],
            )?,
        })
    }

    pub(super) fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.in_flight.clone()))?;
        registry.register(Box::new(self.retry_fraction.clone()))?;
        registry.register(Box::new(self.hedges.clone()))?;
        registry.register(Box::new(self.breaker_transitions.clone()))?;
        registry.register(Box::new(self.leases_lost.clone()))?;
        registry.register(Box::new(self.breaker_state.clone()))
    }

    pub(super) fn in_flight(&self, d: &Dependency, n: InFlight) {
        let set = |kind: &str, v: u64| {
            self.in_flight
                .with_label_values(&[d.as_str(), kind])
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        set("primary", n.primaries);
        set("retry", n.retries);
        #[allow(clippy::cast_precision_loss)] // counts of calls in flight, far below 2^52
        let fraction = if n.primaries == 0 {
            0.0
        } else {
            n.retries as f64 / n.primaries as f64
        };
        self.retry_fraction
            .with_label_values(&[d.as_str()])
            .set(fraction);
        // A series from zero for every dependency with leases, so that an alert sees it.
        let _ = self.leases_lost.with_label_values(&[d.as_str()]);
    }

    pub(super) fn hedge(&self, d: &Dependency, granted: bool) {
        let outcome = if granted { "granted" } else { "refused" };
        self.hedges.with_label_values(&[d.as_str(), outcome]).inc();
    }

    pub(super) fn hedges(&self, d: &str, granted: bool) -> u64 {
        let outcome = if granted { "granted" } else { "refused" };
        self.hedges.with_label_values(&[d, outcome]).get()
    }

    pub(super) fn lease_lost(&self, d: &Dependency) {
        self.leases_lost.with_label_values(&[d.as_str()]).inc();
    }

    pub(super) fn leases_lost(&self, d: &str) -> u64 {
        self.leases_lost.with_label_values(&[d]).get()
    }

    pub(super) fn breaker_transition(&self, d: &Dependency, to: &str) {
        self.breaker_transitions
            .with_label_values(&[d.as_str(), to])
            .inc();
    }

    pub(super) fn breaker_state(&self, d: &Dependency, code: i64) {
        self.breaker_state
            .with_label_values(&[d.as_str()])
            .set(code);
    }

    pub(super) fn breaker_transitions(&self, d: &str, to: &str) -> u64 {
        self.breaker_transitions.with_label_values(&[d, to]).get()
    }

    pub(super) fn retry_fraction(&self, d: &str) -> f64 {
        self.retry_fraction.with_label_values(&[d]).get()
    }

    pub(super) fn calls_in_flight(&self, d: &str, kind: &str) -> i64 {
        self.in_flight.with_label_values(&[d, kind]).get()
    }
}
