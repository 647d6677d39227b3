//! Redis outages never stall a worker (issue 3, item 2): a harness-owned `redis-server` is killed
//! while tasks decide, restarted on the same port, paused with `CLIENT PAUSE` and `DEBUG SLEEP`;
//! the fallback modes `local`, `deny` and `allow`; one log line entering and one leaving.
//!
//! The servers are real; the budget's time is not: each budget keeps time with a
//! [`ManualClock`] that the tests move past probe intervals instead of sleeping them out. The
//! only timed assertion is the one the issue asks for, with a generous margin for this noisy
//! 2-core machine: no call longer than the deadline + [`MARGIN`]. "The fleet budget is used again
//! within 2 s of Redis answering" is counted in probe intervals of the budget's clock.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use fleet_budget::budget::PROBE_INTERVAL;
use fleet_budget::clock::ManualClock;
use fleet_budget::testing::{RedisServer, budget_on_clock, eventually, until_store_answers};
use fleet_budget::{
    BudgetSource, Config, DeadLetterReason, Decision, Failure, FallbackMode, FleetBudget,
};

/// The store deadline under test (the default).
const DEADLINE: Duration = Duration::from_millis(50);
/// Scheduling noise allowed on top of the deadline.
const MARGIN: Duration = Duration::from_millis(250);
/// The fleet budget must be used again within this much of its clock after Redis answers.
const RESUME_WITHIN: Duration = Duration::from_secs(2);
/// How long the tests wait for something they do not control (decisions to accumulate).
const PATIENCE: Duration = Duration::from_secs(10);

/// A budget on `server` with the `fallback`, on a clock the test moves.
fn budget(server: &RedisServer, fallback: FallbackMode) -> (FleetBudget, ManualClock) {
    let mut config = Config::default();
    config.redis.url = server.url();
    config.redis.key_prefix = "fbo".to_owned();
    config.redis.timeout = DEADLINE;
    config.redis.fallback = fallback;
    let clock = ManualClock::new(1_800_000_000_000);
    (budget_on_clock(&config, &clock), clock)
}

fn source(d: &Decision) -> BudgetSource {
    match d {
        Decision::Retry { source, .. } | Decision::DeadLetter { source, .. } => *source,
    }
}

fn store_errors(budget: &FleetBudget) -> u64 {
    ["timeout", "connection", "server", "bad_reply"]
        .iter()
        .map(|k| budget.metrics().store_errors(k))
        .sum()
}

/// Decisions the fallback `mode` made so far (`fleet_budget_fallback_decisions_total`).
fn fallback_decisions(budget: &FleetBudget, mode: FallbackMode) -> u64 {
    let series = format!(
        "fleet_budget_fallback_decisions_total{{mode=\"{}\"}} ",
        mode.as_str()
    );
    budget
        .metrics()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |n| n.parse().unwrap())
}

/// One retry decision for task `search` (its own dependency), and how long it took.
async fn decide(budget: &FleetBudget) -> (Decision, Duration) {
    let started = Instant::now();
    let d = budget
        .on_failure("search", 1, &Failure::retryable("search returned 503"))
        .await
        .unwrap();
    (d, started.elapsed())
}

/// Decides until a decision comes from the fleet budget; returns how much of the budget's
/// clock that took. Between tries it waits (in real time) until the store answers a direct call,
/// then moves the clock one probe interval: the budget must use the store again by then.
async fn until_fleet(budget: &FleetBudget, clock: &ManualClock) -> Duration {
    let mut waited = Duration::ZERO;
    loop {
        let (d, took) = decide(budget).await;
        assert!(took <= DEADLINE + MARGIN, "a decision took {took:?}");
        if source(&d) == BudgetSource::Fleet {
            return waited;
        }
        assert!(
            waited < RESUME_WITHIN,
            "the store answers, yet the fleet budget was not used again within {waited:?} of its clock; {:?}",
            budget
                .metrics()
                .render()
                .lines()
                .filter(|l| l.starts_with("fleet_budget_store_errors"))
                .collect::<Vec<_>>()
        );
        until_store_answers(budget, "search").await;
        clock.advance(PROBE_INTERVAL);
        waited += PROBE_INTERVAL;
    }
}

