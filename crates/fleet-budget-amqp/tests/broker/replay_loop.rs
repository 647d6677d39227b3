//! The replay's closed loop on a real RabbitMQ and a private Redis: held while the dependency's
//! breaker is open (opened and closed through the core crate's breaker store, as workers do),
//! slowed when the dependency's failures rise (counted by its budget in Redis) and climbing back
//! when they stop, a dry run's prediction matching the run after it, and a cancelled run leaving
//! everything it did not move. Orders of events and counts are asserted, never durations.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_budget::breaker::{Breaker, BreakerPolicy, BreakerState, Verdict};
use fleet_budget::store::RedisStore;
use fleet_budget::{DeadLetterReason, Dependency};
use fleet_budget_amqp::headers;
use fleet_budget_amqp::replay::{
    Breakers, HoldReason, RateControl, ReplayMode, ReplayOutcome, SlowReason,
};
use fleet_budget_amqp::{ReplayFilter, ReplayOptions, ReplayProgress, Replayer};

use crate::common::{Env, wait_until};

const LONG: Duration = Duration::from_secs(60);

/// A dependency `search` with a breaker that opens on one failure and closes after one probe
/// success, open `open_secs`; a budget with a large floor (never the bound here).
async fn env_with_breaker(name: &str, open_secs: u64) -> Env {
    Env::new(
        name,
        "",
        "",
        &format!(
            "[dependencies.search]\nwindow_secs = 60\nmin_allowance = 100000\n\
             [dependencies.search.breaker]\nfailure_ratio = 1.0\nmin_volume = 1\n\
             open_secs = {open_secs}\nhalf_open_probes = 1\nclose_after = 1\n"
        ),
    )
    .await
}

/// The breaker store the workers of `env` share, and the policy of `search`.
fn breaker(env: &Env) -> (Breaker, BreakerPolicy, Dependency) {
    let store = RedisStore::from_settings(&env.config.budget.redis).unwrap();
    let dep = Dependency::new("search").unwrap();
    let policy = env.config.budget.breakers[&dep];
    (Breaker::new(Arc::new(store)), policy, dep)
}

/// Opens `search`'s breaker the way a worker does: a call's failure reported to it.
async fn open_breaker(env: &Env) {
    let (breaker, policy, dep) = breaker(env);
    let decided = breaker.record(&dep, &policy, false, None).await.unwrap();
    assert_eq!(decided.state, BreakerState::Open, "{decided:?}");
}

async fn replayer(env: &Env) -> Replayer {
    let breakers = Breakers::from_config(&env.config.budget).unwrap();
    assert!(breakers.is_some());
    Replayer::new(
        env.url.clone(),
        env.topology.clone(),
        Some(env.budget().await),
    )
    .with_breakers(breakers)
}

async fn seed(env: &Env, n: usize, dependency: &str, replays: u32) {
    let publisher = env.publisher().await;
    env.seed_dead_letters(
        &publisher,
        n,
        dependency,
        DeadLetterReason::BudgetExhausted,
        replays,
        headers::now_ms(),
    )
    .await;
    publisher.close().await;
}

fn held_by_breaker(p: &ReplayProgress) -> bool {
    p.held.as_ref().is_some_and(|h| {
        matches!(h.reason, HoldReason::BreakerOpen { .. }) && h.dependency == "search"
    })
}

