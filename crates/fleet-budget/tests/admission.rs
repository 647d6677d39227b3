//! `FleetBudget::admit` with `[dependencies.X.concurrency]` against a real, private
//! `redis-server`: primaries are counted and never refused by the retry share, a retry gets a
//! slot or is dead-lettered at once with the limit that refused it, a waiting primary is held
//! and then dead-lettered after its limit, hedges draw on both budgets and are counted apart,
//! and a dead store lets calls run uncounted.
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
    Admission, BudgetSource, Call, CallOutcome, Config, DeadLetterReason, Decision, Failure,
    FleetBudget, Hold,
};

fn config(url: &str, extra: &str) -> Config {
    let text = format!(
        "[redis]\nurl = \"{url}\"\ntimeout_ms = 2000\nkey_prefix = \"fbt\"\ndeposit_flush_ms = 0\n{extra}"
    );
    Config::from_toml(&text, "test").unwrap()
}

async fn run(budget: &FleetBudget, task: &str, attempt: u32) -> Call {
    match budget.admit(task, attempt, None).await.unwrap() {
        Admission::Run(call) => call,
        other => panic!("attempt {attempt} of {task}: {other:?}"),
    }
}

#[allow(clippy::needless_pass_by_value)] // takes the admission it judges
fn refused(admission: Admission) -> DeadLetterReason {
    let Admission::DeadLetter(Decision::DeadLetter {
        reason,
        source,
        snapshot,
        ..
    }) = admission
    else {
        panic!("a dead-letter, got {admission:?}");
    };
    assert_eq!(source, BudgetSource::Fleet);
    assert_eq!(snapshot, None);
    reason
}

/// cap 4, 2 primaries planned → a retry share of 1.0 × primaries in flight, at least 1 slot.
const PAID: &str = "[dependencies.paid]\ntasks = [\"charge\"]\n\
                    [dependencies.paid.concurrency]\ncap = 4\nplanned_primary = 2\nmin_retry_slots = 1\nmax_retry_fraction = 0.5\n";

#[tokio::test]
async fn a_retry_runs_only_within_the_cap_and_the_share_and_never_waits() {
    let server = RedisServer::start();
    let budget = FleetBudget::from_config(&config(&server.url(), PAID))
        .await
        .unwrap();
    // Two primaries: a retry share of max(1, floor(0.5 × 2)) = 1.
    let p1 = run(&budget, "charge", 1).await;
    let p2 = run(&budget, "charge", 1).await;
    let r1 = run(&budget, "charge", 2).await;
    assert!(r1.lease().is_some());
    assert!((budget.metrics().retry_fraction("paid") - 0.5).abs() < 1e-9);
    assert_eq!(
        refused(budget.admit("charge", 3, None).await.unwrap()),
        DeadLetterReason::ConcurrencyRetryShare
    );
    // Primaries are never refused by the share, and are counted past nothing here: 3 + 1 = cap.
    let p3 = run(&budget, "charge", 1).await;
    assert_eq!(budget.metrics().calls_in_flight("paid", "primary"), 3);
    budget.finish(r1, CallOutcome::Succeeded).await;
    // The share has room again (max(1, floor(1.5)) = 1, no retry in flight), but the cap: 3
    // primaries + 1 more primary = 4.
    let p4 = run(&budget, "charge", 1).await;
    assert_eq!(
        refused(budget.admit("charge", 2, None).await.unwrap()),
        DeadLetterReason::ConcurrencyCap
    );
    assert_eq!(
        budget
            .metrics()
            .dead_letters("paid", DeadLetterReason::ConcurrencyCap),
        1
    );
    // Default policy: a primary past the cap is still counted, never refused.
    let p5 = run(&budget, "charge", 1).await;
    assert_eq!(budget.metrics().calls_in_flight("paid", "primary"), 5);
    for call in [p1, p2, p3, p4, p5] {
        budget.finish(call, CallOutcome::Succeeded).await;
    }
    let lp: u64 = server.cmd(&["ZCARD", "fbt:v1:{paid}:lp"]);
    let lr: u64 = server.cmd(&["ZCARD", "fbt:v1:{paid}:lr"]);
    assert_eq!((lp, lr), (0, 0), "every slot given back");
    // A task without a concurrency section runs without a lease.
    let free = run(&budget, "other", 2).await;
    assert!(free.lease().is_none());
    budget.finish(free, CallOutcome::Succeeded).await;
}

