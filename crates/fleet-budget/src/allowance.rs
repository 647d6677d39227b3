//! The budget math: pure functions of counters, time and policy. No I/O.
//!
//! The Lua scripts in `lua/` implement exactly this arithmetic; the [`crate::store::LocalStore`]
//! and the simulator call these functions directly, and the integration tests check that both give
//! the same decisions and snapshots for the same sequence of operations.
//!
//! All estimates are kept *scaled by the window length in milliseconds* so that comparisons are
//! exact integer arithmetic in Rust and in Lua (whose numbers are doubles, exact below 2^53):
//!
//! ```text
//! elapsed      = now_ms - index × window_ms            (0 ≤ elapsed < window_ms)
//! prev_weight  = window_ms - elapsed   (sliding)  |  0   (fixed)
//! deposits_sc  = cur_deposits × window_ms + prev_deposits × prev_weight
//! retries_sc   = cur_retries  × window_ms + prev_retries  × prev_weight
//! allowance    = max(min_allowance, floor(ratio × deposits_sc / window_ms))
//! grant       ⇔ retries_sc + window_ms ≤ allowance × window_ms
//! ```

use serde::Serialize;

use crate::policy::{BudgetPolicy, DepositBasis, WindowMode};

/// What a window counts. Denials are never counted as retries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WindowCounters {
    /// Successful jobs.
    pub successes: u64,
    /// First attempts (executions with attempt number 1).
    pub first_attempts: u64,
    /// Retries granted.
    pub retries: u64,
    /// Retries denied.
    pub denied: u64,
}

impl WindowCounters {
    /// The deposits of this window under `basis`.
    #[must_use]
    pub fn deposits(&self, basis: DepositBasis) -> u64 {
        match basis {
            DepositBasis::Success => self.successes,
            DepositBasis::Request => self.first_attempts,
        }
    }
}

/// The stored state of one dependency's budget: the current and the previous window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetState {
    /// The window length this state was counted with.
    pub window_ms: u64,
    /// Index of the current window: `floor(server_time_ms / window_ms)`.
    pub index: u64,
    /// Counters of window `index`.
    pub current: WindowCounters,
    /// Counters of window `index - 1`.
    pub previous: WindowCounters,
}

/// Which counter a deposit adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DepositKind {
    /// A successful job.
    Success,
    /// A first attempt.
    FirstAttempt,
}

impl DepositKind {
    /// The one-letter code the deposit script takes (`s` or `a`).
    #[must_use]
    pub fn script_code(self) -> &'static str {
        match self {
            Self::Success => "s",
            Self::FirstAttempt => "a",
        }
    }
}

impl BudgetState {
    /// A state with no counts, positioned at the window holding `now_ms`.
    #[must_use]
    pub fn empty(now_ms: u64, window_ms: u64) -> Self {
        let window_ms = window_ms.max(1);
        Self {
            window_ms,
            index: now_ms / window_ms,
            current: WindowCounters::default(),
            previous: WindowCounters::default(),
        }
    }

    /// Moves the state to the window holding `now_ms`.
    ///
    /// The next window shifts current into previous; a gap of two or more windows clears both; a
    /// different window length starts afresh. Time that goes backwards (a failover to a server
    /// with a slower clock) keeps the current window: counters are never un-rolled.
    pub fn roll(&mut self, now_ms: u64, window_ms: u64) {
        let window_ms = window_ms.max(1);
        if self.window_ms != window_ms {
            *self = Self::empty(now_ms, window_ms);
            return;
        }
        let index = now_ms / window_ms;
        if index == self.index.saturating_add(1) {
            self.previous = self.current;
            self.current = WindowCounters::default();
            self.index = index;
        } else if index > self.index {
            *self = Self::empty(now_ms, window_ms);
        }
    }

    /// Adds `n` to the counter of `kind` in the window holding `now_ms`.
    pub fn deposit(&mut self, now_ms: u64, window_ms: u64, kind: DepositKind, n: u64) {
        self.roll(now_ms, window_ms);
        match kind {
            DepositKind::Success => {
                self.current.successes = self.current.successes.saturating_add(n);
            }
            DepositKind::FirstAttempt => {
                self.current.first_attempts = self.current.first_attempts.saturating_add(n);
            }
        }
    }

