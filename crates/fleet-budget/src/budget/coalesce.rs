//! Coalesced deposits, and the staleness they add.
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
//! [`FleetBudget::on_success`]: super::FleetBudget::on_success
//! [`FleetBudget::on_attempt`]: super::FleetBudget::on_attempt
//! [`FleetBudget::flush`]: super::FleetBudget::flush
//! [`FleetBudget::shutdown`]: super::FleetBudget::shutdown

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError, Weak};
use std::time::Duration;

use super::Inner;
use crate::allowance::BudgetSnapshot;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::store::{BudgetStore, Deposits};

/// Deposits counted in this process and not yet recorded by the fleet store, per dependency.
#[derive(Debug, Default)]
pub(super) struct PendingDeposits(Mutex<HashMap<Dependency, Pending>>);

/// One dependency's pending deposits.
#[derive(Debug, Clone, Copy)]
struct Pending {
    deposits: Deposits,
    /// When the oldest of them was counted (clock ms).
    since_ms: u64,
}

impl PendingDeposits {
    /// The total pending over every dependency.
    pub(super) fn total(&self) -> u64 {
        let pending = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        pending.values().map(|p| p.deposits.total()).sum()
    }
}

impl Inner {
    /// Counts `deposits` for `dependency` to be sent with the next flush; returns how many are
    /// pending for it now.
    pub(super) fn coalesce(&self, dependency: Dependency, deposits: Deposits) -> u64 {
        self.add_pending(dependency, deposits, self.clock.now_ms())
    }

    /// Sends `deposits` for `dependency` now, with any kept back by an earlier failed call (no
    /// flusher runs without coalescing: this is their next chance).
    pub(super) async fn deposit_now(
        &self,
        fleet: &dyn BudgetStore,
        dependency: Dependency,
        deposits: Deposits,
    ) {
        let mut batch = Pending {
            deposits,
            since_ms: self.clock.now_ms(),
        };
        if let Some(kept) = self.take_pending(&dependency) {
            batch.deposits.add(kept.deposits);
            batch.since_ms = kept.since_ms;
        }
        let policy = self.policy(&dependency);
        let result = fleet.deposit(&dependency, &policy, batch.deposits).await;
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
            self.add_pending(dependency.clone(), batch.deposits, batch.since_ms);
        } else {
            // They reached the store (or most likely will): a denial kept in the process may
            // no longer stand.
            self.denials.forget(dependency);
        }
        self.record(dependency, &result);
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
        taken.filter(|p| !p.deposits.is_empty() && now.saturating_sub(p.since_ms) < window)
    }

    /// Adds deposits counted at `since_ms` to the pending ones; returns the dependency's pending
    /// total.
    ///
    /// Deposits older than one window are dropped instead: sent now they would land in the
    /// current server window and inflate the allowance with traffic the sliding estimate no
    /// longer counts (after a long outage, minutes of successes at once). Dropping them errs on
    /// the safe side.
    fn add_pending(&self, dependency: Dependency, deposits: Deposits, since_ms: u64) -> u64 {
        let window = self.window_ms(&dependency);
        let now = self.clock.now_ms();
        let too_old = |since: u64| now.saturating_sub(since) >= window;
        let mut pending = self
            .pending
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let entry = pending.entry(dependency).or_insert(Pending {
            deposits: Deposits::default(),
            since_ms,
        });
        let mut dropped = 0;
        if too_old(entry.since_ms) {
            dropped += entry.deposits.total();
            *entry = Pending {
                deposits: Deposits::default(),
                since_ms,
            };
        }
        if too_old(since_ms) {
            dropped += deposits.total();
        } else {
            entry.deposits.add(deposits);
            entry.since_ms = entry.since_ms.min(since_ms);
        }
        let total = entry.deposits.total();
        if dropped > 0 {
            tracing::debug!(dropped, "pending deposits older than one window dropped");
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
            pending.retain(|d, p| {
                !p.deposits.is_empty() && now.saturating_sub(p.since_ms) < self.window_ms(d)
            });
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
            let policy = self.policy(&dependency);
            let result = fleet.deposit(&dependency, &policy, pending.deposits).await;
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
        self.policy(dependency).window_ms()
    }
}

/// The background flusher: flushes every `interval`, or when woken by a dependency that reached
/// `redis.deposit_flush_count`; ends with the budget or at [`FleetBudget::shutdown`].
///
/// [`FleetBudget::shutdown`]: super::FleetBudget::shutdown
pub(super) async fn flusher(inner: Weak<Inner>, interval: Duration) {
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