/// Nothing moves while the breaker is open; once a probe closes it (the breaker's own admit
/// and record, as a worker's probe would), the replay moves everything.
#[tokio::test]
async fn replay_held_by_an_open_breaker_resumes_when_it_closes() {
    let env = env_with_breaker("loop-breaker", 2).await;
    seed(&env, 6, "search", 0).await;
    open_breaker(&env).await;
    let events: Arc<Mutex<Vec<ReplayProgress>>> = Arc::default();
    let run = {
        let (events, r) = (Arc::clone(&events), replayer(&env).await);
        let mut options = ReplayOptions::new(&env.config);
        options.rate = Some(100.0);
        options.budget_poll = Duration::from_millis(100);
        tokio::spawn(async move {
            r.run(&options, move |p| events.lock().unwrap().push(p.clone()))
                .await
        })
    };
    wait_until(LONG, "the replay to be held by the breaker", || async {
        events.lock().unwrap().iter().any(held_by_breaker)
    })
    .await;
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
    // The open period ends; the first call half-opens it and is the probe; its success closes it.
    let (breaker, policy, dep) = breaker(&env);
    let deadline = std::time::Instant::now() + LONG;
    loop {
        if let Verdict::Probe { generation } = breaker.admit(&dep, &policy).await.unwrap().verdict {
            let d = breaker
                .record(&dep, &policy, true, Some(generation))
                .await
                .unwrap();
            assert_eq!(d.state, BreakerState::Closed, "{d:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the breaker never half-opened"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let report = tokio::time::timeout(LONG, run)
        .await
        .expect("the replay resumes and ends")
        .unwrap()
        .unwrap();
    assert_eq!((report.moved, report.failed), (6, 0), "{report:?}");
    assert!(!report.held_breaker.is_zero(), "{report:?}");
    assert_eq!(env.depth(&env.topology.work_queue).await, 6);
    let events = events.lock().unwrap();
    let first_held = events.iter().position(held_by_breaker).unwrap();
    let first_move = events.iter().position(|p| p.moved > 0).unwrap();
    assert!(first_held < first_move, "held before anything moved");
    assert!(
        events
            .iter()
            .filter(|p| held_by_breaker(p))
            .all(|p| p.moved == 0),
        "nothing moves while the breaker is open"
    );
    assert!(events.last().unwrap().held.is_none());
}

/// The dependency's failures rise while the replay runs (retries its budget grants, counted in
/// Redis where `budgetctl status` reads them): the rate is cut; when they stop, it climbs back.
#[tokio::test]
async fn replay_rate_falls_when_failures_rise_and_climbs_back() {
    let env = env_with_breaker("loop-aimd", 30).await;
    seed(&env, 80, "search", 0).await;
    let budget = env.budget().await;
    let dep = Dependency::new("search").unwrap();
    let policy = budget.policy(&dep);
    let events: Arc<Mutex<Vec<ReplayProgress>>> = Arc::default();
    let run = {
        let (events, r) = (Arc::clone(&events), replayer(&env).await);
        let mut options = ReplayOptions::new(&env.config);
        options.rate = Some(30.0);
        options.control = RateControl {
            interval: Duration::from_millis(200),
            increase: Some(5.0),
            ..RateControl::default()
        };
        tokio::spawn(async move {
            r.run(&options, move |p| events.lock().unwrap().push(p.clone()))
                .await
        })
    };
    let last = || events.lock().unwrap().last().cloned().unwrap_or_default();
    wait_until(LONG, "the first moves", || async { last().moved >= 3 }).await;
    // Failures until the replay reacts, then none.
    wait_until(LONG, "the rate to be cut", || async {
        for _ in 0..5 {
            let (w, _) = budget.withdraw(&dep, &policy).await;
            assert!(w.granted, "the budget's floor grants every retry here");
        }
        last().slowdowns >= 1
    })
    .await;
    let report = tokio::time::timeout(LONG, run)
        .await
        .expect("the replay ends")
        .unwrap()
        .unwrap();
    assert_eq!(report.moved, 80, "{report:?}");
    assert!(report.slowdowns >= 1, "{report:?}");
    let rate = |p: &ReplayProgress| p.rate.map(|r| r.per_sec());
    let events = events.lock().unwrap();
    assert_eq!(rate(&events[0]), Some(30.0), "starts at the maximum");
    // The last cut, and the rate it left.
    let cut_at = events
        .iter()
        .rposition(|p| p.slowed == Some(SlowReason::Failures))
        .unwrap();
    let cut_to = rate(&events[cut_at]).unwrap();
    assert!(cut_to < 30.0, "{:?}", events[cut_at]);
    assert!(report.lowest_rate.unwrap().per_sec() <= cut_to);
    // After it, quiet intervals: the rate climbs, back to the maximum.
    let after: Vec<f64> = events[cut_at..].iter().filter_map(rate).collect();
    assert!(after.iter().any(|r| *r > cut_to), "climbs back: {after:?}");
    assert_eq!(
        events.iter().filter_map(rate).next_back(),
        Some(30.0),
        "back at the maximum by the end: {after:?}"
    );
}

/// A dry run started through the handle predicts the run started after it: moved, parked,
/// skipped, failed; and progress reaches the handle.
#[tokio::test]
async fn dry_run_prediction_matches_the_replay_that_follows() {
    let env = env_with_breaker("loop-dry", 30).await;
    seed(&env, 5, "search", 0).await;
    seed(&env, 2, "search", 3).await; // replayed max_replays times: parked
    seed(&env, 3, "mail", 0).await; // not selected: skipped
    let replayer = replayer(&env).await;
    // Seeded by hand, as dead letters of a topology older than the index: rebuilt once.
    let rebuilt = replayer.reindex().await.unwrap();
    assert_eq!((rebuilt.seen, rebuilt.indexed), (10, 10), "{rebuilt:?}");
    let mut options = ReplayOptions::new(&env.config);
    options.filter = ReplayFilter {
        dependency: Some("search".to_owned()),
        ..ReplayFilter::default()
    };
    let dry = replayer.start(options.clone(), ReplayMode::DryRun);
    let Ok(ReplayOutcome::DryRun(predicted)) = dry.wait().await else {
        panic!("a dry run's outcome")
    };
    assert!(predicted.exact, "{predicted:?}");
    assert_eq!(
        env.depth(&env.topology.dead_queue).await,
        10,
        "a dry run moves nothing"
    );
    let run = replayer.start(options, ReplayMode::Run);
    let Ok(ReplayOutcome::Run(done)) = run.wait().await else {
        panic!("a run's outcome")
    };
    assert_eq!(
        (
            predicted.would_move,
            predicted.would_park_looping + predicted.malformed,
            predicted.skipped,
            predicted.would_fail
        ),
        (done.moved, done.parked, done.skipped, done.failed),
        "{predicted:?} vs {done:?}"
    );
    assert_eq!((done.moved, done.parked, done.skipped), (5, 2, 3));
    env.ready_again(&env.topology.dead_queue, 3).await;
    assert_eq!(env.depth(&env.topology.work_queue).await, 5);
}

/// Cancelled while held, a run returns its report marked cancelled, moves nothing, and leaves
/// every message in the dead-letter queue.
#[tokio::test]
async fn a_cancelled_replay_leaves_what_it_did_not_move() {
    let env = env_with_breaker("loop-cancel", 600).await;
    seed(&env, 4, "search", 0).await;
    open_breaker(&env).await;
    let mut options = ReplayOptions::new(&env.config);
    options.budget_poll = Duration::from_millis(100);
    let handle = replayer(&env).await.start(options, ReplayMode::Run);
    let mut updates = handle.subscribe();
    tokio::time::timeout(LONG, updates.wait_for(held_by_breaker))
        .await
        .expect("held by the open breaker")
        .unwrap();
    assert!(!handle.is_finished());
    handle.cancel();
    let Ok(ReplayOutcome::Run(report)) = tokio::time::timeout(LONG, handle.wait())
        .await
        .expect("a cancelled run ends")
    else {
        panic!("a run's outcome")
    };
    assert!(report.cancelled, "{report:?}");
    assert_eq!((report.moved, report.parked, report.failed), (0, 0, 0));
    env.ready_again(&env.topology.dead_queue, 4).await;
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
}

/// The figure run of `docs/RELIABILITY.md` (not part of the suite: it prints, asserts only
/// counts): the same replay of 150 jobs at 40/s, with the closed loop and with `--fixed-rate`,
/// while the dependency fails for 2 s (20 failed retries every 100 ms, from the 10th move on).
/// Prints the moves sent into the failing period, the cuts, the lowest rate and the wall time.
/// `cargo test -p fleet-budget-amqp --test broker -- --ignored --nocapture replay_loop::figures`
#[tokio::test]
#[ignore = "a figure run for docs/RELIABILITY.md"]
async fn figures_closed_loop_against_a_fixed_rate() {
    for enabled in [true, false] {
        let env = env_with_breaker("loop-figures", 30).await;
        seed(&env, 150, "search", 0).await;
        let budget = env.budget().await;
        let dep = Dependency::new("search").unwrap();
        let policy = budget.policy(&dep);
        let mut options = ReplayOptions::new(&env.config);
        options.rate = Some(40.0);
        options.control.enabled = enabled;
        let started = std::time::Instant::now();
        let handle = replayer(&env).await.start(options, ReplayMode::Run);
        let mut updates = handle.subscribe();
        tokio::time::timeout(LONG, updates.wait_for(|p| p.moved >= 10))
            .await
            .unwrap()
            .unwrap();
        let before = handle.progress().moved;
        let failing = std::time::Instant::now();
        while failing.elapsed() < Duration::from_secs(2) {
            for _ in 0..20 {
                budget.withdraw(&dep, &policy).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let during = handle.progress().moved - before;
        let Ok(ReplayOutcome::Run(report)) = handle.wait().await else {
            panic!("a run's outcome")
        };
        assert_eq!(report.moved, 150);
        println!(
            "closed loop {enabled:5}: moved during the 2 s of failures {during:3}, cuts {}, lowest rate {:.2}/s, wall {:.1} s",
            report.slowdowns,
            report.lowest_rate.map_or(0.0, |r| r.per_sec()),
            started.elapsed().as_secs_f64()
        );
    }
}
