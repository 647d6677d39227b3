//! The policy in force (`lua/README.md`, "The policy in force"): callers that disagree never
//! reset the counters, are served by the policy in force and counted as conflicts; the policy in
//! force changes only once nobody has sent it for one of its windows. Against a private
//! `redis-server`, with short windows (server time: these tests wait for real windows).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::time::Duration;

use fleet_budget::store::{BudgetStore, Deposits, RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{BudgetPolicy, Dependency, DepositBasis, WindowMode};

fn store(server: &RedisServer) -> RedisStore {
    RedisStore::new(
        RedisTarget::Single(server.url()),
        "fbp",
        Duration::from_secs(5),
    )
    .unwrap()
}

fn policy(window_ms: u64, ratio: f64, min: u64) -> BudgetPolicy {
    BudgetPolicy {
        window: Duration::from_millis(window_ms),
        ratio,
        min_allowance: min,
        deposit: DepositBasis::Success,
        mode: WindowMode::Sliding,
    }
}

fn successes(n: u64) -> Deposits {
    Deposits {
        successes: n,
        first_attempts: 0,
    }
}

/// Regression: a caller with another `window_ms` wiped the counters, so two groups alternating
/// during a rolling deploy reset each other and retries were effectively unlimited.
#[tokio::test]
async fn a_caller_with_another_policy_is_served_by_the_one_in_force_and_wipes_nothing() {
    let server = RedisServer::start();
    let s = store(&server);
    let d = Dependency::new("search").unwrap();
    let old = policy(2_000, 0.5, 1);
    let new = policy(1_000, 0.1, 3);
    let first = s.deposit(&d, &old, successes(10)).await.unwrap();
    assert!(!first.control.conflict);
    // The other group, alternating: served by the old policy, its deposits counted in the hash.
    let mut granted = 0;
    for turn in 0..20 {
        let p = if turn % 2 == 0 { &new } else { &old };
        let w = s.withdraw(&d, p).await.unwrap();
        assert_eq!(w.snapshot.control.conflict, p == &new, "turn {turn}");
        assert_eq!(w.snapshot.window_ms, 2_000, "the window in force");
        granted += u64::from(w.granted);
    }
    let seen = s.status(&d, &new).await.unwrap();
    // Whatever the window boundary did, at most the old allowance (5 here, 10 × 0.5) was granted
    // and no call reset anything: every decision is still counted.
    assert!(granted <= 5, "{granted} granted, the allowance is 5");
    let counted =
        seen.current.retries + seen.current.denied + seen.previous.retries + seen.previous.denied;
    assert_eq!(counted, 20, "{seen:?}");
    let conflicts: i64 = server.cmd(&["HGET", "fbp:v1:{search}", "xn"]);
    assert_eq!(conflicts, 10);
    let last: String = server.cmd(&["HGET", "fbp:v1:{search}", "xp"]);
    assert_eq!(last, "1000 0.1 3 s sliding");
}

#[tokio::test]
async fn a_fleet_that_moved_switches_after_one_window_of_the_old_policy_and_carries_counters() {
    let server = RedisServer::start();
    let s = store(&server);
    let d = Dependency::new("mail").unwrap();
    let old = policy(600, 0.5, 0);
    let new = policy(1_500, 0.5, 0);
    // Start at the beginning of an old window, so that the switch below (650 ms on) falls in
    // the next one and the counters still count (two windows on, a roll would clear them).
    let first = s.deposit(&d, &old, successes(40)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(first.ms_until_roll() + 10)).await;
    for _ in 0..4 {
        assert!(s.withdraw(&d, &old).await.unwrap().granted);
    }
    // Everybody runs the new policy now: served by the old one until it has not been heard for
    // one of its windows (600 ms), then the new one is in force.
    let w = s.withdraw(&d, &new).await.unwrap();
    assert!(w.snapshot.control.conflict);
    tokio::time::sleep(Duration::from_millis(650)).await;
    let w = s.withdraw(&d, &new).await.unwrap();
    assert!(!w.snapshot.control.conflict, "{w:?}");
    assert_eq!(w.snapshot.window_ms, 1_500);
    // Counters carried, never more allowance than before: every retry and denial still counting
    // is kept (4 + 1 + this one).
    let all = w.snapshot.current.retries + w.snapshot.current.denied;
    assert!(all >= 2, "{w:?}");
    // And the old policy is now the conflicting one.
    assert!(
        s.withdraw(&d, &old)
            .await
            .unwrap()
            .snapshot
            .control
            .conflict
    );
}

#[tokio::test]
async fn status_never_changes_the_policy_in_force() {
    let server = RedisServer::start();
    let s = store(&server);
    let d = Dependency::new("pay").unwrap();
    s.deposit(&d, &policy(60_000, 0.05, 2), successes(100))
        .await
        .unwrap();
    // `budgetctl status` with the default policy sees the workers' allowance (5), not its own.
    let seen = s.status(&d, &BudgetPolicy::default()).await.unwrap();
    assert_eq!(seen.allowance, 5);
    assert_eq!(seen.current.successes, 100);
    assert!(seen.control.conflict);
    let conflicts: Option<i64> = server.cmd(&["HGET", "fbp:v1:{pay}", "xn"]);
    assert_eq!(conflicts, None, "a read records nothing");
}