/// Waits until `counter` reaches `at_least`.
async fn until_count(counter: &AtomicU64, at_least: u64, what: &str) {
    eventually(what, PATIENCE, async || {
        counter.load(Ordering::Relaxed) >= at_least
    })
    .await;
}

/// The log lines written on this thread. A global subscriber writes each event into a buffer of
/// the thread that emitted it; the tests run on current-thread runtimes, so every task of a
/// test's budget logs on the test's own thread and tests running in parallel do not mix. (A
/// per-thread `set_default` subscriber loses events here: another test's thread can register a
/// callsite first and tracing caches its interest.)
struct Captured;

thread_local! {
    static LOGS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

struct ThreadLogs;

impl Write for ThreadLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.with(|l| l.borrow_mut().extend_from_slice(buf));
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn install() -> Self {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            let subscriber = tracing_subscriber::fmt()
                .with_writer(|| ThreadLogs)
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .finish();
            tracing::subscriber::set_global_default(subscriber).unwrap();
        });
        LOGS.with(|l| l.borrow_mut().clear());
        Self
    }

    fn text(&self) -> String {
        LOGS.with(|l| String::from_utf8_lossy(&l.borrow()).into_owned())
    }

    fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }
}

/// Kills or restarts the server off the runtime thread, so that no decision in flight is
/// held up by the harness (its latency would be the harness's, not the budget's).
async fn off_runtime(mut server: RedisServer, f: fn(&mut RedisServer)) -> RedisServer {
    tokio::task::spawn_blocking(move || {
        f(&mut server);
        server
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn killing_redis_while_deciding_falls_back_within_the_deadline_and_restart_resumes_the_fleet_budget()
 {
    let logs = Captured::install();
    let server = RedisServer::start();
    let (budget, clock) = budget(&server, FallbackMode::Local);
    until_fleet(&budget, &clock).await;

    // 8 tasks decide (and report successes) continuously; phase 0 healthy, 1 killed, 2 restarted.
    let phase = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let max_micros = Arc::new(AtomicU64::new(0));
    let by_phase: Arc<[[AtomicU64; 3]; 3]> = Arc::new(Default::default()); // [phase][fleet, fallback, other]
    let deciders: Vec<_> = (0..8)
        .map(|t| {
            let (budget, phase, stop, max_micros, by_phase) = (
                budget.clone(),
                phase.clone(),
                stop.clone(),
                max_micros.clone(),
                by_phase.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let p = phase.load(Ordering::Relaxed);
                    let (d, took) = decide(&budget).await;
                    max_micros
                        .fetch_max(u64::try_from(took.as_micros()).unwrap(), Ordering::Relaxed);
                    let s = match source(&d) {
                        // A denial of the fleet kept in the process is the fleet's answer.
                        BudgetSource::Fleet | BudgetSource::FleetCache => 0,
                        BudgetSource::LocalFallback => 1,
                        _ => 2,
                    };
                    by_phase[p][s].fetch_add(1, Ordering::Relaxed);
                    if t % 2 == 0 {
                        budget.on_success("search").await.unwrap();
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })
        .collect();

    until_count(&by_phase[0][0], 20, "fleet decisions before the kill").await;
    let server = off_runtime(server, RedisServer::stop).await;
    phase.store(1, Ordering::Relaxed);
    // The first call to fail puts the dependency in fallback; after that the dead store is tried
    // once per probe interval of the clock, and the local budget decides in between.
    eventually("the fallback is entered", PATIENCE, async || {
        budget.in_fallback()
    })
    .await;
    for _ in 0..3 {
        let errors = store_errors(&budget);
        clock.advance(PROBE_INTERVAL);
        eventually("a probe of the dead store fails", PATIENCE, async || {
            store_errors(&budget) > errors
        })
        .await;
    }
    until_count(&by_phase[1][1], 51, "decisions by the local fallback").await;

    assert!(budget.in_fallback(), "Redis is down: the fallback decides");
    assert!(
        budget.metrics().fallback_is_active("search"),
        "the fallback gauge says so"
    );
    assert!(store_errors(&budget) > 0, "store errors are counted");
    let fallback_decisions = by_phase[1][1].load(Ordering::Relaxed);
    assert!(
        fallback_decisions > 50,
        "decisions kept coming from the local fallback: {fallback_decisions}"
    );
    assert_eq!(
        by_phase[1][2].load(Ordering::Relaxed),
        0,
        "fallback `local` decides with the local budget, never blind"
    );
    assert!(
        budget
            .metrics()
            .render()
            .contains("fleet_budget_fallback_decisions_total{mode=\"local\"}")
    );

    let server = off_runtime(server, RedisServer::restart).await;
    phase.store(2, Ordering::Relaxed);
    let resumed = until_fleet(&budget, &clock).await;
    until_count(&by_phase[2][0], 20, "fleet decisions after the restart").await;
    stop.store(true, Ordering::Relaxed);
    for d in deciders {
        d.await.expect("no decider panicked");
    }

    let max = Duration::from_micros(max_micros.load(Ordering::Relaxed));
    eprintln!(
        "outage: max decision latency {max:?} (deadline {DEADLINE:?}), fleet budget resumed {resumed:?} of its clock after the store answered, \
         decisions by phase [fleet, fallback, other]: {:?}",
        by_phase
            .iter()
            .map(|p| p
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );
    assert!(
        max <= DEADLINE + MARGIN,
        "no decision blocked past the deadline + margin: {max:?}"
    );
    assert!(
        by_phase[0][0].load(Ordering::Relaxed) > 0,
        "the fleet budget decided before the kill"
    );
    assert!(
        by_phase[2][0].load(Ordering::Relaxed) > 0,
        "and again after the restart"
    );
    assert!(
        !budget.in_fallback() && !budget.metrics().fallback_is_active("search"),
        "left the fallback"
    );
    // One line per episode, not one per call: the outage is one episode. On a loaded machine a
    // store that is alive can also miss the 50 ms deadline before the kill (a deposit or a
    // decision starved of CPU); that is an episode of its own, entered and left, and logged as
    // such (seen in CI: a deposit timed out 100 ms before the kill, the next call answered).
    // Hundreds of calls went to the fallback; a line per call would show here.
    let entering = logs.count("entering fallback");
    let leaving = logs.count("leaving fallback");
    assert!(
        (1..=3).contains(&entering) && entering == leaving,
        "one line entering and one leaving per episode, not one per call \
         ({entering} entering, {leaving} leaving, {fallback_decisions} decisions in the fallback):\n{}",
        logs.text()
    );

    // The successes counted during the outage reach the restarted (empty) server.
    budget.flush().await.unwrap();
    assert_eq!(budget.pending_deposits(), 0);
    drop(server);
}

#[tokio::test(flavor = "current_thread")]
async fn client_pause_and_debug_sleep_fire_the_deadline() {
    let server = RedisServer::start_with(&["--enable-debug-command", "local"], &[]);
    let (budget, clock) = budget(&server, FallbackMode::Local);
    until_fleet(&budget, &clock).await;

    // CLIENT PAUSE: the server holds every client's commands (CLIENT UNPAUSE too, on this
    // Redis: the pause ends by itself).
    let _: String = server.cmd(&["CLIENT", "PAUSE", "500", "ALL"]);
    let (d, took) = decide(&budget).await;
    assert_eq!(
        source(&d),
        BudgetSource::LocalFallback,
        "the paused server did not decide"
    );
    assert!(
        took >= DEADLINE && took <= DEADLINE + MARGIN,
        "the deadline fired: {took:?}"
    );
    assert!(
        budget.metrics().store_errors("timeout") >= 1,
        "counted as a timeout"
    );
    assert!(budget.metrics().fallback_is_active("search"));
    let resumed = until_fleet(&budget, &clock).await;
    eprintln!(
        "pause: CLIENT PAUSE decision took {took:?} (deadline {DEADLINE:?}); fleet budget again {resumed:?} of its clock after the pause"
    );
    assert!(!budget.metrics().fallback_is_active("search"));

    // DEBUG SLEEP: the server itself is busy (like a slow script or a fork stall). Decide until
    // a decision meets the sleeping server.
    let timeouts = budget.metrics().store_errors("timeout");
    let sleeper = {
        let url = server.url();
        tokio::task::spawn_blocking(move || {
            let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
            redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg("0.5")
                .query::<String>(&mut c)
                .unwrap();
        })
    };
    let (d, took, timeouts_before) = loop {
        let timeouts_before = budget.metrics().store_errors("timeout");
        let (d, took) = decide(&budget).await;
        // The fleet's answer, or its denial kept in the process (`redis.deny_cache_ms`: on a
        // loaded machine the loop can spend the allowance before the sleep starts, and the
        // cached denial answers without a call): neither met the sleeping server.
        if !matches!(source(&d), BudgetSource::Fleet | BudgetSource::FleetCache) {
            break (d, took, timeouts_before);
        }
        assert!(
            !sleeper.is_finished(),
            "no decision met the sleeping server"
        );
        tokio::task::yield_now().await;
    };
    assert_eq!(source(&d), BudgetSource::LocalFallback);
    if took >= DEADLINE {
        // This decision's own call met the sleeping server: cut at the deadline.
        assert!(took <= DEADLINE + MARGIN, "the deadline fired: {took:?}");
    } else {
        // At once: an earlier call met the sleeping server first (one answered from the deny
        // cache, or the budget's own flush), was cut at the deadline, and the budget went to its
        // fallback, which answered this one without a call. Twice in CI (stops 40 and 42, 12 and
        // 23 µs). It must have been a timeout, counted before this decision began: a server
        // that went away (a kill, a dropped connection) would count an I/O error instead.
        assert!(
            timeouts_before > timeouts,
            "a decision fell back in {took:?} with no timeout counted before it: {}",
            budget.metrics().render()
        );
        eprintln!(
            "pause: DEBUG SLEEP met first by an earlier call; this decision fell back in {took:?}"
        );
    }
    assert!(budget.metrics().store_errors("timeout") > timeouts);
    sleeper.await.unwrap();
    let resumed = until_fleet(&budget, &clock).await;
    eprintln!(
        "pause: DEBUG SLEEP decision took {took:?} (deadline {DEADLINE:?}); fleet budget again {resumed:?} of its clock after it ended"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn fallback_deny_refuses_and_fallback_allow_grants_while_blind() {
    for mode in [FallbackMode::Deny, FallbackMode::Allow] {
        let server = RedisServer::start();
        let (budget, clock) = budget(&server, mode);
        until_fleet(&budget, &clock).await;
        // Getting there may have taken a fallback decision (a first call that met its deadline
        // while connecting on a loaded machine): the 50 below are counted on top.
        let before = fallback_decisions(&budget, mode);
        let mut server = off_runtime(server, RedisServer::stop).await;

        for _ in 0..50 {
            let (d, took) = decide(&budget).await;
            assert!(
                took <= DEADLINE + MARGIN,
                "{mode:?}: a decision took {took:?}"
            );
            assert_eq!(
                source(&d),
                BudgetSource::Blind,
                "{mode:?}: no budget was consulted"
            );
            match mode {
                FallbackMode::Deny => assert_eq!(
                    d.dead_letter_reason(),
                    Some(DeadLetterReason::BudgetExhausted),
                    "{d:?}"
                ),
                _ => assert!(d.is_retry(), "{mode:?}: {d:?}"),
            }
        }
        assert!(budget.metrics().fallback_is_active("search"));
        assert!(store_errors(&budget) > 0);
        assert_eq!(
            fallback_decisions(&budget, mode) - before,
            50,
            "{mode:?}: every blind decision counted"
        );

        server = off_runtime(server, RedisServer::restart).await;
        until_fleet(&budget, &clock).await;
        assert!(!budget.in_fallback());
        drop(server);
    }
}
