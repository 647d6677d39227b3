//! The fleet-wide circuit breaker against a real, private `redis-server`, from many tasks over
//! several connections at once: exactly one call opens it, exactly the configured number of
//! half-open probes go out fleet-wide, exactly one probe result closes (or reopens) it, late
//! answers of an older state are ignored, lost probes are reissued, and a key of another type is
//! refused. Then through `FleetBudget::admit`: held jobs, `circuit_open` after the limit, probes
//! spent from the rate budget's floor, transitions counted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::breaker::{Breaker, BreakerPolicy, BreakerState, Verdict};
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{
    Admission, BudgetSource, CallOutcome, Config, DeadLetterReason, Decision, Dependency,
    FleetBudget, Hold, StoreError,
};
use tokio::task::JoinSet;

const CONNECTIONS: usize = 8;
const TASKS: usize = 64;

fn dep() -> Dependency {
    Dependency::new("search").unwrap()
}

/// One breaker client per connection.
fn breakers(server: &RedisServer) -> Vec<Breaker> {
    (0..CONNECTIONS)
        .map(|_| {
            let store = RedisStore::new(
                RedisTarget::Single(server.url()),
                "fbt",
                Duration::from_secs(5),
            )
            .unwrap();
            Breaker::new(Arc::new(store))
        })
        .collect()
}

fn policy(open: Duration, probe_timeout: Duration) -> BreakerPolicy {
    BreakerPolicy {
        window: Duration::from_secs(60),
        failure_ratio: 0.5,
        min_volume: 10,
        open,
        half_open_probes: 3,
        close_after: 2,
        probe_timeout,
        max_wait: Duration::from_secs(60),
    }
    .checked()
    .unwrap()
}

/// Runs `f(breaker, i)` for `TASKS` tasks spread over the connections, all at once.
async fn all_at_once<T, F, Fut>(breakers: &[Breaker], f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(Breaker, usize) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let mut set = JoinSet::new();
    for i in 0..TASKS {
        set.spawn(f(breakers[i % breakers.len()].clone(), i));
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        out.push(r.unwrap());
    }
    out
}

