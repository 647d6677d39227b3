//! The worker-facing API: report outcomes, ask "may I retry?", get a [`Decision`].
//!
//! [`FleetBudget::on_failure`] decides in the order of the contract (`docs/semantics.md`):
//! a non-retryable failure is dead-lettered; so is an execution at its task's attempt ceiling;
//! otherwise the dependency's budget is asked for one retry, and a refusal dead-letters the job
//! (`budget_exhausted`) while a grant schedules it after a backoff with jitter (at least any
//! `Retry-After`). [`FleetBudget::on_attempt`] and [`FleetBudget::on_success`] make the deposits
//! that earn retries.
//!
//! How the parts fit: [`FleetBudget`] is the API and hands each call to the collaborator that
//! owns what it needs, each with its own state:
//! - `route.rs`: where a task goes (its dependency, its ceiling) and each dependency's policy;
//! - `decide.rs`: the decision order, functions of the failure, the ceiling and the withdrawal;
//! - `rate.rs`: the rate budget, which store answers a withdrawal (fleet, deny cache, fallback);
//! - [`health`]: whether the fleet store answers per dependency, the probe interval, the
//!   fallback that decides meanwhile, and the one place a store result is recorded;
//! - [`coalesce`]: deposits counted in the process and flushed in batches, and what a failed
//!   flush keeps or drops;
//! - `enforcement.rs`: whether a dependency is in shadow now (its configuration, unless an
//!   operator switched it);
//! - `admission.rs`: the admission of each call (the circuit breaker, then a lease);
//! - `deny_cache.rs`: fleet denials answered in the process while they stand;
//! - [`heartbeat`]: this worker's report in the worker registry (which dependencies it
//!   decides from its fallback), for tools; never part of a decision;
//! - [`FleetBudgetBuilder`] (`builder.rs`): a budget from parts, and [`FanOut`] (`fanout.rs`):
//!   jobs that call several dependencies.
//!
//! All time (probe intervals, the age of pending deposits, the local store's windows) comes from
//! one [`Clock`](crate::clock::Clock), injectable with [`FleetBudgetBuilder::clock`] so that
//! tests move it instead of sleeping.

mod admission;
mod builder;
pub mod coalesce;
mod decide;
mod deny_cache;
mod enforcement;
mod fanout;
pub mod health;
pub mod heartbeat;
mod rate;
mod route;

use std::sync::Arc;
use std::time::Duration;

use self::admission::AdmissionControl;
pub use self::admission::{Admission, Call, CallOutcome, Hold};
pub use self::builder::FleetBudgetBuilder;
use self::coalesce::Coalescer;
use self::decide::Jitter;
use self::enforcement::EnforcementInForce;
pub use self::fanout::FanOut;
use self::health::Health;
pub use self::health::PROBE_INTERVAL;
use self::rate::RateBudget;
pub use self::route::Route;
use self::route::{Policies, Routes};
use crate::allowance::BudgetSnapshot;
use crate::breaker::Breaker;
use crate::ceiling::TaskCeiling;
use crate::concurrency::ConcurrencyBudget;
use crate::config::Config;
use crate::control::DeadLetterIndex;
use crate::decision::{BudgetSource, DeadLetterReason, Decision, Enforcement, Failure};
use crate::dependency::Dependency;
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

