use super::*;
use crate::allowance::BudgetSnapshot;
use crate::breaker::{BreakerState, BreakerStatus};
use crate::control::overrides::{Freeze, Overrides};

/// A fleet status whose current window holds `current` (the previous one outside the window),
/// with `allowance`.
fn fleet(current: WindowCounters, allowance: u64) -> FleetStatus {
    FleetStatus {
        snapshot: BudgetSnapshot {
            window_ms: 60_000,
            window_index: 10,
            elapsed_ms: 30_000,
            previous_weight_ms: 0,
            current,
            previous: WindowCounters::default(),
            allowance,
            control: crate::allowance::Control::default(),
        },
        policy: BudgetPolicy::default(),
        ttl_ms: None,
        conflicts: 0,
        conflicting_policy: None,
        conflict_age_ms: None,
        now_ms: 630_000,
        overrides: Overrides::default(),
    }
}

fn counters(first_attempts: u64, retries: u64, denied: u64) -> WindowCounters {
    WindowCounters {
        successes: 0,
        first_attempts,
        retries,
        denied,
    }
}

fn kinds(v: &DependencyView) -> Vec<AlertKind> {
    v.alerts.iter().map(|a| a.kind).collect()
}

fn search() -> Dependency {
    Dependency::new("search").unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_healthy_dependency_has_no_alert() {
    let v = DependencyView::new(&search(), &fleet(counters(100, 10, 0), 20), None, None);
    assert!(v.alerts.is_empty());
    assert_eq!(v.severity(), 0);
    assert_eq!(v.amplification, Some(1.1));
    assert_eq!(v.remaining, 10);
}

#[test]
fn an_exhausted_budget_that_denies_is_alerted_above_its_amplification() {
    let v = DependencyView::new(&search(), &fleet(counters(10, 10, 5), 10), None, None);
    assert_eq!(kinds(&v), [AlertKind::Exhausted, AlertKind::Amplified]);
    assert_eq!(v.severity(), 3);
    assert!(v.alerts[1].text.contains("50%"), "{:?}", v.alerts);
}

#[test]
fn amplification_at_the_threshold_is_not_alerted_and_above_it_is() {
    // 1.5 exactly: not above the threshold.
    let at = DependencyView::new(&search(), &fleet(counters(100, 50, 0), 1000), None, None);
    assert!(at.alerts.is_empty(), "{:?}", at.alerts);
    let above = DependencyView::new(&search(), &fleet(counters(100, 51, 0), 1000), None, None);
    assert_eq!(kinds(&above), [AlertKind::Amplified]);
}

#[test]
fn denials_with_room_left_and_a_policy_conflict_are_notices() {
    let mut f = fleet(counters(100, 1, 3), 10);
    f.conflicts = 7;
    f.conflicting_policy = Some("1000 0.5 1 success sliding".to_owned());
    let v = DependencyView::new(&search(), &f, None, None);
    assert_eq!(kinds(&v), [AlertKind::Denials, AlertKind::PolicyConflict]);
    assert_eq!(v.severity(), 1);
    assert!(v.alerts[1].text.contains("7 calls"), "{:?}", v.alerts);
}

#[test]
fn a_freeze_comes_first_and_a_due_open_breaker_reads_half_open() {
    let mut f = fleet(counters(10, 0, 4), 0);
    f.overrides.freeze = Some(Freeze {
        until_ms: 700_000,
        actor: "alice".to_owned(),
        reason: "incident".to_owned(),
        since_ms: 600_000,
    });
    let breaker = BreakerView::new(&BreakerStatus {
        state: BreakerState::Open,
        open_until_ms: 620_000,
        probes_issued: 0,
        probe_successes: 0,
        changed_ms: 600_000,
        times_opened: 2,
        volume: 10.0,
        failures: 9.0,
        now_ms: 630_000,
    });
    assert_eq!(breaker.state, BreakerState::HalfOpen);
    assert!(breaker.open_remaining_secs.abs() < f64::EPSILON);
    assert_eq!(breaker.changed_secs_ago, Some(30.0));
    let v = DependencyView::new(&search(), &f, Some(breaker), None);
    assert_eq!(
        kinds(&v),
        [AlertKind::Frozen, AlertKind::Breaker, AlertKind::Exhausted]
    );
    assert_eq!(v.severity(), 5);
    assert!(v.alerts[1].text.contains("half-open"), "{:?}", v.alerts);
    assert!((v.secs_until(700_000) - 70.0).abs() < 1e-9);
}

#[test]
fn worst_first_orders_by_severity_then_denial_rate_then_name() {
    let dep = |n: &str| Dependency::new(n).unwrap_or_else(|e| panic!("{e}"));
    let fleet_view = FleetView {
        dependencies: vec![
            DependencyView::new(&dep("a"), &fleet(counters(100, 1, 0), 10), None, None),
            DependencyView::new(&dep("b"), &fleet(counters(100, 1, 2), 10), None, None),
            DependencyView::new(&dep("c"), &fleet(counters(100, 1, 9), 10), None, None),
            DependencyView::new(&dep("d"), &fleet(counters(10, 10, 1), 10), None, None),
        ],
        unusable: Vec::new(),
    };
    let order: Vec<&str> = fleet_view
        .worst_first()
        .iter()
        .map(|v| v.dependency.as_str())
        .collect();
    assert_eq!(order, ["d", "c", "b", "a"]);
}
