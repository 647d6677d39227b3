//! The worker-facing API: report outcomes, ask "may I retry?", get a [`Decision`].
//!
//! # Coalesced deposits, and the staleness they add
//!
//! At thousands of jobs per second per process, one Redis round trip per success would be the
//! dominant load on Redis. So [`FleetBudget::on_success`] and [`FleetBudget::on_attempt`] only
//! count deposits in the process; a background task sends them in **one script call per
//! dependency** every `redis.deposit_flush` (default 100 ms), sooner when
//! `redis.deposit_flush_count` (default 1,000) are pending for one dependency, and on
//! [`FleetBudget::flush`] / [`FleetBudget::shutdown`]. Retry decisions are not coalesced: each is
//! one atomic round trip. Measured: 0.006 round trips per successful job at 2,000 jobs/s
//! (`docs/BENCHMARKS.md`).
//!
//! The price is staleness: **the fleet-wide allowance lags this process's successes by at most
//! one flush interval** (plus the flush's own round trip). The lag is in the safe direction:
//! deposits not yet sent can only make the allowance *smaller* than the exact one, never larger,
//! so a retry storm is never let through by coalescing; at worst a retry is denied that a
//! perfectly fresh count would have granted (at `ratio = 0.2` and 1,000 jobs/s, 100 ms of lag
//! is 20 retries out of an allowance of 12,000 per minute). A deposit counted just before a
//! window boundary may be recorded just after it; the sliding estimate makes that shift
//! negligible.
//!
//! When a flush fails:
//! - **Redis unreachable** (refused, reset, broken pipe): the deposits stay pending and are sent
//!   by a later flush once Redis answers (without coalescing, `deposit_flush_ms = 0`, by the next
//!   deposit that reaches Redis), so they are not lost while the process lives (they
//!   are lost with the process if [`FleetBudget::shutdown`] cannot flush).
//! - **Deadline passed**: the request most likely reached Redis and runs there late (a paused or
//!   busy server runs it when it wakes up), so it is *not* sent again; counting it twice would
//!   err in the unsafe direction. If it never arrived, those deposits are missing: the safe
//!   direction again.
//! - Deposits pending for longer than one window (a long outage) are dropped rather than sent:
//!   they would all land in the current server window at once and inflate the allowance with
//!   traffic the sliding estimate no longer counts.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::sync::Notify;

use crate::allowance::BudgetSnapshot;
use crate::ceiling::{Ceilings, TaskCeiling};
use crate::config::{Config, FallbackMode};
use crate::decision::{BudgetSource, DeadLetterReason, Decision, Failure};
use crate::dependency::{Dependency, DependencyMap};
use crate::error::{Error, StoreError};
use crate::metrics::Metrics;
use crate::policy::BudgetPolicy;
use crate::store::{BudgetStore, Deposits, LocalStore, RedisStore, RedisTarget, Withdrawal};

/// While the fleet store is failing, it is retried at most this often; other calls go straight
/// to the fallback instead of each waiting for a deadline.
const PROBE_INTERVAL: Duration = Duration::from_millis(200);

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
    ceilings: Ceilings,
    fleet: Option<Arc<dyn BudgetStore>>,
    local: LocalStore,
    fallback: FallbackMode,
    health: Health,
    pending: Mutex<HashMap<Dependency, Pending>>,
    flush_interval: Duration,
    flush_count: u64,
    flush_now: Notify,
    flusher_running: AtomicBool,
    metrics: Metrics,
    rng: Mutex<SmallRng>,
}

/// Builds a [`FleetBudget`] from parts (tests, the simulator, custom stores).
#[derive(Debug)]
pub struct FleetBudgetBuilder {
    config: Config,
    fleet: Option<Arc<dyn BudgetStore>>,
    local: Option<LocalStore>,
    metrics: Option<Metrics>,
    seed: Option<u64>,
}

impl FleetBudgetBuilder {
    /// Uses `store` as the fleet-wide store (otherwise the budget is local only).
    #[must_use]
    pub fn fleet_store(mut self, store: Arc<dyn BudgetStore>) -> Self {
        self.fleet = Some(store);
        self
    }

    /// Uses `local` as the in-process store (the budget when local only, else the fallback).
    #[must_use]
    pub fn local_store(mut self, local: LocalStore) -> Self {
        self.local = Some(local);
        self
    }

