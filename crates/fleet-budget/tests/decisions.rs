//! The worker-facing API on a real, private `redis-server`: the decision order of the contract
//! (non-retryable, then the attempt ceiling, then the budget, then the delay) and the floor.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::time::Duration;

use fleet_budget::testing::RedisServer;
use fleet_budget::{
    BudgetSource, Config, DeadLetterReason, Decision, Dependency, Failure, FleetBudget,
};

fn dep(name: &str) -> Dependency {
    Dependency::new(name).unwrap()
}

fn config(server: &RedisServer, extra: &str) -> Config {
    let text = format!(
        "[redis]\nurl = \"{}\"\ntimeout_ms = 5000\nkey_prefix = \"fbt\"\ndeposit_flush_ms = 0\n{extra}",
        server.url()
    );
    Config::from_toml(&text, "test").unwrap()
}

#[tokio::test]
async fn floor_grants_a_single_failing_job_on_an_idle_dependency() {
    let server = RedisServer::start();
    let budget = FleetBudget::from_config(&config(&server, ""))
        .await
        .unwrap();
    budget.on_attempt("send_sms", 1).await.unwrap();
    let decision = budget
        .on_failure("send_sms", 1, &Failure::retryable("timeout"))
        .await
        .unwrap();
    let Decision::Retry {
        snapshot,
        source,
        next_attempt,
        ..
    } = decision
    else {
        panic!("{decision:?}")
    };
    assert_eq!(source, BudgetSource::Fleet);
    assert_eq!(next_attempt, 2);
    assert_eq!(snapshot.allowance, 10);
    assert_eq!(snapshot.current.retries, 1);
    assert_eq!(snapshot.current.first_attempts, 1);
}

#[tokio::test]
async fn decision_order_non_retryable_then_attempts_then_budget_then_delay() {
    let server = RedisServer::start();
    let budget = FleetBudget::from_config(&config(
        &server,
        "[defaults]\nmin_allowance = 2\nratio = 0.0\n[dependencies.search]\ntasks = [\"index\"]\n[tasks.index]\nmax_attempts = 3\n",
    ))
    .await
    .unwrap();
    let search = dep("search");
    let retries_counted = || async { budget.status(&search).await.0.current };

    let d = budget
        .on_failure("index", 1, &Failure::non_retryable("400 bad request"))
        .await
        .unwrap();
    assert_eq!(d.dead_letter_reason(), Some(DeadLetterReason::NonRetryable));
    let d = budget
        .on_failure("index", 1, &Failure::poison("not json"))
        .await
        .unwrap();
    assert_eq!(d.dead_letter_reason(), Some(DeadLetterReason::NonRetryable));
    let d = budget
        .on_failure("index", 3, &Failure::retryable("503"))
        .await
        .unwrap();
    assert_eq!(
        d.dead_letter_reason(),
        Some(DeadLetterReason::AttemptsExhausted)
    );
    let Decision::DeadLetter {
        source, snapshot, ..
    } = &d
    else {
        panic!("{d:?}")
    };
    assert_eq!(
        (*source, *snapshot),
        (BudgetSource::NotConsulted, None),
        "no budget is asked before step 3"
    );
    let c = retries_counted().await;
    assert_eq!(
        (c.retries, c.denied),
        (0, 0),
        "no budget spent before step 3"
    );

    let d = budget
        .on_failure(
            "index",
            1,
            &Failure::retry_after(Duration::from_secs(42), "429"),
        )
        .await
        .unwrap();
    let Decision::Retry { delay, .. } = d else {
        panic!("{d:?}")
    };
    assert!(
        delay >= Duration::from_secs(42),
        "Retry-After is a lower bound: {delay:?}"
    );
    let d = budget
        .on_failure("reindex_never_mapped", 2, &Failure::retryable("503"))
        .await
        .unwrap();
    let Decision::Retry {
        delay, dependency, ..
    } = d
    else {
        panic!("{d:?}")
    };
    assert_eq!(
        dependency.as_str(),
        "reindex_never_mapped",
        "an unmapped task is its own dependency"
    );
    // The second failure's nominal delay is 2 s × 2 = 4 s; centred jitter draws from [3 s, 5 s].
    assert!(
        delay >= Duration::from_secs(3) && delay <= Duration::from_secs(5),
        "{delay:?}"
    );

    assert!(
        budget
            .on_failure("index", 2, &Failure::retryable("503"))
            .await
            .unwrap()
            .is_retry()
    );
    let d = budget
        .on_failure("index", 1, &Failure::retryable("503"))
        .await
        .unwrap();
    let Decision::DeadLetter {
        reason,
        snapshot: Some(snapshot),
        source,
        ..
    } = d
    else {
        panic!("{d:?}")
    };
    assert_eq!(reason, DeadLetterReason::BudgetExhausted);
    assert_eq!(source, BudgetSource::Fleet);
    assert_eq!(
        (
            snapshot.allowance,
            snapshot.current.retries,
            snapshot.current.denied
        ),
        (2, 2, 1)
    );
    let m = budget.metrics();
    assert_eq!(m.counter("retries_granted", "search"), 2);
    assert_eq!(m.counter("retries_denied", "search"), 1);
    assert_eq!(m.dead_letters("search", DeadLetterReason::NonRetryable), 2);
    assert_eq!(
        m.dead_letters("search", DeadLetterReason::AttemptsExhausted),
        1
    );
    assert_eq!(
        m.dead_letters("search", DeadLetterReason::BudgetExhausted),
        1
    );
    let text = m.render();
    assert!(
        text.contains("fleet_budget_retries_denied_total{dependency=\"search\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("fleet_budget_allowance{dependency=\"search\"} 2"),
        "{text}"
    );
}
