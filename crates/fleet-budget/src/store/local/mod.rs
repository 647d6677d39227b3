//! The in-process store: same arithmetic as the Lua scripts, time from a [`Clock`].
//!
//! Each dependency's budget is a set of atomic counters (`Cells`, `cells.rs`): a decision reads them, decides
//! with [`allowance.rs`](crate::allowance)'s arithmetic, and counts the retry with one
//! compare-and-swap, so it takes no lock. [`LocalStore`] finds a dependency's counters in a map
//! under a mutex; a [`LocalBudget`] handle holds them, and decides without the map or the mutex.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

mod cells;

use self::cells::Cells;
use super::{BudgetStore, Deposits, StoreFuture, Withdrawal};
use crate::allowance::{BudgetSnapshot, BudgetState};
use crate::clock::{Clock, CoarseClock};
use crate::dependency::Dependency;
use crate::policy::BudgetPolicy;

/// Budgets kept in this process. Cheap to clone; clones share the budgets.
///
/// Entries idle for two windows are dropped, like the Redis keys' expiry (unless a
/// [`LocalBudget`] handle still holds them).
#[derive(Debug, Clone)]
pub struct LocalStore {
    budgets: Arc<Mutex<Budgets>>,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Default)]
struct Budgets {
    by_dependency: HashMap<Dependency, Arc<Cells>, BuildHasherDefault<Fnv1a>>,
    next_sweep_ms: u64,
}

/// Idle entries are looked for at most this often (clock time).
const SWEEP_INTERVAL_MS: u64 = 1000;

/// FNV-1a: dependency names are short, and SipHash's DoS resistance buys nothing for a map
/// whose keys come from the operator's configuration and task names.
#[derive(Debug, Default)]
struct Fnv1a(u64);

impl Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut hash = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = hash;
    }
}

/// One dependency's budget in this process, held: a decision reads and counts its atomic
/// counters, with no lock and no map lookup. From [`LocalStore::handle`]; clones, and the
/// store, share the same counters.
///
/// A handle keeps the policy it was made with (the store keeps a new window length as a new
/// budget, as [`BudgetState::roll`] does: a handle made before such a change keeps counting the
/// old one).
#[derive(Debug, Clone)]
pub struct LocalBudget {
    cells: Arc<Cells>,
    policy: BudgetPolicy,
    clock: Arc<dyn Clock>,
}

impl LocalBudget {
    /// Asks for one retry now: granted (counted as a retry) or denied (counted as a denial).
    #[must_use]
    pub fn withdraw(&self) -> Withdrawal {
        self.cells.withdraw(self.clock.now_ms(), &self.policy)
    }

    /// Records deposits now.
    pub fn deposit(&self, deposits: Deposits) -> BudgetSnapshot {
        self.cells
            .deposit(self.clock.now_ms(), &self.policy, deposits)
    }

    /// Reads the budget now without changing it.
    #[must_use]
    pub fn status(&self) -> BudgetSnapshot {
        self.cells.status(self.clock.now_ms(), &self.policy)
    }

    /// The policy this handle decides with.
    #[must_use]
    pub fn policy(&self) -> &BudgetPolicy {
        &self.policy
    }
}

impl Default for LocalStore {
    fn default() -> Self {
        Self::new()
    }
}

impl LocalStore {
    /// A store on the wall clock ([`CoarseClock`]: read from memory, a few ms of resolution).
    #[must_use]
    pub fn new() -> Self {
        Self::with_clock(Arc::new(CoarseClock))
    }