    /// The snapshot of this state at `now_ms` under `policy`, without changing anything.
    ///
    /// The state should already be rolled to `now_ms` (see [`BudgetState::roll`]).
    #[must_use]
    pub fn snapshot(&self, now_ms: u64, policy: &BudgetPolicy) -> BudgetSnapshot {
        let window_ms = self.window_ms.max(1);
        let start = self.index.saturating_mul(window_ms);
        let elapsed_ms = now_ms.saturating_sub(start).min(window_ms - 1);
        let previous_weight_ms = match policy.mode {
            WindowMode::Sliding => window_ms - elapsed_ms,
            WindowMode::Fixed => 0,
        };
        let mut snapshot = BudgetSnapshot {
            window_ms,
            window_index: self.index,
            elapsed_ms,
            previous_weight_ms,
            current: self.current,
            previous: self.previous,
            allowance: 0,
            control: Control::default(),
        };
        snapshot.allowance = allowance(
            policy.ratio,
            policy.min_allowance,
            snapshot.deposits_scaled(policy.deposit),
            window_ms,
        );
        snapshot
    }

    /// Asks for one retry at `now_ms`: rolls the window, decides, and counts the retry or the
    /// denial. Returns whether it was granted and the snapshot after counting.
    pub fn try_spend(&mut self, now_ms: u64, policy: &BudgetPolicy) -> (bool, BudgetSnapshot) {
        self.roll(now_ms, policy.window_ms());
        let mut snapshot = self.snapshot(now_ms, policy);
        let granted = grants(&snapshot);
        if granted {
            self.current.retries = self.current.retries.saturating_add(1);
        } else {
            self.current.denied = self.current.denied.saturating_add(1);
        }
        // The allowance depends on deposits only: the counters are all that changed.
        snapshot.current = self.current;
        (granted, snapshot)
    }
}

/// `max(min_allowance, floor(ratio × deposits_scaled / window_ms))`, computed in the same order of
/// floating-point operations as the Lua scripts so both give the same integer.
#[must_use]
pub fn allowance(ratio: f64, min_allowance: u64, deposits_scaled: u128, window_ms: u64) -> u64 {
    // u128 → f64 is a software routine; through u64 it is one instruction, same rounding.
    #[allow(clippy::cast_precision_loss)]
    let deposits = match u64::try_from(deposits_scaled) {
        Ok(small) => small as f64,
        Err(_) => deposits_scaled as f64,
    };
    #[allow(clippy::cast_precision_loss)]
    let earned = (ratio * deposits / window_ms.max(1) as f64).floor();
    max_u64(min_allowance, f64_to_u64(earned))
}

/// Whether one more retry fits: `retries_est + 1 <= allowance`, in scaled integers.
#[must_use]
pub fn grants(snapshot: &BudgetSnapshot) -> bool {
    let window = u128::from(snapshot.window_ms);
    snapshot.retries_scaled() + window <= u128::from(snapshot.allowance) * window
}

