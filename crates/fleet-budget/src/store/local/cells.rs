//! One dependency's budget in this process as atomic counters, decided without a lock: a
//! decision reads them, decides with [`allowance.rs`](crate::allowance)'s arithmetic, and
//! counts a grant with one compare-and-swap. The map that finds them is `mod.rs`'s.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::allowance::{BudgetSnapshot, BudgetState, WindowCounters, grants};
use crate::policy::BudgetPolicy;
use crate::store::{Deposits, Withdrawal};

/// The low 32 bits of a counter hold its count, the high 32 the window index it counts (mod
/// 2^32): a counter tagged with an older window reads as 0, so a window rolls without a lock,
/// by the first write into it. Counts saturate at 2^32 − 1 per window (the Redis store's at
/// 10^18); a counter untouched for exactly a multiple of 2^32 windows while its budget is held
/// (136 years of 1 s windows) would be misread as current.
const COUNT_MASK: u64 = 0xffff_ffff;

fn pack(index: u64, count: u64) -> u64 {
    ((index & COUNT_MASK) << 32) | count.min(COUNT_MASK)
}

/// The count a raw counter holds for window `index` (0 when it counts an older window).
fn count_at(raw: u64, index: u64) -> u64 {
    if raw >> 32 == index & COUNT_MASK {
        raw & COUNT_MASK
    } else {
        0
    }
}

/// The counts of window `index` in raw counters `[successes, first attempts, retries, denied]`.
fn counters([s, a, r, d]: [u64; 4], index: u64) -> WindowCounters {
    WindowCounters {
        successes: count_at(s, index),
        first_attempts: count_at(a, index),
        retries: count_at(r, index),
        denied: count_at(d, index),
    }
}

/// One window's counters, raw (see [`pack`]).
#[derive(Debug, Default)]
struct Slot {
    successes: AtomicU64,
    first_attempts: AtomicU64,
    retries: AtomicU64,
    denied: AtomicU64,
}

/// Which counter of a slot is added to (a grant is counted by a compare-and-swap of `retries`).
#[derive(Debug, Clone, Copy)]
enum Counter {
    Successes,
    FirstAttempts,
    Denied,
}

impl Slot {
    fn cell(&self, which: Counter) -> &AtomicU64 {
        match which {
            Counter::Successes => &self.successes,
            Counter::FirstAttempts => &self.first_attempts,
            Counter::Denied => &self.denied,
        }
    }

    /// The raw counters: successes, first attempts, retries, denied.
    fn load(&self) -> [u64; 4] {
        [
            self.successes.load(Ordering::Acquire),
            self.first_attempts.load(Ordering::Acquire),
            self.retries.load(Ordering::Acquire),
            self.denied.load(Ordering::Acquire),
        ]
    }
}

/// One dependency's budget: the index of the latest window seen, and two slots (window `i` is
/// counted in slot `i % 2`, so the current and the previous window never share one).
#[derive(Debug)]
pub(crate) struct Cells {
    pub(super) window_ms: u64,
    index: AtomicU64,
    even: Slot,
    odd: Slot,
}

impl Cells {
    pub(super) fn new(now_ms: u64, window_ms: u64) -> Self {
        let window_ms = window_ms.max(1);
        Self {
            window_ms,
            index: AtomicU64::new(now_ms / window_ms),
            even: Slot::default(),
            odd: Slot::default(),
        }
    }

    fn slot(&self, index: u64) -> &Slot {
        if index.is_multiple_of(2) {
            &self.even
        } else {
            &self.odd
        }
    }

    /// The window a call at `now_ms` counts in: the latest seen, moved forward to `now_ms`'s
    /// (never back: time that goes backwards keeps the current window, as `BudgetState::roll`).
    fn current_index(&self, now_ms: u64) -> u64 {
        let at = now_ms / self.window_ms;
        let seen = self.index.load(Ordering::Acquire);
        if at > seen {
            self.index.fetch_max(at, Ordering::AcqRel).max(at)
        } else {
            seen
        }
    }