    /// A store on `clock` (a [`crate::clock::ManualClock`] in tests and the simulator).
    #[must_use]
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            budgets: Arc::new(Mutex::new(Budgets::default())),
            clock,
        }
    }

    /// The clock the store keeps its windows with.
    #[must_use]
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// A handle on `dependency`'s budget under `policy`, for decisions without the store's map
    /// and lock (see [`LocalBudget`]).
    #[must_use]
    pub fn handle(&self, dependency: &Dependency, policy: &BudgetPolicy) -> LocalBudget {
        let now = self.clock.now_ms();
        LocalBudget {
            cells: self.cells(dependency, policy.window_ms(), now),
            policy: *policy,
            clock: self.clock.clone(),
        }
    }

    /// The counters of `dependency` for `window_ms` (new ones for a new dependency or a new
    /// window length), sweeping idle entries first.
    fn cells(&self, dependency: &Dependency, window_ms: u64, now: u64) -> Arc<Cells> {
        let mut guard = self.budgets.lock().unwrap_or_else(PoisonError::into_inner);
        let budgets = &mut *guard;
        if now >= budgets.next_sweep_ms {
            budgets.next_sweep_ms = now.saturating_add(SWEEP_INTERVAL_MS);
            budgets
                .by_dependency
                .retain(|_, c| Arc::strong_count(c) > 1 || !c.idle(now));
        }
        let window_ms = window_ms.max(1);
        match budgets.by_dependency.get_mut(dependency) {
            Some(cells) if cells.window_ms == window_ms => cells.clone(),
            Some(cells) => {
                *cells = Arc::new(Cells::new(now, window_ms));
                cells.clone()
            }
            None => budgets
                .by_dependency
                .entry(dependency.clone())
                .or_insert_with(|| Arc::new(Cells::new(now, window_ms)))
                .clone(),
        }
    }

    /// Records deposits now (synchronous form of [`BudgetStore::deposit`]).
    pub fn deposit_now(
        &self,
        dependency: &Dependency,
        policy: &BudgetPolicy,
        deposits: Deposits,
    ) -> BudgetSnapshot {
        let now = self.clock.now_ms();
        self.cells(dependency, policy.window_ms(), now)
            .deposit(now, policy, deposits)
    }

    /// Asks for one retry now (synchronous form of [`BudgetStore::withdraw`]).
    pub fn withdraw_now(&self, dependency: &Dependency, policy: &BudgetPolicy) -> Withdrawal {
        let now = self.clock.now_ms();
        self.cells(dependency, policy.window_ms(), now)
            .withdraw(now, policy)
    }

    /// Reads a budget now without changing it (synchronous form of [`BudgetStore::status`]).
    #[must_use]
    pub fn status_now(&self, dependency: &Dependency, policy: &BudgetPolicy) -> BudgetSnapshot {
        let now = self.clock.now_ms();
        let window_ms = policy.window_ms().max(1);
        let cells = {
            let budgets = self.budgets.lock().unwrap_or_else(PoisonError::into_inner);
            budgets.by_dependency.get(dependency).cloned()
        };
        match cells {
            Some(cells) if cells.window_ms == window_ms => cells.status(now, policy),
            _ => BudgetState::empty(now, window_ms).snapshot(now, policy),
        }
    }

    /// Dependencies with a budget entry (possibly idle).
    #[must_use]
    pub fn dependencies(&self) -> Vec<Dependency> {
        let budgets = self.budgets.lock().unwrap_or_else(PoisonError::into_inner);
        let mut deps: Vec<_> = budgets.by_dependency.keys().cloned().collect();
        deps.sort();
        deps
    }
}