    /// Registers metrics on the application's registry instead of a private one.
    #[must_use]
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Seeds the backoff jitter (deterministic tests and simulations).
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Builds the budget. Inside a Tokio runtime, with a fleet store and a non-zero
    /// `redis.deposit_flush`, a background task flushes coalesced deposits; otherwise every
    /// deposit is recorded with its own store call.
    #[must_use]
    pub fn build(self) -> FleetBudget {
        let c = self.config;
        let coalesce = self.fleet.is_some()
            && !c.redis.deposit_flush.is_zero()
            && tokio::runtime::Handle::try_current().is_ok();
        let inner = Arc::new(Inner {
            defaults: c.defaults,
            policies: c.policies,
            map: c.map,
            ceilings: c.ceilings,
            fleet: self.fleet,
            local: self.local.unwrap_or_default(),
            fallback: c.redis.fallback,
            health: Health::new(),
            pending: Mutex::new(HashMap::new()),
            flush_interval: if coalesce {
                c.redis.deposit_flush
            } else {
                Duration::ZERO
            },
            flush_count: c.redis.deposit_flush_count,
            flush_now: Notify::new(),
            flusher_running: AtomicBool::new(coalesce),
            metrics: self.metrics.unwrap_or_default(),
            rng: Mutex::new(self.seed.map_or_else(
                || SmallRng::from_rng(&mut rand::rng()),
                SmallRng::seed_from_u64,
            )),
        });
        if coalesce {
            tokio::spawn(flusher(Arc::downgrade(&inner), inner.flush_interval));
        }
        FleetBudget { inner }
    }
}

impl FleetBudget {
    /// A builder over `config` (local only until a fleet store is given).
    #[must_use]
    pub fn builder(config: &Config) -> FleetBudgetBuilder {
        FleetBudgetBuilder {
            config: config.clone(),
            fleet: None,
            local: None,
            metrics: None,
            seed: None,
        }
    }

    /// The budget `config` describes, its fleet store in Redis (single node or cluster).
    ///
    /// Does not wait for Redis: if it is down, decisions come from the fallback until it answers.
    ///
    /// # Errors
    /// A Redis URL that cannot be parsed.
    pub async fn from_config(config: &Config) -> Result<Self, Error> {
        let target = if config.redis.cluster_urls.is_empty() {
            RedisTarget::Single(config.redis.url.clone())
        } else {
            RedisTarget::Cluster(config.redis.cluster_urls.clone())
        };
        let store = RedisStore::new(target, &config.redis.key_prefix, config.redis.timeout)?;
        Ok(Self::builder(config).fleet_store(Arc::new(store)).build())
    }

    /// A budget kept in this process only (single-process workers, demos without Redis).
    #[must_use]
    pub fn local(config: &Config) -> Self {
        Self::builder(config).build()
    }

