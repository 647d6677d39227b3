//! Prometheus metrics, on a registry the embedding application exposes.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fleet_budget_successes_total` | counter | dependency | successful jobs |
//! | `fleet_budget_first_attempts_total` | counter | dependency | first executions of jobs |
//! | `fleet_budget_executions_total` | counter | dependency | all executions (first + retries) |
//! | `fleet_budget_retries_granted_total` | counter | dependency | retries the budget granted |
//! | `fleet_budget_retries_denied_total` | counter | dependency | retries the budget refused (never counted as retries) |
//! | `fleet_budget_dead_letters_total` | counter | dependency, reason | dead-letter decisions |
//! | `fleet_budget_allowance` | gauge | dependency | allowance at the last decision |
//! | `fleet_budget_headroom` | gauge | dependency | retries still grantable at the last decision |
//! | `fleet_budget_fallback_active` | gauge | — | 1 while the fleet store is unreachable and the fallback decides |
//! | `fleet_budget_fallback_dependencies` | gauge | — | dependencies whose store calls fail now (on a Redis Cluster, those on a failed master) |
//! | `fleet_budget_store_errors_total` | counter | kind | store calls that failed (`timeout`, `connection`, `server`, `bad_reply`) |
//! | `fleet_budget_fallback_decisions_total` | counter | mode | retry decisions taken by the fallback |
//! | `fleet_budget_deposits_pending` | gauge | — | deposits counted locally, not yet flushed |
//! | `fleet_budget_policy_conflicts_total` | counter | dependency | store calls whose policy differed from the one in force in Redis (served by that one; logged once per dependency) |
//!
//! Amplification is `executions_total / first_attempts_total`; alert above ~1.5 sustained, and on
//! sustained `retries_denied_total` rates, not on single spikes.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::allowance::BudgetSnapshot;
use crate::decision::DeadLetterReason;
use crate::dependency::Dependency;

/// The metrics of one [`crate::FleetBudget`].
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    successes: IntCounterVec,
    first_attempts: IntCounterVec,
    executions: IntCounterVec,
    retries_granted: IntCounterVec,
    retries_denied: IntCounterVec,
    dead_letters: IntCounterVec,
    allowance: IntGaugeVec,
    headroom: IntGaugeVec,
    fallback_active: IntGauge,
    fallback_dependencies: IntGauge,
    store_errors: IntCounterVec,
    fallback_decisions: IntCounterVec,
    deposits_pending: IntGauge,
    policy_conflicts: IntCounterVec,
    /// Dependencies whose policy conflict was logged (at most [`CONFLICT_LOG_LIMIT`]).
    conflicts_logged: Arc<Mutex<HashSet<Dependency>>>,
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
        for g in [&m.allowance, &m.headroom] {
            registry.register(Box::new(g.clone()))?;
        }
        registry.register(Box::new(m.fallback_active.clone()))?;
        registry.register(Box::new(m.fallback_dependencies.clone()))?;
        registry.register(Box::new(m.deposits_pending.clone()))?;
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
            fallback_active: IntGauge::new(
                "fleet_budget_fallback_active",
                "1 while the fleet store is unreachable and the fallback budget decides.",
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
            registry,
        })
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

    pub(crate) fn fallback(&self, active: bool) {
        self.fallback_active.set(i64::from(active));
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

    /// Value of a per-dependency counter, for tests and `budgetctl` (`successes`,
    /// `first_attempts`, `executions`, `retries_granted`, `retries_denied`, `policy_conflicts`).
    #[must_use]
    pub fn counter(&self, name: &str, dependency: &str) -> u64 {
        let c = match name {
            "successes" => &self.successes,
            "first_attempts" => &self.first_attempts,
            "executions" => &self.executions,
            "retries_granted" => &self.retries_granted,
            "retries_denied" => &self.retries_denied,
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

    /// Whether the fallback is deciding now.
    #[must_use]
    pub fn fallback_is_active(&self) -> bool {
        self.fallback_active.get() == 1
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
