//! The pace's decisions, interval by interval, on a clock the tests move (server ms handed in).

use super::*;

fn counters(window_index: u64, successes: u64, retries: u64, denied: u64) -> Counters {
    Counters {
        window_index,
        successes,
        retries,
        denied,
    }
}

fn healthy(c: Counters) -> Health {
    Health {
        breaker: BreakerGate::Closed,
        frozen: false,
        counters: Some(c),
    }
}

fn go(g: &Gate) -> (f64, Pace) {
    match g {
        Gate::Go {
            rate: Some(rate),
            pace,
        } => (*rate, *pace),
        other => panic!("not a paced go: {other:?}"),
    }
}

fn settings() -> RateControl {
    RateControl {
        start_rate: 10.0,
        increase: Some(50.0),
        ..RateControl::default()
    }
}

/// A run and its clock: each `second` is one interval in which the dependency saw `successes`
/// and `failures` (granted retries), then a read.
struct Run {
    l: Loop,
    c: Counters,
    now: u64,
}

impl Run {
    fn new(settings: RateControl, max: f64) -> Self {
        let mut r = Self {
            l: Loop::new(settings, Some(max)),
            c: counters(1, 0, 0, 0),
            now: 0,
        };
        r.l.decide(r.now, healthy(r.c));
        r
    }

    fn second(&mut self, successes: u64, failures: u64) -> (f64, Pace) {
        self.c.successes += successes;
        self.c.retries += failures;
        self.now += 1000;
        go(&self.l.decide(self.now, healthy(self.c)))
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
        }
    );
    // Rolled over: what the new window holds (never negative, never the old window's).
    let c = counters(8, 2, 1, 0);
    assert_eq!(
        c.since(&b),
        Delta {
            successes: 2,
            failures: 1,
        }
    );
    // A counter that went down (a key recreated): saturates at 0.
    assert_eq!(a.since(&b), Delta::default());
}

/// Issue 31: after an outage the budget's `remaining` is 0 and its window still holds the
/// outage's retries; none of that is read. A healthy dependency takes the run from the start
/// rate to the asked rate by doubling, one interval each, and the pace never says "slowed".
#[test]
fn slow_start_doubles_while_jobs_succeed_up_to_the_asked_rate() {
    // The window the run starts in holds the outage: 400 retries granted, 39,600 denied.
    let mut r = Run {
        l: Loop::new(settings(), Some(2000.0)),
        c: counters(1, 0, 400, 39_600),
        now: 0,
    };
    assert_eq!(
        go(&r.l.decide(0, healthy(r.c))),
        (10.0, Pace::Starting),
        "starts slow, not held"
    );
    let mut seen = Vec::new();
    for _ in 0..9 {
        seen.push(r.second(5, 0));
    }
    let rates: Vec<f64> = seen.iter().map(|(rate, _)| *rate).collect();
    assert_eq!(
        rates,
        [
            20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0, 2000.0, 2000.0
        ]
    );
    assert!(seen[..7].iter().all(|(_, p)| *p == Pace::Starting));
    assert!(seen[7..].iter().all(|(_, p)| *p == Pace::AtRate));
    assert_eq!(r.l.cuts, 0);
}

#[test]
fn an_interval_without_a_success_keeps_the_rate() {
    let mut r = Run::new(settings(), 1000.0);
    assert_eq!(r.second(0, 0), (10.0, Pace::AwaitingSuccess));
    assert_eq!(r.second(0, 0), (10.0, Pace::AwaitingSuccess));
    assert_eq!(r.second(3, 0), (20.0, Pace::Starting));
    // At the asked rate, a quiet interval is still at the asked rate.
    let mut r = Run::new(settings(), 10.0);
    assert_eq!(r.second(0, 0), (10.0, Pace::AtRate));
}

#[test]
fn the_rate_moves_once_per_interval() {
    let mut r = Run::new(settings(), 1000.0);
    r.c.successes += 10;
    assert_eq!(go(&r.l.decide(500, healthy(r.c))), (10.0, Pace::Starting));
    assert_eq!(go(&r.l.decide(999, healthy(r.c))), (10.0, Pace::Starting));
    assert_eq!(go(&r.l.decide(1000, healthy(r.c))), (20.0, Pace::Starting));
    // The next interval starts at that read: no second doubling on the same counters.
    assert_eq!(go(&r.l.decide(1500, healthy(r.c))).0, 20.0);
}

#[test]
fn failures_above_the_share_halve_the_rate_and_it_climbs_back_additively() {
    let mut r = Run::new(settings(), 400.0);
    for _ in 0..6 {
        r.second(10, 0);
    }
    assert_eq!(r.second(10, 0), (400.0, Pace::AtRate));
    // 30 failures of 40 outcomes: cut, twice.
    assert_eq!(r.second(10, 30), (200.0, Pace::Slowed { failures: 30 }));
    assert_eq!(r.second(10, 30), (100.0, Pace::Slowed { failures: 30 }));
    assert_eq!(r.l.cuts, 2);
    // Then successes only: +50 an interval (not doubling), back to the asked rate.
    let climb: Vec<(f64, Pace)> = (0..7).map(|_| r.second(10, 0)).collect();
    assert_eq!(
        climb[..3],
        [
            (150.0, Pace::Recovering),
            (200.0, Pace::Recovering),
            (250.0, Pace::Recovering)
        ]
    );
    assert_eq!(climb[5], (400.0, Pace::AtRate));
    assert_eq!(climb[6], (400.0, Pace::AtRate));
}

