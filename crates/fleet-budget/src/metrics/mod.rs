//! Prometheus metrics, on a registry the embedding application exposes — or serves with
//! [`MetricsServer`] (one line, or `[metrics] listen = "127.0.0.1:9464"` in the configuration).
//!
//! Counters are per process: always `sum by (dependency)` them in PromQL. The fleet's budget as
//! Redis holds it (allowance, headroom, window counts, policy) comes from the fleet exporter
//! (`budgetctl exporter`), not from here: a process only knows what it saw at its last decision.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fleet_budget_first_attempts_total` | counter | dependency | first executions of jobs |
//! | `fleet_budget_executions_total` | counter | dependency | all executions (first attempts + retries); amplification = executions / first attempts |
//! | `fleet_budget_successes_total` | counter | dependency | successful jobs |
//! | `fleet_budget_retries_granted_total` | counter | dependency | retries the budget granted |
//! | `fleet_budget_retries_denied_total` | counter | dependency | retries the budget refused (never counted as retries) |
//! | `fleet_budget_retries_denied_in_process_total` | counter | dependency | of those, the denials of the fleet store answered in the process while they stand (`redis.deny_cache_ms`), without a call |
//! | `fleet_budget_dead_letters_total` | counter | dependency, reason | dead-letter decisions (`non_retryable`, `attempts_exhausted`, `budget_exhausted`, `budget_frozen`, `delay_exceeded`) |
//! | `fleet_budget_allowance` | gauge | dependency | allowance this process saw at its last decision |
//! | `fleet_budget_headroom` | gauge | dependency | retries still grantable at this process's last decision |
//! | `fleet_budget_fallback_active` | gauge | dependency | 1 while the fleet store fails for the dependency and the fallback decides, else 0 |
//! | `fleet_budget_fallback_dependencies` | gauge | — | dependencies in fallback now (on a Redis Cluster, those on a failed master) |
//! | `fleet_budget_fallback_decisions_total` | counter | mode | retry decisions taken by the fallback (`local`, `deny`, `allow`) |
//! | `fleet_budget_store_errors_total` | counter | kind | store calls that failed (`timeout`, `connection`, `server`, `bad_reply`) |
//! | `fleet_budget_store_call_duration_seconds` | histogram | op | budget store calls (`deposit`, `spend`, `status`), failed ones included; buckets around the 50 ms default deadline |
//! | `fleet_budget_deposits_pending` | gauge | — | deposits counted locally, not yet flushed |
//! | `fleet_budget_policy_conflicts_total` | counter | dependency | store calls whose policy differed from the one in force in Redis (served by that one; logged once per dependency) |
//! | `fleet_budget_calls_in_flight` | gauge | dependency, kind | calls in flight fleet-wide (`primary`, `retry`; hedges count as retries) at this process's last lease call (dependencies with a concurrency budget) |
//! | `fleet_budget_retry_fraction` | gauge | dependency | retries in flight over primary calls in flight, fleet-wide, at the last lease call: it moves before p99 does |
//! | `fleet_budget_hedges_total` | counter | dependency, outcome | hedges asked for (`granted`, `refused`), never counted as retries |
//! | `fleet_budget_breaker_transitions_total` | counter | dependency, to | circuit breaker state changes made by this process (`open`, `half_open`, `closed`) |
//! | `fleet_budget_breaker_state` | gauge | dependency | breaker state at this process's last breaker call: 0 closed, 1 open, 2 half-open |
//!
//! Every label is bounded: `dependency` by the configuration plus at most
//! `unmapped_tasks.max_own_budgets + 1` values for unmapped task names (names past the cap share
//! `unmapped`; `share` and `reject` add none), the others by the enums above.
//! Amplification is `executions_total / first_attempts_total`; alert above ~1.5 sustained, and on
//! sustained denials, not on single spikes (`deploy/prometheus/alerts.yml`).

mod calls;
mod exporter;
mod fleet;
mod server;
mod timed_store;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

pub use exporter::{ExporterSource, FleetExporter, ReadFuture, SCRAPER_SHARE};
pub use fleet::{DependencyBudget, READ_CONCURRENCY, read_budgets, write_budgets};

