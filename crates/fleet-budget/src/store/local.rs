//! The in-process store: same arithmetic as the Lua scripts, time from a [`Clock`].

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use super::{BudgetStore, Deposits, StoreFuture, Withdrawal};
use crate::allowance::{BudgetSnapshot, BudgetState};
use crate::clock::{Clock, CoarseClock};
use crate::dependency::Dependency;
use crate::policy::BudgetPolicy;

/// Budgets kept in this process. Cheap to clone; clones share the budgets.
///
/// Entries idle for two windows are dropped, like the Redis keys' expiry.
#[derive(Debug, Clone)]
pub struct LocalStore {
    budgets: Arc<Mutex<Budgets>>,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Default)]
struct Budgets {
    by_dependency: HashMap<Dependency, BudgetState, BuildHasherDefault<Fnv1a>>,
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

    fn with_state<T>(
        &self,
        dependency: &Dependency,
        window_ms: u64,
        f: impl FnOnce(&mut BudgetState, u64) -> T,
    ) -> T {
        let now = self.clock.now_ms();
        let mut guard = self.budgets.lock().unwrap_or_else(PoisonError::into_inner);
        let budgets = &mut *guard;
        if now >= budgets.next_sweep_ms {
            budgets.next_sweep_ms = now.saturating_add(SWEEP_INTERVAL_MS);
            budgets
                .by_dependency
                .retain(|_, s| now / s.window_ms.max(1) <= s.index.saturating_add(1));
        }
        if let Some(state) = budgets.by_dependency.get_mut(dependency) {
            return f(state, now);
        }
        let state = budgets
            .by_dependency
            .entry(dependency.clone())
            .or_insert_with(|| BudgetState::empty(now, window_ms));
        f(state, now)
    }

    /// Records deposits now (synchronous form of [`BudgetStore::deposit`]).
    pub fn deposit_now(
        &self,
        dependency: &Dependency,
        policy: &BudgetPolicy,
        deposits: Deposits,
    ) -> BudgetSnapshot {
        let window_ms = policy.window_ms();
        self.with_state(dependency, window_ms, |state, now| {
            state.roll(now, window_ms);
            let current = &mut state.current;
            current.successes = current.successes.saturating_add(deposits.successes);
            current.first_attempts = current
                .first_attempts
                .saturating_add(deposits.first_attempts);
            state.snapshot(now, policy)
        })
    }

    /// Asks for one retry now (synchronous form of [`BudgetStore::withdraw`]).
    pub fn withdraw_now(&self, dependency: &Dependency, policy: &BudgetPolicy) -> Withdrawal {
        self.with_state(dependency, policy.window_ms(), |state, now| {
            let (granted, snapshot) = state.try_spend(now, policy);
            Withdrawal { granted, snapshot }
        })
    }

    /// Reads a budget now without changing it (synchronous form of [`BudgetStore::status`]).
    #[must_use]
    pub fn status_now(&self, dependency: &Dependency, policy: &BudgetPolicy) -> BudgetSnapshot {
        let now = self.clock.now_ms();
        let window_ms = policy.window_ms();
        let budgets = self.budgets.lock().unwrap_or_else(PoisonError::into_inner);
        let mut state = budgets
            .by_dependency
            .get(dependency)
            .copied()
            .unwrap_or_else(|| BudgetState::empty(now, window_ms));
        state.roll(now, window_ms);
        state.snapshot(now, policy)
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
