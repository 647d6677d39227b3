//! Group commit of withdrawals against a private `redis-server`: batches decide exactly what
//! one call per decision would, a batch cut by the deadline is counted once (never lost from
//! Redis's count, never sent again), and the lane goes on after it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;
use std::time::Duration;

use fleet_budget::store::{BudgetStore, Deposits, RedisStore, RedisTarget};
use fleet_budget::testing::{RedisServer, eventually};
use fleet_budget::{BudgetPolicy, Dependency, DepositBasis, WindowMode};

fn policy() -> BudgetPolicy {
    BudgetPolicy {
        window: Duration::from_secs(60),
        ratio: 0.2,
        min_allowance: 10,
        deposit: DepositBasis::Success,
        mode: WindowMode::Sliding,
    }
}

fn store(server: &RedisServer, timeout: Duration) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::new(RedisTarget::Single(server.url()), "fbg", timeout)
            .unwrap()
            .with_group_commit(Some(64)),
    )
}

/// Waits until at least 20 s remain in the current 60 s window (no roll mid-test).
async fn away_from_the_roll(s: &RedisStore, d: &Dependency, p: &BudgetPolicy) {
    let snap = s.status(d, p).await.unwrap();
    if snap.ms_until_roll() < 20_000 {
        tokio::time::sleep(Duration::from_millis(snap.ms_until_roll() + 20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_withdrawals_are_batched_and_grant_exactly_the_allowance() {
    let server = RedisServer::start();
    let s = store(&server, Duration::from_secs(5));
    let (d, p) = (Dependency::new("batched").unwrap(), policy());
    away_from_the_roll(&s, &d, &p).await;
    s.deposit(
        &d,
        &p,
        Deposits {
            successes: 1000,
            first_attempts: 0,
        },
    )
    .await
    .unwrap();
    let before = s.group_commit_stats();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (s, d) = (Arc::clone(&s), d.clone());
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for _ in 0..20 {
                answers.push(s.withdraw(&d, &p).await.unwrap());
            }
            answers
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.unwrap());
    }
    let stats = s.group_commit_stats();
    let (calls, decisions) = (
        stats.calls - before.calls,
        stats.decisions - before.decisions,
    );
    assert_eq!(decisions, 640, "every decision sent once");
    assert!(
        calls < decisions,
        "32 tasks on one dependency made batches: {calls} calls for {decisions} decisions"
    );
    let granted = answers.iter().filter(|w| w.granted).count() as u64;
    assert_eq!(granted, 200, "floor(0.2 × 1000) granted, no more");
    // Each answer is a state some sequence of single decisions passes through: distinct
    // (retries, denied) pairs, and a grant never above the allowance.
    let mut seen: Vec<_> = answers
        .iter()
        .map(|w| (w.snapshot.current.retries, w.snapshot.current.denied))
        .collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 640, "no two decisions saw the same counters");
    assert!(answers.iter().all(|w| w.snapshot.current.retries <= 200));
    let snap = s.status(&d, &p).await.unwrap();
    assert_eq!(snap.current.retries, 200);
    assert_eq!(snap.current.denied, 440, "denials counted as denials");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_cut_by_the_deadline_neither_loses_nor_double_counts() {
    let server = RedisServer::start();
    let deadline = Duration::from_millis(100);
    let s = store(&server, deadline);
    let patient = store(&server, Duration::from_secs(10));
    let (d, p) = (Dependency::new("cut").unwrap(), policy());
    away_from_the_roll(&patient, &d, &p).await;
    patient
        .deposit(
            &d,
            &p,
            Deposits {
                successes: 1000,
                first_attempts: 0,
            },
        )
        .await
        .unwrap();
    // Both scripts loaded first: a call cut while its EVALSHA meets NOSCRIPT is never retried,
    // so it would not be counted at all (the caller got the fallback's answer either way).
    s.withdraw_many(&d, &p, 2).await.unwrap();
    s.withdraw(&d, &p).await.unwrap();
    let warm = s.group_commit_stats();

    // The server holds every command for 600 ms: the lone decision goes out and waits; the 31
    // that arrive meanwhile queue behind it. When the first one's deadline passes, the lane goes
    // to the next, which sends the other 30 with its own as one batch: also held, also cut.
    let _: String = server.cmd(&["CLIENT", "PAUSE", "600", "ALL"]);
    let first = {
        let (s, d) = (Arc::clone(&s), d.clone());
        tokio::spawn(async move { s.withdraw(&d, &p).await })
    };
    while s.group_commit_stats().calls == warm.calls {
        tokio::task::yield_now().await;
    }
    // Later deadlines than the first's (ordering of the scene, not a condition checked).
    tokio::time::sleep(Duration::from_millis(30)).await;
    let mut rest = Vec::new();
    for _ in 0..31 {
        let (s, d) = (Arc::clone(&s), d.clone());
        rest.push(tokio::spawn(async move { s.withdraw(&d, &p).await }));
    }
    let mut answered = 0u64;
    for task in std::iter::once(first).chain(rest) {
        match task.await.unwrap() {
            Ok(_) => answered += 1,
            Err(e) => assert!(e.is_timeout(), "{e}"),
        }
    }
    assert_eq!(answered, 0, "nothing was answered by a paused server");
    let cut = s.group_commit_stats();
    assert_eq!(cut.decisions - warm.decisions, 32);
    assert_eq!(
        cut.calls - warm.calls,
        2,
        "the lone call, then one batch of 31"
    );

    // The held commands run when the pause ends: each decision sent is counted once, none
    // lost (the server got them) and none twice (nothing was sent again).
    let sent = 3 + cut.decisions - warm.decisions;
    eventually(
        "the held calls run when the pause ends",
        Duration::from_secs(5),
        async || {
            let snap = patient.status(&d, &p).await.unwrap();
            snap.current.retries + snap.current.denied >= sent
        },
    )
    .await;
    let snap = patient.status(&d, &p).await.unwrap();
    assert_eq!(snap.current.retries + snap.current.denied, sent, "{snap:?}");
    assert_eq!(
        snap.current.retries, 35,
        "allowance 200: the 3 and all 32 granted, once"
    );

    // The lane was handed on: decisions after the cut are answered, and batched again.
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (s, d) = (Arc::clone(&s), d.clone());
        tasks.push(tokio::spawn(
            async move { s.withdraw(&d, &p).await.unwrap() },
        ));
    }
    for task in tasks {
        assert!(task.await.unwrap().granted);
    }
    let after = patient.status(&d, &p).await.unwrap();
    assert_eq!(after.current.retries, 67);
    assert_eq!(s.group_commit_stats().decisions - warm.decisions, 64);
}

#[tokio::test]
async fn a_lone_decision_is_one_spend_call_and_a_bad_batch_size_is_refused() {
    let server = RedisServer::start();
    let s = store(&server, Duration::from_secs(5));
    let (d, p) = (Dependency::new("lone").unwrap(), policy());
    for _ in 0..3 {
        s.withdraw(&d, &p).await.unwrap();
    }
    let calls = server.command_calls();
    assert_eq!(s.group_commit_stats().calls, 3);
    assert!(
        calls.get("evalsha").copied().unwrap_or(0) + calls.get("eval").copied().unwrap_or(0) >= 3,
        "{calls:?}"
    );
    for n in [0, 10_001] {
        let e = s.withdraw_many(&d, &p, n).await.unwrap_err();
        assert!(e.to_string().contains("ARGV[2] n must be"), "{e}");
    }
    let snap = s.status(&d, &p).await.unwrap();
    assert_eq!(
        snap.current.retries + snap.current.denied,
        3,
        "refused calls wrote nothing"
    );
}
