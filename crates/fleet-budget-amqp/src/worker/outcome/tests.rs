//! The cases of [`super::Outcome`]: each decision and delivery the worker meets, mapped without
//! a broker.

use crate::config::AmqpSettings;
use fleet_budget::{BudgetSnapshot, Dependency};

use super::*;

fn topology() -> Topology {
    Topology::new(&AmqpSettings {
        retry_tiers: vec![Duration::from_secs(1), Duration::from_secs(5)],
        ..AmqpSettings::default()
    })
}

fn job() -> JobContext {
    JobContext {
        task: "index".into(),
        attempt: 2,
        replays: 1,
        original_exchange: "fleet.work".into(),
        original_routing_key: "index".into(),
        queue: "fleet.work".into(),
        first_failure_ms: Some(1_000),
        now_ms: 50_000,
    }
}

fn failure() -> Failure {
    Failure::retryable("503").with_class("http_503")
}

fn retry(delay: Duration) -> Decision {
    Decision::Retry {
        dependency: Dependency::new("search").unwrap(),
        delay,
        next_attempt: 3,
        snapshot: BudgetSnapshot::default(),
        source: BudgetSource::Fleet,
        shadow_denied: None,
    }
}

#[test]
fn a_hold_that_seems_to_start_in_the_future_counts_from_now() {
    assert_eq!(held_since(Some(u64::MAX), 50_000), Some(50_000));
    assert_eq!(held_since(Some(60_000), 50_000), Some(50_000));
    assert_eq!(held_since(Some(40_000), 50_000), Some(40_000));
    assert_eq!(held_since(None, 50_000), None);
}

#[test]
fn a_retry_waits_its_first_hop_and_the_rest_when_it_comes_back() {
    let t = topology();
    let Outcome::Retry { tier, record } =
        Outcome::of_decision(&t, &job(), &failure(), &retry(Duration::from_millis(1200)))
    else {
        panic!("a retry");
    };
    assert_eq!(tier, t.retry_tiers[0]);
    assert_eq!(
        record,
        RetryRecord {
            task: "index".into(),
            attempt: 3,
            delay_ms: 1200,
            tier_ms: 1000,
            not_before_ms: Some(51_201),
            original_exchange: "fleet.work".into(),
            original_routing_key: "index".into(),
            original_queue: "fleet.work".into(),
            first_failure_ms: 1_000,
            error_class: "http_503".into(),
            error: "503".into(),
            shadow_denied: None,
        }
    );
}

#[test]
fn a_wait_goes_hop_by_hop_until_its_time() {
    let t = topology();
    let hop = |now| match Outcome::wait(&t, now, 50_000) {
        Some(Outcome::Wait {
            tier,
            not_before_ms,
        }) => {
            assert_eq!(not_before_ms, 50_000);
            Some(tier.delay)
        }
        None => None,
        Some(other) => panic!("{other:?}"),
    };
    assert_eq!(hop(43_800), Some(Duration::from_secs(5)));
    assert_eq!(hop(48_800), Some(Duration::from_secs(1)));
    assert_eq!(hop(49_300), Some(Duration::from_secs(1)), "late by < 1 s");
    assert_eq!(hop(50_000), None);
    assert_eq!(hop(60_000), None);
    let bare = Topology {
        retry_tiers: Vec::new(),
        ..t
    };
    assert_eq!(Outcome::wait(&bare, 0, 1), Some(Outcome::Requeue));
}

#[test]
fn a_held_job_keeps_its_identity_and_when_it_was_first_held() {
    let t = topology();
    let first = JobContext {
        attempt: 1,
        first_failure_ms: None,
        ..job()
    };
    let Outcome::Hold {
        tier,
        not_before_ms,
        record,
    } = Outcome::hold(&t, &first, "circuit_open", Duration::from_secs(5), None)
    else {
        panic!("a hold");
    };
    assert_eq!(tier.delay, Duration::from_secs(5));
    assert_eq!(not_before_ms, 55_001, "1 ms past now + pause: never early");
    assert_eq!(
        record,
        HoldRecord {
            task: "index".into(),
            reason: "circuit_open".into(),
            held_since_ms: 50_000,
            original_exchange: "fleet.work".into(),
            original_routing_key: "index".into(),
            original_queue: "fleet.work".into(),
        }
    );
    let Outcome::Hold { record, .. } =
        Outcome::hold(&t, &first, "circuit_open", Duration::from_secs(1), Some(7))
    else {
        panic!("a hold");
    };
    assert_eq!(record.held_since_ms, 7, "the first hold's time is kept");
}

