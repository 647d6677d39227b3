//! Coalesced deposits, and the staleness they add; and the denials answered in the process,
//! sent with them.
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
//!   traffic the sliding estimate no longer counts. Their age is read from the budget's clock.
//!
//! **Denials answered in the process** (the deny cache, `deny_cache.rs`) never reached Redis,
//! whose `cd` counts only the denials it made: after an outage `budgetctl status` showed 2,302
//! denied of 40,000 jobs the workers dead-lettered. So each is counted here, per dependency,
//! beside the deposits, and goes with them (`deposit.lua`'s optional ARGV 8), which adds them to
//! the window's denial counter: the fleet's count is Redis's. They ride the same rules: a
//! failed flush keeps them, a timed-out one does not resend them (never counted twice), those
//! older than one window are dropped. They never make the flusher hurry
//! (`redis.deposit_flush_count` counts deposits), and a flush of denials alone does not forget
//! a denial kept in the process (no deposit made room). So the fleet's count lags the jobs
//! denied by at most one flush interval per process, and a process that dies loses the
//! denials it had not flushed: an under-count, never an over-count.
//!
//! [`FleetBudget::on_success`]: super::FleetBudget::on_success
//! [`FleetBudget::on_attempt`]: super::FleetBudget::on_attempt
//! [`FleetBudget::flush`]: super::FleetBudget::flush
//! [`FleetBudget::shutdown`]: super::FleetBudget::shutdown

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::deny_cache::DenyCache;
use super::health::Health;
use super::route::Policies;
use crate::allowance::BudgetSnapshot;
use crate::clock::Clock;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::metrics::Metrics;
use crate::store::{BudgetStore, Deposits, LocalStore};

/// The deposits of a [`FleetBudget`](super::FleetBudget): counted in the local store at once,
/// and sent to the fleet store coalesced (or one call each when `redis.deposit_flush_ms = 0`),
/// with the denials answered in the process.
#[derive(Debug)]
pub(super) struct Coalescer {
    pending: PendingDeposits,
    fleet: Option<Arc<dyn BudgetStore>>,
    /// Sees every deposit: the budget when local only, else the fallback kept warm.
    local: LocalStore,
    policies: Arc<Policies>,
    health: Arc<Health>,
    /// A flush forgets the denials it may have made stale.
    denials: Arc<DenyCache>,
    metrics: Metrics,
    clock: Arc<dyn Clock>,
    /// Zero: no flusher, each deposit is its own call.
    flush_interval: Duration,
    flush_count: u64,
    flush_now: Notify,
    flusher_running: AtomicBool,
}

/// What a [`Coalescer`] is made of.
#[derive(Debug)]
pub(super) struct CoalescerParts {
    pub(super) fleet: Option<Arc<dyn BudgetStore>>,
    pub(super) local: LocalStore,
    pub(super) policies: Arc<Policies>,
    pub(super) health: Arc<Health>,
    pub(super) denials: Arc<DenyCache>,
    pub(super) metrics: Metrics,
    pub(super) clock: Arc<dyn Clock>,
    /// Zero: every deposit is sent with its own call (no flusher runs).
    pub(super) flush_interval: Duration,
    pub(super) flush_count: u64,
}

/// Deposits counted in this process and not yet recorded by the fleet store, per dependency.
#[derive(Debug, Default)]
struct PendingDeposits(Mutex<HashMap<Dependency, Pending>>);

/// One dependency's pending deposits, and its denials answered in the process.
#[derive(Debug, Clone, Copy)]
struct Pending {
    deposits: Deposits,
    /// Denials answered by the deny cache, which the store has not counted.
    denied: u64,
    /// When the oldest of them was counted (clock ms).
    since_ms: u64,
}

impl Pending {
    fn empty(since_ms: u64) -> Self {
        Self {
            deposits: Deposits::default(),
            denied: 0,
            since_ms,
        }
    }

    /// Whether there is nothing to send.
    fn is_empty(&self) -> bool {
        self.deposits.is_empty() && self.denied == 0
    }
}

impl PendingDeposits {
    /// The total pending over every dependency.
    fn total(&self) -> u64 {
        let pending = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        pending.values().map(|p| p.deposits.total()).sum()
    }
}

impl Coalescer {
    pub(super) fn new(parts: CoalescerParts) -> Self {
        let coalescing = !parts.flush_interval.is_zero();
        Self {
            pending: PendingDeposits::default(),
            fleet: parts.fleet,
            local: parts.local,
            policies: parts.policies,
            health: parts.health,
            denials: parts.denials,
            metrics: parts.metrics,
            clock: parts.clock,
            flush_interval: parts.flush_interval,
            flush_count: parts.flush_count,
            flush_now: Notify::new(),
            flusher_running: AtomicBool::new(coalescing),
        }
    }

