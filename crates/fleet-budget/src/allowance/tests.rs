//! The budget math against its definition: unit cases and a property test.

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