    /// The dependency whose budget `task` spends.
    ///
    /// # Errors
    /// An unmapped task whose name cannot be a dependency name.
    pub fn dependency(&self, task: &str) -> Result<Dependency, Error> {
        self.inner
            .map
            .resolve(task)
            .map_err(|source| Error::InvalidTask {
                task: task.to_owned(),
                source,
            })
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

    /// Reports the start of an execution. `attempt` is 1 for the first execution. First
    /// attempts are deposits under `deposit = "request"` and feed amplification in every mode.
    ///
    /// # Errors
    /// See [`FleetBudget::dependency`]; store failures are not errors (deposits are retried).
    pub async fn on_attempt(&self, task: &str, attempt: u32) -> Result<(), Error> {
        let dependency = self.dependency(task)?;
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
        Ok(())
    }

    /// Reports a successful job: one deposit under `deposit = "success"`.
    ///
    /// # Errors
    /// See [`FleetBudget::dependency`]; store failures are not errors (deposits are retried).
    pub async fn on_success(&self, task: &str) -> Result<(), Error> {
        let dependency = self.dependency(task)?;
        self.inner.metrics.success(&dependency);
        self.deposit(
            dependency,
            Deposits {
                successes: 1,
                first_attempts: 0,
            },
        )
        .await;
        Ok(())
    }

    /// Decides what to do with a failed execution, in the order of the contract:
    /// non-retryable → dead-letter; `attempt >= max_attempts` → dead-letter; ask the
    /// dependency's budget for one retry (denied → dead-letter `budget_exhausted`); granted →
    /// delay with backoff and jitter, at least any `Retry-After`.
    ///
    /// `attempt` is the number of the execution that failed (1 for the first).
    ///
    /// # Errors
    /// See [`FleetBudget::dependency`]. A failing store is not an error: the fallback decides.
    pub async fn on_failure(
        &self,
        task: &str,
        attempt: u32,
        failure: &Failure,
    ) -> Result<Decision, Error> {
        let dependency = self.dependency(task)?;
        let attempt = attempt.max(1);
        if !failure.is_retryable() {
            return Ok(self.dead_letter(
                dependency,
                DeadLetterReason::NonRetryable,
                None,
                BudgetSource::NotConsulted,
            ));
        }
        let ceiling = self.ceiling(task);
        if attempt >= ceiling.max_attempts {
            return Ok(self.dead_letter(
                dependency,
                DeadLetterReason::AttemptsExhausted,
                None,
                BudgetSource::NotConsulted,
            ));
        }
        let policy = self.policy(&dependency);
        let (withdrawal, source) = self.withdraw(&dependency, &policy).await;
        self.inner.metrics.retry(&dependency, withdrawal.granted);
        self.inner
            .metrics
            .snapshot(&dependency, &withdrawal.snapshot);
        if !withdrawal.granted {
            return Ok(self.dead_letter(
                dependency,
                DeadLetterReason::BudgetExhausted,
                Some(withdrawal.snapshot),
                source,
            ));
        }
        let delay = {
            let mut rng = self
                .inner
                .rng
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            ceiling
                .backoff
                .delay(attempt, failure.retry_after_hint(), &mut *rng)
        };
        Ok(Decision::Retry {
            dependency,
            delay,
            next_attempt: attempt.saturating_add(1),
            snapshot: withdrawal.snapshot,
            source,
        })
    }

    /// Asks `dependency`'s budget for one retry directly (no ceiling, no backoff).
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
        if inner.health.should_try(dependency) {
            match fleet.withdraw(dependency, policy).await {
                Ok(w) => {
                    inner.health.ok(dependency, &inner.metrics);
                    return (w, BudgetSource::Fleet);
                }
                Err(e) => inner
                    .health
                    .failed(dependency, &e, &inner.metrics, inner.fallback),
            }
        }
        inner.metrics.fallback_decision(inner.fallback.as_str());
        match inner.fallback {
            FallbackMode::Local => (
                inner.local.withdraw_now(dependency, policy),
                BudgetSource::LocalFallback,
            ),
            FallbackMode::Deny => {
                let snapshot = inner.local.status_now(dependency, policy);
                (
                    Withdrawal {
                        granted: false,
                        snapshot,
                    },
                    BudgetSource::Blind,
                )
            }
            FallbackMode::Allow => {
                let snapshot = inner.local.status_now(dependency, policy);
                (
                    Withdrawal {
                        granted: true,
                        snapshot,
                    },
                    BudgetSource::Blind,
                )
            }
        }
    }

