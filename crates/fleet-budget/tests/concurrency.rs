//! The fleet-wide concurrency budget against real Redis: several processes never hold more
//! slots than the cap, a SIGKILLed worker's slots come back within one lease, a retry is
//! answered at once (one call, no waiting), the share and the cap refuse with their own reasons.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fleet_budget::Dependency;
use fleet_budget::concurrency::{ConcurrencyBudget, ConcurrencyPolicy, LeaseKind, Refusal};
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::{RedisServer, eventually};

const CHILD_MODE: &str = "FB_CONCURRENCY_CHILD";
const CHILD_URL: &str = "FB_CONCURRENCY_URL";
const CAP: u64 = 5;
/// The lease of the slots the killed worker holds.
const HOLD_LEASE: Duration = Duration::from_secs(2);

fn budget(url: &str) -> ConcurrencyBudget {
    let store = RedisStore::new(
        RedisTarget::Single(url.to_owned()),
        "fbt",
        Duration::from_secs(2),
    )
    .unwrap();
    ConcurrencyBudget::new(Arc::new(store))
}

fn dep() -> Dependency {
    Dependency::new("paid-api").unwrap()
}

fn policy(lease: Duration, primary_waits: bool) -> ConcurrencyPolicy {
    ConcurrencyPolicy {
        cap: CAP,
        max_retry_fraction: 0.5,
        min_retry_slots: 1,
        lease,
        primary_waits,
        max_wait: Duration::from_secs(60),
    }
    .checked()
    .unwrap()
}

/// Runs this test binary's `child_process` in a new process with `mode`.
fn spawn_child(mode: &str, url: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_MODE, mode)
        .env(CHILD_URL, url)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The body of the worker processes the tests start (run only by them, with its environment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process started by the other tests"]
async fn child_process() {
    let (Ok(mode), Ok(url)) = (std::env::var(CHILD_MODE), std::env::var(CHILD_URL)) else {
        return;
    };
    let b = budget(&url);
    match mode.as_str() {
        // Four tasks take and give back slots, primary and retry alternately, primaries refused
        // at the cap; every grant checks the count the script saw.
        "churn" => {
            let p = policy(Duration::from_secs(30), true);
            let mut tasks = Vec::new();
            for t in 0..4_u32 {
                let b = b.clone();
                tasks.push(tokio::spawn(async move {
                    let mut granted = 0_u32;
                    for i in 0..120_u32 {
                        let kind = if (i + t) % 3 == 0 {
                            LeaseKind::Retry
                        } else {
                            LeaseKind::Primary
                        };
                        let a = b.acquire(&dep(), &p, kind).await.unwrap();
                        if let Ok(lease) = &a.lease {
                            assert!(a.in_flight.primaries + a.in_flight.retries <= CAP, "{a:?}");
                            granted += 1;
                            tokio::task::yield_now().await;
                            b.release(lease).await.unwrap();
                        }
                    }
                    granted
                }));
            }
            let mut granted = 0;
            for t in tasks {
                granted += t.await.unwrap();
            }
            println!("granted {granted}");
        }
        // Takes every slot with a short lease, says so, and waits to be killed.
        "hold" => {
            let p = policy(HOLD_LEASE, true);
            for _ in 0..CAP {
                assert!(
                    b.acquire(&dep(), &p, LeaseKind::Primary)
                        .await
                        .unwrap()
                        .lease
                        .is_ok()
                );
            }
            println!("held");
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        other => panic!("unknown child mode {other}"),
    }
}

#[test]
fn several_processes_never_hold_more_than_the_cap() {
    let server = RedisServer::start();
    let url = server.url();
    let base = fleet_budget::keys::budget_key("fbt", &dep());
    let keys = [format!("{base}:lp"), format!("{base}:lr")];
    let children: Vec<_> = (0..3).map(|_| spawn_child("churn", &url)).collect();
    // Meanwhile, sample both lease sets in one transaction: never above the cap.
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = Arc::clone(&done);
        let mut c = server.connection().unwrap();
        let keys = keys.clone();
        std::thread::spawn(move || {
            let (mut samples, mut peak) = (0_u64, 0_u64);
            while !done.load(Ordering::Relaxed) {
                let (p, r): (u64, u64) = redis::pipe()
                    .atomic()
                    .zcard(&keys[0])
                    .zcard(&keys[1])
                    .query(&mut c)
                    .unwrap();
                assert!(p + r <= CAP, "{p} primaries + {r} retries in flight");
                peak = peak.max(p + r);
                samples += 1;
            }
            (samples, peak)
        })
    };
    let mut granted = 0_u64;
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "a worker process failed: {:?}",
            out.status
        );
        let text = String::from_utf8_lossy(&out.stdout);
        // The harness prints `test child_process ... ` on the same line.
        let n: String = text
            .split("granted ")
            .nth(1)
            .unwrap_or_else(|| panic!("no count in {text}"))
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        granted += n.parse::<u64>().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let (samples, peak) = sampler.join().unwrap();
    // 3 processes × 4 tasks × 120 asks: contention refused some, the cap was reached.
    assert!(granted > 0 && granted < 3 * 4 * 120, "granted {granted}");
    assert!(samples > 0 && peak >= 2, "{samples} samples, peak {peak}");
    // Every lease was given back: nothing left in flight, no key left.
    let left: u64 = server.cmd(&["EXISTS", &keys[0], &keys[1]]);
    assert_eq!(left, 0);
}