pub use server::{
    CONNECTION_TIMEOUT, Exposition, HEAD_TIMEOUT, MAX_CONNECTIONS, MetricsServer, RenderFuture,
    SCRAPE_TIMEOUT_HEADER, ServeError, TEXT_FORMAT, encode,
};
pub(crate) use timed_store::TimedStore;

use std::any::{Any, TypeId};
use std::collections::HashMap;

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::allowance::BudgetSnapshot;
use crate::decision::DeadLetterReason;
use crate::dependency::Dependency;

/// Upper bounds of the store-call duration buckets, in seconds: fine around the 50 ms default
/// deadline (`redis.timeout_ms`), past which a call fails and the fallback decides.
pub const STORE_CALL_BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.25,
];

/// A budget store operation, the `op` label of `fleet_budget_store_call_duration_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreOp {
    /// Recording deposits (`lua/deposit.lua`).
    Deposit,
    /// Asking for a retry (`lua/spend.lua`).
    Spend,
    /// Reading a budget (`lua/status.lua`).
    Status,
}

impl StoreOp {
    /// The label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deposit => "deposit",
            Self::Spend => "spend",
            Self::Status => "status",
        }
    }
}

/// The metrics of one [`crate::FleetBudget`].
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    successes: IntCounterVec,
    first_attempts: IntCounterVec,
    executions: IntCounterVec,
    retries_granted: IntCounterVec,
    retries_denied: IntCounterVec,
    retries_denied_in_process: IntCounterVec,
    dead_letters: IntCounterVec,
    allowance: IntGaugeVec,
    headroom: IntGaugeVec,
    fallback_active: IntGaugeVec,
    fallback_dependencies: IntGauge,
    store_call_duration: HistogramVec,
    store_errors: IntCounterVec,
    fallback_decisions: IntCounterVec,
    deposits_pending: IntGauge,
    policy_conflicts: IntCounterVec,
    /// Dependencies whose policy conflict was logged (at most [`CONFLICT_LOG_LIMIT`]).
    conflicts_logged: Arc<Mutex<HashSet<Dependency>>>,
    extensions: Extensions,
    calls: calls::CallMetrics,
}

/// Metrics of other crates registered on the same registry (see [`Metrics::extension`]).
#[derive(Clone, Default)]
struct Extensions(Arc<Mutex<HashMap<TypeId, Box<dyn Any + Send + Sync>>>>);

impl std::fmt::Debug for Extensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map_or(0, |m| m.len());
        write!(f, "Extensions({n})")
    }
}

/// At most this many dependencies get their first policy conflict logged: the set is bounded
/// whatever task names the broker delivers.
const CONFLICT_LOG_LIMIT: usize = 1024;

impl Metrics {
    /// Metrics registered on a new registry of their own.
    #[must_use]
    pub fn new() -> Self {
        Self::register(&Registry::new()).unwrap_or_else(|_| Self::unregistered())
    }