/// Milliseconds from the snapshot's instant until one more retry could be granted if nothing
/// changed meanwhile (no deposit, no spend, no override or policy change): `Some(0)` when one
/// would be granted now, `None` when none ever would (a floor of 0 and no deposits left).
///
/// Without new deposits the estimates only decay, so the allowance can only fall: this is the
/// first millisecond at which the retries estimate, decaying with the previous window's weight
/// and then rolling with the windows, fits the allowance as it is now. Exact while the allowance
/// holds (a budget at its floor: a retry storm); never later than the true instant, so a caller
/// that refuses retries until then refuses none the budget would grant. `lua/README.md`,
/// "Reply", field `next_grant_ms`: `shared/next_grant.lua` computes the same, operation for
/// operation (it also stops at the end of a freeze or a set override, which this snapshot of the
/// local store never has).
#[must_use]
pub fn next_grant_in_ms(snapshot: &BudgetSnapshot) -> Option<u64> {
    let window = u128::from(snapshot.window_ms.max(1));
    let elapsed = u128::from(snapshot.elapsed_ms);
    let weight = u128::from(snapshot.previous_weight_ms);
    let (cur, prev) = (
        u128::from(snapshot.current.retries),
        u128::from(snapshot.previous.retries),
    );
    let allowance = u128::from(snapshot.allowance);
    if cur * window + prev * weight + window <= allowance * window {
        return Some(0);
    }
    let k = allowance.checked_sub(1)?;
    let ms = |v: u128| Some(u64::try_from(v).unwrap_or(u64::MAX));
    // This window: the previous one's weight falls 1 per ms, and with it its retries.
    if weight > 0 && prev > 0 && k >= cur {
        let y = (k - cur) * window / prev;
        if y >= 1 {
            return ms(window.saturating_sub(y).saturating_sub(elapsed));
        }
    }
    if weight == 0 || cur <= k {
        // The next window, from its start (fixed mode: it starts empty).
        return ms(window.saturating_sub(elapsed));
    }
    // The next window, where this one's retries decay in turn; else the one after (empty).
    let y = k * window / cur;
    ms((2 * window).saturating_sub(y).saturating_sub(elapsed))
}

fn max_u64(a: u64, b: u64) -> u64 {
    if a > b { a } else { b }
}

/// Converts a non-negative, floored float to `u64`, saturating; NaN gives 0.
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]
fn f64_to_u64(x: f64) -> u64 {
    if x.is_nan() || x <= 0.0 {
        0
    } else if x >= u64::MAX as f64 {
        u64::MAX
    } else {
        x as u64
    }
}

/// What the store saw when it decided: the two windows, their weights and the allowance.
///
/// Returned by every store call (deposit, retry, status) so that a dead-letter can say why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BudgetSnapshot {
    /// Window length in milliseconds.
    pub window_ms: u64,
    /// Index of the current window (`floor(server_time_ms / window_ms)`).
    pub window_index: u64,
    /// Milliseconds since the current window began (server time).
    pub elapsed_ms: u64,
    /// Weight of the previous window, in milliseconds out of `window_ms` (0 in fixed mode).
    pub previous_weight_ms: u64,
    /// Counters of the current window.
    pub current: WindowCounters,
    /// Counters of the previous window.
    pub previous: WindowCounters,
    /// Retries allowed in the last window: `max(min_allowance, floor(ratio × deposits_est))`
    /// (0 while the dependency is frozen).
    pub allowance: u64,
    /// What the fleet store said about the policy and the overrides (all false from the local
    /// store, which has neither).
    pub control: Control,
}

/// How the fleet store's answer relates to the caller's policy and to operators' overrides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Control {
    /// The caller's policy differs from the policy in force, which served the call instead.
    pub conflict: bool,
    /// A freeze is in force: no retry is granted, the floor included.
    pub frozen: bool,
    /// A `set` override replaces the ratio and/or the floor.
    pub overridden: bool,
}

impl BudgetSnapshot {
    fn scaled(&self, cur: u64, prev: u64) -> u128 {
        u128::from(cur) * u128::from(self.window_ms)
            + u128::from(prev) * u128::from(self.previous_weight_ms)
    }

    /// Deposits estimate scaled by `window_ms`.
    #[must_use]
    pub fn deposits_scaled(&self, basis: DepositBasis) -> u128 {
        self.scaled(self.current.deposits(basis), self.previous.deposits(basis))
    }

    /// Retries estimate scaled by `window_ms`.
    #[must_use]
    pub fn retries_scaled(&self) -> u128 {
        self.scaled(self.current.retries, self.previous.retries)
    }

    /// The sliding estimate over the last window of a counter that holds `current` in the
    /// current window and `previous` in the previous one, rounded down:
    /// `floor((current × window_ms + previous × previous_weight_ms) / window_ms)`.
    #[must_use]
    pub fn estimate(&self, current: u64, previous: u64) -> u64 {
        let window = u128::from(self.window_ms.max(1));
        u64::try_from(self.scaled(current, previous) / window).unwrap_or(u64::MAX)
    }

