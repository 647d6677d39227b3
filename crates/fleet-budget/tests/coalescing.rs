//! Coalesced deposits (issue 3, item 3): successes and first attempts are counted in the process
//! and sent in one script call per dependency per flush. After a flush the totals in Redis are
//! exact; a flush dropped while Redis is down is kept and sent later, not lost; and at more than
//! 1,000 jobs/s the budget costs Redis at most 0.01 round trips per successful job.
//!
//! The servers are real; the budgets of the outage tests keep time with a [`ManualClock`] that
//! the tests move past probe intervals and window ages instead of sleeping them out.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::time::{Duration, Instant};

use fleet_budget::budget::PROBE_INTERVAL;
use fleet_budget::clock::ManualClock;
use fleet_budget::store::{BudgetStore, RedisStore, RedisTarget};
use fleet_budget::testing::{RedisServer, budget_on_clock, eventually, until_store_answers};
use fleet_budget::{BudgetSnapshot, Config, Dependency, FleetBudget};

const PREFIX: &str = "fbd";

fn config(server: &RedisServer, flush: Duration, deadline: Duration) -> Config {
    let mut config = Config::default();
    config.redis.url = server.url();
    config.redis.key_prefix = PREFIX.to_owned();
    config.redis.timeout = deadline;
    config.redis.deposit_flush = flush;
    config
}

/// A second, independent view of the budgets (another process, in effect).
async fn status(server: &RedisServer, budget: &FleetBudget, dependency: &str) -> BudgetSnapshot {
    let store = RedisStore::new(
        RedisTarget::Single(server.url()),
        PREFIX,
        Duration::from_secs(5),
    )
    .unwrap();
    let d = Dependency::new(dependency).unwrap();
    store.status(&d, &budget.policy(&d)).await.unwrap()
}

/// How long the tests wait for what they do not control (a restarted server, the flusher).
const PATIENCE: Duration = Duration::from_secs(10);

/// The store deadline of the outage tests: longer than the Redis client's reconnect attempts, so
/// that a flush made while it reconnects to the dead server fails as refused (its deposits kept)
/// rather than as timed out (a timed-out flush is never sent again: see
/// `a_flush_that_timed_out_on_a_paused_redis_is_not_counted_twice`).
const OUTAGE_DEADLINE: Duration = Duration::from_secs(1);

fn store_errors(budget: &FleetBudget) -> u64 {
    ["timeout", "connection", "server", "bad_reply"]
        .iter()
        .map(|k| budget.metrics().store_errors(k))
        .sum()
}

/// Waits until a call of the budget (the flusher's, here) has failed once more than `before`.
async fn until_another_store_error(budget: &FleetBudget, before: u64) {
    eventually("a call to the dead store fails", PATIENCE, async || {
        store_errors(budget) > before
    })
    .await;
}

/// After Redis is back: moves the clock one probe interval at a time (once the store answers
/// again) until the background flusher alone has brought `dependency`'s successes in Redis to
/// `expected`.
async fn until_flushed_after_restart(
    server: &RedisServer,
    budget: &FleetBudget,
    clock: &ManualClock,
    dependency: &str,
    expected: u64,
) {
    for _ in 0..5 {
        until_store_answers(budget, dependency).await;
        let errors = store_errors(budget);
        clock.advance(PROBE_INTERVAL);
        let mut arrived = false;
        eventually(
            "the flusher sends the pending deposits (or fails trying)",
            PATIENCE,
            async || {
                arrived = totals(&status(server, budget, dependency).await).0 == expected;
                arrived || store_errors(budget) > errors
            },
        )
        .await;
        if arrived {
            return;
        }
    }
    panic!(
        "{} deposits still pending after 5 probes of a store that answers",
        budget.pending_deposits()
    );
}

