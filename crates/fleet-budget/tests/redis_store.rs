// Over ~500 lines on purpose: the Redis store's tests on private servers, named in docs/semantics.md;
// submodules would rename them.
//! The Redis store against real, private `redis-server` processes (never the shared 6379).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    missing_docs
)]

use std::sync::Arc;
use std::time::Duration;

use fleet_budget::clock::ManualClock;
use fleet_budget::store::{BudgetStore, Deposits, LocalStore, RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{BudgetPolicy, Dependency, DepositBasis, WindowMode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn store(server: &RedisServer) -> RedisStore {
    // Generous deadline: these tests check behaviour, not latency, on a noisy machine.
    RedisStore::new(
        RedisTarget::Single(server.url()),
        "fbt",
        Duration::from_secs(5),
    )
    .unwrap()
}

fn dep(name: &str) -> Dependency {
    Dependency::new(name).unwrap()
}

fn policy(window_ms: u64, ratio: f64, min: u64, mode: WindowMode) -> BudgetPolicy {
    BudgetPolicy {
        window: Duration::from_millis(window_ms),
        ratio,
        min_allowance: min,
        deposit: DepositBasis::Success,
        mode,
    }
}

/// Waits (real time: Redis keeps server time) until a window of `window_ms` has just begun.
async fn wait_for_window_start(s: &RedisStore, d: &Dependency, p: &BudgetPolicy) {
    let snap = s.status(d, p).await.unwrap();
    tokio::time::sleep(Duration::from_millis(snap.ms_until_roll() + 15)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn atomicity_64_tasks_over_4_connections_grant_exactly_the_allowance() {
    let server = RedisServer::start();
    let stores: Vec<Arc<RedisStore>> = (0..4).map(|_| Arc::new(store(&server))).collect();
    let d = dep("search");
    let p = policy(60_000, 0.2, 10, WindowMode::Sliding);
    // Avoid a window boundary in the middle of the test.
    let first = stores[0].status(&d, &p).await.unwrap();
    if first.ms_until_roll() < 10_000 {
        tokio::time::sleep(Duration::from_millis(first.ms_until_roll() + 20)).await;
    }
    stores[0]
        .deposit(
            &d,
            &p,
            Deposits {
                successes: 500,
                first_attempts: 0,
            },
        )
        .await
        .unwrap();
    let allowance = 100u64; // floor(0.2 × 500)
    let per_task = 5u64;
    let tasks = 64u64;
    let demand = tasks * per_task; // 320 > allowance
    let mut handles = Vec::new();
    for t in 0..tasks {
        let s = Arc::clone(&stores[usize::try_from(t % 4).unwrap()]);
        let (d, p) = (d.clone(), p);
        handles.push(tokio::spawn(async move {
            let mut granted = 0u64;
            for _ in 0..per_task {
                let w = s.withdraw(&d, &p).await.unwrap();
                assert!(w.snapshot.current.retries <= w.snapshot.allowance);
                granted += u64::from(w.granted);
            }
            granted
        }));
    }
    let mut granted = 0;
    for h in handles {
        granted += h.await.unwrap();
    }
    assert_eq!(granted, demand.min(allowance));
    let snap = stores[1].status(&d, &p).await.unwrap();
    assert_eq!(snap.current.retries, granted, "every grant is counted");
    assert_eq!(
        snap.current.denied,
        demand - granted,
        "every denial is counted, never as a retry"
    );
    assert_eq!(snap.current.successes, 500);
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Deposit(u64, u64),
    Spend,
    /// `n` withdrawals in one `spend_many.lua` call (group commit's batch).
    SpendMany(u64),
    /// One `spend_batch.lua` call (group commit over several dependencies): `n` withdrawals,
    /// then one of another dependency, then `n / 2 + 1` more of the first (a key twice).
    SpendBatch(u64),
    Status,
    Sleep(u64),
}

#[tokio::test]
async fn redis_and_local_stores_agree_on_random_sequences() {
    let server = RedisServer::start();
    let redis = store(&server);
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    for case in 0..6 {
        let d = dep(&format!("equiv-{case}"));
        let other = dep(&format!("equiv-{case}-other"));
        let mode = if case % 2 == 0 {
            WindowMode::Sliding
        } else {
            WindowMode::Fixed
        };
        let mut p = policy(
            1000,
            rng.random_range(0.0..0.8),
            rng.random_range(0..6),
            mode,
        );
        if case % 3 == 2 {
            p.deposit = DepositBasis::Request;
        }
        let clock = ManualClock::new(0);
        let local = LocalStore::with_clock(Arc::new(clock.clone()));
        let mut crossed = 0;
        let mut last_index = None;
        for step in 0..70 {
            let op = match rng.random_range(0..10) {
                0..=2 => Op::Deposit(rng.random_range(0..30), rng.random_range(0..30)),
                3..=5 => Op::Spend,
                // Every other step's batch is a spend_batch.lua call (the random sequence is the
                // one drawn before that script existed).
                6 if step % 2 == 0 => Op::SpendMany(rng.random_range(1..12)),
                6 => Op::SpendBatch(rng.random_range(1..12)),
                7 => Op::Status,
                _ => Op::Sleep(rng.random_range(50..400)),
            };
            // Redis decides first; its snapshot says the server time it used, which the local
            // store is then given: the same operation at the same instant must agree exactly.
            let (redis_granted, redis_snap) = match op {
                Op::Sleep(ms) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    continue;
                }
                Op::SpendMany(n) => {
                    // The batch answers each request as n spends in a row at its instant would.
                    let batch = redis.withdraw_many(&d, &p, n).await.unwrap();
                    assert_eq!(batch.len() as u64, n);
                    let at = batch[0].snapshot;
                    clock.set_ms(at.window_index * at.window_ms + at.elapsed_ms);
                    for (k, w) in batch.iter().enumerate() {
                        let l = local.withdraw_now(&d, &p);
                        assert_eq!(w, &l, "case {case} step {step} {op:?} request {k}");
                    }
                    if last_index.is_some_and(|i| i != at.window_index) {
                        crossed += 1;
                    }
                    last_index = Some(at.window_index);
                    continue;
                }
                Op::SpendBatch(n) => {
                    // Each budget's answers are its spends in order at the call's instant, the
                    // first key's two entries one after the other.
                    let second = n / 2 + 1;
                    let batch = redis
                        .withdraw_batch(&[(&d, &p, n), (&other, &p, 1), (&d, &p, second)])
                        .await
                        .unwrap();
                    let [first, others, again] = &batch[..] else {
                        panic!("three entries, three answers: {batch:?}");
                    };
                    let (first, others, again) = (
                        first.as_ref().unwrap(),
                        others.as_ref().unwrap(),
                        again.as_ref().unwrap(),
                    );
                    assert_eq!(
                        (first.len() as u64, others.len(), again.len() as u64),
                        (n, 1, second)
                    );
                    let at = first[0].snapshot;
                    clock.set_ms(at.window_index * at.window_ms + at.elapsed_ms);
                    for (k, w) in first.iter().enumerate() {
                        let l = local.withdraw_now(&d, &p);
                        assert_eq!(
                            w, &l,
                            "case {case} step {step} {op:?} first entry, request {k}"
                        );
                    }
                    assert_eq!(
                        others[0],
                        local.withdraw_now(&other, &p),
                        "case {case} step {step} {op:?} other dependency"
                    );
                    for (k, w) in again.iter().enumerate() {
                        let l = local.withdraw_now(&d, &p);
                        assert_eq!(
                            w, &l,
                            "case {case} step {step} {op:?} third entry, request {k}"
                        );
                    }
                    if last_index.is_some_and(|i| i != at.window_index) {
                        crossed += 1;
                    }
                    last_index = Some(at.window_index);
                    continue;
                }
                Op::Deposit(s, a) => (
                    None,
                    redis
                        .deposit(
                            &d,
                            &p,
                            Deposits {
                                successes: s,
                                first_attempts: a,
                            },
                        )
                        .await
                        .unwrap(),
                ),
                Op::Spend => {
                    let w = redis.withdraw(&d, &p).await.unwrap();
                    (Some(w.granted), w.snapshot)
                }
                Op::Status => (None, redis.status(&d, &p).await.unwrap()),
            };
            clock.set_ms(redis_snap.window_index * redis_snap.window_ms + redis_snap.elapsed_ms);
            let (local_granted, local_snap) = match op {
                Op::Deposit(s, a) => (
                    None,
                    local.deposit_now(
                        &d,
                        &p,
                        Deposits {
                            successes: s,
                            first_attempts: a,
                        },
                    ),
                ),
                Op::Spend => {
                    let w = local.withdraw_now(&d, &p);
                    (Some(w.granted), w.snapshot)
                }
                Op::Status => (None, local.status_now(&d, &p)),
                Op::Sleep(_) | Op::SpendMany(_) | Op::SpendBatch(_) => unreachable!(),
            };
            assert_eq!(
                redis_granted, local_granted,
                "case {case} step {step} {op:?}"
            );
            assert_eq!(redis_snap, local_snap, "case {case} step {step} {op:?}");
            if last_index.is_some_and(|i| i != redis_snap.window_index) {
                crossed += 1;
            }
            last_index = Some(redis_snap.window_index);
        }
        assert!(
            crossed >= 1,
            "case {case}: the sequence should cross a window boundary"
        );
    }
}

#[tokio::test]
async fn sliding_mode_has_no_cliff_at_the_boundary_and_fixed_mode_does() {
    let server = RedisServer::start();
    let s = store(&server);
    let sliding = policy(2000, 0.2, 10, WindowMode::Sliding);
    let fixed = policy(2000, 0.2, 10, WindowMode::Fixed);
    let d = dep("cliff");
    // One dependency per mode: a key keeps the policy in force of its first caller.
    let df = dep("cliff-fixed");
    wait_for_window_start(&s, &d, &sliding).await;
    s.deposit(
        &df,
        &fixed,
        Deposits {
            successes: 1000,
            first_attempts: 0,
        },
    )
    .await
    .unwrap();
    let before = s
        .deposit(
            &d,
            &sliding,
            Deposits {
                successes: 1000,
                first_attempts: 0,
            },
        )
        .await
        .unwrap();
    assert_eq!(before.allowance, 200);
    assert_eq!(s.status(&df, &fixed).await.unwrap().allowance, 200);
    // Cross into the next window and look right after the boundary.
    tokio::time::sleep(Duration::from_millis(
        s.status(&d, &sliding).await.unwrap().ms_until_roll() + 10,
    ))
    .await;
    let after_sliding = s.status(&d, &sliding).await.unwrap();
    let after_fixed = s.status(&df, &fixed).await.unwrap();
    assert_eq!(after_sliding.window_index, before.window_index + 1);
    assert_eq!(
        after_fixed.allowance, 10,
        "fixed mode falls to the floor at the boundary"
    );
    let expected = (0.2 * 1000.0 * after_sliding.previous_weight_ms as f64 / 2000.0).floor() as u64;
    assert_eq!(after_sliding.allowance, expected.max(10));
    assert!(
        after_sliding.previous_weight_ms > 1000,
        "looked within the first half of the window"
    );
    assert!(
        after_sliding.allowance > 100,
        "sliding mode keeps most of the allowance: {after_sliding:?}"
    );
    // ... and the sliding estimate decays as the previous window slides out.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let later = s.status(&d, &sliding).await.unwrap();
    assert!(later.allowance < after_sliding.allowance, "{later:?}");
}

#[tokio::test]
async fn keys_vanish_after_two_idle_windows() {
    let server = RedisServer::start();
    let s = store(&server);
    let p = policy(1000, 0.2, 10, WindowMode::Sliding);
    let d = dep("idle");
    s.deposit(
        &d,
        &p,
        Deposits {
            successes: 3,
            first_attempts: 1,
        },
    )
    .await
    .unwrap();
    s.withdraw(&d, &p).await.unwrap();
    let key = s.key(&d);
    assert_eq!(key, "fbt:v1:{idle}");
    let ttl: i64 = server.cmd(&["PTTL", &key]);
    assert!(ttl > 0 && ttl <= 2000, "expiry is two windows: {ttl}");
    // The read-only status script never extends the expiry.
    s.status(&d, &p).await.unwrap();
    let ttl_after: i64 = server.cmd(&["PTTL", &key]);
    assert!(ttl_after <= ttl);
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert!(keys.is_empty(), "{keys:?}");
    let dbsize: i64 = server.cmd(&["DBSIZE"]);
    assert_eq!(dbsize, 0);
}

#[tokio::test]
async fn allowance_rebuilds_within_two_windows_after_total_failure() {
    let server = RedisServer::start();
    let s = store(&server);
    let p = policy(1000, 0.2, 5, WindowMode::Sliding);
    let d = dep("recovering");
    wait_for_window_start(&s, &d, &p).await;
    // Total failure: nothing succeeds, retries are held to the floor.
    let mut granted = 0;
    for _ in 0..40 {
        granted += u64::from(s.withdraw(&d, &p).await.unwrap().granted);
    }
    assert_eq!(
        granted, 5,
        "during total failure retries plateau at the floor"
    );
    // The dependency recovers: successes resume in the next window.
    tokio::time::sleep(Duration::from_millis(
        s.status(&d, &p).await.unwrap().ms_until_roll() + 10,
    ))
    .await;
    let resumed = s
        .deposit(
            &d,
            &p,
            Deposits {
                successes: 400,
                first_attempts: 0,
            },
        )
        .await
        .unwrap();
    let resumed_index = resumed.window_index;
    let mut granted = 0;
    for _ in 0..40 {
        granted += u64::from(s.withdraw(&d, &p).await.unwrap().granted);
    }
    let snap = s.status(&d, &p).await.unwrap();
    assert!(
        snap.window_index <= resumed_index + 1,
        "measured within two windows of recovery"
    );
    assert!(
        snap.allowance >= 75,
        "allowance rebuilt from successes: {snap:?}"
    );
    assert_eq!(granted, 40, "retries resume without restarting anything");
}

#[tokio::test]
async fn the_client_clock_plays_no_part() {
    // A worker whose clock is a day and a half behind (libfaketime on a child process, this
    // same test binary) decides against the server; the window it lands in must be the
    // server's. Had the client's clock been used, the index would be off by 129,600 windows.
    let server = RedisServer::start();
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "skewed_client_worker",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("FB_SKEWED_REDIS_URL", server.url())
        .env("LD_PRELOAD", fleet_budget::testing::LIBFAKETIME)
        .env("FAKETIME", "-129600s")
        .env("DONT_FAKE_MONOTONIC", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = stdout
        .split("SKEWED ")
        .nth(1)
        .unwrap_or_else(|| panic!("no report in {stdout}"));
    let fields: Vec<u64> = report
        .split_whitespace()
        .take(2)
        .map(|f| f.parse().unwrap())
        .collect();
    let (child_clock_ms, window_index) = (fields[0], fields[1]);
    let own_ms = fleet_budget::clock::now_ms();
    assert!(
        own_ms > child_clock_ms + 129_000_000,
        "libfaketime must skew the child's clock"
    );
    let time: Vec<String> = server.cmd(&["TIME"]);
    let server_secs: u64 = time[0].parse().unwrap();
    assert!(
        window_index.abs_diff(server_secs) <= 5,
        "index {window_index} follows the server ({server_secs})"
    );
    assert!(
        window_index.abs_diff(child_clock_ms / 1000) > 129_000,
        "index does not follow the child's clock"
    );
    // A worker with a correct clock shares the very same window and counters.
    let p = policy(1000, 0.2, 10, WindowMode::Sliding);
    let w = store(&server).withdraw(&dep("skewed"), &p).await.unwrap();
    assert!(w.snapshot.window_index.abs_diff(window_index) <= 3);
    assert_eq!(w.snapshot.current.retries + w.snapshot.previous.retries, 2);
}

/// The skewed worker of `the_client_clock_plays_no_part`; does nothing when run on its own.
#[tokio::test]
#[ignore = "run as a child process by the_client_clock_plays_no_part"]
async fn skewed_client_worker() {
    let Ok(url) = std::env::var("FB_SKEWED_REDIS_URL") else {
        return;
    };
    let s = RedisStore::new(RedisTarget::Single(url), "fbt", Duration::from_secs(5)).unwrap();
    let p = policy(1000, 0.2, 10, WindowMode::Sliding);
    let w = s.withdraw(&dep("skewed"), &p).await.unwrap();
    let clock_ms = fleet_budget::clock::now_ms();
    println!("SKEWED {clock_ms} {}", w.snapshot.window_index);
}

#[tokio::test]
async fn scripts_recover_after_script_flush() {
    let server = RedisServer::start();
    let s = store(&server);
    let p = policy(60_000, 0.2, 10, WindowMode::Sliding);
    let d = dep("flushed");
    assert!(s.withdraw(&d, &p).await.unwrap().granted);
    let _: String = server.cmd(&["SCRIPT", "FLUSH"]);
    let exists: Vec<i64> = server.cmd(&[
        "SCRIPT",
        "EXISTS",
        fleet_budget::store::SPEND_SCRIPT.get_hash(),
    ]);
    assert_eq!(exists, vec![0]);
    let w = s.withdraw(&d, &p).await.unwrap();
    assert!(w.granted);
    assert_eq!(w.snapshot.current.retries, 2, "counters survive the flush");
    s.deposit(
        &d,
        &p,
        Deposits {
            successes: 1,
            first_attempts: 0,
        },
    )
    .await
    .unwrap();
    let _: String = server.cmd(&["SCRIPT", "FLUSH"]);
    assert_eq!(s.status(&d, &p).await.unwrap().current.successes, 1);
}

#[tokio::test]
async fn scripts_refuse_bad_arguments_with_a_clear_error() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    let script = include_str!("../lua/spend.lua");
    for (args, needle) in [
        (vec!["0", "0.2", "10", "s", "sliding"], "window_ms"),
        (vec!["1000", "nan", "10", "s", "sliding"], "ratio"),
        (vec!["1000", "0.2", "-1", "s", "sliding"], "min_allowance"),
        (vec!["1000", "0.2", "10", "x", "sliding"], "basis"),
        (vec!["1000", "0.2", "10", "s", "weird"], "mode"),
    ] {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script).arg(1).arg("fbt:v1:{bad}");
        for a in &args {
            cmd.arg(*a);
        }
        let err = cmd.query::<redis::Value>(&mut c).unwrap_err();
        assert!(err.to_string().contains(needle), "{args:?}: {err}");
    }
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert!(keys.is_empty(), "a refused call writes nothing");
}

#[tokio::test]
async fn dependencies_are_discovered_from_the_budget_keys_under_the_prefix() {
    let server = RedisServer::start();
    let s = store(&server);
    assert!(s.discover_dependencies().await.unwrap().is_empty());
    let p = policy(60_000, 0.2, 10, WindowMode::Sliding);
    for name in ["search", "mail", "search"] {
        s.withdraw(&dep(name), &p).await.unwrap();
    }
    let other = RedisStore::new(
        RedisTarget::Single(server.url()),
        "other",
        Duration::from_secs(5),
    )
    .unwrap();
    other.withdraw(&dep("billing"), &p).await.unwrap();
    let _: () = server.cmd(&["SET", "fbt:v1:not-a-budget", "x"]);
    let _: () = server.cmd(&["SET", "fbt:v2:{future}", "x"]);
    assert_eq!(
        s.discover_dependencies().await.unwrap(),
        [dep("mail"), dep("search")]
    );
    assert_eq!(
        other.discover_dependencies().await.unwrap(),
        [dep("billing")]
    );
    let mut down = server;
    let url = down.url();
    down.stop();
    let e = s.discover_dependencies().await.unwrap_err();
    assert_eq!(e.node, url);
}

#[tokio::test]
async fn a_corrupted_key_is_an_error_not_a_panic() {
    let server = RedisServer::start();
    let s = store(&server);
    let p = policy(60_000, 0.2, 10, WindowMode::Sliding);
    let d = dep("corrupt");
    let _: () = server.cmd(&["SET", &s.key(&d), "not a hash"]);
    let err = s.withdraw(&d, &p).await.unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
}
