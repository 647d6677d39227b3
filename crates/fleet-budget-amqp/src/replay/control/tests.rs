//! The closed loop's decisions, checked window by window.

use super::*;

const LOTS: u64 = 1_000_000;

fn counters(window_index: u64, successes: u64, retries: u64, denied: u64) -> Counters {
    Counters {
        window_index,
        successes,
        retries,
        denied,
    }
}

fn rate(g: &Gate) -> Option<f64> {
    match g {
        Gate::Go { rate, .. } => *rate,
        Gate::Hold(h) => panic!("held: {h:?}"),
    }
}

fn settings() -> RateControl {
    RateControl {
        increase: Some(2.0),
        ..RateControl::default()
    }
}

#[test]
fn deltas_within_a_window_and_across_a_roll() {
    let a = counters(7, 10, 4, 1);
    let b = counters(7, 15, 9, 3);
    assert_eq!(
        b.since(&a),
        Delta {
            successes: 5,
            failures: 7,
            denied: 2
        }
    );
    // Rolled over: what the new window holds (never negative, never the old window's).
    let c = counters(8, 2, 1, 0);
    assert_eq!(
        c.since(&b),
        Delta {
            successes: 2,
            failures: 1,
            denied: 0
        }
    );
    // A counter that went down (a key recreated): saturates at 0.
    assert_eq!(a.since(&b), Delta::default());
}

#[test]
fn an_open_breaker_holds_then_half_open_goes_at_the_probe_pace() {
    let mut l = Loop::new(settings(), Some(50.0));
    let c = counters(1, 0, 0, 0);
    assert_eq!(
        l.decide(0, BreakerGate::Open { until_ms: 900 }, LOTS, c),
        Gate::Hold(HoldReason::BreakerOpen { until_ms: 900 })
    );
    let half = BreakerGate::HalfOpen {
        probes: 3,
        open: Duration::from_secs(30),
    };
    assert_eq!(
        l.decide(1000, half, LOTS, c),
        Gate::Go {
            rate: Some(0.1),
            slowed: Some(SlowReason::ProbePace)
        }
    );
    assert_eq!(
        l.decide(1100, BreakerGate::Closed, LOTS, c),
        Gate::Go {
            rate: Some(50.0),
            slowed: None
        }
    );
}

#[test]
fn an_exhausted_budget_holds_and_a_small_headroom_bounds_the_rate() {
    let mut l = Loop::new(settings(), Some(50.0));
    let c = counters(1, 0, 0, 0);
    assert_eq!(
        l.decide(0, BreakerGate::Closed, 0, c),
        Gate::Hold(HoldReason::BudgetExhausted)
    );
    assert_eq!(
        l.decide(0, BreakerGate::Closed, 8, c),
        Gate::Go {
            rate: Some(8.0),
            slowed: Some(SlowReason::BudgetPace)
        }
    );
}

#[test]
fn failures_cut_the_rate_and_quiet_intervals_climb_back_to_the_maximum() {
    let mut l = Loop::new(settings(), Some(40.0));
    let mut c = counters(1, 0, 0, 0);
    let mut now = 0;
    assert_eq!(
        rate(&l.decide(now, BreakerGate::Closed, LOTS, c)),
        Some(40.0)
    );
    // Three intervals with only failures: 40 → 20 → 10 → 5.
    let mut seen = Vec::new();
    for _ in 0..3 {
        c.retries += 10;
        now += 1000;
        seen.push(rate(&l.decide(now, BreakerGate::Closed, LOTS, c)).unwrap());
    }
    assert_eq!(seen, [20.0, 10.0, 5.0]);
    assert_eq!(l.cuts, 3);
    assert_eq!(
        l.decide(now, BreakerGate::Closed, LOTS, c),
        Gate::Go {
            rate: Some(5.0),
            slowed: Some(SlowReason::Failures)
        }
    );
    // Quiet: +2 per interval, up to the maximum and no further.
    let mut climb = Vec::new();
    for _ in 0..20 {
        c.successes += 10;
        now += 1000;
        climb.push(rate(&l.decide(now, BreakerGate::Closed, LOTS, c)).unwrap());
    }
    assert_eq!(&climb[..3], &[7.0, 9.0, 11.0]);
    assert_eq!(*climb.last().unwrap(), 40.0);
    assert!(climb.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(
        l.decide(now, BreakerGate::Closed, LOTS, c),
        Gate::Go {
            rate: Some(40.0),
            slowed: None
        }
    );
}

#[test]
fn a_denial_cuts_whatever_the_share_and_a_small_share_does_not() {
    let mut l = Loop::new(settings(), Some(40.0));
    let mut c = counters(1, 0, 0, 0);
    l.decide(0, BreakerGate::Closed, LOTS, c);
    // 1 failure in 100 outcomes: below the 20 % share, the rate climbs (already at max).
    c.successes += 99;
    c.retries += 1;
    assert_eq!(
        rate(&l.decide(1000, BreakerGate::Closed, LOTS, c)),
        Some(40.0)
    );
    // One denial among many successes: cut.
    c.successes += 1000;
    c.denied += 1;
    assert_eq!(
        rate(&l.decide(2000, BreakerGate::Closed, LOTS, c)),
        Some(20.0)
    );
}

#[test]
fn the_rate_moves_once_per_interval_and_never_below_the_minimum() {
    let mut l = Loop::new(settings(), Some(2.0));
    let mut c = counters(1, 0, 0, 0);
    l.decide(0, BreakerGate::Closed, LOTS, c);
    c.retries += 5;
    // Within the interval: no decision yet.
    assert_eq!(
        rate(&l.decide(500, BreakerGate::Closed, LOTS, c)),
        Some(2.0)
    );
    assert_eq!(
        rate(&l.decide(1000, BreakerGate::Closed, LOTS, c)),
        Some(1.0)
    );
    for i in 2..=10 {
        c.retries += 5;
        l.decide(i * 1000, BreakerGate::Closed, LOTS, c);
    }
    assert_eq!(l.rate(), Some(0.5));
    assert_eq!(l.cuts, 10);
}

#[test]
fn unpaced_runs_stay_unpaced_until_a_ceiling_appears() {
    let mut l = Loop::new(settings(), None);
    let mut c = counters(1, 0, 0, 0);
    assert_eq!(
        rate(&l.decide(0, BreakerGate::Closed, LOTS, c)),
        Some(1_000_000.0)
    );
    // Cut from the budget pace, then climbing by the step.
    c.retries += 3;
    assert_eq!(
        rate(&l.decide(1000, BreakerGate::Closed, 100, c)),
        Some(50.0)
    );
    c.successes += 3;
    assert_eq!(
        rate(&l.decide(2000, BreakerGate::Closed, 100, c)),
        Some(52.0)
    );
}

#[test]
fn disabled_keeps_the_fixed_rate_but_still_holds() {
    let mut l = Loop::new(
        RateControl {
            enabled: false,
            ..settings()
        },
        Some(30.0),
    );
    let mut c = counters(1, 0, 0, 0);
    for i in 0..5 {
        c.denied += 5;
        assert_eq!(
            rate(&l.decide(i * 1000, BreakerGate::Closed, 3, c)),
            Some(30.0)
        );
    }
    assert_eq!(
        l.decide(9000, BreakerGate::Open { until_ms: 1 }, 3, c),
        Gate::Hold(HoldReason::BreakerOpen { until_ms: 1 })
    );
    assert_eq!(
        l.decide(9000, BreakerGate::Closed, 0, c),
        Gate::Hold(HoldReason::BudgetExhausted)
    );
}