impl BudgetStore for LocalStore {
    fn deposit<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
        deposits: Deposits,
    ) -> StoreFuture<'a, BudgetSnapshot> {
        let snapshot = self.deposit_now(dependency, policy, deposits);
        Box::pin(async move { Ok(snapshot) })
    }

    fn withdraw<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
    ) -> StoreFuture<'a, Withdrawal> {
        let withdrawal = self.withdraw_now(dependency, policy);
        Box::pin(async move { Ok(withdrawal) })
    }

    fn status<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
    ) -> StoreFuture<'a, BudgetSnapshot> {
        let snapshot = self.status_now(dependency, policy);
        Box::pin(async move { Ok(snapshot) })
    }

    fn kind(&self) -> &'static str {
        "local"
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::ManualClock;

    fn dep() -> Dependency {
        Dependency::new("search").unwrap()
    }

    #[test]
    fn windows_advance_with_the_manual_clock_not_with_sleep() {
        let clock = ManualClock::new(1_000_000);
        let store = LocalStore::with_clock(Arc::new(clock.clone()));
        let policy = BudgetPolicy {
            window: Duration::from_secs(1),
            min_allowance: 2,
            ..BudgetPolicy::default()
        };
        assert!(store.withdraw_now(&dep(), &policy).granted);
        assert!(store.withdraw_now(&dep(), &policy).granted);
        assert!(!store.withdraw_now(&dep(), &policy).granted);
        clock.advance(Duration::from_millis(999));
        assert!(
            !store.withdraw_now(&dep(), &policy).granted,
            "previous window weighs almost fully"
        );
        clock.advance(Duration::from_secs(2));
        assert!(
            store.withdraw_now(&dep(), &policy).granted,
            "two windows later the budget is fresh"
        );
    }

    /// The atomic counters decide as `allowance.rs`'s `BudgetState` does, call for call: the
    /// store's map path and a held handle, on random deposits, withdrawals, reads and time
    /// steps (forwards past several windows, and backwards).
    #[test]
    fn atomic_counters_agree_with_budget_state() {
        use crate::allowance::DepositKind;
        use crate::policy::{DepositBasis, WindowMode};
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for case in 0..40 {
            let policy = BudgetPolicy {
                window: Duration::from_millis(1000),
                ratio: [0.0, 0.1, 0.2, 0.5, 1.5][usize::try_from(case % 5).unwrap()],
                min_allowance: next(6),
                deposit: if case % 3 == 0 {
                    DepositBasis::Request
                } else {
                    DepositBasis::Success
                },
                mode: if case % 2 == 0 {
                    WindowMode::Sliding
                } else {
                    WindowMode::Fixed
                },
            };
            let clock = ManualClock::new(5_000 + next(100_000));
            let store = LocalStore::with_clock(Arc::new(clock.clone()));
            let handle = store.handle(&dep(), &policy);
            let mut model = BudgetState::empty(clock.now_ms(), 1000);
            for step in 0..300 {
                let now = clock.now_ms();
                let use_handle = next(2) == 0;
                match next(10) {
                    0..=2 => {
                        let (s, a) = (next(20), next(20));
                        model.deposit(now, 1000, DepositKind::Success, s);
                        model.deposit(now, 1000, DepositKind::FirstAttempt, a);
                        let want = model.snapshot(now, &policy);
                        let d = Deposits {
                            successes: s,
                            first_attempts: a,
                        };
                        let got = if use_handle {
                            handle.deposit(d)
                        } else {
                            store.deposit_now(&dep(), &policy, d)
                        };
                        assert_eq!(got, want, "case {case} step {step} deposit");
                    }
                    3..=6 => {
                        let (granted, want) = model.try_spend(now, &policy);
                        let got = if use_handle {
                            handle.withdraw()
                        } else {
                            store.withdraw_now(&dep(), &policy)
                        };
                        assert_eq!(got.granted, granted, "case {case} step {step} withdraw");
                        assert_eq!(got.snapshot, want, "case {case} step {step} withdraw");
                    }
                    7 => {
                        let mut read = model;
                        read.roll(now, 1000);
                        let want = read.snapshot(now, &policy);
                        let got = if use_handle {
                            handle.status()
                        } else {
                            store.status_now(&dep(), &policy)
                        };
                        assert_eq!(got, want, "case {case} step {step} status");
                    }
                    8 => clock.set_ms(now.saturating_sub(next(1500))),
                    _ => clock.advance(Duration::from_millis(next(2600))),
                }
            }
        }
    }

    /// Threads sharing one handle, with no deposits: exactly the floor is granted in the
    /// window, and every request is counted once, as a retry or a denial.
    #[test]
    fn concurrent_withdrawals_never_exceed_the_allowance() {
        let clock = ManualClock::new(10_000);
        let store = LocalStore::with_clock(Arc::new(clock));
        let policy = BudgetPolicy {
            window: Duration::from_secs(60),
            min_allowance: 1000,
            ..BudgetPolicy::default()
        };
        let handle = store.handle(&dep(), &policy);
        let granted: usize = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    let handle = handle.clone();
                    s.spawn(move || (0..2000).filter(|_| handle.withdraw().granted).count())
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(granted, 1000);
        let status = store.status_now(&dep(), &policy);
        assert_eq!(status.current.retries, 1000);
        assert_eq!(status.current.denied, 7000);
    }

    #[test]
    fn a_held_budget_is_not_swept() {
        let clock = ManualClock::new(0);
        let store = LocalStore::with_clock(Arc::new(clock.clone()));
        let policy = BudgetPolicy {
            window: Duration::from_secs(1),
            min_allowance: 5,
            ..BudgetPolicy::default()
        };
        let handle = store.handle(&dep(), &policy);
        assert!(handle.withdraw().granted);
        clock.advance(Duration::from_secs(3));
        store.deposit_now(
            &Dependency::new("other").unwrap(),
            &policy,
            Deposits::default(),
        );
        assert!(store.dependencies().contains(&dep()));
        assert!(handle.withdraw().granted);
        assert_eq!(store.status_now(&dep(), &policy).current.retries, 1);
    }

    #[test]
    fn idle_entries_are_swept() {
        let clock = ManualClock::new(0);
        let store = LocalStore::with_clock(Arc::new(clock.clone()));
        let policy = BudgetPolicy {
            window: Duration::from_secs(1),
            ..BudgetPolicy::default()
        };
        store.deposit_now(
            &dep(),
            &policy,
            Deposits {
                successes: 1,
                first_attempts: 0,
            },
        );
        clock.advance(Duration::from_secs(3));
        let other = Dependency::new("other").unwrap();
        store.deposit_now(&other, &policy, Deposits::default());
        assert_eq!(store.dependencies(), vec![other.clone()]);
        // Entries still inside their two windows are kept.
        clock.advance(Duration::from_millis(1500));
        store.deposit_now(&dep(), &policy, Deposits::default());
        assert_eq!(store.dependencies(), vec![other, dep()]);
    }
}