    /// The current budget of `dependency`, from the fleet store when it answers.
    pub async fn status(&self, dependency: &Dependency) -> (BudgetSnapshot, BudgetSource) {
        let inner = &self.inner;
        let policy = self.policy(dependency);
        if let Some(fleet) = &inner.fleet {
            match fleet.status(dependency, &policy).await {
                Ok(s) => {
                    inner.health.ok(dependency, &inner.metrics);
                    return (s, BudgetSource::Fleet);
                }
                Err(e) => inner
                    .health
                    .failed(dependency, &e, &inner.metrics, inner.fallback),
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
    /// of a call that passed its deadline are not sent again (see the module documentation).
    pub async fn flush(&self) -> Result<(), StoreError> {
        flush_pending(&self.inner, true).await
    }

    /// Flushes deposits and stops the background flusher. Call before the process exits.
    ///
    /// # Errors
    /// The final flush failed (the deposits are lost with the process).
    pub async fn shutdown(&self) -> Result<(), StoreError> {
        self.inner.flusher_running.store(false, Ordering::Release);
        self.inner.flush_now.notify_one();
        self.flush().await
    }

    /// Deposits counted locally and not yet sent to the fleet store.
    #[must_use]
    pub fn pending_deposits(&self) -> u64 {
        let pending = self
            .inner
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        pending.values().map(|p| p.deposits.total()).sum()
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
        if inner.flush_interval.is_zero() {
            if inner.health.should_try(&dependency) {
                // Carry along what an earlier failed call kept back: with no flusher, this is
                // the next chance to send it.
                let mut batch = Pending {
                    deposits,
                    since: Instant::now(),
                };
                if let Some(kept) = take_pending(inner, &dependency) {
                    batch.deposits.add(kept.deposits);
                    batch.since = kept.since;
                }
                match fleet.deposit(&dependency, &policy, batch.deposits).await {
                    Ok(s) => {
                        inner.health.ok(&dependency, &inner.metrics);
                        inner.metrics.snapshot(&dependency, &s);
                    }
                    Err(e) => {
                        inner
                            .health
                            .failed(&dependency, &e, &inner.metrics, inner.fallback);
                        // A timed-out call most likely ran late (see the module docs): never
                        // sent twice. Otherwise keep it rather than lose it.
                        if !e.is_timeout() {
                            add_pending(inner, dependency, batch.deposits, batch.since);
                        }
                    }
                }
                return;
            }
            add_pending(inner, dependency, deposits, Instant::now());
            return;
        }
        if add_pending(inner, dependency, deposits, Instant::now()) >= inner.flush_count {
            inner.flush_now.notify_one();
        }
    }
}

/// Deposits counted in this process and not yet recorded by the fleet store.
#[derive(Debug, Clone, Copy)]
struct Pending {
    deposits: Deposits,
    /// When the oldest of them was counted.
    since: Instant,
}

impl Inner {
    fn policy(&self, dependency: &Dependency) -> BudgetPolicy {
        self.policies
            .get(dependency)
            .copied()
            .unwrap_or(self.defaults)
    }
}

/// The policy window of `dependency`: pending deposits older than this are dropped.
fn window_of(inner: &Inner, dependency: &Dependency) -> Duration {
    inner.policy(dependency).window
}

/// Takes `dependency`'s pending deposits (none when they are older than a window) and when the
/// oldest of them was counted.
fn take_pending(inner: &Inner, dependency: &Dependency) -> Option<Pending> {
    let window = window_of(inner, dependency);
    let taken = {
        let mut pending = inner.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let taken = pending.remove(dependency);
        inner
            .metrics
            .pending(pending.values().map(|p| p.deposits.total()).sum());
        taken
    };
    taken.filter(|p| !p.deposits.is_empty() && p.since.elapsed() < window)
}

/// Adds deposits counted at `since` to the pending ones; returns the dependency's pending total.
///
/// Deposits older than one window are dropped instead: sent now they would land in the current
/// server window and inflate the allowance with traffic the sliding estimate no longer counts
/// (after a long outage, minutes of successes at once). Dropping them errs on the safe side.
fn add_pending(inner: &Inner, dependency: Dependency, deposits: Deposits, since: Instant) -> u64 {
    let window = window_of(inner, &dependency);
    let mut pending = inner.pending.lock().unwrap_or_else(PoisonError::into_inner);
    let entry = pending.entry(dependency).or_insert(Pending {
        deposits: Deposits::default(),
        since,
    });
    let mut dropped = 0;
    if entry.since.elapsed() >= window {
        dropped += entry.deposits.total();
        *entry = Pending {
            deposits: Deposits::default(),
            since,
        };
    }
    if since.elapsed() >= window {
        dropped += deposits.total();
    } else {
        entry.deposits.add(deposits);
        entry.since = entry.since.min(since);
    }
    let total = entry.deposits.total();
    if dropped > 0 {
        tracing::debug!(dropped, "pending deposits older than one window dropped");
    }
    inner
        .metrics
        .pending(pending.values().map(|p| p.deposits.total()).sum());
    total
}

async fn flush_pending(inner: &Inner, force: bool) -> Result<(), StoreError> {
    let Some(fleet) = &inner.fleet else {
        return Ok(());
    };
    let nothing_pending = {
        let pending = inner.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.values().all(|p| p.deposits.is_empty())
    };
    if nothing_pending {
        return Ok(());
    }
    // Take a dependency's probe slot only when it has deposits to send: with nothing to send,
    // the flusher would spend the slot without calling the store (its 100 ms ticks fall exactly
    // when a 200 ms slot reopens, so it took every slot and the fleet budget never came back
    // while nothing succeeded). A dependency whose store is failing keeps its deposits pending.
    let batch: Vec<(Dependency, Pending)> = {
        let mut pending = inner.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.retain(|d, p| !p.deposits.is_empty() && p.since.elapsed() < window_of(inner, d));
        let ready: Vec<Dependency> = pending
            .keys()
            .filter(|d| force || inner.health.should_try(d))
            .cloned()
            .collect();
        ready
            .into_iter()
            .filter_map(|d| pending.remove(&d).map(|p| (d, p)))
            .collect()
    };
    if batch.is_empty() {
        inner.metrics.pending(0);
        return Ok(());
    }
    let calls = batch.into_iter().map(|(dependency, pending)| async move {
        let policy = inner.policy(&dependency);
        let result = fleet.deposit(&dependency, &policy, pending.deposits).await;
        (dependency, pending, result)
    });
    let mut first_error = None;
    for (dependency, pending, result) in futures::future::join_all(calls).await {
        match result {
            Ok(s) => {
                inner.health.ok(&dependency, &inner.metrics);
                inner.metrics.snapshot(&dependency, &s);
            }
            Err(e) => {
                inner
                    .health
                    .failed(&dependency, &e, &inner.metrics, inner.fallback);
                // A timed-out call most likely reached Redis and runs (or ran) there: sending it
                // again would count it twice, in the unsafe direction. Other failures (refused,
                // reset, broken pipe) did not count: keep the deposits for a later flush.
                if !e.is_timeout() {
                    add_pending(inner, dependency, pending.deposits, pending.since);
                }
                first_error.get_or_insert(e);
            }
        }
    }
    let pending: u64 = {
        let pending = inner.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.values().map(|p| p.deposits.total()).sum()
    };
    inner.metrics.pending(pending);
    first_error.map_or(Ok(()), Err)
}

async fn flusher(inner: Weak<Inner>, interval: Duration) {
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        if !strong.flusher_running.load(Ordering::Acquire) {
            return;
        }
        {
            let notified = strong.flush_now.notified();
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = notified => {}
            }
        }
        // Errors are counted and logged by the health tracker; the deposits stay pending.
        let _ = flush_pending(&strong, false).await;
        drop(strong);
    }
}

/// Whether the fleet store answers, per dependency: on Redis Cluster one master can fail while
/// the others serve, so only the dependencies whose slots fail go to the fallback.
///
/// Logs one line when the first dependency enters the fallback and one when the last leaves
/// (per-dependency changes at debug level), so an outage of a single Redis is two lines, not one
/// per dependency or per call.
#[derive(Debug)]
struct Health {
    started: Instant,
    /// Dependencies in fallback; read without the lock on the hot path.
    degraded_count: AtomicU64,
    /// Degraded dependencies → when the store may next be probed for them (ms since `started`).
    degraded: Mutex<HashMap<Dependency, u64>>,
}

impl Health {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            degraded_count: AtomicU64::new(0),
            degraded: Mutex::new(HashMap::new()),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn any_degraded(&self) -> bool {
        self.degraded_count.load(Ordering::Acquire) > 0
    }