/// Waits (polling the server's clock, not asserting on time) until the open period has ended.
async fn until_open_period_ends(b: &Breaker, p: &BreakerPolicy) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = b.status(&dep(), p).await.unwrap();
        if s.now_ms >= s.open_until_ms {
            return;
        }
        assert!(Instant::now() < deadline, "the open period never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_the_configured_probes_go_out_fleet_wide_and_each_transition_happens_once() {
    let server = RedisServer::start();
    let bs = breakers(&server);
    // Open long enough that the 64 calls below finish inside the open period on a loaded
    // machine (a call after it would half-open the breaker).
    let p = policy(Duration::from_secs(3), Duration::from_secs(60));

    // 64 failures at once: exactly one of them opens it (the 10th or later, at a ratio of 1).
    let opened = all_at_once(&bs, move |b, _| async move {
        b.record(&dep(), &p, false, None).await.unwrap()
    })
    .await;
    let changes: Vec<_> = opened.iter().filter(|d| d.changed).collect();
    assert_eq!(changes.len(), 1, "{opened:?}");
    assert_eq!(changes[0].state, BreakerState::Open);
    assert_eq!(
        opened
            .iter()
            .filter(|d| d.state == BreakerState::Closed)
            .count(),
        9,
        "the first nine are below the minimum volume; the tenth opens it"
    );
    let s = bs[0].status(&dep(), &p).await.unwrap();
    assert_eq!((s.state, s.times_opened), (BreakerState::Open, 1));

    until_open_period_ends(&bs[0], &p).await;
    // 64 calls at once after the open period: exactly 3 probes, one half-open transition.
    let admitted = all_at_once(&bs, move |b, _| async move {
        b.admit(&dep(), &p).await.unwrap()
    })
    .await;
    let probes: Vec<u64> = admitted
        .iter()
        .filter_map(|d| match d.verdict {
            Verdict::Probe { generation } => Some(generation),
            _ => None,
        })
        .collect();
    assert_eq!(probes.len(), 3, "{admitted:?}");
    assert!(probes.iter().all(|g| *g == probes[0]), "one generation");
    assert_eq!(
        admitted
            .iter()
            .filter(|d| d.verdict == Verdict::Wait)
            .count(),
        TASKS - 3
    );
    assert_eq!(admitted.iter().filter(|d| d.changed).count(), 1);
    assert!(admitted.iter().all(|d| d.state == BreakerState::HalfOpen));

    // Late failures of calls admitted before it opened say nothing: still half-open.
    for _ in 0..20 {
        let d = bs[1].record(&dep(), &p, false, None).await.unwrap();
        assert_eq!((d.state, d.changed), (BreakerState::HalfOpen, false));
    }
    // The three probes succeed at once: exactly one closes it (close_after = 2), the third is
    // a late answer.
    let generation = probes[0];
    let mut set = JoinSet::new();
    for b in &bs[..3] {
        let b = b.clone();
        set.spawn(async move { b.record(&dep(), &p, true, Some(generation)).await.unwrap() });
    }
    let mut closed = Vec::new();
    while let Some(r) = set.join_next().await {
        closed.push(r.unwrap());
    }
    assert_eq!(closed.iter().filter(|d| d.changed).count(), 1, "{closed:?}");
    let s = bs[0].status(&dep(), &p).await.unwrap();
    assert_eq!(s.state, BreakerState::Closed);
    assert!(
        s.volume < 1.0,
        "closing starts the counts afresh: {}",
        s.volume
    );
    let d = bs[0].admit(&dep(), &p).await.unwrap();
    assert_eq!(d.verdict, Verdict::Run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_probe_reopens_once_and_older_probes_are_ignored() {
    let server = RedisServer::start();
    let bs = breakers(&server);
    let p = policy(Duration::from_secs(1), Duration::from_secs(60));
    // Below the minimum volume nothing opens, whatever the ratio.
    for _ in 0..9 {
        assert!(!bs[0].record(&dep(), &p, false, None).await.unwrap().changed);
    }
    // Successes keep the ratio below a half.
    for _ in 0..11 {
        bs[0].record(&dep(), &p, true, None).await.unwrap();
    }
    assert!(
        !bs[0].record(&dep(), &p, false, None).await.unwrap().changed,
        "10 of 21"
    );
    let d = bs[0].record(&dep(), &p, false, None).await.unwrap();
    assert_eq!((d.state, d.changed), (BreakerState::Open, true), "11 of 22");

    until_open_period_ends(&bs[0], &p).await;
    let Verdict::Probe { generation } = bs[0].admit(&dep(), &p).await.unwrap().verdict else {
        panic!("a probe");
    };
    let Verdict::Probe { generation: same } = bs[1].admit(&dep(), &p).await.unwrap().verdict else {
        panic!("a second probe");
    };
    assert_eq!(generation, same);
    // One probe fails: reopened at once, by that call only.
    let d = bs[0]
        .record(&dep(), &p, false, Some(generation))
        .await
        .unwrap();
    assert_eq!((d.state, d.changed), (BreakerState::Open, true));
    // The other probe's success comes late: ignored.
    let d = bs[1]
        .record(&dep(), &p, true, Some(generation))
        .await
        .unwrap();
    assert_eq!((d.state, d.changed), (BreakerState::Open, false));
    assert_eq!(bs[0].status(&dep(), &p).await.unwrap().times_opened, 2);

    // A probe given back (not sent) can be taken by another call.
    until_open_period_ends(&bs[0], &p).await;
    let mut taken = Vec::new();
    for b in bs.iter().take(3) {
        let Verdict::Probe { generation } = b.admit(&dep(), &p).await.unwrap().verdict else {
            panic!("a probe");
        };
        taken.push(generation);
    }
    assert_eq!(
        bs[3].admit(&dep(), &p).await.unwrap().verdict,
        Verdict::Wait
    );
    bs[0].cancel(&dep(), &p, taken[0]).await.unwrap();
    assert!(matches!(
        bs[3].admit(&dep(), &p).await.unwrap().verdict,
        Verdict::Probe { .. }
    ));
}

#[tokio::test]
async fn probes_lost_with_their_workers_are_reissued_after_the_probe_timeout() {
    let server = RedisServer::start();
    let bs = breakers(&server);
    let p = policy(Duration::from_millis(50), Duration::from_secs(2));
    for _ in 0..10 {
        bs[0].record(&dep(), &p, false, None).await.unwrap();
    }
    until_open_period_ends(&bs[0], &p).await;
    for _ in 0..3 {
        assert!(matches!(
            bs[0].admit(&dep(), &p).await.unwrap().verdict,
            Verdict::Probe { .. }
        ));
    }
    assert_eq!(
        bs[0].admit(&dep(), &p).await.unwrap().verdict,
        Verdict::Wait
    );
    // Nobody answers (the probing workers died). After the probe timeout, new probes go out.
    let half_open_at = bs[0].status(&dep(), &p).await.unwrap().changed_ms;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = bs[0].status(&dep(), &p).await.unwrap();
        if s.now_ms >= half_open_at + 2000 {
            break;
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(matches!(
        bs[0].admit(&dep(), &p).await.unwrap().verdict,
        Verdict::Probe { .. }
    ));
}

#[tokio::test]
async fn a_key_of_another_type_is_refused_naming_it() {
    let server = RedisServer::start();
    let bs = breakers(&server);
    let _: () = server.cmd(&["SET", "fbt:v1:{search}:cb", "x"]);
    let p = policy(Duration::from_secs(1), Duration::from_secs(1));
    match bs[0].admit(&dep(), &p).await {
        Err(StoreError::BadKey { key, .. }) => assert_eq!(key, "fbt:v1:{search}:cb"),
        other => panic!("{other:?}"),
    }
    let _: () = server.cmd(&["DEL", "fbt:v1:{search}:cb"]);
    let _: () = server.cmd(&["HSET", "fbt:v1:{search}:cb", "st", "banana"]);
    match bs[0].admit(&dep(), &p).await {
        Err(StoreError::BadKey { detail, .. }) => assert!(detail.contains("st"), "{detail}"),
        other => panic!("{other:?}"),
    }
}

fn config(server: &RedisServer) -> Config {
    let text = format!(
        "[redis]\nurl = \"{}\"\ntimeout_ms = 5000\nkey_prefix = \"fbt\"\ndeposit_flush_ms = 0\n\
         [defaults]\nmin_allowance = 2\nratio = 0\n\
         [dependencies.search]\ntasks = [\"index\"]\n\
         [dependencies.search.breaker]\nmin_volume = 4\nfailure_ratio = 0.5\nopen_secs = 2\nhalf_open_probes = 2\nclose_after = 2\nmax_wait_secs = 600\n",
        server.url()
    );
    Config::from_toml(&text, "test").unwrap()
}

#[tokio::test]
async fn through_the_budget_jobs_are_held_while_open_and_probes_spend_the_floor() {
    let server = RedisServer::start();
    let budget = FleetBudget::from_config(&config(&server)).await.unwrap();
    for _ in 0..4 {
        let Admission::Run(call) = budget.admit("index", 1, None).await.unwrap() else {
            panic!("closed: runs");
        };
        budget.finish(call, CallOutcome::Failed).await;
    }
    let m = budget.metrics();
    assert_eq!(m.breaker_transitions("search", "open"), 1);
    // Open: held with the rest of the open period (at least 1 s), then dead-lettered after the
    // limit without an attempt.
    let held = budget.admit("index", 3, None).await.unwrap();
    let Admission::Wait(Hold::CircuitOpen { retry_in }) = held else {
        panic!("{held:?}");
    };
    assert!(retry_in >= Duration::from_secs(1), "{retry_in:?}");
    let late = budget
        .admit("index", 3, Some(Duration::from_secs(600)))
        .await
        .unwrap();
    let Admission::DeadLetter(Decision::DeadLetter { reason, source, .. }) = late else {
        panic!("{late:?}");
    };
    assert_eq!(
        (reason, source),
        (DeadLetterReason::CircuitOpen, BudgetSource::Fleet)
    );
    // After the open period: two probes, each a retry of the floor (2), then everyone waits.
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        match budget.admit("index", 1, None).await.unwrap() {
            Admission::Run(call) => break call,
            Admission::Wait(_) => {
                assert!(Instant::now() < deadline, "never half-opened");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other @ Admission::DeadLetter(_) => panic!("{other:?}"),
        }
    };
    assert!(first.is_probe());
    let Admission::Run(second) = budget.admit("index", 1, None).await.unwrap() else {
        panic!("a second probe");
    };
    assert!(second.is_probe());
    assert!(matches!(
        budget.admit("index", 1, None).await.unwrap(),
        Admission::Wait(Hold::CircuitOpen { .. })
    ));
    let (snapshot, _) = budget.status(&dep()).await;
    assert_eq!(
        snapshot.current.retries + snapshot.previous.retries,
        2,
        "probes spend the floor"
    );
    budget.finish(first, CallOutcome::Succeeded).await;
    budget.finish(second, CallOutcome::Succeeded).await;
    assert_eq!(m.breaker_transitions("search", "half_open"), 1);
    assert_eq!(m.breaker_transitions("search", "closed"), 1);
    let Admission::Run(call) = budget.admit("index", 1, None).await.unwrap() else {
        panic!("closed again");
    };
    assert!(!call.is_probe());
    budget.finish(call, CallOutcome::Succeeded).await;
}