#[tokio::test]
async fn the_rate_budget_and_then_the_slot_each_refuse_with_their_own_reason() {
    let server = RedisServer::start();
    let budget = FleetBudget::from_config(&config(
        &server.url(),
        &format!("[defaults]\nmin_allowance = 1\nratio = 0\n{PAID}"),
    ))
    .await
    .unwrap();
    let failure = Failure::retryable("503");
    // The rate budget grants its one retry (the floor) ...
    let call = run(&budget, "charge", 1).await;
    budget.on_attempt("charge", 1).await.unwrap();
    budget.finish(call, CallOutcome::Succeeded).await;
    let granted = budget.on_failure("charge", 1, &failure).await.unwrap();
    assert!(granted.is_retry(), "{granted:?}");
    // ... but when the retry is to run, the retry share is taken by another retry.
    let other = run(&budget, "charge", 2).await;
    assert_eq!(
        refused(budget.admit("charge", 2, None).await.unwrap()),
        DeadLetterReason::ConcurrencyRetryShare
    );
    budget.finish(other, CallOutcome::Succeeded).await;
    // The next failure finds the rate budget spent: its own reason.
    let denied = budget.on_failure("charge", 1, &failure).await.unwrap();
    assert_eq!(
        denied.dead_letter_reason(),
        Some(DeadLetterReason::BudgetExhausted)
    );
}

#[tokio::test]
async fn a_waiting_primary_is_held_at_the_cap_and_dead_lettered_after_its_limit() {
    let server = RedisServer::start();
    let budget = FleetBudget::from_config(&config(
        &server.url(),
        "[dependencies.paid.concurrency]\ncap = 1\nplanned_primary = 1\nprimary_waits = true\nmax_wait_secs = 30\n",
    ))
    .await
    .unwrap();
    let first = run(&budget, "paid", 1).await;
    let held = budget.admit("paid", 1, None).await.unwrap();
    assert!(
        matches!(held, Admission::Wait(Hold::PrimaryAtCap)),
        "{held:?}"
    );
    let still = budget
        .admit("paid", 1, Some(Duration::from_secs(29)))
        .await
        .unwrap();
    assert!(matches!(still, Admission::Wait(_)), "{still:?}");
    assert_eq!(
        refused(
            budget
                .admit("paid", 1, Some(Duration::from_secs(30)))
                .await
                .unwrap()
        ),
        DeadLetterReason::ConcurrencyCap
    );
    budget.finish(first, CallOutcome::Succeeded).await;
    let next = run(&budget, "paid", 1).await;
    budget.finish(next, CallOutcome::Succeeded).await;
}

#[tokio::test]
async fn a_hedge_draws_on_both_budgets_and_is_counted_apart() {
    let server = RedisServer::start();
    let budget = FleetBudget::from_config(&config(
        &server.url(),
        &format!("[defaults]\nmin_allowance = 1\nratio = 0\n{PAID}"),
    ))
    .await
    .unwrap();
    let primary = run(&budget, "charge", 1).await;
    let hedge = budget.try_hedge("charge").await.unwrap().expect("granted");
    assert!(hedge.lease().unwrap().id.starts_with('h'));
    // The share (1 slot) is held by the hedge: a retry is refused.
    assert_eq!(
        refused(budget.admit("charge", 2, None).await.unwrap()),
        DeadLetterReason::ConcurrencyRetryShare
    );
    budget.finish(hedge, CallOutcome::Succeeded).await;
    // The slot is free, but the rate budget's one retry went to the hedge: refused, and the
    // slot it took is given back at once.
    assert!(budget.try_hedge("charge").await.unwrap().is_none());
    let lr: u64 = server.cmd(&["ZCARD", "fbt:v1:{paid}:lr"]);
    assert_eq!(lr, 0);
    let m = budget.metrics();
    assert_eq!((m.hedges("paid", true), m.hedges("paid", false)), (1, 1));
    assert_eq!(
        m.counter("retries_granted", "paid"),
        0,
        "hedges are not retries"
    );
    budget.finish(primary, CallOutcome::Succeeded).await;
}

#[tokio::test]
async fn without_redis_calls_run_uncounted() {
    let port = fleet_budget::testing::free_port();
    let budget = FleetBudget::from_config(&config(
        &format!("redis://127.0.0.1:{port}"),
        "[dependencies.paid.concurrency]\ncap = 1\nplanned_primary = 1\nprimary_waits = true\n",
    ))
    .await
    .unwrap();
    for attempt in [1, 1, 2, 2] {
        let call = run(&budget, "paid", attempt).await;
        assert!(call.lease().is_none());
        budget.finish(call, CallOutcome::Succeeded).await;
    }
}