#[test]
fn a_zero_delay_still_goes_through_a_tier() {
    let Outcome::Retry { tier, record } =
        Outcome::of_decision(&topology(), &job(), &failure(), &retry(Duration::ZERO))
    else {
        panic!("a retry");
    };
    assert_eq!(tier.delay, Duration::from_secs(1));
    assert_eq!(record.not_before_ms, None);
}

#[test]
fn a_retry_longer_than_every_tier_waits_in_the_longest_until_its_time() {
    let Outcome::Retry { tier, record } = Outcome::of_decision(
        &topology(),
        &JobContext {
            first_failure_ms: None,
            ..job()
        },
        &failure(),
        &retry(Duration::from_secs(60)),
    ) else {
        panic!("a retry");
    };
    assert_eq!(tier.delay, Duration::from_secs(5));
    assert_eq!(record.not_before_ms, Some(50_000 + 60_000 + 1));
    assert_eq!(record.first_failure_ms, 50_000, "this failure is the first");
}

#[test]
fn without_tiers_a_granted_retry_is_requeued() {
    let bare = Topology {
        retry_tiers: Vec::new(),
        ..topology()
    };
    assert_eq!(
        Outcome::of_decision(&bare, &job(), &failure(), &retry(Duration::from_secs(1))),
        Outcome::Requeue
    );
}

#[test]
fn a_refused_retry_is_dead_lettered_with_the_budget_that_refused() {
    let snapshot = BudgetSnapshot {
        allowance: 10,
        window_ms: 60_000,
        window_index: 7,
        ..BudgetSnapshot::default()
    };
    let decision = Decision::DeadLetter {
        dependency: Dependency::new("search").unwrap(),
        reason: DeadLetterReason::BudgetExhausted,
        snapshot: Some(snapshot),
        source: BudgetSource::LocalFallback,
    };
    let Outcome::DeadLetter(record) =
        Outcome::of_decision(&topology(), &job(), &failure(), &decision)
    else {
        panic!("a dead-letter");
    };
    assert_eq!(
        record,
        DeadLetterRecord {
            task: "index".into(),
            dependency: "search".into(),
            reason: DeadLetterReason::BudgetExhausted,
            original_exchange: "fleet.work".into(),
            original_routing_key: "index".into(),
            original_queue: "fleet.work".into(),
            attempts: 2,
            first_failure_ms: 1_000,
            dead_lettered_ms: 50_000,
            error_class: "http_503".into(),
            error: "503".into(),
            budget: Some(BudgetHeaders::from(&snapshot)),
            budget_source: Some(BudgetSource::LocalFallback),
            replays: 1,
        }
    );
}

#[test]
fn a_not_before_past_max_delay_is_dead_lettered_delay_exceeded() {
    let Outcome::DeadLetter(record) = Outcome::not_before_too_far(
        &job(),
        50_000 + 86_400_000,
        Duration::from_secs(1024),
        Some("search"),
    ) else {
        panic!("a dead-letter");
    };
    assert_eq!(record.reason, DeadLetterReason::DelayExceeded);
    assert_eq!(record.error_class, "not_before");
    assert!(
        record.error.contains("86400000 ms away"),
        "{}",
        record.error
    );
    assert!(record.error.contains("1024000 ms"), "{}", record.error);
    assert_eq!(record.dependency, "search");
    assert_eq!(record.budget_source, Some(BudgetSource::NotConsulted));
}

#[test]
fn refusals_before_the_budget_say_it_was_not_consulted() {
    let Outcome::DeadLetter(record) =
        Outcome::malformed_headers(&job(), &HeaderError::missing("fb-attempt"), None)
    else {
        panic!("a dead-letter");
    };
    assert_eq!(
        (
            record.reason,
            record.error_class.as_str(),
            record.dependency.as_str()
        ),
        (DeadLetterReason::NonRetryable, "malformed_header", "")
    );
    assert_eq!(record.budget_source, Some(BudgetSource::NotConsulted));
    assert_eq!(record.budget, None);
}
