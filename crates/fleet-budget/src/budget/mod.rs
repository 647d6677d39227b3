//! The worker-facing API: report outcomes, ask "may I retry?", get a [`Decision`].
//!
//! [`FleetBudget::on_failure`] decides in the order of the contract (`docs/semantics.md`):
//! a non-retryable failure is dead-lettered; so is an execution at its task's attempt ceiling;
//! otherwise the dependency's budget is asked for one retry, and a refusal dead-letters the job
//! (`budget_exhausted`) while a grant schedules it after a backoff with jitter (at least any
//! `Retry-After`). [`FleetBudget::on_attempt`] and [`FleetBudget::on_success`] make the deposits
//! that earn retries.
//!
//! How the parts fit:
//! - this file: the API, the decision order, and which store answers;
//! - [`FleetBudgetBuilder`] (`builder.rs`): a budget from parts;
//! - [`coalesce`]: deposits counted in the process and flushed in batches, and what a failed
//!   flush keeps or drops;
//! - [`health`]: whether the fleet store answers per dependency, the probe interval, the
//!   fallback that decides meanwhile, and the one place a store result is recorded;
//! - [`heartbeat`]: this worker's report in the worker registry (which dependencies it
//!   decides from its fallback), for tools; never part of a decision.
//!
//! All time (probe intervals, the age of pending deposits, the local store's windows) comes from
//! one [`Clock`], injectable with [`FleetBudgetBuilder::clock`] so that tests move it instead of
//! sleeping.

mod admission;
mod builder;
pub mod coalesce;
mod deny_cache;
mod failure;
mod fanout;
pub mod health;
pub mod heartbeat;
mod route;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use tokio::sync::Notify;

pub use self::admission::{Admission, Call, CallOutcome, Hold};
pub use self::builder::FleetBudgetBuilder;
use self::coalesce::PendingDeposits;
use self::deny_cache::{DenyCache, Lookup};
pub use self::fanout::FanOut;
use self::health::Health;
pub use self::health::PROBE_INTERVAL;
pub use self::route::Route;
use crate::allowance::BudgetSnapshot;
use crate::breaker::{Breaker, BreakerPolicy};
use crate::ceiling::{Ceilings, TaskCeiling};
use crate::clock::Clock;
use crate::concurrency::{ConcurrencyBudget, ConcurrencyPolicy};
use crate::config::{Config, FallbackMode};
use crate::control::DeadLetterIndex;
use crate::decision::{BudgetSource, DeadLetterReason, Decision};
use crate::dependency::{Dependency, DependencyMap, OwnBudgets};
use crate::error::{Error, StoreError};
use crate::metrics::Metrics;
use crate::policy::BudgetPolicy;
use crate::store::{BudgetStore, Deposits, LocalStore, RedisStore, Withdrawal};

/// A fleet-wide retry budget per dependency, embedded in a worker.
///
/// Cheap to clone; clones share everything. See the crate documentation for an example.
#[derive(Debug, Clone)]
pub struct FleetBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    defaults: BudgetPolicy,
    policies: BTreeMap<Dependency, BudgetPolicy>,
    map: DependencyMap,
    /// The unmapped names given a budget of their own (bounded: `[unmapped_tasks]`).
    own_budgets: OwnBudgets,
    ceilings: Ceilings,
    fleet: Option<Arc<dyn BudgetStore>>,
    /// Concurrency budgets by dependency (`[dependencies.X.concurrency]`).
    concurrency: BTreeMap<Dependency, ConcurrencyPolicy>,
    /// Where leases are kept: the fleet store's Redis, when there is one.
    leases: Option<ConcurrencyBudget>,
    /// Circuit breakers by dependency (`[dependencies.X.breaker]`).
    breakers: BTreeMap<Dependency, BreakerPolicy>,
    /// Where breakers are kept: the fleet store's Redis, when there is one.
    breaker: Option<Breaker>,
    local: LocalStore,
    fallback: FallbackMode,
    clock: Arc<dyn Clock>,
    health: Health,
    /// Denials of the fleet store that still stand, answered without a call (`deny_cache`).
    denials: DenyCache,
    pending: PendingDeposits,
    flush_interval: Duration,
    flush_count: u64,
    flush_now: Notify,
    flusher_running: AtomicBool,
    metrics: Metrics,
    rng: Mutex<SmallRng>,
    /// The worker registry's writer, when the budget reports (`redis.heartbeat_ms`).
    registry: Option<Arc<heartbeat::Registry>>,
    /// Where what this worker dead-letters and parks is counted, when there is a fleet store.
    dead_letters: Option<DeadLetterIndex>,
}