    /// Whether to call the fleet store for `dependency`: always when it is healthy; when it is
    /// degraded, one caller per probe interval.
    fn should_try(&self, dependency: &Dependency) -> bool {
        if !self.any_degraded() {
            return true;
        }
        let now = self.now_ms();
        let mut degraded = self.degraded.lock().unwrap_or_else(PoisonError::into_inner);
        match degraded.get_mut(dependency) {
            None => true,
            Some(next_probe) if now >= *next_probe => {
                *next_probe = now + ms(PROBE_INTERVAL);
                true
            }
            Some(_) => false,
        }
    }

    fn ok(&self, dependency: &Dependency, metrics: &Metrics) {
        if !self.any_degraded() {
            return;
        }
        let mut degraded = self.degraded.lock().unwrap_or_else(PoisonError::into_inner);
        if degraded.remove(dependency).is_some() {
            let left = degraded.len() as u64;
            self.degraded_count.store(left, Ordering::Release);
            metrics.fallback_dependencies(left);
            tracing::debug!(%dependency, "fleet budget store answers for this dependency again");
            if left == 0 {
                metrics.fallback(false);
                tracing::info!("fleet budget store answers again; leaving fallback");
            }
        }
    }

    fn failed(
        &self,
        dependency: &Dependency,
        error: &StoreError,
        metrics: &Metrics,
        mode: FallbackMode,
    ) {
        metrics.store_error(error.kind_label());
        let next_probe = self.now_ms() + ms(PROBE_INTERVAL);
        let mut degraded = self.degraded.lock().unwrap_or_else(PoisonError::into_inner);
        if degraded.insert(dependency.clone(), next_probe).is_none() {
            let now_degraded = degraded.len() as u64;
            self.degraded_count.store(now_degraded, Ordering::Release);
            metrics.fallback_dependencies(now_degraded);
            if now_degraded == 1 {
                metrics.fallback(true);
                tracing::warn!(%error, %dependency, fallback = mode.as_str(), "fleet budget store failed; entering fallback");
            } else {
                tracing::debug!(%error, %dependency, "fleet budget store failed for this dependency too");
            }
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