#[tokio::test]
async fn a_killed_workers_slots_come_back_within_one_lease() {
    let server = RedisServer::start();
    let url = server.url();
    let b = budget(&url);
    let keys = b.keys(&dep());
    let mut child = spawn_child("hold", &url);
    // The test harness prints its own lines first; keep the pipe open until the kill.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("held") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the worker exited before holding"
        );
    }
    child.kill().unwrap(); // SIGKILL: no release runs.
    child.wait().unwrap();
    drop(out);
    let (secs, micros): (u64, u64) = {
        let t: Vec<String> = server.cmd(&["TIME"]);
        (t[0].parse().unwrap(), t[1].parse().unwrap())
    };
    let killed_at_ms = secs * 1000 + micros / 1000;
    let lease_ms = u64::try_from(HOLD_LEASE.as_millis()).unwrap();
    // Every slot it held expires no later than one lease after the kill...
    let scores: Vec<(String, u64)> = server.cmd(&["ZRANGE", &keys[0], "0", "-1", "WITHSCORES"]);
    assert_eq!(scores.len(), 5, "{scores:?}");
    for (_, expires) in &scores {
        assert!(
            *expires <= killed_at_ms + lease_ms,
            "{expires} > {killed_at_ms} + {lease_ms}"
        );
    }
    // ...and until then they are held: the cap refuses a retry.
    let p = policy(Duration::from_secs(5), true);
    let a = b.acquire(&dep(), &p, LeaseKind::Retry).await.unwrap();
    assert_eq!(a.lease, Err(Refusal::Cap), "{a:?}");
    // Once the server's clock passes them, the slots are free again.
    eventually(
        "the dead worker's slots expire",
        Duration::from_secs(10),
        async || {
            b.acquire(&dep(), &p, LeaseKind::Retry)
                .await
                .unwrap()
                .lease
                .is_ok()
        },
    )
    .await;
}

#[tokio::test]
async fn a_retry_is_answered_at_once_and_says_which_limit_refused() {
    let server = RedisServer::start();
    let b = budget(&server.url());
    let p = policy(Duration::from_secs(30), false);
    // 2 primaries: the share is floor(0.5 × 2) = 1 retry slot.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            b.acquire(&dep(), &p, LeaseKind::Primary)
                .await
                .unwrap()
                .lease
                .unwrap(),
        );
    }
    let r = b.acquire(&dep(), &p, LeaseKind::Retry).await.unwrap();
    assert_eq!(r.retry_slots, 1);
    held.push(r.lease.unwrap());
    let before = server.command_calls();
    let refused = b.acquire(&dep(), &p, LeaseKind::Retry).await.unwrap();
    let after = server.command_calls();
    assert_eq!(refused.lease, Err(Refusal::RetryShare), "{refused:?}");
    assert_eq!(Refusal::RetryShare.reason(), "concurrency_retry_share");
    // One script call answered it: no polling, no second try.
    let evals = |m: &std::collections::BTreeMap<String, u64>| {
        m.get("evalsha").copied().unwrap_or(0) + m.get("eval").copied().unwrap_or(0)
    };
    assert_eq!(evals(&after) - evals(&before), 1, "{before:?} -> {after:?}");
    // Primaries are counted, never refused by the share, even past the cap when they do not wait.
    for _ in 0..4 {
        held.push(
            b.acquire(&dep(), &p, LeaseKind::Primary)
                .await
                .unwrap()
                .lease
                .unwrap(),
        );
    }
    let a = b.acquire(&dep(), &p, LeaseKind::Retry).await.unwrap();
    assert_eq!(a.lease, Err(Refusal::Cap), "{a:?}");
    assert_eq!((a.in_flight.primaries, a.in_flight.retries), (6, 1));
    // Primaries that wait are refused at the cap.
    let mut waits = p;
    waits.primary_waits = true;
    let a = b.acquire(&dep(), &waits, LeaseKind::Primary).await.unwrap();
    assert_eq!(a.lease, Err(Refusal::Cap));
    // Releasing gives the slots back; a second release is harmless.
    for lease in &held {
        b.release(lease).await.unwrap();
    }
    let after = b.release(&held[0]).await.unwrap();
    assert_eq!((after.primaries, after.retries), (0, 0));
}

#[tokio::test]
async fn a_hedge_is_refused_when_the_retry_share_is_spent() {
    let server = RedisServer::start();
    let b = budget(&server.url());
    let p = policy(Duration::from_secs(30), false);
    // 2 primaries: one slot of share; a hedge takes it, and the next hedge and a retry are refused.
    for _ in 0..2 {
        b.acquire(&dep(), &p, LeaseKind::Primary).await.unwrap();
    }
    let h = b.try_hedge(&dep(), &p).await.unwrap();
    let lease = h.lease.unwrap();
    assert_eq!(lease.kind, LeaseKind::Hedge);
    assert!(lease.id.starts_with('h'), "{}", lease.id);
    assert_eq!(h.in_flight.retries, 1);
    let again = b.try_hedge(&dep(), &p).await.unwrap();
    assert_eq!(again.lease, Err(Refusal::RetryShare), "{again:?}");
    let retry = b.acquire(&dep(), &p, LeaseKind::Retry).await.unwrap();
    assert_eq!(retry.lease, Err(Refusal::RetryShare), "{retry:?}");
    // Given back, the share serves a retry again.
    b.release(&lease).await.unwrap();
    assert!(
        b.acquire(&dep(), &p, LeaseKind::Retry)
            .await
            .unwrap()
            .lease
            .is_ok()
    );
}