    /// The state at window `index` (with the current window's raw retries counter, for the
    /// compare-and-swap that counts a grant), or `None` if the latest window seen is already a later one
    /// (another thread saw a later time: decide again).
    fn read(&self, index: u64) -> Option<(BudgetState, u64)> {
        let (cur, prev) = (self.slot(index), self.slot(index.wrapping_add(1)));
        let raw = cur.load();
        let previous = match index.checked_sub(1) {
            Some(p) => counters(prev.load(), p),
            None => WindowCounters::default(),
        };
        // A window is counted into only once the index has reached it, so if the index is
        // still `index`, no counter read above counts a later window.
        if self.index.load(Ordering::Acquire) > index {
            return None;
        }
        let state = BudgetState {
            window_ms: self.window_ms,
            index,
            current: counters(raw, index),
            previous,
        };
        Some((state, raw[2]))
    }

    /// Adds `n` to counter `which` of window `index` and returns its count; `None` if the
    /// latest window seen is already a later one.
    fn add(&self, index: u64, which: Counter, n: u64) -> Option<u64> {
        let cell = self.slot(index).cell(which);
        let mut raw = cell.load(Ordering::Acquire);
        loop {
            if raw >> 32 != index & COUNT_MASK && self.index.load(Ordering::Acquire) > index {
                return None;
            }
            let count = count_at(raw, index).saturating_add(n).min(COUNT_MASK);
            match cell.compare_exchange_weak(
                raw,
                pack(index, count),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(count),
                Err(now) => raw = now,
            }
        }
    }

    /// Asks for one retry at `now_ms`: decides on the counters as read, then counts. A grant
    /// is counted only if the retries counter did not move meanwhile (else it decides again),
    /// so grants never exceed the allowance; a denial is counted as it stands.
    pub(super) fn withdraw(&self, now_ms: u64, policy: &BudgetPolicy) -> Withdrawal {
        loop {
            let index = self.current_index(now_ms);
            let Some((state, raw_retries)) = self.read(index) else {
                continue;
            };
            let mut snapshot = state.snapshot(now_ms, policy);
            if grants(&snapshot) {
                let retries = state.current.retries.saturating_add(1).min(COUNT_MASK);
                if self
                    .slot(index)
                    .retries
                    .compare_exchange(
                        raw_retries,
                        pack(index, retries),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok()
                {
                    snapshot.current.retries = retries;
                    return Withdrawal::decided(true, snapshot);
                }
            } else if let Some(denied) = self.add(index, Counter::Denied, 1) {
                snapshot.current.denied = denied;
                return Withdrawal::decided(false, snapshot);
            }
        }
    }

    pub(super) fn deposit(
        &self,
        now_ms: u64,
        policy: &BudgetPolicy,
        deposits: Deposits,
    ) -> BudgetSnapshot {
        let mut index = self.current_index(now_ms);
        for (which, n) in [
            (Counter::Successes, deposits.successes),
            (Counter::FirstAttempts, deposits.first_attempts),
        ] {
            while n > 0 && self.add(index, which, n).is_none() {
                index = self.current_index(now_ms);
            }
        }
        loop {
            if let Some((state, _)) = self.read(index) {
                return state.snapshot(now_ms, policy);
            }
            index = self.current_index(now_ms);
        }
    }

    pub(super) fn status(&self, now_ms: u64, policy: &BudgetPolicy) -> BudgetSnapshot {
        loop {
            let at = (now_ms / self.window_ms).max(self.index.load(Ordering::Acquire));
            if let Some((state, _)) = self.read(at) {
                return state.snapshot(now_ms, policy);
            }
        }
    }

    /// Whether the counters have been idle for two windows at `now_ms`.
    pub(super) fn idle(&self, now_ms: u64) -> bool {
        now_ms / self.window_ms > self.index.load(Ordering::Acquire).saturating_add(1)
    }
}