#[test]
fn failures_at_or_below_the_share_do_not_slow_it() {
    let mut r = Run::new(settings(), 40.0);
    // 2 of 10 outcomes: 20 %, not above.
    assert_eq!(r.second(8, 2), (20.0, Pace::Starting));
    // Denied retries count as failures like granted ones.
    r.c.denied += 1;
    assert_eq!(r.second(99, 0), (40.0, Pace::AtRate));
    r.c.denied += 50;
    assert_eq!(r.second(10, 0), (20.0, Pace::Slowed { failures: 50 }));
}

#[test]
fn cuts_never_go_below_the_minimum() {
    let mut r = Run::new(settings(), 2.0);
    for _ in 0..10 {
        r.second(0, 5);
    }
    assert_eq!(r.l.rate(), 0.5);
    assert_eq!(r.l.cuts, 10);
}

#[test]
fn an_open_breaker_holds_and_after_it_the_run_starts_over() {
    let mut r = Run::new(settings(), 100.0);
    for _ in 0..4 {
        r.second(10, 0);
    }
    assert_eq!(r.l.rate(), 100.0);
    let open = Health {
        breaker: BreakerGate::Open { until_ms: 9_000 },
        ..healthy(r.c)
    };
    assert_eq!(
        r.l.decide(r.now, open),
        Gate::Hold(HoldReason::BreakerOpen { until_ms: 9_000 })
    );
    // Half-open: the probe pace, 3 per 30 s.
    let half = Health {
        breaker: BreakerGate::HalfOpen {
            probes: 3,
            open: Duration::from_secs(30),
        },
        ..healthy(r.c)
    };
    assert_eq!(go(&r.l.decide(r.now + 100, half)), (0.1, Pace::ProbePace));
    // Closed: slow start again, from the start rate.
    assert_eq!(
        go(&r.l.decide(r.now + 200, healthy(r.c))),
        (10.0, Pace::Starting)
    );
}

#[test]
fn a_freeze_holds_whatever_the_counters_say() {
    let mut r = Run::new(settings(), 100.0);
    r.c.successes += 1000;
    let frozen = Health {
        frozen: true,
        ..healthy(r.c)
    };
    assert_eq!(r.l.decide(1000, frozen), Gate::Hold(HoldReason::Frozen));
    assert_eq!(r.l.decide(5000, frozen), Gate::Hold(HoldReason::Frozen));
    assert_eq!(go(&r.l.decide(6000, healthy(r.c))), (10.0, Pace::Starting));
}

#[test]
fn counters_not_read_from_the_fleet_keep_the_rate_and_say_so() {
    let mut r = Run::new(settings(), 100.0);
    r.second(10, 0);
    let unread = Health {
        counters: None,
        ..healthy(r.c)
    };
    assert_eq!(go(&r.l.decide(5000, unread)), (20.0, Pace::Unread));
    assert_eq!(go(&r.l.decide(9000, unread)), (20.0, Pace::Unread));
    // Read again: a new interval starts at that read.
    r.now = 10_000;
    assert_eq!(go(&r.l.decide(r.now, healthy(r.c))), (20.0, Pace::Starting));
    assert_eq!(r.second(1, 0), (40.0, Pace::Starting));
}

#[test]
fn a_low_asked_rate_is_the_start_and_unpaced_runs_stay_unpaced() {
    let r = Run::new(settings(), 5.0);
    assert_eq!(r.l.rate(), 5.0);
    let mut l = Loop::new(settings(), None);
    let c = counters(1, 0, 0, 0);
    assert_eq!(
        l.decide(0, healthy(c)),
        Gate::Go {
            rate: None,
            pace: Pace::Unpaced
        }
    );
    let c = counters(1, 0, 50, 0);
    assert_eq!(
        l.decide(1000, healthy(c)),
        Gate::Go {
            rate: None,
            pace: Pace::Unpaced
        }
    );
}

#[test]
fn disabled_keeps_the_fixed_rate_but_still_holds() {
    let mut r = Run::new(
        RateControl {
            enabled: false,
            ..settings()
        },
        30.0,
    );
    for _ in 0..5 {
        assert_eq!(r.second(0, 50), (30.0, Pace::AtRate));
    }
    let open = Health {
        breaker: BreakerGate::Open { until_ms: 1 },
        ..healthy(r.c)
    };
    assert_eq!(
        r.l.decide(9000, open),
        Gate::Hold(HoldReason::BreakerOpen { until_ms: 1 })
    );
}

#[test]
fn what_the_progress_line_says() {
    assert_eq!(
        Pace::Slowed { failures: 12 }.describe(),
        "slowed: 12 failures in the last window"
    );
    assert_eq!(
        HoldReason::Frozen.describe("se\u{1b}arch"),
        "held: se\\u{1b}arch frozen by an operator"
    );
}
