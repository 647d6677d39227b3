// Over ~500 lines on purpose: one mechanism's tests against one private server, named in
// docs/BENCHMARKS.md and docs/semantics.md; submodules would rename them.
//! Group commit of withdrawals against a private `redis-server`: batches decide exactly what
//! one call per decision would, a batch cut by the deadline is counted once (never lost from
//! Redis's count, never sent again), the lane goes on after it, and a batch is led by the caller
//! with the most time left, so the later callers of a busy period are not cut by an older one's
//! deadline.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;
use std::time::Duration;

use fleet_budget::store::{BudgetStore, Deposits, RedisStore, RedisTarget, Withdrawal};
use fleet_budget::testing::{RedisServer, eventually};
use fleet_budget::{BudgetPolicy, Dependency, DepositBasis, StoreError, WindowMode};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

fn policy() -> BudgetPolicy {
    BudgetPolicy {
        window: Duration::from_secs(60),
        ratio: 0.2,
        min_allowance: 10,
        deposit: DepositBasis::Success,
        mode: WindowMode::Sliding,
    }
}

/// The deadline of the store whose calls the test cuts: seconds, so that the scene's ordering
/// (who joins the lane before whose deadline) holds through the scheduling stalls of a loaded
/// machine, and the calls meant to be answered are never cut by one.
const CUT_DEADLINE: Duration = Duration::from_secs(2);

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
    let s = store(&server, CUT_DEADLINE);
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

    // The server is frozen until the scene is over: the lone decision goes out and waits; the 31
    // that join meanwhile queue behind it. When the first one's deadline passes, the lane goes to
    // the next, which sends the other 30 with its own as one batch: also held, also cut.
    server.freeze();
    let first = {
        let (s, d) = (Arc::clone(&s), d.clone());
        tokio::spawn(async move { s.withdraw(&d, &p).await })
    };
    while s.group_commit_stats().calls == warm.calls {
        tokio::task::yield_now().await;
    }
    // Later deadlines than the first's, by half of it: when the first's passes, the next in line
    // takes the lead long before its own (ordering of the scene, not a condition checked).
    tokio::time::sleep(CUT_DEADLINE / 2).await;
    // One poll each: all 31 join the queue now, at once, while the first is still in flight.
    let mut rest: Vec<_> = (0..31).map(|_| s.withdraw(&d, &p)).collect();
    std::future::poll_fn(|cx| {
        for call in &mut rest {
            assert!(
                call.as_mut().poll(cx).is_pending(),
                "a frozen server answered"
            );
        }
        std::task::Poll::Ready(())
    })
    .await;
    let (first, rest) = tokio::join!(first, futures::future::join_all(rest));
    let mut answered = 0u64;
    for answer in std::iter::once(first.unwrap()).chain(rest) {
        match answer {
            Ok(_) => answered += 1,
            Err(e) => assert!(e.is_timeout(), "{e}"),
        }
    }
    assert_eq!(answered, 0, "nothing was answered by a frozen server");
    let cut = s.group_commit_stats();
    assert_eq!(cut.decisions - warm.decisions, 32);
    assert_eq!(
        cut.calls - warm.calls,
        2,
        "the lone call, then one batch of 31"
    );

    // The held commands run when the server is thawed: each decision sent is counted once, none
    // lost (the server got them) and none twice (nothing was sent again).
    server.thaw();
    let sent = 3 + cut.decisions - warm.decisions;
    eventually(
        "the held calls run when the server is thawed",
        Duration::from_secs(30),
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

/// The deadline of the store in the busy-period scene, cut in thirds: each step of the scene is a
/// third of it (a second) away from the deadline it must come before or after, so that the
/// ordering holds through the scheduling stalls of a loaded machine.
const BUSY_DEADLINE: Duration = Duration::from_secs(3);

/// Starts `n` withdrawals for `d` on one task, each polled once, at once: when this returns all
/// have joined the queue behind the call in flight (in order). The task then awaits their
/// answers, in the same order.
async fn queue_behind(
    s: &Arc<RedisStore>,
    d: &Dependency,
    p: BudgetPolicy,
    n: usize,
) -> JoinHandle<Vec<Result<Withdrawal, StoreError>>> {
    let (s, d) = (Arc::clone(s), d.clone());
    let (joined_tx, joined) = oneshot::channel();
    let task = tokio::spawn(async move {
        let mut calls: Vec<_> = (0..n).map(|_| s.withdraw(&d, &p)).collect();
        std::future::poll_fn(|cx| {
            for call in &mut calls {
                assert!(
                    call.as_mut().poll(cx).is_pending(),
                    "a frozen server answered"
                );
            }
            std::task::Poll::Ready(())
        })
        .await;
        joined_tx.send(()).unwrap();
        futures::future::join_all(calls).await
    });
    joined.await.unwrap();
    task
}

/// Under sustained load a batch goes out when the call before it ends, late in the wait of its
/// oldest callers. It is led by the caller with the most time left (the latest to arrive), and
/// the call is bounded by the leader's deadline: so the callers that came later in the busy
/// period are answered by Redis, although the older ones of the same batch ran out of time (led
/// by the oldest, the call was cut at its deadline and all 20 got a timeout). Every decision is
/// counted once, in the order they came.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn later_decisions_of_a_busy_period_are_answered_not_cut_by_an_older_deadline() {
    let server = RedisServer::start();
    let s = store(&server, BUSY_DEADLINE);
    let patient = store(&server, Duration::from_secs(10));
    let (d, p) = (Dependency::new("busy").unwrap(), policy());
    away_from_the_roll(&patient, &d, &p).await;
    // Allowance 20 (0.2 × 100): it runs out within the batch, so each answer shows its place.
    patient
        .deposit(
            &d,
            &p,
            Deposits {
                successes: 100,
                first_attempts: 0,
            },
        )
        .await
        .unwrap();
    // Both scripts loaded first (a cut EVALSHA that meets NOSCRIPT is never retried): 3 retries.
    s.withdraw_many(&d, &p, 2).await.unwrap();
    s.withdraw(&d, &p).await.unwrap();
    let warm = s.group_commit_stats();

    // In thirds of the deadline, the server frozen until the older callers have run out of time:
    // a lone decision goes out at 0 and is cut at 3/3; 10 older callers queue at 1/3 (they give
    // up at 4/3), 10 later ones at 2/3 (they give up at 5/3). At 3/3 the 20 go as one batch.
    let third = BUSY_DEADLINE / 3;
    server.freeze();
    let first = {
        let (s, d) = (Arc::clone(&s), d.clone());
        tokio::spawn(async move { s.withdraw(&d, &p).await })
    };
    while s.group_commit_stats().calls == warm.calls {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(third).await;
    let older = queue_behind(&s, &d, p, 10).await;
    tokio::time::sleep(third).await;
    let later = queue_behind(&s, &d, p, 10).await;
    let e = first.await.unwrap().unwrap_err();
    assert!(e.is_timeout(), "the first call is cut: {e}");
    for answer in older.await.unwrap() {
        let e = answer.unwrap_err();
        assert!(e.is_timeout(), "the older callers ran out of time: {e}");
    }
    let cut = s.group_commit_stats();
    assert_eq!(
        (cut.calls - warm.calls, cut.decisions - warm.decisions),
        (2, 21),
        "the lone call, then one batch of all 20"
    );

    // Thawed at 4/3: the batch's call is still in flight (its leader has until 5/3), and Redis
    // answers the later callers, after the first's call and the older ten: 4 to 14 retries
    // counted before them, then 6 granted up to the allowance of 20, then 4 denied.
    server.thaw();
    let later: Vec<Withdrawal> = later
        .await
        .unwrap()
        .into_iter()
        .map(|answer| answer.expect("a later caller is answered by Redis"))
        .collect();
    let seen: Vec<(bool, u64, u64)> = later
        .iter()
        .map(|w| {
            (
                w.granted,
                w.snapshot.current.retries,
                w.snapshot.current.denied,
            )
        })
        .collect();
    let want: Vec<(bool, u64, u64)> = (0..10u64)
        .map(|i| (i < 6, (15 + i).min(20), i.saturating_sub(5)))
        .collect();
    assert_eq!(
        seen, want,
        "each answered in its place, in the order they came"
    );
    // Counted once each: the 3, the first, the older 10 (their callers got the fallback's
    // answer; they reached Redis, as a cut call does) and the later 10 as answered.
    let snap = patient.status(&d, &p).await.unwrap();
    assert_eq!(
        (snap.current.retries, snap.current.denied),
        (20, 4),
        "{snap:?}"
    );
    assert_eq!(s.group_commit_stats().decisions - warm.decisions, 21);

    // The group was handed on: a decision after the scene is answered (denied: all spent).
    let next = s.withdraw(&d, &p).await.unwrap();
    assert!(!next.granted);
    assert_eq!(next.snapshot.current.denied, 5);
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

/// Deposits 1000 successes on each of `deps` (allowance 200 each under [`policy`]).
async fn fund(s: &RedisStore, deps: &[Dependency], p: &BudgetPolicy) {
    for d in deps {
        s.deposit(
            d,
            p,
            Deposits {
                successes: 1000,
                first_attempts: 0,
            },
        )
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn decisions_for_many_dependencies_share_calls_and_each_budget_is_exact() {
    let server = RedisServer::start();
    let s = store(&server, Duration::from_secs(5));
    let p = policy();
    let deps: Vec<Dependency> = (0..4)
        .map(|i| Dependency::new(&format!("shared-{i}")).unwrap())
        .collect();
    away_from_the_roll(&s, &deps[0], &p).await;
    fund(&s, &deps, &p).await;
    let before = s.group_commit_stats();
    let mut tasks = Vec::new();
    for t in 0..32usize {
        let (s, deps) = (Arc::clone(&s), deps.clone());
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for i in 0..25usize {
                let which = (t + i) % deps.len();
                answers.push((which, s.withdraw(&deps[which], &p).await.unwrap()));
            }
            answers
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.unwrap());
    }
    let stats = s.group_commit_stats();
    let (calls, decisions, budgets) = (
        stats.calls - before.calls,
        stats.decisions - before.decisions,
        stats.budgets - before.budgets,
    );
    assert_eq!(decisions, 800, "every decision sent once");
    assert!(
        budgets > calls,
        "calls held several dependencies: {budgets} budgets in {calls} calls"
    );
    for (which, d) in deps.iter().enumerate() {
        let mine: Vec<_> = answers.iter().filter(|(w, _)| *w == which).collect();
        assert_eq!(mine.len(), 200);
        let granted = mine.iter().filter(|(_, w)| w.granted).count();
        assert_eq!(granted, 200, "{d}: allowance 200, 200 asked");
        let mut seen: Vec<_> = mine
            .iter()
            .map(|(_, w)| (w.snapshot.current.retries, w.snapshot.current.denied))
            .collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen.len(),
            200,
            "{d}: no two decisions saw the same counters"
        );
    }
    // Past the allowance: 40 more per dependency, all denied and counted as denials.
    let mut tasks = Vec::new();
    for t in 0..32usize {
        let (s, deps) = (Arc::clone(&s), deps.clone());
        tasks.push(tokio::spawn(async move {
            let mut granted = 0;
            for i in 0..5usize {
                granted += usize::from(s.withdraw(&deps[(t + i) % 4], &p).await.unwrap().granted);
            }
            granted
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), 0);
    }
    for d in &deps {
        let snap = s.status(d, &p).await.unwrap();
        assert_eq!(
            (snap.current.retries, snap.current.denied),
            (200, 40),
            "{d}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_over_many_dependencies_cut_by_the_deadline_neither_loses_nor_double_counts() {
    let server = RedisServer::start();
    let s = store(&server, CUT_DEADLINE);
    let patient = store(&server, Duration::from_secs(10));
    let p = policy();
    let deps: Vec<Dependency> = (0..8)
        .map(|i| Dependency::new(&format!("cut-many-{i}")).unwrap())
        .collect();
    away_from_the_roll(&patient, &deps[0], &p).await;
    fund(&patient, &deps, &p).await;
    // The three scripts loaded first (a call cut while its EVALSHA meets NOSCRIPT is never
    // retried): one decision on each of deps 0 and 1, and one more on dep 0.
    let warmed = s
        .withdraw_batch(&[(&deps[0], &p, 1), (&deps[1], &p, 1)])
        .await
        .unwrap();
    assert!(warmed.iter().all(Result::is_ok), "{warmed:?}");
    s.withdraw_many(&deps[0], &p, 1).await.unwrap();
    s.withdraw(&deps[0], &p).await.unwrap();
    let mut expected = vec![0u64; deps.len()];
    expected[0] = 3;
    expected[1] = 1;
    let warm = s.group_commit_stats();

    // The server is frozen until the scene is over: the lone decision (dep 0) goes out and
    // waits; the 31 that join meanwhile, over all 8 dependencies, queue behind it. When the first
    // one's deadline passes, the group goes to the next, which sends the other 30 with its own as
    // one spend_batch.lua call over the 8 keys: also held, also cut.
    server.freeze();
    let first = {
        let (s, d) = (Arc::clone(&s), deps[0].clone());
        tokio::spawn(async move { s.withdraw(&d, &p).await })
    };
    expected[0] += 1;
    while s.group_commit_stats().calls == warm.calls {
        tokio::task::yield_now().await;
    }
    // Later deadlines than the first's, by half of it (ordering of the scene, not a condition
    // checked); then one poll each: all 31 join the queue at once, while the first is in flight.
    tokio::time::sleep(CUT_DEADLINE / 2).await;
    let mut rest: Vec<_> = (0..31usize)
        .map(|i| {
            let which = (i + 1) % deps.len();
            expected[which] += 1;
            s.withdraw(&deps[which], &p)
        })
        .collect();
    std::future::poll_fn(|cx| {
        for call in &mut rest {
            assert!(
                call.as_mut().poll(cx).is_pending(),
                "a frozen server answered"
            );
        }
        std::task::Poll::Ready(())
    })
    .await;
    let (first, rest) = tokio::join!(first, futures::future::join_all(rest));
    for answer in std::iter::once(first.unwrap()).chain(rest) {
        let e = answer.unwrap_err();
        assert!(
            e.is_timeout(),
            "nothing is answered by a frozen server: {e}"
        );
    }
    let cut = s.group_commit_stats();
    assert_eq!(cut.decisions - warm.decisions, 32);
    assert_eq!(
        (cut.calls - warm.calls, cut.budgets - warm.budgets),
        (2, 9),
        "the lone call, then one batch of 31 over the 8 dependencies"
    );

    // The held commands run when the server is thawed: each decision sent is counted once on its
    // own budget, none lost (the server got them) and none twice (nothing was sent again).
    server.thaw();
    let counted = async || {
        let mut counts = Vec::new();
        for d in &deps {
            let snap = patient.status(d, &p).await.unwrap();
            counts.push((snap.current.retries, snap.current.denied));
        }
        counts
    };
    eventually(
        "the held calls run when the server is thawed",
        Duration::from_secs(30),
        async || {
            let counts = counted().await;
            counts.iter().map(|(r, d)| r + d).sum::<u64>() >= expected.iter().sum::<u64>()
        },
    )
    .await;
    let want: Vec<(u64, u64)> = expected.iter().map(|n| (*n, 0)).collect();
    assert_eq!(
        counted().await,
        want,
        "allowance 200 each: every decision granted, once"
    );

    // The group was handed on: decisions after the cut are answered, and batched again.
    let mut tasks = Vec::new();
    for i in 0..32usize {
        let which = i % deps.len();
        expected[which] += 1;
        let (s, d) = (Arc::clone(&s), deps[which].clone());
        tasks.push(tokio::spawn(
            async move { s.withdraw(&d, &p).await.unwrap() },
        ));
    }
    for task in tasks {
        assert!(task.await.unwrap().granted);
    }
    let want: Vec<(u64, u64)> = expected.iter().map(|n| (*n, 0)).collect();
    assert_eq!(counted().await, want);
    assert_eq!(s.group_commit_stats().decisions - warm.decisions, 64);
}

#[tokio::test]
async fn a_refused_budget_in_a_batch_does_not_stop_the_others() {
    let server = RedisServer::start();
    let s = store(&server, Duration::from_secs(5));
    let p = policy();
    let (good, bad) = (
        Dependency::new("good").unwrap(),
        Dependency::new("tampered").unwrap(),
    );
    let _: String = server.cmd(&["SET", &s.key(&bad), "not a hash"]);
    let replies = s
        .withdraw_batch(&[(&good, &p, 2), (&bad, &p, 3), (&good, &p, 1)])
        .await
        .unwrap();
    let [first, refused, again] = &replies[..] else {
        panic!("{replies:?}");
    };
    assert_eq!(first.as_ref().unwrap().len(), 2);
    assert_eq!(again.as_ref().unwrap()[0].snapshot.current.retries, 3);
    let e = refused.as_ref().unwrap_err();
    assert!(
        e.to_string().contains("is not a budget hash"),
        "the refusal names the key: {e}"
    );
    let kind: String = server.cmd(&["TYPE", &s.key(&bad)]);
    assert_eq!(kind, "string", "the refused budget was not written");
    let snap = s.status(&good, &p).await.unwrap();
    assert_eq!(snap.current.retries, 3, "the others were decided, once");
    for n in [0, 10_001] {
        let replies = s
            .withdraw_batch(&[(&good, &p, n), (&bad, &p, 1)])
            .await
            .unwrap();
        let e = replies[0].as_ref().unwrap_err();
        assert!(e.to_string().contains("ARGV[2] n must be"), "{e}");
    }
    assert!(s.withdraw_batch(&[]).await.is_err(), "no budget: refused");
}

/// `redis.batch_across_dependencies = false` (for a URL that is a sharding proxy) reaches the
/// store built from the configuration: batches stay per dependency, every call holds one
/// dependency's decisions, and every decision is sent once. With the default the same load puts
/// several dependencies in one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_can_keep_batches_to_one_dependency() {
    let server = RedisServer::start();
    let p = policy();
    let deps: Vec<Dependency> = (0..4)
        .map(|i| Dependency::new(&format!("apart-{i}")).unwrap())
        .collect();
    for (across, prefix) in [(false, "fbq"), (true, "fbr")] {
        let text = format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\ntimeout_ms = 5000\nbatch_across_dependencies = {across}\n",
            server.url()
        );
        let config = fleet_budget::Config::from_toml(&text, "t").unwrap();
        let s = Arc::new(RedisStore::from_settings(&config.redis).unwrap());
        fund(&s, &deps, &p).await;
        let before = s.group_commit_stats();
        let mut tasks = Vec::new();
        for t in 0..32usize {
            let (s, deps) = (Arc::clone(&s), deps.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..25usize {
                    s.withdraw(&deps[(t + i) % deps.len()], &p).await.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let stats = s.group_commit_stats();
        let (calls, decisions, budgets) = (
            stats.calls - before.calls,
            stats.decisions - before.decisions,
            stats.budgets - before.budgets,
        );
        assert_eq!(
            decisions, 800,
            "across = {across}: every decision sent once"
        );
        if across {
            assert!(budgets > calls, "{budgets} budgets in {calls} calls");
        } else {
            assert_eq!(budgets, calls, "one dependency per call");
        }
    }
}