    /// Metrics registered on `registry` (e.g. the application's own).
    ///
    /// # Errors
    /// The registry already holds metrics of these names.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self::build(registry.clone())?;
        for c in [
            &m.successes,
            &m.first_attempts,
            &m.executions,
            &m.retries_granted,
            &m.retries_denied,
            &m.dead_letters,
            &m.store_errors,
            &m.fallback_decisions,
            &m.policy_conflicts,
        ] {
            registry.register(Box::new(c.clone()))?;
        }
        for g in [&m.allowance, &m.headroom, &m.fallback_active] {
            registry.register(Box::new(g.clone()))?;
        }
        registry.register(Box::new(m.store_call_duration.clone()))?;
        registry.register(Box::new(m.fallback_dependencies.clone()))?;
        registry.register(Box::new(m.deposits_pending.clone()))?;
        m.calls.register(registry)?;
        Ok(m)
    }

    fn unregistered() -> Self {
        // Building metric families only fails on invalid names, which are constants here.
        Self::build(Registry::new()).unwrap_or_else(|e| unreachable!("constant metric names: {e}"))
    }

    fn build(registry: Registry) -> Result<Self, prometheus::Error> {
        let dep = &["dependency"];
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
        };
        let gauge = |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), dep);
        Ok(Self {
            successes: counter("fleet_budget_successes_total", "Successful jobs.", dep)?,
            first_attempts: counter(
                "fleet_budget_first_attempts_total",
                "First executions of jobs.",
                dep,
            )?,
            executions: counter(
                "fleet_budget_executions_total",
                "Executions of jobs, first attempts and retries.",
                dep,
            )?,
            retries_granted: counter(
                "fleet_budget_retries_granted_total",
                "Retries granted by the budget.",
                dep,
            )?,
            retries_denied: counter(
                "fleet_budget_retries_denied_total",
                "Retries refused by the budget (not counted as retries).",
                dep,
            )?,
            retries_denied_in_process: counter(
                "fleet_budget_retries_denied_in_process_total",
                "Denials of the fleet store answered in the process while they stand, without a call (also in retries_denied_total).",
                dep,
            )?,
            dead_letters: counter(
                "fleet_budget_dead_letters_total",
                "Dead-letter decisions by reason.",
                &["dependency", "reason"],
            )?,
            allowance: gauge(
                "fleet_budget_allowance",
                "Retry allowance of the last window at the last decision.",
            )?,
            headroom: gauge(
                "fleet_budget_headroom",
                "Retries still grantable at the last decision.",
            )?,
            fallback_active: gauge(
                "fleet_budget_fallback_active",
                "1 while the fleet store fails for the dependency and the fallback decides.",
            )?,
            store_call_duration: HistogramVec::new(
                HistogramOpts::new(
                    "fleet_budget_store_call_duration_seconds",
                    "Budget store calls by operation, failed ones included.",
                )
                .buckets(STORE_CALL_BUCKETS.to_vec()),
                &["op"],
            )?,
            fallback_dependencies: IntGauge::new(
                "fleet_budget_fallback_dependencies",
                "Dependencies whose fleet store calls fail now and are decided by the fallback.",
            )?,
            store_errors: counter(
                "fleet_budget_store_errors_total",
                "Budget store calls that failed, by kind.",
                &["kind"],
            )?,
            fallback_decisions: counter(
                "fleet_budget_fallback_decisions_total",
                "Retry decisions taken by the fallback, by mode.",
                &["mode"],
            )?,
            extensions: Extensions::default(),
            deposits_pending: IntGauge::new(
                "fleet_budget_deposits_pending",
                "Deposits counted locally and not yet flushed to the store.",
            )?,
            policy_conflicts: counter(
                "fleet_budget_policy_conflicts_total",
                "Store calls whose policy differed from the one in force (served by that one).",
                dep,
            )?,
            conflicts_logged: Arc::new(Mutex::new(HashSet::new())),
            calls: calls::CallMetrics::build()?,
            registry,
        })
    }

    /// Metrics of another crate (`T`, e.g. the AMQP worker's), registered on this registry the
    /// first time and shared afterwards: every worker of a process that shares one budget counts
    /// into the same series instead of failing on a second registration.
    ///
    /// # Errors
    /// `register` failed (e.g. the registry already holds metrics of its names from elsewhere).
    pub fn extension<T: Any + Clone + Send + Sync, E>(
        &self,
        register: impl FnOnce(&Registry) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut map = self
            .extensions
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(existing) = map
            .get(&TypeId::of::<T>())
            .and_then(|b| b.downcast_ref::<T>())
        {
            return Ok(existing.clone());
        }
        let made = register(&self.registry)?;
        map.insert(TypeId::of::<T>(), Box::new(made.clone()));
        Ok(made)
    }

    /// Serves this registry on `addr` (`/metrics`), once: later calls — other workers sharing
    /// the budget — find the server running and get its address. It stops when the last clone
    /// of these metrics (of the budget) is dropped.
    ///
    /// # Errors
    /// Outside a tokio runtime, or the address cannot be bound.
    pub fn serve(&self, addr: std::net::SocketAddr) -> Result<std::net::SocketAddr, ServeError> {
        let server: Arc<MetricsServer> =
            self.extension(|registry| MetricsServer::start(addr, registry.clone()).map(Arc::new))?;
        Ok(server.local_addr())
    }

    /// The registry to expose (e.g. with `prometheus::TextEncoder`).
    #[must_use]
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The text exposition of every metric.
    #[must_use]
    pub fn render(&self) -> String {
        let families = self.registry.gather();
        prometheus::TextEncoder::new()
            .encode_to_string(&families)
            .unwrap_or_default()
    }

    pub(crate) fn success(&self, d: &Dependency) {
        self.successes.with_label_values(&[d.as_str()]).inc();
    }

    pub(crate) fn execution(&self, d: &Dependency, first: bool) {
        self.executions.with_label_values(&[d.as_str()]).inc();
        if first {
            self.first_attempts.with_label_values(&[d.as_str()]).inc();
        }
    }

    pub(crate) fn retry(&self, d: &Dependency, granted: bool) {
        let c = if granted {
            &self.retries_granted
        } else {
            &self.retries_denied
        };
        c.with_label_values(&[d.as_str()]).inc();
    }

    /// Counts a budget's answer to a retry request: granted or denied; a denial answered in
    /// the process also as such. Its snapshot sets the gauges only when it is fresh: a denial
    /// answered in the process repeats the one its call saw (and is no store call, so no
    /// policy conflict either).
    pub(crate) fn decided(
        &self,
        d: &Dependency,
        withdrawal: &crate::store::Withdrawal,
        source: crate::decision::BudgetSource,
    ) {
        self.retry(d, withdrawal.granted);
        if source == crate::decision::BudgetSource::FleetCache {
            self.retries_denied_in_process
                .with_label_values(&[d.as_str()])
                .inc();
        } else {
            self.snapshot(d, &withdrawal.snapshot);
        }
    }

    pub(crate) fn dead_letter(&self, d: &Dependency, reason: DeadLetterReason) {
        self.dead_letters
            .with_label_values(&[d.as_str(), reason.as_str()])
            .inc();
    }

    pub(crate) fn snapshot(&self, d: &Dependency, s: &BudgetSnapshot) {
        if s.control.conflict {
            self.policy_conflict(d);
        }
        self.allowance
            .with_label_values(&[d.as_str()])
            .set(i64::try_from(s.allowance).unwrap_or(i64::MAX));
        self.headroom
            .with_label_values(&[d.as_str()])
            .set(i64::try_from(s.remaining()).unwrap_or(i64::MAX));
    }

    /// Counts a call whose policy differed from the one in force, and logs the first per
    /// dependency (a rolling deploy makes many; one line says it).
    fn policy_conflict(&self, d: &Dependency) {
        self.policy_conflicts.with_label_values(&[d.as_str()]).inc();
        let first = {
            let mut logged = self
                .conflicts_logged
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            logged.len() < CONFLICT_LOG_LIMIT && logged.insert(d.clone())
        };
        if first {
            tracing::warn!(
                dependency = %d,
                "this worker's budget policy differs from the one in force in Redis, which \
                 decides instead (see `budgetctl status`); counted in \
                 fleet_budget_policy_conflicts_total"
            );
        }
    }

    pub(crate) fn fallback(&self, d: &Dependency, active: bool) {
        self.fallback_active
            .with_label_values(&[d.as_str()])
            .set(i64::from(active));
    }

    /// Makes `fleet_budget_fallback_active` show 0 for `d` before its first failure, so that
    /// a dashboard and an alert see a series for every configured dependency.
    pub(crate) fn healthy(&self, d: &Dependency) {
        let _ = self.fallback_active.with_label_values(&[d.as_str()]);
    }

    pub(crate) fn store_call(&self, op: StoreOp, elapsed: std::time::Duration) {
        self.store_call_duration
            .with_label_values(&[op.as_str()])
            .observe(elapsed.as_secs_f64());
    }

    pub(crate) fn store_error(&self, kind: &str) {
        self.store_errors.with_label_values(&[kind]).inc();
    }

    pub(crate) fn fallback_dependencies(&self, n: u64) {
        self.fallback_dependencies
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn fallback_decision(&self, mode: &str) {
        self.fallback_decisions.with_label_values(&[mode]).inc();
    }

    pub(crate) fn pending(&self, n: u64) {
        self.deposits_pending
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn in_flight(&self, d: &Dependency, n: crate::concurrency::InFlight) {
        self.calls.in_flight(d, n);
    }

    pub(crate) fn hedge(&self, d: &Dependency, granted: bool) {
        self.calls.hedge(d, granted);
    }

    pub(crate) fn breaker_transition(&self, d: &Dependency, to: &str) {
        self.calls.breaker_transition(d, to);
    }

    pub(crate) fn breaker_state(&self, d: &Dependency, code: i64) {
        self.calls.breaker_state(d, code);
    }

    /// Hedges of `dependency` asked for and `granted` (or refused).
    #[must_use]
    pub fn hedges(&self, dependency: &str, granted: bool) -> u64 {
        self.calls.hedges(dependency, granted)
    }

    /// Breaker transitions of `dependency` into `to` (`open`, `half_open`, `closed`).
    #[must_use]
    pub fn breaker_transitions(&self, dependency: &str, to: &str) -> u64 {
        self.calls.breaker_transitions(dependency, to)
    }

    /// Retries in flight over primaries in flight at the last lease call for `dependency`.
    #[must_use]
    pub fn retry_fraction(&self, dependency: &str) -> f64 {
        self.calls.retry_fraction(dependency)
    }

    /// Calls in flight of `kind` (`primary`, `retry`) at the last lease call for `dependency`.
    #[must_use]
    pub fn calls_in_flight(&self, dependency: &str, kind: &str) -> i64 {
        self.calls.calls_in_flight(dependency, kind)
    }

    /// Value of a per-dependency counter, for tests and `budgetctl` (`successes`,
    /// `first_attempts`, `executions`, `retries_granted`, `retries_denied`,
    /// `retries_denied_in_process`, `policy_conflicts`).
    #[must_use]
    pub fn counter(&self, name: &str, dependency: &str) -> u64 {
        let c = match name {
            "successes" => &self.successes,
            "first_attempts" => &self.first_attempts,
            "executions" => &self.executions,
            "retries_granted" => &self.retries_granted,
            "retries_denied" => &self.retries_denied,
            "retries_denied_in_process" => &self.retries_denied_in_process,
            "policy_conflicts" => &self.policy_conflicts,
            _ => return 0,
        };
        c.with_label_values(&[dependency]).get()
    }

    /// Dead-letter decisions for `dependency` and `reason`.
    #[must_use]
    pub fn dead_letters(&self, dependency: &str, reason: DeadLetterReason) -> u64 {
        self.dead_letters
            .with_label_values(&[dependency, reason.as_str()])
            .get()
    }

    /// Whether the fallback is deciding now for `dependency`.
    #[must_use]
    pub fn fallback_is_active(&self, dependency: &str) -> bool {
        self.fallback_active.with_label_values(&[dependency]).get() == 1
    }

    /// Store calls of `op` observed so far.
    #[must_use]
    pub fn store_calls(&self, op: StoreOp) -> u64 {
        self.store_call_duration
            .with_label_values(&[op.as_str()])
            .get_sample_count()
    }

    /// Store errors of `kind`.
    #[must_use]
    pub fn store_errors(&self, kind: &str) -> u64 {
        self.store_errors.with_label_values(&[kind]).get()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Metrics>();
    is::<IntCounter>();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use prometheus::IntCounter;

    use super::Metrics;

    #[test]
    fn an_extension_is_registered_once_and_shared_by_clones() {
        let metrics = Metrics::new();
        let make = |r: &prometheus::Registry| {
            let c = IntCounter::new("fleet_budget_amqp_test_total", "x")?;
            r.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let a: IntCounter = metrics.extension(make).unwrap();
        let clone = metrics.clone();
        let b: IntCounter = clone.extension(make).unwrap();
        let again: Result<IntCounter, prometheus::Error> = make(metrics.registry());
        assert!(
            again.is_err(),
            "a second registration fails: that is why extensions exist"
        );
        a.inc();
        b.inc();
        assert!(
            metrics
                .render()
                .contains("fleet_budget_amqp_test_total 2\n")
        );
    }

    #[tokio::test]
    async fn serve_starts_one_server_for_every_clone() {
        let metrics = Metrics::new();
        let addr = metrics.serve("127.0.0.1:0".parse().unwrap()).unwrap();
        let clone = metrics.clone();
        assert_eq!(clone.serve("127.0.0.1:0".parse().unwrap()).unwrap(), addr);
        assert!(tokio::net::TcpStream::connect(addr).await.is_ok());
    }
}