    /// Starts the background flusher when deposits are coalesced (a Tokio runtime is needed).
    pub(super) fn start_flusher(self: &Arc<Self>) {
        if self.flusher_running.load(Ordering::Acquire) {
            tokio::spawn(flusher(Arc::downgrade(self), self.flush_interval));
        }
    }

    /// Stops the background flusher (it ends after waking).
    pub(super) fn stop_flusher(&self) {
        self.flusher_running.store(false, Ordering::Release);
        self.flush_now.notify_one();
    }

    /// Deposits counted and not yet sent to the fleet store.
    pub(super) fn pending_total(&self) -> u64 {
        self.pending.total()
    }

    /// Records `deposits` for `dependency`: in the local store at once; for the fleet store,
    /// coalesced (the flusher is woken at `redis.deposit_flush_count`), or sent now without
    /// coalescing (kept pending while the store fails for it).
    pub(super) async fn deposit(&self, dependency: Dependency, deposits: Deposits) {
        let policy = self.policies.of(&dependency);
        // The local store always sees deposits: it is the budget when local only, and it keeps
        // the fallback warm with this process's traffic when Redis fails.
        self.local.deposit_now(&dependency, &policy, deposits);
        let Some(fleet) = &self.fleet else { return };
        if !self.flush_interval.is_zero() {
            if self.coalesce(dependency, deposits) >= self.flush_count {
                self.flush_now.notify_one();
            }
        } else if self.health.should_try(&dependency) {
            self.deposit_now(&**fleet, dependency, deposits).await;
        } else {
            self.coalesce(dependency, deposits);
        }
    }

    /// Counts `deposits` for `dependency` to be sent with the next flush; returns how many are
    /// pending for it now.
    fn coalesce(&self, dependency: Dependency, deposits: Deposits) -> u64 {
        let mut counted = Pending::empty(self.clock.now_ms());
        counted.deposits = deposits;
        self.add_pending(dependency, counted)
    }

    /// Counts a denial of `dependency` answered in the process (the deny cache), to be sent
    /// with the next flush of its deposits: the store did not see it.
    ///
    /// On the deny cache's hit path: an entry younger than a window is counted into under the
    /// lock and nothing else (the pending-deposits gauge does not move); the rest is
    /// [`Coalescer::add_pending`]'s.
    pub(super) fn denied_in_process(&self, dependency: &Dependency) {
        let now = self.clock.now_ms();
        {
            let mut pending = self
                .pending
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = pending.get_mut(dependency)
                && now.saturating_sub(entry.since_ms) < self.window_ms(dependency)
            {
                entry.denied = entry.denied.saturating_add(1);
                return;
            }
        }
        let mut counted = Pending::empty(now);
        counted.denied = 1;
        self.add_pending(dependency.clone(), counted);
    }

    /// Sends `deposits` for `dependency` now, with any kept back by an earlier failed call (no
    /// flusher runs without coalescing: this is their next chance).
    async fn deposit_now(
        &self,
        fleet: &dyn BudgetStore,
        dependency: Dependency,
        deposits: Deposits,
    ) {
        let mut batch = Pending::empty(self.clock.now_ms());
        batch.deposits = deposits;
        if let Some(kept) = self.take_pending(&dependency) {
            batch.deposits.add(kept.deposits);
            batch.denied = batch.denied.saturating_add(kept.denied);
            batch.since_ms = kept.since_ms;
        }
        let policy = self.policies.of(&dependency);
        let result = fleet
            .deposit_with_denials(&dependency, &policy, batch.deposits, batch.denied)
            .await;
        let _ = self.record_deposit(&dependency, batch, result);
    }

    /// Records the result of sending `batch` for `dependency`: the store's health and the
    /// snapshot; on failure, deposits that surely did not count are kept for a later call.
    fn record_deposit(
        &self,
        dependency: &Dependency,
        batch: Pending,
        result: Result<BudgetSnapshot, StoreError>,
    ) -> Result<(), StoreError> {
        // A timed-out call most likely reached Redis and runs (or ran) there: sending it again
        // would count it twice, in the unsafe direction. Other failures (refused, reset, broken
        // pipe) did not count: the deposits are kept for a later call (before the failure is
        // recorded, so that whoever sees it counted also sees them pending).
        if let Err(e) = &result
            && !e.is_timeout()
        {
            self.add_pending(dependency.clone(), batch);
        } else if !batch.deposits.is_empty() {
            // They reached the store (or most likely will): a denial kept in the process may
            // no longer stand. Denials alone make no room.
            self.denials.forget(dependency);
        }
        self.health.record(dependency, &result);
        let snapshot = result?;
        self.metrics.snapshot(dependency, &snapshot);
        Ok(())
    }