impl FleetBudget {
    /// The budget `config` describes, its fleet store in Redis (single node or cluster).
    ///
    /// Does not wait for Redis: if it is down, decisions come from the fallback until it answers.
    ///
    /// # Errors
    /// A Redis URL that cannot be parsed.
    pub async fn from_config(config: &Config) -> Result<Self, Error> {
        let store = Arc::new(RedisStore::from_settings(&config.redis)?);
        // Settings that drop budgets without an error (eviction, no persistence), logged once.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(crate::risks::log_redis_risks_once(Arc::clone(&store)));
        }
        Ok(Self::builder(config)
            .fleet_store(store.clone())
            .worker_registry(store.clone())
            .leases(ConcurrencyBudget::new(store.clone()))
            .breakers(Breaker::new(store.clone()))
            .dead_letter_index(DeadLetterIndex::new(store))
            .build())
    }

    /// A budget kept in this process only (single-process workers, demos without Redis).
    #[must_use]
    pub fn local(config: &Config) -> Self {
        Self::builder(config).build()
    }

    /// The policy of `dependency`.
    #[must_use]
    pub fn policy(&self, dependency: &Dependency) -> BudgetPolicy {
        self.inner.policy(dependency)
    }

    /// The attempt ceiling and backoff of `task`.
    #[must_use]
    pub fn ceiling(&self, task: &str) -> TaskCeiling {
        self.inner.ceilings.for_task(task)
    }

    /// The metrics (expose `metrics().registry()`).
    #[must_use]
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The fleet store, when there is one.
    #[must_use]
    pub fn fleet_store(&self) -> Option<&Arc<dyn BudgetStore>> {
        self.inner.fleet.as_ref()
    }

    /// Where what this worker dead-letters and parks is counted (the fleet store's Redis, with
    /// [`FleetBudget::from_config`]; `None` for a local budget).
    #[must_use]
    pub fn dead_letter_index(&self) -> Option<&DeadLetterIndex> {
        self.inner.dead_letters.as_ref()
    }

    /// The in-process store (the budget when local only, else the fallback).
    #[must_use]
    pub fn local_store(&self) -> &LocalStore {
        &self.inner.local
    }

    /// Whether the fallback is deciding because the fleet store failed.
    #[must_use]
    pub fn in_fallback(&self) -> bool {
        self.inner.health.any_degraded()
    }

    /// This worker's id in the worker registry, when it reports there (a fleet store given
    /// with [`FleetBudgetBuilder::worker_registry`], `redis.heartbeat_ms` not 0, built inside a
    /// Tokio runtime).
    #[must_use]
    pub fn worker_id(&self) -> Option<&str> {
        self.inner.registry.as_ref().map(|r| r.id.as_str())
    }

    /// The dependencies whose decisions come from the fallback now, each with how long it has
    /// been (ms of the budget's clock), in name order: what the worker registry reports.
    #[must_use]
    pub fn fallback_dependencies(&self) -> Vec<(Dependency, u64)> {
        self.inner.health.episodes()
    }

    /// Reports the start of an execution. `attempt` is 1 for the first execution. First
    /// attempts are deposits under `deposit = "request"` and feed amplification in every mode.
    ///
    /// # Errors
    /// See [`FleetBudget::dependency`]; store failures are not errors (deposits are retried).
    pub async fn on_attempt(&self, task: &str, attempt: u32) -> Result<(), Error> {
        self.attempted(self.dependency(task)?, attempt).await;
        Ok(())
    }

    /// [`FleetBudget::on_attempt`] for a task already mapped ([`FleetBudget::route`]).
    pub async fn on_attempt_routed(&self, route: &Route, attempt: u32) {
        self.attempted(route.dependency().clone(), attempt).await;
    }

    async fn attempted(&self, dependency: Dependency, attempt: u32) {
        let first = attempt <= 1;
        self.inner.metrics.execution(&dependency, first);
        if first {
            self.deposit(
                dependency,
                Deposits {
                    successes: 0,
                    first_attempts: 1,
                },
            )
            .await;
        }
    }

    /// Reports a successful job: one deposit under `deposit = "success"`.
    ///
    /// # Errors
    /// See [`FleetBudget::dependency`]; store failures are not errors (deposits are retried).
    pub async fn on_success(&self, task: &str) -> Result<(), Error> {
        self.succeeded(self.dependency(task)?).await;
        Ok(())
    }

    /// [`FleetBudget::on_success`] for a task already mapped ([`FleetBudget::route`]).
    pub async fn on_success_routed(&self, route: &Route) {
        self.succeeded(route.dependency().clone()).await;
    }

    async fn succeeded(&self, dependency: Dependency) {
        self.inner.metrics.success(&dependency);
        self.deposit(
            dependency,
            Deposits {
                successes: 1,
                first_attempts: 0,
            },
        )
        .await;
    }

    /// Asks `dependency`'s budget for one retry directly (no ceiling, no backoff). A denial of
    /// the fleet store that still stands is answered without a call
    /// ([`BudgetSource::FleetCache`], `redis.deny_cache_ms`).
    pub async fn withdraw(
        &self,
        dependency: &Dependency,
        policy: &BudgetPolicy,
    ) -> (Withdrawal, BudgetSource) {
        let inner = &self.inner;
        let Some(fleet) = &inner.fleet else {
            return (
                inner.local.withdraw_now(dependency, policy),
                BudgetSource::Local,
            );
        };
        let epoch = match inner.denials.lookup(dependency) {
            Lookup::Denied(withdrawal) => {
                // The store never sees this denial: counted here, sent with the deposits.
                inner.denied_in_process(dependency);
                return (withdrawal, BudgetSource::FleetCache);
            }
            Lookup::Ask(epoch) => epoch,
        };
        if inner.health.should_try(dependency) {
            let sent = std::time::Instant::now();
            let asked_ms = inner.health.now_ms();
            let result = fleet.withdraw(dependency, policy).await;
            inner.record(dependency, &result);
            if let Ok(withdrawal) = result {
                inner.health.saw(dependency, asked_ms, &withdrawal);
                inner.denials.remember(dependency, epoch, sent, &withdrawal);
                return (withdrawal, BudgetSource::Fleet);
            }
        }
        inner.fallback_withdrawal(dependency, policy)
    }

    /// The current budget of `dependency`, from the fleet store when it answers.
    pub async fn status(&self, dependency: &Dependency) -> (BudgetSnapshot, BudgetSource) {
        let inner = &self.inner;
        let policy = self.policy(dependency);
        if let Some(fleet) = &inner.fleet {
            let result = fleet.status(dependency, &policy).await;
            inner.record(dependency, &result);
            if let Ok(snapshot) = result {
                inner.denials.seen(dependency, snapshot.control);
                return (snapshot, BudgetSource::Fleet);
            }
            return (
                inner.local.status_now(dependency, &policy),
                BudgetSource::LocalFallback,
            );
        }
        (
            inner.local.status_now(dependency, &policy),
            BudgetSource::Local,
        )
    }

    /// Sends every coalesced deposit to the fleet store now.
    ///
    /// # Errors
    /// The store failed. Deposits it refused stay pending and are sent by a later flush; those
    /// of a call that passed its deadline are not sent again (see [`coalesce`]).
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush_pending(true).await
    }

    /// Flushes deposits, stops the background flusher, and takes this worker out of the
    /// worker registry (its heartbeat ends). Call before the process exits.
    ///
    /// # Errors
    /// The final flush failed (the deposits are lost with the process). A registry that cannot
    /// be left is not an error: the entry turns silent, then is pruned.
    pub async fn shutdown(&self) -> Result<(), StoreError> {
        self.inner.flusher_running.store(false, Ordering::Release);
        self.inner.flush_now.notify_one();
        let flushed = self.flush().await;
        if let Some(registry) = &self.inner.registry {
            registry.leave().await;
        }
        flushed
    }

    /// Deposits counted locally and not yet sent to the fleet store.
    #[must_use]
    pub fn pending_deposits(&self) -> u64 {
        self.inner.pending.total()
    }

    fn dead_letter(
        &self,
        dependency: Dependency,
        reason: DeadLetterReason,
        snapshot: Option<BudgetSnapshot>,
        source: BudgetSource,
    ) -> Decision {
        self.inner.metrics.dead_letter(&dependency, reason);
        Decision::DeadLetter {
            dependency,
            reason,
            snapshot,
            source,
        }
    }

    async fn deposit(&self, dependency: Dependency, deposits: Deposits) {
        let inner = &self.inner;
        let policy = self.policy(&dependency);
        // The local store always sees deposits: it is the budget when local only, and it keeps
        // the fallback warm with this process's traffic when Redis fails.
        inner.local.deposit_now(&dependency, &policy, deposits);
        let Some(fleet) = &inner.fleet else { return };
        if !inner.flush_interval.is_zero() {
            if inner.coalesce(dependency, deposits) >= inner.flush_count {
                inner.flush_now.notify_one();
            }
        } else if inner.health.should_try(&dependency) {
            inner.deposit_now(&**fleet, dependency, deposits).await;
        } else {
            inner.coalesce(dependency, deposits);
        }
    }
}

impl Inner {
    fn policy(&self, dependency: &Dependency) -> BudgetPolicy {
        self.policies
            .get(dependency)
            .copied()
            .unwrap_or(self.defaults)
    }
}