/// The collaborators, each owning its state.
#[derive(Debug)]
struct Inner {
    policies: Arc<Policies>,
    routes: Routes,
    health: Arc<Health>,
    rate: RateBudget,
    deposits: Arc<Coalescer>,
    admission: AdmissionControl,
    /// Shadow or enforcement, per dependency.
    enforcement: EnforcementInForce,
    /// The jitter of retry delays (and of held jobs' returns, in `admission`).
    jitter: Arc<Jitter>,
    metrics: Metrics,
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
            .enforcement_switches(store.clone())
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
        self.inner.policies.of(dependency)
    }

    /// The attempt ceiling and backoff of `task`.
    #[must_use]
    pub fn ceiling(&self, task: &str) -> TaskCeiling {
        self.inner.routes.ceiling(task)
    }

    /// The metrics (expose `metrics().registry()`).
    #[must_use]
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The fleet store, when there is one.
    #[must_use]
    pub fn fleet_store(&self) -> Option<&Arc<dyn BudgetStore>> {
        self.inner.rate.fleet.as_ref()
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
        &self.inner.rate.local
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

    // Where tasks go (`route.rs`).

    /// Maps `task` once: its dependency ([`FleetBudget::dependency`]) and its ceiling
    /// ([`FleetBudget::ceiling`]), for [`FleetBudget::admit_routed`],
    /// [`FleetBudget::on_attempt_routed`], [`FleetBudget::on_failure_routed`] and
    /// [`FleetBudget::on_success_routed`].
    ///
    /// # Errors
    /// As [`FleetBudget::dependency`].
    pub fn route(&self, task: &str) -> Result<Route, Error> {
        self.inner.routes.route(task)
    }

    /// The dependency whose budget `task` spends: its mapping, else what `[unmapped_tasks]`
    /// says (its own budget while fewer than the cap have one, else the shared `unmapped`
    /// budget; a named dependency's; or a refusal).
    ///
    /// # Errors
    /// An unmapped task that is refused ([`Error::UnmappedTask`]), or that is to be its own
    /// dependency and whose name cannot be a dependency name ([`Error::InvalidTask`]).
    pub fn dependency(&self, task: &str) -> Result<Dependency, Error> {
        self.inner.routes.dependency(task)
    }

    /// The dependency whose budget a failure naming `name` spends
    /// ([`Failure::in_dependency`], a branch of a [`FanOut`]): `name` when a section configures
    /// it (or a mapping, the shared dependency or `unmapped` is that name), else what
    /// `[unmapped_tasks]` says, with the same cap and the same admitted names as unmapped
    /// tasks: a name chosen by a handler (often read from the message) makes no more budgets
    /// or metric label values than an unmapped task name does.
    ///
    /// # Errors
    /// An unknown name that is refused ([`Error::UnmappedDependency`]), or that is to be its
    /// own dependency and cannot be a dependency name ([`Error::InvalidDependency`]).
    pub fn named_dependency(&self, name: &str) -> Result<Dependency, Error> {
        self.inner
            .routes
            .named_dependency(name, &self.inner.policies)
    }

    // Deposits (`coalesce.rs`).

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
            let deposits = Deposits {
                successes: 0,
                first_attempts: 1,
            };
            self.inner.deposits.deposit(dependency, deposits).await;
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
        let deposits = Deposits {
            successes: 1,
            first_attempts: 0,
        };
        self.inner.deposits.deposit(dependency, deposits).await;
    }

    /// Sends every coalesced deposit to the fleet store now.
    ///
    /// # Errors
    /// The store failed. Deposits it refused stay pending and are sent by a later flush; those
    /// of a call that passed its deadline are not sent again (see [`coalesce`]).
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.inner.deposits.flush_pending(true).await
    }

    /// Flushes deposits, stops the background flusher, and takes this worker out of the
    /// worker registry (its heartbeat ends). Call before the process exits.
    ///
    /// # Errors
    /// The final flush failed (the deposits are lost with the process). A registry that cannot
    /// be left is not an error: the entry turns silent, then is pruned.
    pub async fn shutdown(&self) -> Result<(), StoreError> {
        self.inner.deposits.stop_flusher();
        let flushed = self.flush().await;
        if let Some(registry) = &self.inner.registry {
            registry.leave().await;
        }
        flushed
    }

    /// Deposits counted locally and not yet sent to the fleet store.
    #[must_use]
    pub fn pending_deposits(&self) -> u64 {
        self.inner.deposits.pending_total()
    }

    // The decision (`decide.rs`, `rate.rs`).

    /// Decides what to do with a failed execution, in the order of the contract:
    /// non-retryable → dead-letter; `attempt >= max_attempts` → dead-letter; a `Retry-After`
    /// longer than the task's `max_delay` → dead-letter `delay_exceeded`; ask the
    /// dependency's budget for one retry (denied → dead-letter `budget_exhausted`); granted →
    /// delay with backoff and jitter, at least any `Retry-After`.
    ///
    /// `attempt` is the number of the execution that failed (1 for the first). The budget asked
    /// is that of the task's dependency, or of the one the failure names
    /// ([`Failure::in_dependency`], a job calling several). A task with a
    /// recovery window is held to its derived count here; a caller that knows when the job
    /// first failed calls [`FleetBudget::on_failure_since`] to hold it to its window.
    ///
    /// # Errors
    /// See [`FleetBudget::dependency`]. A failing store is not an error: the fallback decides.
    pub async fn on_failure(
        &self,
        task: &str,
        attempt: u32,
        failure: &Failure,
    ) -> Result<Decision, Error> {
        self.on_failure_since(task, attempt, failure, None).await
    }

    /// [`FleetBudget::on_failure`] for a job that first failed `since_first_failure` ago (zero
    /// when this failure is its first): a task with a recovery window retries until the window
    /// has passed, its last delay fitted to end at it (`ceiling::window`). `None` is
    /// [`FleetBudget::on_failure`].
    ///
    /// # Errors
    /// See [`FleetBudget::dependency`].
    pub async fn on_failure_since(
        &self,
        task: &str,
        attempt: u32,
        failure: &Failure,
        since_first_failure: Option<Duration>,
    ) -> Result<Decision, Error> {
        let dependency = match &failure.dependency {
            None => self.dependency(task)?,
            Some(failed) => self.named_dependency(failed)?,
        };
        let ceiling = self.ceiling(task);
        Ok(self
            .decide(dependency, &ceiling, attempt, failure, since_first_failure)
            .await)
    }

    /// [`FleetBudget::on_failure_since`] for a task already mapped ([`FleetBudget::route`]).
    ///
    /// # Errors
    /// A failure naming another dependency ([`Failure::in_dependency`]) that is refused, as
    /// [`FleetBudget::named_dependency`].
    pub async fn on_failure_routed(
        &self,
        route: &Route,
        attempt: u32,
        failure: &Failure,
        since_first_failure: Option<Duration>,
    ) -> Result<Decision, Error> {
        let dependency = match &failure.dependency {
            None => route.dependency().clone(),
            Some(failed) => self.named_dependency(failed)?,
        };
        Ok(self
            .decide(
                dependency,
                route.ceiling(),
                attempt,
                failure,
                since_first_failure,
            )
            .await)
    }

    /// The decision on a failure of `dependency`'s call, in the order of the contract
    /// (`decide.rs`), the budget asked between its two steps.
    async fn decide(
        &self,
        dependency: Dependency,
        ceiling: &TaskCeiling,
        attempt: u32,
        failure: &Failure,
        since_first_failure: Option<Duration>,
    ) -> Decision {
        let attempt = attempt.max(1);
        if let Some(reason) = decide::before_budget(failure, ceiling, attempt, since_first_failure)
        {
            return self.dead_letter(dependency, reason, None, BudgetSource::NotConsulted);
        }
        let (withdrawal, source) = self.withdraw_counted(&dependency).await;
        let shadow_denied = decide::refusal(&withdrawal);
        if let Some(reason) = shadow_denied
            && !self.shadows(&dependency, reason, source).await
        {
            return self.dead_letter(dependency, reason, Some(withdrawal.snapshot), source);
        }
        let retry_after = failure.retry_after_hint();
        let delay = self
            .inner
            .jitter
            .draw(|rng| ceiling.delay(attempt, since_first_failure, retry_after, rng));
        Decision::Retry {
            dependency,
            delay,
            next_attempt: attempt.saturating_add(1),
            snapshot: withdrawal.snapshot,
            source,
            shadow_denied,
        }
    }

    /// Whether `dependency`'s budget's refusal for `reason` is retried anyway (shadow, see
    /// [`Enforcement`]); counted in `fleet_budget_retries_would_deny_total` when it is.
    async fn shadows(
        &self,
        dependency: &Dependency,
        reason: DeadLetterReason,
        source: BudgetSource,
    ) -> bool {
        if !decide::shadows(reason, source, Enforcement::Shadow) {
            return false;
        }
        let shadow = self.inner.enforcement.of(dependency).await == Enforcement::Shadow;
        if shadow {
            self.inner.metrics.would_deny(dependency);
        }
        shadow
    }

    /// Asks `dependency`'s budget for one retry directly (no ceiling, no backoff). A denial of
    /// the fleet store that still stands is answered without a call
    /// ([`BudgetSource::FleetCache`], `redis.deny_cache_ms`).
    pub async fn withdraw(
        &self,
        dependency: &Dependency,
        policy: &BudgetPolicy,
    ) -> (Withdrawal, BudgetSource) {
        self.inner.rate.withdraw(dependency, policy).await
    }

    /// One retry of `dependency`'s budget under its policy, counted in the metrics as a
    /// decision.
    async fn withdraw_counted(&self, dependency: &Dependency) -> (Withdrawal, BudgetSource) {
        let policy = self.policy(dependency);
        let (withdrawal, source) = self.inner.rate.withdraw(dependency, &policy).await;
        self.inner.metrics.decided(dependency, &withdrawal, source);
        (withdrawal, source)
    }

    /// The current budget of `dependency`, from the fleet store when it answers.
    pub async fn status(&self, dependency: &Dependency) -> (BudgetSnapshot, BudgetSource) {
        let policy = self.policy(dependency);
        self.inner.rate.status(dependency, &policy).await
    }

    /// The branches of one execution of `task`, allowed `max_retries` retries across all of
    /// them.
    #[must_use]
    pub fn fan_out(&self, task: &str, max_retries: u32) -> FanOut {
        FanOut::new(self.clone(), task, max_retries)
    }

    fn dead_letter(
        &self,
        dependency: Dependency,
        reason: DeadLetterReason,
        snapshot: Option<BudgetSnapshot>,
        source: BudgetSource,
    ) -> Decision {
        decide::dead_letter(&self.inner.metrics, dependency, reason, snapshot, source)
    }

    fn jitter(&self) -> &Jitter {
        &self.inner.jitter
    }

    // Admission (`admission.rs`).

    /// Asks whether execution `attempt` (1 = first) of `task` may run now; see
    /// [`Admission`] for what each answer means. `held_for` is how long the job has already
    /// been held by earlier [`Admission::Wait`]s (`None`: never). Never waits for a slot.
    ///
    /// # Errors
    /// An unmapped task whose name cannot be a dependency name. A failing store is not an
    /// error: the call runs without a lease.
    pub async fn admit(
        &self,
        task: &str,
        attempt: u32,
        held_for: Option<Duration>,
    ) -> Result<Admission, Error> {
        Ok(self
            .admit_dependency(self.dependency(task)?, attempt, held_for)
            .await)
    }

    /// [`FleetBudget::admit`] for a task already mapped ([`FleetBudget::route`]).
    pub async fn admit_routed(
        &self,
        route: &Route,
        attempt: u32,
        held_for: Option<Duration>,
    ) -> Admission {
        self.admit_dependency(route.dependency().clone(), attempt, held_for)
            .await
    }

    async fn admit_dependency(
        &self,
        dependency: Dependency,
        attempt: u32,
        held_for: Option<Duration>,
    ) -> Admission {
        let policy = self.policy(&dependency);
        self.inner
            .admission
            .admit(dependency, attempt, held_for, &self.inner.rate, &policy)
            .await
    }

    /// Asks for a hedged request to `task`'s dependency: amplification like a retry, so it
    /// draws on the same budgets, a slot of the retry share (when the dependency has a
    /// concurrency budget) and one retry of the rate budget, granted or refused at once. `None`:
    /// do not send the hedge. Counted in `fleet_budget_hedges_total`, never as a retry in this
    /// process's metrics. Give a granted [`Call`] back to [`FleetBudget::finish`].
    ///
    /// # Errors
    /// As [`FleetBudget::admit`]. A failing store refuses the hedge (a hedge is optional).
    pub async fn try_hedge(&self, task: &str) -> Result<Option<Call>, Error> {
        let dependency = self.dependency(task)?;
        let policy = self.policy(&dependency);
        Ok(self
            .inner
            .admission
            .try_hedge(dependency, &self.inner.rate, &policy)
            .await)
    }

    /// Gives back what `call` holds and reports how it ended to the dependency's breaker (a
    /// probe that ended inconclusively is given back for another call to make). A store call
    /// that fails is logged: the slot comes back when its lease expires, a lost probe after the
    /// probe timeout.
    pub async fn finish(&self, call: Call, outcome: CallOutcome) {
        self.inner.admission.finish(call, outcome).await;
    }
}