    /// The sliding estimates of every counter over the last window, rounded down: the counts
    /// the allowance is computed from, as `budgetctl status` shows them and dead-letter headers
    /// carry them.
    #[must_use]
    pub fn estimates(&self) -> WindowCounters {
        let (c, p) = (&self.current, &self.previous);
        WindowCounters {
            successes: self.estimate(c.successes, p.successes),
            first_attempts: self.estimate(c.first_attempts, p.first_attempts),
            retries: self.estimate(c.retries, p.retries),
            denied: self.estimate(c.denied, p.denied),
        }
    }

    /// Sliding estimate of retries granted in the last window.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn retries_estimate(&self) -> f64 {
        self.retries_scaled() as f64 / self.window_ms.max(1) as f64
    }

    /// Sliding estimate of deposits in the last window.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn deposits_estimate(&self, basis: DepositBasis) -> f64 {
        self.deposits_scaled(basis) as f64 / self.window_ms.max(1) as f64
    }

    /// Retries that would still be granted now (the headroom).
    #[must_use]
    pub fn remaining(&self) -> u64 {
        let window = u128::from(self.window_ms.max(1));
        let room = (u128::from(self.allowance) * window).saturating_sub(self.retries_scaled());
        u64::try_from(room / window).unwrap_or(u64::MAX)
    }

    /// Milliseconds until the current window rolls over.
    #[must_use]
    pub fn ms_until_roll(&self) -> u64 {
        self.window_ms.saturating_sub(self.elapsed_ms)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    fn policy(window_ms: u64, ratio: f64, min: u64, mode: WindowMode) -> BudgetPolicy {
        BudgetPolicy {
            window: Duration::from_millis(window_ms),
            ratio,
            min_allowance: min,
            deposit: DepositBasis::Success,
            mode,
        }
    }

    #[test]
    fn floor_grants_a_retry_on_an_idle_dependency() {
        let p = BudgetPolicy::default();
        let mut s = BudgetState::empty(0, p.window_ms());
        let (granted, snap) = s.try_spend(5, &p);
        assert!(granted);
        assert_eq!(snap.allowance, 10);
        assert_eq!(snap.current.retries, 1);
    }

    #[test]
    fn allowance_is_ratio_of_successes_above_the_floor() {
        let p = policy(60_000, 0.2, 10, WindowMode::Sliding);
        let mut s = BudgetState::empty(0, 60_000);
        s.deposit(0, 60_000, DepositKind::Success, 1000);
        assert_eq!(s.snapshot(0, &p).allowance, 200);
        let grants = (0..300).filter(|_| s.try_spend(10, &p).0).count();
        assert_eq!(grants, 200);
        assert_eq!(s.current.denied, 100);
    }

    #[test]
    fn denials_are_not_counted_as_retries() {
        let p = policy(1000, 0.0, 1, WindowMode::Fixed);
        let mut s = BudgetState::empty(0, 1000);
        assert!(s.try_spend(0, &p).0);
        assert!(!s.try_spend(0, &p).0);
        assert!(!s.try_spend(0, &p).0);
        assert_eq!(s.current.retries, 1);
        assert_eq!(s.current.denied, 2);
    }

    #[test]
    fn fixed_mode_has_a_cliff_at_the_boundary_and_sliding_does_not() {
        for (mode, expected_allowance) in [(WindowMode::Fixed, 10), (WindowMode::Sliding, 199)] {
            let p = policy(60_000, 0.2, 10, mode);
            let mut s = BudgetState::empty(0, 60_000);
            s.deposit(30_000, 60_000, DepositKind::Success, 1000);
            s.roll(60_001, 60_000);
            assert_eq!(
                s.snapshot(60_001, &p).allowance,
                expected_allowance,
                "{mode:?}"
            );
        }
    }

    #[test]
    fn estimates_weigh_the_previous_window_by_what_is_left_of_it() {
        let p = policy(1000, 0.5, 0, WindowMode::Sliding);
        let mut s = BudgetState::empty(0, 1000);
        s.deposit(0, 1000, DepositKind::Success, 100);
        s.deposit(0, 1000, DepositKind::FirstAttempt, 7);
        for _ in 0..60 {
            s.try_spend(0, &p);
        }
        s.roll(1250, 1000);
        s.deposit(1250, 1000, DepositKind::Success, 10);
        let snap = s.snapshot(1250, &p);
        assert_eq!(snap.previous_weight_ms, 750);
        let e = snap.estimates();
        assert_eq!(
            e.successes,
            10 + 75,
            "all of the current, 3/4 of the previous"
        );
        assert_eq!(e.first_attempts, 5, "5.25 rounded down");
        assert_eq!((e.retries, e.denied), (37, 7), "50 and 10, weighted");
        assert_eq!(e.retries, snap.estimate(0, 50));
        assert_eq!(u128::from(e.retries), snap.retries_scaled() / 1000);
        let fixed = s.snapshot(1250, &policy(1000, 0.5, 0, WindowMode::Fixed));
        assert_eq!(
            fixed.estimates().successes,
            10,
            "fixed mode forgets the previous window"
        );
        let huge = BudgetSnapshot {
            window_ms: 1,
            previous_weight_ms: 1,
            current: WindowCounters {
                successes: u64::MAX,
                ..WindowCounters::default()
            },
            previous: WindowCounters {
                successes: u64::MAX,
                ..WindowCounters::default()
            },
            ..BudgetSnapshot::default()
        };
        assert_eq!(huge.estimates().successes, u64::MAX, "saturates, no panic");
        assert_eq!(
            BudgetSnapshot::default().estimates(),
            WindowCounters::default()
        );
    }

    #[test]
    fn two_idle_windows_forget_everything() {
        let p = policy(1000, 0.2, 10, WindowMode::Sliding);
        let mut s = BudgetState::empty(0, 1000);
        s.deposit(0, 1000, DepositKind::Success, 500);
        s.roll(2000, 1000);
        assert_eq!(s.current, WindowCounters::default());
        assert_eq!(s.previous, WindowCounters::default());
        assert_eq!(s.snapshot(2000, &p).allowance, 10);
    }

    #[test]
    fn time_going_backwards_keeps_the_window() {
        let mut s = BudgetState::empty(10_000, 1000);
        s.deposit(10_000, 1000, DepositKind::Success, 3);
        s.roll(9_000, 1000);
        assert_eq!(s.index, 10);
        assert_eq!(s.current.successes, 3);
    }

    #[test]
    fn nan_and_huge_ratios_do_not_panic() {
        assert_eq!(allowance(f64::NAN, 3, 10, 1000), 3);
        assert_eq!(allowance(f64::INFINITY, 3, 10, 1000), u64::MAX);
        assert_eq!(allowance(1e300, 0, u128::MAX, 1), u64::MAX);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Deposit(u64, DepositKind),
        Spend,
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (
                1u64..50,
                prop_oneof![Just(DepositKind::Success), Just(DepositKind::FirstAttempt)]
            )
                .prop_map(|(n, k)| Op::Deposit(n, k)),
            Just(Op::Spend),
            (0u64..1500).prop_map(Op::Advance),
        ]
    }

    /// The first ms at or after `now` (up to three windows on) at which a spend on `state`
    /// would be granted, nothing else happening: the brute-force answer `next_grant_in_ms`
    /// must never be later than (and, without deposits, must equal).
    fn first_grant_by_brute_force(state: &BudgetState, now: u64, p: &BudgetPolicy) -> Option<u64> {
        (now..now + 3 * p.window_ms())
            .find(|&t| {
                let mut s = *state;
                s.roll(t, p.window_ms());
                grants(&s.snapshot(t, p))
            })
            .map(|t| t - now)
    }

    proptest! {
        /// The wait a denial reports is never later than the first grant, and is that grant's
        /// instant exactly when the allowance cannot fall (no deposits: the floor decides).
        #[test]
        fn next_grant_is_never_late_and_exact_at_the_floor(
            prev_retries in 0u64..30, cur_retries in 0u64..30, prev_dep in 0u64..60,
            cur_dep in 0u64..60, elapsed in 0u64..40, ratio in 0.0f64..1.0, min in 0u64..12,
            sliding in any::<bool>(), deposits in any::<bool>(),
        ) {
            let mode = if sliding { WindowMode::Sliding } else { WindowMode::Fixed };
            let p = policy(40, ratio, min, mode);
            let mut s = BudgetState::empty(40, 40);
            s.previous.retries = prev_retries;
            s.current.retries = cur_retries;
            if deposits {
                s.previous.successes = prev_dep;
                s.current.successes = cur_dep;
            }
            let now = 40 + elapsed;
            let snap = s.snapshot(now, &p);
            let next = next_grant_in_ms(&snap);
            let truth = first_grant_by_brute_force(&s, now, &p);
            match (next, truth) {
                (Some(n), Some(t)) => {
                    prop_assert!(n <= t, "reported {n} ms, first grant at {t}");
                    if !deposits {
                        prop_assert_eq!(n, t);
                    }
                }
                (None, t) => prop_assert_eq!(t, None, "reported never"),
                (Some(n), None) => prop_assert!(deposits || min == 0, "reported {n}, never granted"),
            }
        }
    }

    proptest! {
        /// Within any one window, granted retries never exceed the allowance in force, and every
        /// request is counted exactly once as a retry or a denial.
        #[test]
        fn grants_never_exceed_allowance(
            ops in prop::collection::vec(op(), 1..400),
            ratio in 0.0f64..2.0,
            min in 0u64..20,
            sliding in any::<bool>(),
        ) {
            let mode = if sliding { WindowMode::Sliding } else { WindowMode::Fixed };
            let p = policy(1000, ratio, min, mode);
            let mut now = 0u64;
            let mut s = BudgetState::empty(now, 1000);
            let mut requested = 0u64;
            let mut counted = 0u64;
            let mut index = s.index;
            for op in ops {
                match op {
                    Op::Deposit(n, k) => s.deposit(now, 1000, k, n),
                    Op::Advance(ms) => now += ms,
                    Op::Spend => {
                        let (granted, snap) = s.try_spend(now, &p);
                        if s.index != index {
                            index = s.index;
                            requested = 0;
                        }
                        requested += 1;
                        counted = snap.current.retries + snap.current.denied;
                        if granted {
                            // after counting, the estimate is still within the allowance
                            prop_assert!(snap.retries_scaled() <= u128::from(snap.allowance) * 1000);
                        } else {
                            prop_assert!(snap.retries_scaled() + 1000 > u128::from(snap.allowance) * 1000);
                        }
                        prop_assert!(snap.allowance >= min);
                    }
                }
            }
            prop_assert_eq!(requested, counted);
        }

        /// With no deposits, grants in one window are exactly the floor.
        #[test]
        fn floor_is_exact(min in 0u64..100, demand in 0u64..200) {
            let p = policy(60_000, 0.2, min, WindowMode::Sliding);
            let mut s = BudgetState::empty(0, 60_000);
            let granted = (0..demand).filter(|_| s.try_spend(1, &p).0).count() as u64;
            prop_assert_eq!(granted, demand.min(min));
        }

        /// Sliding allowance never drops below fixed allowance at the same instant.
        #[test]
        fn sliding_is_never_below_fixed(
            prev in 0u64..10_000, cur in 0u64..10_000, elapsed in 0u64..60_000, ratio in 0.0f64..1.0,
        ) {
            let mut s = BudgetState::empty(0, 60_000);
            s.deposit(0, 60_000, DepositKind::Success, prev);
            s.roll(60_000 + elapsed, 60_000);
            s.deposit(60_000 + elapsed, 60_000, DepositKind::Success, cur);
            let sliding = s.snapshot(60_000 + elapsed, &policy(60_000, ratio, 0, WindowMode::Sliding));
            let fixed = s.snapshot(60_000 + elapsed, &policy(60_000, ratio, 0, WindowMode::Fixed));
            prop_assert!(sliding.allowance >= fixed.allowance);
        }
    }
}
