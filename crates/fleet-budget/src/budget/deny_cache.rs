//! Exhausted budgets answered in the process: a retry storm costs Redis almost nothing.
//!
//! When the budget is exhausted every answer is "no", yet without this each process would still
//! send Redis a call per round trip per hot dependency: Redis would see processes × 1/RTT calls
//! per second exactly when the dependency is down. A denial from the fleet store says how long
//! it stands at least (`next_grant_ms`, `lua/README.md`): the ms until one more retry could be
//! granted if nothing changed (the retries estimate decaying and rolling against the allowance
//! as it is now, which without deposits can only fall). So the next requests for that
//! dependency are denied here, without a call, until the first of:
//!
//! - that instant, counted from when the call was *sent* (the server decided after that, so the
//!   local deadline is never later than the server's instant);
//! - `redis.deny_cache_ms` after the call was sent (the staleness; 0 turns the cache off);
//! - this process's deposits for the dependency reaching the store (a flush), or a reply for it
//!   that shows room (a grant that left headroom) or another override state than the cached one
//!   (a `status` read): the entry is forgotten.
//!
//! What that costs: a retry another process's deposits (or an operator's `budget set`, or the
//! end of a freeze lifted early) just made possible may be denied here for at most the
//! staleness. What it never does: grant. Only denials are answered here, so no retry is granted
//! that the fleet budget would refuse. Denials answered here are counted as denials
//! (`fleet_budget_retries_denied_total`), and also in
//! `fleet_budget_retries_denied_in_process_total`, with [`BudgetSource::FleetCache`] in the
//! decision. Redis's denial counter (`cd`) does not see them when they are made, so
//! [`FleetBudget::withdraw`] counts each with the pending deposits and the next flush sends them
//! (`coalesce.rs`): within a flush interval `budgetctl status` counts every denial of the fleet.
//!
//! A reply that arrives after an entry was forgotten (a call sent before a flush, answered
//! after it) is not kept: the cache has an epoch, bumped whenever an entry is forgotten, and a
//! reply is kept only under the epoch read before its call was sent (one epoch for all
//! dependencies: a flush of one may cost another an extra call, never a stale denial).
//!
//! Bounded: one entry per dependency denied, and dependencies are bounded by the configuration
//! (plus `unmapped_tasks.max_own_budgets` own budgets). While no denial is kept (the healthy
//! path) no lock is taken at all: two atomic loads. Otherwise the hit path takes a read lock for
//! a map lookup (no await is ever made while it is held); writes happen at most once per reply
//! from Redis.
//!
//! [`BudgetSource::FleetCache`]: crate::decision::BudgetSource::FleetCache
//! [`FleetBudget::withdraw`]: super::FleetBudget::withdraw

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::allowance::{BudgetSnapshot, Control};
use crate::dependency::Dependency;
use crate::store::Withdrawal;

/// The denials of the fleet store that still stand, by dependency.
#[derive(Debug)]
pub(super) struct DenyCache {
    /// At most this long after its call was sent is a denial answered here; zero: never.
    staleness: Duration,
    denials: RwLock<HashMap<Dependency, Denial>>,
    /// Entries in `denials` (0: the healthy path takes no lock).
    kept: AtomicUsize,
    /// Bumped each time an entry is forgotten: a reply under an older epoch is not kept.
    epoch: AtomicU64,
}

/// A denial that stands until `until`.
#[derive(Debug, Clone, Copy)]
struct Denial {
    until: Instant,
    /// When a retry could next be granted (`None`: not without a change).
    next_grant: Option<Instant>,
    snapshot: BudgetSnapshot,
}

/// The cache's answer: a denial that stands, or the epoch to remember the store's reply under.
pub(super) enum Lookup {
    Denied(Withdrawal),
    Ask(u64),
}

impl DenyCache {
    /// A cache keeping denials at most `staleness` (zero: off).
    pub(super) fn new(staleness: Duration) -> Self {
        Self {
            staleness,
            denials: RwLock::new(HashMap::new()),
            kept: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
        }
    }

    /// Whether the cache is on (`redis.deny_cache_ms` above 0).
    pub(super) fn is_on(&self) -> bool {
        !self.staleness.is_zero()
    }

