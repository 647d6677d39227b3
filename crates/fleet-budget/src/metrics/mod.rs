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
//! | `fleet_budget_retries_denied_in_process_total` | counter | dependency | of those, the denials of the fleet store answered in the process while they stand (`redis.deny_cache_ms`), without a call (sent to Redis with the next deposit flush, so the fleet's `denied` counts them too) |
//! | `fleet_budget_retries_would_deny_total` | counter | dependency | of the denials, those of a dependency in shadow (`enforcement = "shadow"` or `budgetctl budget shadow`): retried anyway, the job enforcement would have dead-lettered `budget_exhausted` |
//! | `fleet_budget_dead_letters_total` | counter | dependency, reason | dead-letter decisions (`non_retryable`, `attempts_exhausted`, `budget_exhausted`, `budget_frozen`, `delay_exceeded`) |
//! | `fleet_budget_allowance` | gauge | dependency | allowance this process saw at its last decision |
//! | `fleet_budget_headroom` | gauge | dependency | retries still grantable at this process's last decision |
//! | `fleet_budget_fallback_active` | gauge | dependency | 1 while the fleet store fails for the dependency and the fallback decides, else 0 |
//! | `fleet_budget_fallback_dependencies` | gauge | — | dependencies in fallback now (on a Redis Cluster, those on a failed master) |
//! | `fleet_budget_fallback_decisions_total` | counter | mode | retry decisions taken by the fallback (`local`, `deny`, `allow`) |
//! | `fleet_budget_store_errors_total` | counter | kind | store calls that failed (`timeout`, `connection`, `server`, `bad_reply`, `bad_key`, `oom`: Redis's memory is full under `maxmemory-policy noeviction`, the fallback decides) |
//! | `fleet_budget_budget_lost_total` | counter | dependency | store calls that found the dependency's budget hash gone mid-window (evicted under a `maxmemory-policy`, `FLUSHALL`, Redis restarted empty) and restored what this process remembered of it: overrides in force, counters (`lua/README.md`, "Lost budgets"; logged once per dependency per window) |
//! | `fleet_budget_store_call_duration_seconds` | histogram | op | budget store calls (`deposit`, `spend`, `status`), failed ones included; buckets around the 50 ms default deadline |
//! | `fleet_budget_deposits_pending` | gauge | — | deposits counted locally, not yet flushed |
//! | `fleet_budget_policy_conflicts_total` | counter | dependency | store calls whose policy differed from the one in force in Redis (served by that one; logged once per dependency) |
//! | `fleet_budget_calls_in_flight` | gauge | dependency, kind | calls in flight fleet-wide (`primary`, `retry`; hedges count as retries) at this process's last lease call (dependencies with a concurrency budget) |
//! | `fleet_budget_retry_fraction` | gauge | dependency | retries in flight over primary calls in flight, fleet-wide, at the last lease call: it moves before p99 does |
//! | `fleet_budget_hedges_total` | counter | dependency, outcome | hedges asked for (`granted`, `refused`), never counted as retries |
//! | `fleet_budget_breaker_transitions_total` | counter | dependency, to | circuit breaker state changes made by this process (`open`, `half_open`, `closed`), and `lost`: a breaker this process saw open found closed before its open period ended (its key evicted or flushed) |
//! | `fleet_budget_leases_lost_total` | counter | dependency | concurrency leases given back that were gone from Redis before their expiry (evicted by a `maxmemory-policy`, flushed, Redis restarted empty): their slots were free for others meanwhile (logged) |
//! | `fleet_budget_breaker_state` | gauge | dependency | breaker state at this process's last breaker call: 0 closed, 1 open, 2 half-open |
//!
//! Every label is bounded: `dependency` by the configuration plus at most
//! `unmapped_tasks.max_own_budgets + 1` values for unmapped task names (names past the cap share
//! `unmapped`; `share` and `reject` add none), the others by the enums above.
//! Amplification is `executions_total / first_attempts_total`; alert above ~1.5 sustained, and on
//! sustained denials, not on single spikes (`deploy/prometheus/alerts.yml`).

mod alerts;
mod calls;
mod exporter;
mod fleet;
mod prometheus_api;
mod read;
mod record;
mod server;
mod timed_store;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

pub use alerts::AlertSource;
pub use exporter::{ExporterSource, FleetExporter, ReadFuture, SCRAPER_SHARE};
pub use fleet::{DependencyBudget, READ_CONCURRENCY, read_budgets, write_budgets};
pub use prometheus_api::{Prometheus, Series as PrometheusSeries};

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
    retries_would_deny: IntCounterVec,
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
    budget_lost: IntCounterVec,
    /// Dependency → the window index whose lost budget was logged (at most
    /// [`CONFLICT_LOG_LIMIT`] dependencies): one line per dependency per window.
    lost_logged: Arc<Mutex<HashMap<Dependency, u64>>>,
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
            &m.retries_denied_in_process,
            &m.retries_would_deny,
            &m.dead_letters,
            &m.store_errors,
            &m.fallback_decisions,
            &m.policy_conflicts,
            &m.budget_lost,
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
            retries_would_deny: counter(
                "fleet_budget_retries_would_deny_total",
                "Denials of a dependency in shadow, retried anyway: jobs enforcement would have dead-lettered (also in retries_denied_total).",
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
            budget_lost: counter(
                "fleet_budget_budget_lost_total",
                "Store calls that found the dependency's budget hash lost (evicted, flushed, Redis restarted empty) and restored what this process remembered.",
                dep,
            )?,
            lost_logged: Arc::new(Mutex::new(HashMap::new())),
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