fn totals(s: &BudgetSnapshot) -> (u64, u64) {
    (
        s.current.successes + s.previous.successes,
        s.current.first_attempts + s.previous.first_attempts,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_flush_the_totals_in_redis_are_exact() {
    let server = RedisServer::start();
    // A generous deadline: a flush that timed out after Redis applied it would be sent again
    // (see the budget module's documentation); this test is about exact counting.
    let budget = FleetBudget::from_config(&config(
        &server,
        Duration::from_millis(100),
        Duration::from_secs(5),
    ))
    .await
    .unwrap();
    let _: String = server.cmd(&["CONFIG", "RESETSTAT"]);
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let budget = budget.clone();
            tokio::spawn(async move {
                for j in 0..500 {
                    let task = ["search", "mail", "billing", "render"][(t + j) % 4];
                    budget.on_attempt(task, 1).await.unwrap();
                    budget.on_success(task).await.unwrap();
                    if j % 50 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    budget.flush().await.unwrap();
    assert_eq!(budget.pending_deposits(), 0);
    for dependency in ["search", "mail", "billing", "render"] {
        let s = status(&server, &budget, dependency).await;
        assert_eq!(
            totals(&s),
            (8000, 8000),
            "{dependency}: 64 × 500 / 4 successes and first attempts, exactly"
        );
        assert_eq!(budget.metrics().counter("successes", dependency), 8000);
    }
    let calls = server.command_calls();
    let trips = RedisServer::client_round_trips(&calls);
    assert!(
        trips * 50 < 64_000,
        "64,000 deposits in {trips} round trips: {calls:?}"
    );
    budget.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_dropped_while_redis_is_down_is_sent_when_it_is_back() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new(1_800_000_000_000);
    let budget = budget_on_clock(
        &config(&server, Duration::from_millis(50), OUTAGE_DEADLINE),
        &clock,
    );
    for _ in 0..300 {
        budget.on_success("mail").await.unwrap();
    }
    budget.flush().await.unwrap();
    assert_eq!(totals(&status(&server, &budget, "mail").await).0, 300);

    let mut server_off = tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap();
    for _ in 0..700 {
        budget.on_success("mail").await.unwrap();
    }
    // Background flushes fail meanwhile (the first, then one per probe interval of the clock);
    // so does an explicit one. Nothing is dropped.
    until_another_store_error(&budget, 0).await;
    for _ in 0..3 {
        let errors = store_errors(&budget);
        clock.advance(PROBE_INTERVAL);
        until_another_store_error(&budget, errors).await;
    }
    assert!(budget.flush().await.is_err(), "Redis is down");
    assert_eq!(
        budget.pending_deposits(),
        700,
        "the failed flushes are kept, not lost"
    );
    assert!(budget.in_fallback());

    // Back on the same port, empty (the harness saves nothing); the 300 come back from this
    // worker's memory of the hash with the first call that reaches it (lua/README.md, "Lost
    // budgets"), the 700 kept ride with it.
    server_off = tokio::task::spawn_blocking(move || {
        server_off.restart();
        server_off
    })
    .await
    .unwrap();
    let server = server_off;
    // The background flusher alone delivers them, once, exactly.
    until_flushed_after_restart(&server, &budget, &clock, "mail", 1000).await;
    assert_eq!(budget.pending_deposits(), 0);
    eventually("the budget leaves the fallback", PATIENCE, async || {
        !budget.in_fallback()
    })
    .await;
    assert_eq!(
        totals(&status(&server, &budget, "mail").await).0,
        1000,
        "sent once, not lost, not doubled"
    );
    budget.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_over_1000_jobs_per_second_a_job_costs_at_most_a_hundredth_of_a_round_trip() {
    let server = RedisServer::start();
    let _: String = server.cmd(&["CONFIG", "RESETSTAT"]);
    let budget = FleetBudget::from_config(&config(
        &server,
        Duration::from_millis(100),
        Duration::from_secs(1),
    ))
    .await
    .unwrap();
    // 20 successful jobs every 10 ms (2,000 jobs/s nominal) for 1.5 s, on one dependency.
    let jobs = 3000u64;
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut done = 0;
    while done < jobs {
        tick.tick().await;
        for _ in 0..20 {
            budget.on_success("search").await.unwrap();
        }
        done += 20;
    }
    let elapsed = started.elapsed();
    budget.shutdown().await.unwrap();
    #[allow(clippy::cast_precision_loss)]
    let rate = jobs as f64 / elapsed.as_secs_f64();
    let calls = server.command_calls();
    let trips = RedisServer::client_round_trips(&calls);
    #[allow(clippy::cast_precision_loss)]
    let per_job = trips as f64 / jobs as f64;
    eprintln!(
        "coalescing: {jobs} jobs at {rate:.0} jobs/s, {trips} round trips, {per_job:.4} per job: {calls:?}"
    );
    assert!(rate >= 1000.0, "the test ran at {rate:.0} jobs/s");
    assert!(
        per_job <= 0.01,
        "{per_job:.4} round trips per job: {calls:?}"
    );
    assert_eq!(
        totals(&status(&server, &budget, "search").await).0,
        jobs,
        "and every job was counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_that_timed_out_on_a_paused_redis_is_not_counted_twice() {
    let server = RedisServer::start();
    let budget = FleetBudget::from_config(&config(
        &server,
        Duration::from_secs(10),
        Duration::from_millis(50),
    ))
    .await
    .unwrap();
    budget.on_success("search").await.unwrap();
    budget.flush().await.unwrap();
    // Redis holds every command for 500 ms (CLIENT UNPAUSE too, on this Redis): the flush times
    // out, but its request is already in the server's socket and runs when the pause ends.
    let _: String = server.cmd(&["CLIENT", "PAUSE", "500", "ALL"]);
    for _ in 0..99 {
        budget.on_success("search").await.unwrap();
    }
    let e = budget.flush().await.unwrap_err();
    assert!(e.is_timeout(), "{e}");
    eventually(
        "the held flush runs when the pause ends",
        PATIENCE,
        async || totals(&status(&server, &budget, "search").await).0 == 100,
    )
    .await;
    budget.flush().await.unwrap();
    assert_eq!(
        totals(&status(&server, &budget, "search").await).0,
        100,
        "applied once, not sent again"
    );
    assert_eq!(budget.pending_deposits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deposits_pending_for_longer_than_a_window_are_dropped_not_credited_to_the_current_one() {
    let mut server = RedisServer::start();
    let mut config = config(&server, Duration::from_millis(50), OUTAGE_DEADLINE);
    config.defaults.window = Duration::from_secs(2);
    let clock = ManualClock::new(1_800_000_000_000);
    let budget = budget_on_clock(&config, &clock);
    server = tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap();
    for _ in 0..500 {
        budget.on_success("search").await.unwrap();
    }
    until_another_store_error(&budget, 0).await;
    // A long outage: these 500 are now older than the window. Sent after it, they would all
    // land in the current server window and inflate the allowance.
    clock.advance(Duration::from_millis(2300));
    let errors = store_errors(&budget);
    for _ in 0..200 {
        budget.on_success("search").await.unwrap();
    }
    // The flusher tries the dead store again (the moved clock opened the probe) and keeps these.
    until_another_store_error(&budget, errors).await;
    assert_eq!(
        budget.pending_deposits(),
        200,
        "only the last window's deposits are kept"
    );
    server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    until_flushed_after_restart(&server, &budget, &clock, "search", 200).await;
    assert_eq!(budget.pending_deposits(), 0);
}

/// Regression: without coalescing (`deposit_flush_ms = 0`) there is no flusher, so deposits kept
/// back while Redis was down waited for an explicit `flush()`. The next deposit that reaches
/// Redis now carries them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_coalescing_deposits_kept_during_an_outage_ride_with_the_next_one() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new(1_800_000_000_000);
    let budget = budget_on_clock(&config(&server, Duration::ZERO, OUTAGE_DEADLINE), &clock);
    budget.on_success("search").await.unwrap();
    server.stop();
    for _ in 0..5 {
        budget.on_success("search").await.unwrap();
    }
    assert_eq!(budget.pending_deposits(), 5, "kept while Redis is down");
    let mut server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    // Within the probe interval the store is not tried: the next success is kept too.
    until_store_answers(&budget, "search").await;
    budget.on_success("search").await.unwrap();
    assert_eq!(budget.pending_deposits(), 6);
    // Past it, the next success reaches Redis and takes the kept ones along. (The restarted
    // server is empty: the one success from before the outage comes back from this worker's
    // memory of the hash, lua/README.md, "Lost budgets".)
    clock.advance(PROBE_INTERVAL);
    budget.on_success("search").await.unwrap();
    assert_eq!(budget.pending_deposits(), 0, "kept deposits sent");
    assert_eq!(
        totals(&status(&server, &budget, "search").await).0,
        8,
        "the 6 kept deposits arrived with the later one, each once (and the one restored)"
    );
    server.stop();
}