    /// Takes `dependency`'s pending deposits (none when they are older than a window).
    fn take_pending(&self, dependency: &Dependency) -> Option<Pending> {
        let window = self.window_ms(dependency);
        let now = self.clock.now_ms();
        let taken = {
            let mut pending = self
                .pending
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let taken = pending.remove(dependency);
            self.metrics
                .pending(pending.values().map(|p| p.deposits.total()).sum());
            taken
        };
        taken.filter(|p| !p.is_empty() && now.saturating_sub(p.since_ms) < window)
    }

    /// Adds `counted` (deposits and denials counted at its `since_ms`) to the pending ones;
    /// returns the dependency's pending deposits.
    ///
    /// Deposits older than one window are dropped instead: sent now they would land in the
    /// current server window and inflate the allowance with traffic the sliding estimate no
    /// longer counts (after a long outage, minutes of successes at once). Dropping them errs on
    /// the safe side. Denials that old go too: the window they belong to is no longer shown.
    fn add_pending(&self, dependency: Dependency, counted: Pending) -> u64 {
        let since_ms = counted.since_ms;
        let window = self.window_ms(&dependency);
        let now = self.clock.now_ms();
        let too_old = |since: u64| now.saturating_sub(since) >= window;
        let mut pending = self
            .pending
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let entry = pending
            .entry(dependency)
            .or_insert_with(|| Pending::empty(since_ms));
        let (mut dropped, mut dropped_denials) = (0, 0);
        if too_old(entry.since_ms) {
            dropped += entry.deposits.total();
            dropped_denials += entry.denied;
            *entry = Pending::empty(since_ms);
        }
        if too_old(since_ms) {
            dropped += counted.deposits.total();
            dropped_denials += counted.denied;
        } else {
            entry.deposits.add(counted.deposits);
            entry.denied = entry.denied.saturating_add(counted.denied);
            entry.since_ms = entry.since_ms.min(since_ms);
        }
        let total = entry.deposits.total();
        if dropped > 0 || dropped_denials > 0 {
            tracing::debug!(
                dropped,
                dropped_denials,
                "pending deposits and denials older than one window dropped"
            );
        }
        self.metrics
            .pending(pending.values().map(|p| p.deposits.total()).sum());
        total
    }

    /// Sends the pending deposits, one call per dependency. Unless `force`d, only for the
    /// dependencies whose store may be tried now (see [`super::health`]).
    pub(super) async fn flush_pending(&self, force: bool) -> Result<(), StoreError> {
        let Some(fleet) = &self.fleet else {
            return Ok(());
        };
        let now = self.clock.now_ms();
        // Take a dependency's probe slot only when it has deposits to send: with nothing to
        // send, the flusher would spend the slot without calling the store (its 100 ms ticks
        // fall exactly when a 200 ms slot reopens, so it took every slot and the fleet budget
        // never came back while nothing succeeded). A dependency whose store is failing keeps
        // its deposits pending.
        let batch: Vec<(Dependency, Pending)> = {
            let mut pending = self
                .pending
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            pending
                .retain(|d, p| !p.is_empty() && now.saturating_sub(p.since_ms) < self.window_ms(d));
            let ready: Vec<Dependency> = pending
                .keys()
                .filter(|d| force || self.health.should_try(d))
                .cloned()
                .collect();
            ready
                .into_iter()
                .filter_map(|d| pending.remove(&d).map(|p| (d, p)))
                .collect()
        };
        if batch.is_empty() {
            self.metrics.pending(self.pending.total());
            return Ok(());
        }
        let calls = batch.into_iter().map(|(dependency, pending)| async move {
            let policy = self.policies.of(&dependency);
            let result = fleet
                .deposit_with_denials(&dependency, &policy, pending.deposits, pending.denied)
                .await;
            (dependency, pending, result)
        });
        let mut first_error = None;
        for (dependency, pending, result) in futures::future::join_all(calls).await {
            if let Err(e) = self.record_deposit(&dependency, pending, result) {
                first_error.get_or_insert(e);
            }
        }
        self.metrics.pending(self.pending.total());
        first_error.map_or(Ok(()), Err)
    }

    /// The policy window of `dependency` in ms: pending deposits older than this are dropped.
    fn window_ms(&self, dependency: &Dependency) -> u64 {
        self.policies.of(dependency).window_ms()
    }
}

/// The background flusher: flushes every `interval`, or when woken by a dependency that reached
/// `redis.deposit_flush_count`; ends with the budget or at [`FleetBudget::shutdown`].
///
/// [`FleetBudget::shutdown`]: super::FleetBudget::shutdown
async fn flusher(inner: Weak<Coalescer>, interval: Duration) {
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
        let _ = strong.flush_pending(false).await;
        drop(strong);
    }
}