    /// A denial of `dependency` that still stands now, or the epoch under which to remember the
    /// store's answer.
    pub(super) fn lookup(&self, dependency: &Dependency) -> Lookup {
        let epoch = self.epoch.load(Ordering::SeqCst);
        if !self.is_on() || self.kept.load(Ordering::SeqCst) == 0 {
            return Lookup::Ask(epoch);
        }
        let denials = self.denials.read().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        match denials.get(dependency) {
            Some(denial) if now < denial.until => {
                let next_grant_ms = denial.next_grant.map(|at| {
                    let left = at.saturating_duration_since(now);
                    u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1)
                });
                Lookup::Denied(Withdrawal {
                    granted: false,
                    snapshot: denial.snapshot,
                    next_grant_ms,
                })
            }
            _ => Lookup::Ask(epoch),
        }
    }

    /// Keeps what the fleet store answered for `dependency` to a call sent at `sent` under
    /// `epoch`: a denial with a wait before the next grant is kept until then (at most the
    /// staleness); room now forgets any denial kept.
    pub(super) fn remember(
        &self,
        dependency: &Dependency,
        epoch: u64,
        sent: Instant,
        withdrawal: &Withdrawal,
    ) {
        if !self.is_on() {
            return;
        }
        // Only a denial is kept: the grant that used the last of the budget is not (the next
        // request asks, and its denial, counted by Redis, is the one kept).
        let wait = match withdrawal.next_grant_ms {
            Some(0) => {
                self.room(dependency);
                return;
            }
            _ if withdrawal.granted => return,
            Some(ms) => Some(Duration::from_millis(ms)),
            None => None,
        };
        let stale = sent.checked_add(self.staleness);
        let next_grant = wait.and_then(|wait| sent.checked_add(wait));
        let Some(until) = [stale, next_grant].into_iter().flatten().min() else {
            return;
        };
        if until <= Instant::now() {
            return;
        }
        let mut denials = self.denials.write().unwrap_or_else(PoisonError::into_inner);
        // Counted before the epoch is checked: a forget that bumps the epoch after the check
        // then sees the entry counted, and waits for this lock to remove it.
        self.kept.fetch_add(1, Ordering::SeqCst);
        let denial = Denial {
            until,
            next_grant,
            snapshot: withdrawal.snapshot,
        };
        if self.epoch.load(Ordering::SeqCst) != epoch
            || denials.insert(dependency.clone(), denial).is_some()
        {
            self.kept.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Forgets any denial kept for `dependency` (its deposits reached the store, or the budget
    /// changed), and any reply to a call sent before now.
    pub(super) fn forget(&self, dependency: &Dependency) {
        if !self.is_on() {
            return;
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.remove(dependency);
    }

    /// A reply showed room for `dependency`: any denial kept is forgotten. Replies on one
    /// connection come in the order they were decided, so a denial decided before this reply
    /// has been kept already; with none kept (the healthy path) this takes no lock.
    fn room(&self, dependency: &Dependency) {
        self.remove(dependency);
    }

    /// Forgets the denial kept for `dependency` when `control` (what a fresh reply says of the
    /// overrides and the policy in force) is not what it was when the denial was kept.
    pub(super) fn seen(&self, dependency: &Dependency, control: Control) {
        if !self.is_on() || self.kept.load(Ordering::SeqCst) == 0 {
            return;
        }
        let changed = {
            let denials = self.denials.read().unwrap_or_else(PoisonError::into_inner);
            denials
                .get(dependency)
                .is_some_and(|denial| denial.snapshot.control != control)
        };
        if changed {
            self.forget(dependency);
        }
    }

    fn remove(&self, dependency: &Dependency) {
        if self.kept.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut denials = self.denials.write().unwrap_or_else(PoisonError::into_inner);
        if denials.remove(dependency).is_some() {
            self.kept.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep() -> Dependency {
        Dependency::new("search").unwrap_or_else(|e| panic!("{e}"))
    }

    fn denial(next_grant_ms: Option<u64>) -> Withdrawal {
        Withdrawal {
            granted: false,
            snapshot: BudgetSnapshot::default(),
            next_grant_ms,
        }
    }

    fn denied(cache: &DenyCache) -> bool {
        matches!(cache.lookup(&dep()), Lookup::Denied(_))
    }

    #[test]
    fn a_denial_stands_until_the_next_grant_or_the_staleness_whichever_first() {
        let cache = DenyCache::new(Duration::from_secs(3600));
        let now = Instant::now();
        cache.remember(&dep(), 0, now, &denial(Some(60_000)));
        assert!(denied(&cache));
        let Lookup::Denied(w) = cache.lookup(&dep()) else {
            panic!("denied");
        };
        assert!(
            !w.granted
                && w.next_grant_ms
                    .is_some_and(|ms| ms <= 60_000 && ms > 59_000)
        );
        // A reply whose next grant has come already, or whose staleness has passed: not kept.
        cache.forget(&dep());
        let past = now.checked_sub(Duration::from_secs(2)).unwrap_or(now);
        cache.remember(&dep(), 1, past, &denial(Some(1000)));
        assert!(!denied(&cache));
        let short = DenyCache::new(Duration::from_millis(1));
        short.remember(&dep(), 0, past, &denial(None));
        assert!(!denied(&short), "staleness passed");
        let off = DenyCache::new(Duration::ZERO);
        off.remember(&dep(), 0, now, &denial(None));
        assert!(!denied(&off), "0 turns it off");
    }

    #[test]
    fn room_a_flush_or_another_override_state_forgets_and_a_late_reply_is_not_kept() {
        let cache = DenyCache::new(Duration::from_secs(3600));
        let now = Instant::now();
        cache.remember(&dep(), 0, now, &denial(None));
        assert!(denied(&cache));
        cache.remember(&dep(), 0, now, &denial(Some(0)));
        assert!(!denied(&cache), "room now: forgotten");
        let Lookup::Ask(epoch) = cache.lookup(&dep()) else {
            panic!("asks");
        };
        cache.remember(&dep(), epoch, now, &denial(None));
        assert!(denied(&cache));
        cache.seen(&dep(), Control::default());
        assert!(denied(&cache), "the same override state");
        cache.seen(
            &dep(),
            Control {
                overridden: true,
                ..Control::default()
            },
        );
        assert!(!denied(&cache), "a set override seen");
        // A call sent before a flush and answered after it is not kept.
        let Lookup::Ask(before) = cache.lookup(&dep()) else {
            panic!("asks");
        };
        cache.forget(&dep());
        cache.remember(&dep(), before, now, &denial(None));
        assert!(!denied(&cache), "answered under an older epoch");
    }
}
