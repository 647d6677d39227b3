//! The infrastructure as it really is (issue 33, items 2, 3 and 7): a budget hash lost in Redis
//! mid-window, on real, private `redis-server`s with `maxmemory 8mb`.
//!
//! - Under `volatile-lru` and `allkeys-lru`, a cache on the same Redis fills memory (keys with a
//!   TTL, until about 30,000 are evicted). An operator's freeze holds (20 asked, 0 granted), and
//!   an exhausted budget grants no more than the written bound (`docs/semantics.md`, "Lost
//!   budgets"): the retries the fleet granted that the first worker to call after the loss had
//!   not seen.
//! - Under `noeviction` with memory full, every script that writes fails with `OOM`: the
//!   decisions come from the fallback, counted under `kind="oom"`, and from Redis again once
//!   memory frees.
//! - `FLUSHALL`, `SCRIPT FLUSH` and a restart without persistence during a retry storm: scripts
//!   reload, the freeze holds, extra grants stay within the bound, and the loss is counted.
//!
//! Each test prints its accounting (grants, bound, evicted keys); `docs/RELIABILITY.md` records
//! the figures.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::time::Duration;

use fleet_budget::control::{AuditLog, OverrideAction, overrides};
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{BudgetSource, Config, Decision, Dependency, Failure, FleetBudget};

const PREFIX: &str = "fbe";
/// The floor of both dependencies; no deposits, so the allowance is the floor.
const FLOOR: u64 = 10;

fn config(server: &RedisServer) -> Config {
    let text = format!(
        "[redis]\nurl = \"{}\"\ntimeout_ms = 5000\nkey_prefix = \"{PREFIX}\"\n\
         deposit_flush_ms = 0\ndeny_cache_ms = 0\nheartbeat_ms = 0\n\
         [dependencies.mail]\ntasks = [\"send\"]\nwindow_secs = 600\nmin_allowance = {FLOOR}\n\
         [dependencies.search]\ntasks = [\"index\"]\nwindow_secs = 600\nmin_allowance = {FLOOR}\n",
        server.url()
    );
    Config::from_toml(&text, "test").unwrap()
}

fn dep(name: &str) -> Dependency {
    Dependency::new(name).unwrap()
}

fn key(name: &str) -> String {
    format!("{PREFIX}:v1:{{{name}}}")
}

async fn worker(server: &RedisServer) -> FleetBudget {
    FleetBudget::from_config(&config(server)).await.unwrap()
}

fn source(decision: &Decision) -> BudgetSource {
    match decision {
        Decision::Retry { source, .. } | Decision::DeadLetter { source, .. } => *source,
    }
}

/// Asks `n` retries of `task` (each a first failure): how many were granted, and the sources.
async fn ask(budget: &FleetBudget, task: &str, n: u64) -> (u64, Vec<BudgetSource>) {
    let mut granted = 0;
    let mut sources = Vec::new();
    for _ in 0..n {
        let d = budget
            .on_failure(task, 1, &Failure::retryable("503"))
            .await
            .unwrap();
        granted += u64::from(d.is_retry());
        sources.push(source(&d));
    }
    (granted, sources)
}

async fn freeze(server: &RedisServer, name: &str) {
    let operator = RedisStore::new(
        RedisTarget::Single(server.url()),
        PREFIX,
        Duration::from_secs(5),
    )
    .unwrap();
    overrides::apply(
        &operator,
        &AuditLog::default(),
        &dep(name),
        OverrideAction::Freeze {
            duration: Duration::from_secs(3600),
        },
        "ops",
        "incident",
    )
    .await
    .unwrap();
}

fn info_field(server: &RedisServer, section: &str, field: &str) -> u64 {
    let info: String = server.cmd(&["INFO", section]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd::<i64>(&["EXISTS", key]) == 1
}

/// A cache on the same Redis: keys with a TTL, 1 KiB each, written until at least `evictions`
/// keys were evicted and none of `gone` exists any more (at most 2,000,000 writes). Returns
/// the keys written and evicted.
fn fill_cache(server: &RedisServer, evictions: u64, gone: &[String]) -> (u64, u64) {
    let mut connection = server.connection().unwrap();
    let value = "x".repeat(1024);
    let mut written = 0u64;
    loop {
        let mut pipe = redis::pipe();
        for _ in 0..1000 {
            pipe.cmd("SET")
                .arg(format!("cache:{written}"))
                .arg(&value)
                .arg("EX")
                .arg(3600)
                .ignore();
            written += 1;
        }
        let _: () = pipe.query(&mut connection).unwrap();
        let evicted = info_field(server, "stats", "evicted_keys");
        if (evicted >= evictions && gone.iter().all(|k| !exists(server, k))) || written >= 2_000_000
        {
            return (written, evicted);
        }
    }
}

/// Two workers exhaust `search` (A grants 5, B the other 5 and is denied once: B saw every
/// grant, A half of them); `mail` is frozen and A has seen the freeze (one denial).
async fn before_the_loss(server: &RedisServer, a: &FleetBudget, b: &FleetBudget) {
    freeze(server, "mail").await;
    let (granted, _) = ask(a, "send", 1).await;
    assert_eq!(granted, 0, "frozen");
    assert_eq!(ask(a, "index", 5).await.0, 5);
    assert_eq!(ask(b, "index", 6).await.0, 5, "the floor is spent");
}

async fn eviction(policy: &str) {
    let server =
        RedisServer::start_with(&["--maxmemory", "8mb", "--maxmemory-policy", policy], &[]);
    let a = worker(&server).await;
    let b = worker(&server).await;
    before_the_loss(&server, &a, &b).await;
    let frozen_ttl: i64 = server.cmd(&["PTTL", &key("mail")]);
    assert_eq!(
        frozen_ttl, -1,
        "a hash with an override in force has no TTL"
    );

    // Under volatile-*, only keys with a TTL go: the exhausted budget's hash, not the frozen
    // one. Under allkeys-*, both.
    let gone: Vec<String> = if policy.starts_with("volatile") {
        vec![key("search")]
    } else {
        vec![key("search"), key("mail")]
    };
    let (written, evicted) = fill_cache(&server, 30_000, &gone);
    let mail_kept = exists(&server, &key("mail"));
    let search_kept = exists(&server, &key("search"));
    assert!(!search_kept, "the exhausted budget's hash was evicted");
    assert!(evicted >= 30_000, "{evicted} evicted");
    if policy.starts_with("volatile") {
        assert!(mail_kept, "volatile-*: a hash without TTL is never evicted");
    } else {
        assert!(!mail_kept, "allkeys-*: evicted too");
    }

    // The frozen dependency: a worker that never saw the freeze (a new process) under
    // volatile-* (the hash is still there), the worker that saw it under allkeys-* (it restores
    // the freeze from memory).
    let fresh = worker(&server).await;
    let asker = if mail_kept { &fresh } else { &a };
    let (frozen_granted, _) = ask(asker, "send", 20).await;
    // The exhausted budget: A, which saw 5 of the 10 grants, asks first; then B, which saw all.
    let (a_granted, a_sources) = ask(&a, "index", 20).await;
    let (b_granted, _) = ask(&b, "index", 20).await;
    let extra = a_granted + b_granted;
    // The bound (docs/semantics.md, "Lost budgets"): the retries the fleet had granted in the
    // window that the first worker to call after the loss had not seen.
    let bound = 10 - 5;
    let lost_a =
        a.metrics().counter("budget_lost", "search") + a.metrics().counter("budget_lost", "mail");
    let lost_b = b.metrics().counter("budget_lost", "search");
    println!(
        "eviction accounting ({policy}, maxmemory 8mb): cache keys written {written}, evicted \
         {evicted}; frozen hash kept {mail_kept}, exhausted hash kept {search_kept}; frozen \
         dependency: asked 20, granted {frozen_granted}; exhausted budget (floor {FLOOR}, 10 \
         granted before): asked 40 after, granted {extra} (A {a_granted}, B {b_granted}), bound \
         {bound}; losses counted: A {lost_a}, B {lost_b}"
    );
    assert_eq!(frozen_granted, 0, "the operator's freeze holds");
    assert!(extra <= bound, "{extra} extra grants, bound {bound}");
    assert!(
        a_sources.iter().all(|s| *s == BudgetSource::Fleet),
        "decided by Redis"
    );
    assert!(
        lost_a >= 1 && lost_b >= 1,
        "each worker counts the loss it found"
    );
    if !mail_kept {
        assert_eq!(a.metrics().counter("budget_lost", "mail"), 1);
    }
    // The hash restored says what it holds: the freeze with its end, the retries counted.
    let fu: Option<String> = server.cmd(&["HGET", &key("mail"), "fu"]);
    assert!(fu.is_some(), "the freeze is in the hash again");
    let cr: String = server.cmd(&["HGET", &key("search"), "cr"]);
    assert_eq!(
        cr, "10",
        "the window's retries, restored and spent again up to the floor"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freeze_holds_and_an_exhausted_budget_stays_within_the_bound_under_volatile_lru() {
    eviction("volatile-lru").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freeze_holds_and_an_exhausted_budget_stays_within_the_bound_under_allkeys_lru() {
    eviction("allkeys-lru").await;
}

/// What a worker older than 0.2.0 (no memory) got, for comparison: the figures of the issue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_memory_a_lost_hash_grants_its_floor_again() {
    let server = RedisServer::start_with(
        &["--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru"],
        &[],
    );
    let a = worker(&server).await;
    let b = worker(&server).await;
    before_the_loss(&server, &a, &b).await;
    let (written, evicted) = fill_cache(&server, 30_000, &[key("search"), key("mail")]);
    let fresh = worker(&server).await;
    let (frozen_granted, _) = ask(&fresh, "send", 20).await;
    let (granted, _) = ask(&fresh, "index", 20).await;
    println!(
        "without memory (a new process; allkeys-lru): cache keys written {written}, evicted \
         {evicted}; frozen dependency: asked 20, granted {frozen_granted}; exhausted budget: \
         asked 20, granted {granted}"
    );
    assert_eq!(
        (frozen_granted, granted),
        (FLOOR, FLOOR),
        "nothing remembered, nothing restored: the documented limit"
    );
}

/// Keys without a TTL, 1 KiB each, written until Redis refuses one with `OOM` (under
/// `noeviction`). Returns how many were written.
fn fill_until_oom(server: &RedisServer) -> u64 {
    let mut connection = server.connection().unwrap();
    let value = "x".repeat(1024);
    for written in 0..1_000_000u64 {
        let result: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("cache:{written}"))
            .arg(&value)
            .query(&mut connection);
        if let Err(e) = result {
            assert_eq!(e.code(), Some("OOM"), "{e}");
            // At the limit, buffers that shrink let the next write through now and then; a
            // limit just under what is used holds memory full until keys go.
            let used = info_field(server, "memory", "used_memory");
            let _: () = server.cmd(&[
                "CONFIG",
                "SET",
                "maxmemory",
                &(used - 256 * 1024).to_string(),
            ]);
            return written;
        }
    }
    panic!("memory never filled");
}

/// Item 3: under `noeviction` with memory full every script that writes fails with `OOM`. The
/// decisions come from the fallback, the failures are counted as `oom`, and Redis decides
/// again once memory frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_memory_decides_from_the_fallback_named_oom_and_comes_back() {
    let server = RedisServer::start_with(
        &["--maxmemory", "8mb", "--maxmemory-policy", "noeviction"],
        &[],
    );
    let a = worker(&server).await;
    freeze(&server, "mail").await;
    assert_eq!(ask(&a, "index", 3).await.0, 3, "Redis decides");
    assert_eq!(ask(&a, "send", 1).await.0, 0, "frozen");
    let written = fill_until_oom(&server);
    let (granted, sources) = ask(&a, "index", 20).await;
    let oom = a.metrics().store_errors("oom");
    let fallback = sources
        .iter()
        .filter(|s| **s == BudgetSource::LocalFallback)
        .count();
    let (mail_in_oom, _) = ask(&a, "send", 20).await;
    // Nothing was written meanwhile: the window's three grants are all Redis holds.
    let cr: String = server.cmd(&["HGET", &key("search"), "cr"]);
    println!(
        "full memory (noeviction, maxmemory 8mb): cache keys written {written} until OOM; asked \
         20: {fallback} decided by the fallback (local), granted {granted} (the local budget's \
         floor {FLOOR}); frozen dependency asked 20, granted {mail_in_oom}; store errors \
         counted oom {oom}; Redis's retries counter {cr}"
    );
    assert_eq!(
        mail_in_oom, 0,
        "the freeze this worker saw holds in the fallback"
    );
    assert_eq!(
        fallback, 20,
        "every decision from the fallback: {sources:?}"
    );
    assert!(oom >= 1, "counted as oom");
    assert_eq!(
        a.metrics().store_errors("server"),
        0,
        "named oom, not server"
    );
    assert!(granted <= FLOOR, "the local fallback's floor");
    assert_eq!(cr, "3", "nothing written while memory is full");

    // Memory frees (the cache goes): Redis decides again, the freeze included.
    let mut connection = server.connection().unwrap();
    for start in (0..written).step_by(1000) {
        let mut pipe = redis::pipe();
        for k in start..(start + 1000).min(written) {
            pipe.cmd("UNLINK").arg(format!("cache:{k}")).ignore();
        }
        let _: () = pipe.query(&mut connection).unwrap();
    }
    fleet_budget::testing::eventually("Redis decides again", Duration::from_secs(10), async || {
        source(
            &a.on_failure("send", 1, &Failure::retryable("503"))
                .await
                .unwrap(),
        ) == BudgetSource::Fleet
    })
    .await;
    let (mail_granted, mail_sources) = ask(&a, "send", 5).await;
    assert_eq!(mail_granted, 0, "the freeze holds again");
    assert!(mail_sources.iter().all(|s| *s == BudgetSource::Fleet));
    fleet_budget::testing::eventually(
        "Redis decides search again",
        Duration::from_secs(10),
        async || {
            source(
                &a.on_failure("index", 1, &Failure::retryable("503"))
                    .await
                    .unwrap(),
            ) == BudgetSource::Fleet
        },
    )
    .await;
    assert!(!a.in_fallback(), "every dependency back on Redis");
}

/// Item 7: state lost in Redis during a retry storm (three workers asking in a loop): FLUSHALL,
/// SCRIPT FLUSH, then a restart without persistence. Scripts reload, the freeze holds on every
/// decision (Redis's, and the fallback's during the restart), the exhausted budget's grants stay within the written bound, and the
/// losses are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flushall_script_flush_and_a_restart_during_a_storm_stay_within_the_bound() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    #[derive(Default)]
    struct Tally {
        decisions: AtomicU64,
        search_fleet: AtomicU64,
        search_fallback: AtomicU64,
        mail_fleet: AtomicU64,
        mail_fallback: AtomicU64,
    }

    let mut server = RedisServer::start();
    let workers: Vec<Arc<FleetBudget>> = vec![
        Arc::new(worker(&server).await),
        Arc::new(worker(&server).await),
        Arc::new(worker(&server).await),
    ];
    freeze(&server, "mail").await;
    for w in &workers {
        assert_eq!(ask(w, "send", 1).await.0, 0, "every worker sees the freeze");
    }
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let storm: Vec<_> = workers
        .iter()
        .map(|w| {
            let (w, tally, stop) = (Arc::clone(w), Arc::clone(&tally), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    for (task, fleet, fallback) in [
                        ("index", &tally.search_fleet, &tally.search_fallback),
                        ("send", &tally.mail_fleet, &tally.mail_fallback),
                    ] {
                        let d = w
                            .on_failure(task, 1, &Failure::retryable("503"))
                            .await
                            .unwrap();
                        if d.is_retry() {
                            match source(&d) {
                                BudgetSource::Fleet => fleet.fetch_add(1, Ordering::Relaxed),
                                _ => fallback.fetch_add(1, Ordering::Relaxed),
                            };
                        }
                    }
                    tally.decisions.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    // Each step waits for the storm to make 300 more rounds of decisions (counts, not time).
    let progress = async |tally: &Tally| {
        let from = tally.decisions.load(Ordering::Relaxed);
        fleet_budget::testing::eventually(
            "the storm goes on",
            Duration::from_secs(60),
            async || tally.decisions.load(Ordering::Relaxed) >= from + 300,
        )
        .await;
    };
    progress(&tally).await;
    let before = tally.search_fleet.load(Ordering::Relaxed);
    let _: () = server.cmd(&["FLUSHALL"]);
    progress(&tally).await;
    let loads_before = server
        .command_calls()
        .get("script|load")
        .copied()
        .unwrap_or(0);
    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    progress(&tally).await;
    let loads_after = server
        .command_calls()
        .get("script|load")
        .copied()
        .unwrap_or(0);
    tokio::task::block_in_place(|| server.restart());
    progress(&tally).await;
    stop.store(true, Ordering::Relaxed);
    for task in storm {
        task.await.unwrap();
    }

    let search_fleet = tally.search_fleet.load(Ordering::Relaxed);
    let search_fallback = tally.search_fallback.load(Ordering::Relaxed);
    let mail_fleet = tally.mail_fleet.load(Ordering::Relaxed);
    let mail_fallback = tally.mail_fallback.load(Ordering::Relaxed);
    let lost: u64 = workers
        .iter()
        .map(|w| w.metrics().counter("budget_lost", "search"))
        .sum();
    let server_errors: u64 = workers
        .iter()
        .map(|w| w.metrics().store_errors("server"))
        .sum();
    // The bound (docs/semantics.md, "Lost budgets"): the window's allowance, plus, per loss
    // (FLUSHALL, the restart; SCRIPT FLUSH loses no state), the retries the first worker to
    // call after it had not seen (at most one allowance); the fallback's slack apart.
    let losses = 2;
    let bound = FLOOR * (1 + losses);
    let fallback_bound = FLOOR * workers.len() as u64;
    println!(
        "state lost during a storm (3 workers, floor {FLOOR}, {} rounds): exhausted budget \
         granted by Redis {search_fleet} (bound {bound}: {before} before FLUSHALL), by the \
         fallback during the restart {search_fallback} (bound {fallback_bound}); frozen \
         dependency granted by Redis {mail_fleet}, by the fallback {mail_fallback}; losses \
         counted {lost}; scripts loaded again after SCRIPT FLUSH {}; server errors {server_errors}",
        tally.decisions.load(Ordering::Relaxed),
        loads_after - loads_before,
    );
    assert_eq!(before, FLOOR, "the storm spent the floor before the loss");
    assert!(search_fleet <= bound, "{search_fleet} > {bound}");
    assert!(search_fallback <= fallback_bound);
    assert_eq!(
        mail_fleet, 0,
        "the freeze holds on every decision Redis makes"
    );
    assert_eq!(mail_fallback, 0, "and on every decision the fallback makes");
    assert!(
        lost >= losses,
        "each loss counted by a worker that found it"
    );
    assert!(
        loads_after > loads_before,
        "NOSCRIPT: the scripts were loaded again"
    );
    assert_eq!(server_errors, 0, "no decision failed for a missing script");
}

/// An open circuit breaker has no TTL while it is open: under `volatile-lru` a cache filling
/// memory evicts the closed state's keys around it, not the breaker, which stays open (no call
/// goes through to the failing dependency). Under `allkeys-lru` it goes, and comes back closed:
/// the documented bound (`docs/semantics.md`, "Lost budgets": at most `min_volume` calls per loss).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_stays_open_under_volatile_lru_and_comes_back_closed_under_allkeys_lru() {
    use std::sync::Arc;

    use fleet_budget::breaker::{Breaker, BreakerPolicy, BreakerState, Verdict};

    for policy in ["volatile-lru", "allkeys-lru"] {
        let server =
            RedisServer::start_with(&["--maxmemory", "8mb", "--maxmemory-policy", policy], &[]);
        let store = RedisStore::new(
            RedisTarget::Single(server.url()),
            PREFIX,
            Duration::from_secs(5),
        )
        .unwrap();
        let breaker = Breaker::new(Arc::new(store));
        let p = BreakerPolicy {
            window: Duration::from_secs(60),
            failure_ratio: 0.5,
            min_volume: 4,
            open: Duration::from_secs(3600),
            half_open_probes: 1,
            close_after: 1,
            probe_timeout: Duration::from_secs(60),
            max_wait: Duration::from_secs(60),
        }
        .checked()
        .unwrap();
        let search = dep("search");
        for _ in 0..4 {
            breaker.record(&search, &p, false, None).await.unwrap();
        }
        let key = format!("{PREFIX}:v1:{{search}}:cb");
        assert_eq!(
            breaker.status(&search, &p).await.unwrap().state,
            BreakerState::Open
        );
        assert_eq!(server.cmd::<i64>(&["PTTL", &key]), -1, "no TTL while open");
        let gone = if policy == "allkeys-lru" {
            vec![key.clone()]
        } else {
            Vec::new()
        };
        let (written, evicted) = fill_cache(&server, 30_000, &gone);
        let kept = exists(&server, &key);
        let verdict = breaker.admit(&search, &p).await.unwrap().verdict;
        println!(
            "open breaker ({policy}, maxmemory 8mb): cache keys written {written}, evicted \
             {evicted}; breaker kept {kept}; next call: {verdict:?}"
        );
        if policy == "volatile-lru" {
            assert!(kept, "volatile-*: a key without TTL is never evicted");
            assert!(matches!(verdict, Verdict::Wait), "still open: {verdict:?}");
        } else {
            assert!(!kept);
            assert!(
                matches!(verdict, Verdict::Run),
                "comes back closed: {verdict:?}"
            );
        }
    }
}

/// A worker that saw its breaker open and finds it closed before the open period ended (its key
/// evicted under `allkeys-lru`) says so: `fleet_budget_breaker_transitions_total{to="lost"}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_lost_while_open_is_counted() {
    use fleet_budget::{Admission, CallOutcome};

    let server = RedisServer::start_with(
        &["--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru"],
        &[],
    );
    let text = format!(
        "[redis]\nurl = \"{}\"\ntimeout_ms = 5000\nkey_prefix = \"{PREFIX}\"\nheartbeat_ms = 0\n\
         [dependencies.search]\ntasks = [\"index\"]\n[dependencies.search.breaker]\n\
         min_volume = 4\nfailure_ratio = 0.5\nopen_secs = 3600\n",
        server.url()
    );
    let budget = FleetBudget::from_config(&Config::from_toml(&text, "test").unwrap())
        .await
        .unwrap();
    for _ in 0..4 {
        match budget.admit("index", 1, None).await.unwrap() {
            Admission::Run(call) => budget.finish(call, CallOutcome::Failed).await,
            other => panic!("{other:?}"),
        }
    }
    assert!(
        matches!(
            budget.admit("index", 1, None).await.unwrap(),
            Admission::Wait(_)
        ),
        "open"
    );
    let key = format!("{PREFIX}:v1:{{search}}:cb");
    let (written, evicted) = fill_cache(&server, 30_000, std::slice::from_ref(&key));
    let after = budget.admit("index", 1, None).await.unwrap();
    let lost = budget.metrics().breaker_transitions("search", "lost");
    println!(
        "breaker lost while open (allkeys-lru): cache keys written {written}, evicted {evicted}; \
         next call runs {}; counted lost {lost}",
        matches!(after, Admission::Run(_))
    );
    assert!(
        matches!(after, Admission::Run(_)),
        "closed again: {after:?}"
    );
    assert_eq!(lost, 1);
    if let Admission::Run(call) = after {
        budget.finish(call, CallOutcome::Succeeded).await;
    }
}

/// The contract of the optional memory arguments (`lua/README.md`, "Lost budgets"), on the raw
/// scripts: a caller without them gets the reply it always got (17 fields, and `next_grant_ms`
/// for a spend), one with them six more; a malformed memory is refused by name and writes
/// nothing; `spend_batch.lua` takes six or eight arguments per entry, nothing else.
#[test]
fn memory_arguments_are_optional_and_checked() {
    use fleet_budget::store::{DEPOSIT_SCRIPT, SPEND_BATCH_SCRIPT, SPEND_SCRIPT};
    use redis::Value;

    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    let policy = ["60000", "0.2", "2", "s", "sliding"];
    let run = |c: &mut redis::Connection, script: &redis::Script, key: &str, args: &[&str]| {
        let mut invocation = script.key(key);
        for a in args {
            invocation.arg(*a);
        }
        invocation.invoke::<Value>(c)
    };
    let len = |v: &Value| match v {
        Value::Array(a) => a.len(),
        other => panic!("{other:?}"),
    };
    let old = run(&mut c, &SPEND_SCRIPT, "fbe:v1:{a}", &policy).unwrap();
    assert_eq!(len(&old), 18, "an older caller's reply");
    let mut with = policy.to_vec();
    with.extend(["", ""]);
    let new = run(&mut c, &SPEND_SCRIPT, "fbe:v1:{a}", &with).unwrap();
    assert_eq!(len(&new), 24, "six more fields");
    let deposit_old = run(
        &mut c,
        &DEPOSIT_SCRIPT,
        "fbe:v1:{a}",
        &["60000", "1", "0", "0.2", "2", "s", "sliding"],
    )
    .unwrap();
    assert_eq!(len(&deposit_old), 17);
    let deposit_new = run(
        &mut c,
        &DEPOSIT_SCRIPT,
        "fbe:v1:{a}",
        &["60000", "1", "0", "0.2", "2", "s", "sliding", "0", "", ""],
    )
    .unwrap();
    assert_eq!(len(&deposit_new), 23);

    let before: std::collections::BTreeMap<String, String> = server.cmd(&["HGETALL", "fbe:v1:{a}"]);
    for (memory, named) in [
        (["x", ""], "ARGV[6] birth"),
        (["1", "1,2,3"], "ARGV[7] memory"),
        (["1", "0,0,,,60000,1,0,0,0,0,0,0,0,-1"], "ARGV[7] memory"),
        (["1", "0,0,abc,,60000,1,0,0,0,0,0,0,0,0"], "ARGV[7] memory"),
    ] {
        let mut args = policy.to_vec();
        args.extend(memory);
        let e = run(&mut c, &SPEND_SCRIPT, "fbe:v1:{a}", &args).unwrap_err();
        assert!(e.to_string().contains(named), "{memory:?}: {e}");
    }
    let after: std::collections::BTreeMap<String, String> = server.cmd(&["HGETALL", "fbe:v1:{a}"]);
    assert_eq!(before, after, "a refused memory writes nothing");

    let mut batch = SPEND_BATCH_SCRIPT.prepare_invoke();
    batch.key("fbe:v1:{a}").key("fbe:v1:{b}");
    for _ in 0..2 {
        batch
            .arg("60000")
            .arg(1)
            .arg("0.2")
            .arg(2)
            .arg("s")
            .arg("sliding")
            .arg("")
            .arg("");
    }
    let replies: Vec<Value> = batch.invoke(&mut c).unwrap();
    assert!(replies.iter().all(|r| len(r) == 24), "{replies:?}");
    let mut seven = SPEND_BATCH_SCRIPT.prepare_invoke();
    seven.key("fbe:v1:{a}");
    for a in ["60000", "1", "0.2", "2", "s", "sliding", ""] {
        seven.arg(a);
    }
    assert!(seven.invoke::<Value>(&mut c).is_err(), "6 or 8 per entry");
}

/// Concurrency leases are not restored (they would only hold slots), but a worker that gives
/// back a lease gone from Redis before its expiry (`FLUSHALL` here; an eviction alike) says so:
/// `fleet_budget_leases_lost_total`. A lease given back in time counts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_before_its_expiry_is_counted() {
    use fleet_budget::{Admission, CallOutcome};

    let server = RedisServer::start();
    let text = format!(
        "[redis]\nurl = \"{}\"\ntimeout_ms = 5000\nkey_prefix = \"{PREFIX}\"\nheartbeat_ms = 0\n\
         [dependencies.paid-api]\ntasks = [\"charge\"]\n[dependencies.paid-api.concurrency]\n\
         cap = 6\nplanned_primary = 6\nlease_secs = 600\n",
        server.url()
    );
    let budget = FleetBudget::from_config(&Config::from_toml(&text, "test").unwrap())
        .await
        .unwrap();
    let run = async || match budget.admit("charge", 1, None).await.unwrap() {
        Admission::Run(call) => call,
        other => panic!("{other:?}"),
    };
    let kept = run().await;
    budget.finish(kept, CallOutcome::Succeeded).await;
    assert_eq!(
        budget.metrics().leases_lost("paid-api"),
        0,
        "given back in time"
    );
    let (a, b) = (run().await, run().await);
    let _: () = server.cmd(&["FLUSHALL"]);
    budget.finish(a, CallOutcome::Succeeded).await;
    budget.finish(b, CallOutcome::Succeeded).await;
    let lost = budget.metrics().leases_lost("paid-api");
    println!("leases lost to FLUSHALL: 2 held, counted lost {lost}");
    assert_eq!(lost, 2);
}

/// The audit trail under eviction (issue 33): the stream has no TTL, so under `volatile-lru` a
/// cache filling memory never takes it; under `allkeys-lru` it goes whole, and the next entry
/// recorded starts a new trail marked `trail_started`, so a reader sees where the earlier
/// entries were lost (`docs/semantics.md`, "Lost budgets").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_trail_is_kept_under_volatile_lru_and_its_loss_is_marked_under_allkeys_lru() {
    use fleet_budget::control::AuditEntry;
    use fleet_budget::keys::audit_key;

    for policy in ["volatile-lru", "allkeys-lru"] {
        let server =
            RedisServer::start_with(&["--maxmemory", "8mb", "--maxmemory-policy", policy], &[]);
        let store = RedisStore::new(
            RedisTarget::Single(server.url()),
            PREFIX,
            Duration::from_secs(5),
        )
        .unwrap();
        let log = AuditLog::default();
        freeze(&server, "mail").await;
        for i in 0..4 {
            log.record(
                &store,
                &AuditEntry::new("ops", "replay", Some("search"), &format!("run {i}")),
            )
            .await
            .unwrap();
        }
        let before = log.read(&store, None, None, None, 100).await.unwrap();
        assert_eq!(before.len(), 5);
        assert_eq!(
            before.iter().filter(|e| e.trail_started).count(),
            1,
            "the first entry of a new trail says it started it"
        );
        assert!(before[0].trail_started, "the first, not another");

        let audit = audit_key(PREFIX);
        let gone: Vec<String> = if policy.starts_with("allkeys") {
            vec![audit.clone()]
        } else {
            Vec::new()
        };
        let (written, evicted) = fill_cache(&server, 30_000, &gone);
        let kept = exists(&server, &audit);
        log.record(
            &store,
            &AuditEntry::new("ops", "unfreeze", Some("mail"), "after the fill"),
        )
        .await
        .unwrap();
        let after = log.read(&store, None, None, None, 100).await.unwrap();
        let marked = after.iter().filter(|e| e.trail_started).count();
        println!(
            "{policy}: cache keys written {written}, evicted {evicted}; audit trail kept: {kept}; \
             entries before the fill 5, after one more write {}; entries marked trail_started \
             {marked} (the newest marked: {})",
            after.len(),
            after.last().is_some_and(|e| e.trail_started),
        );
        if policy.starts_with("volatile") {
            assert!(kept, "no TTL: volatile-lru does not take the trail");
            assert_eq!(after.len(), 6, "nothing lost");
            assert_eq!(marked, 1, "no new start");
        } else {
            assert!(!kept, "allkeys-lru took the trail (the fill waits for it)");
            assert_eq!(after.len(), 1, "the earlier entries are gone");
            assert!(
                after[0].trail_started,
                "the entry written after the loss says the trail started there"
            );
        }
    }
}

/// The overrides keeper (`fleet_budget::control::keeper`) in the process, pass by pass: a freeze
/// no worker saw, lost (`FLUSHALL`), is put back by a keeper whose Redis user may run
/// `override.lua`; one under the read-only user of `lua/README.md` may not, and counts the
/// failure under `reason="noperm"` instead of guessing, keeping its copy to try again every
/// pass, and logs it once, not once per pass.
#[tokio::test]
async fn the_keeper_puts_back_a_lost_freeze_and_counts_what_its_user_may_not() {
    use std::sync::Arc;

    use fleet_budget::control::Keeper;

    let server = RedisServer::start();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../lua/README.md"))
            .unwrap();
    let line = readme
        .lines()
        .find(|l| l.starts_with("ACL SETUSER fleet-readonly "))
        .unwrap()
        .replace(">CHANGE-ME", ">keeper-pw")
        .replace("~fb:v1:*", &format!("~{PREFIX}:v1:*"));
    let args: Vec<&str> = line.split_whitespace().collect();
    let ok: String = server.cmd(&args);
    assert_eq!(ok, "OK");
    let store = |url: String| {
        Arc::new(RedisStore::new(RedisTarget::Single(url), PREFIX, Duration::from_secs(5)).unwrap())
    };
    let readonly_url = format!(
        "redis://fleet-readonly:keeper-pw@127.0.0.1:{}",
        server.port()
    );
    let config = config(&server);
    let reader = Keeper::new(store(readonly_url), &config, "test").unwrap();
    let writer = Keeper::new(store(server.url()), &config, "test").unwrap();
    let registry = prometheus::Registry::new();
    reader.register(&registry).unwrap();

    captured::install();
    freeze(&server, "mail").await;
    assert_eq!(reader.pass().await.unwrap().kept, 1);
    assert_eq!(writer.pass().await.unwrap().kept, 1);
    let _: () = server.cmd(&["FLUSHALL"]);
    let mut refused = Vec::new();
    for _ in 0..3 {
        refused.push(reader.pass().await.unwrap());
    }
    let (noperm, error) = (
        restore_failures(&registry, "noperm"),
        restore_failures(&registry, "error"),
    );
    let logged = captured::count("could not be put back");
    assert!(
        !exists(&server, &key("mail")),
        "the read-only user wrote nothing"
    );
    let put_back = writer.pass().await.unwrap();
    let fresh = worker(&server).await;
    let (granted, _) = ask(&fresh, "send", 20).await;
    println!(
        "keeper passes after FLUSHALL: read-only user, 3 passes, restored {}, failures counted \
         noperm {noperm} error {error}, logged {logged} time(s), copies kept {}; operator's user \
         restored {}; a new worker then asked 20, granted {granted}",
        refused.iter().map(|p| p.restored).sum::<usize>(),
        refused[2].kept,
        put_back.restored
    );
    assert!(refused.iter().all(|p| p.restored == 0));
    assert!(
        refused.iter().all(|p| p.kept == 1),
        "the copy is kept to try again"
    );
    assert_eq!((noperm, error), (3.0, 0.0), "one refusal per pass, named");
    assert_eq!(logged, 1, "logged once, not once per pass");
    assert!(
        captured::count("reason=\"noperm\"") == 1 || captured::count("reason=noperm") == 1,
        "the log line names the reason"
    );
    assert_eq!(put_back.restored, 1);
    assert_eq!(granted, 0, "the freeze holds again");
}

/// `fleet_budget_overrides_restore_failures_total{reason}` of a keeper.
fn restore_failures(registry: &prometheus::Registry, reason: &str) -> f64 {
    registry
        .gather()
        .iter()
        .find(|f| f.name() == "fleet_budget_overrides_restore_failures_total")
        .and_then(|f| {
            f.get_metric()
                .iter()
                .find(|m| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == "reason" && l.value() == reason)
                })
                .map(|m| m.get_counter().get_value())
        })
        .unwrap()
}

/// A restore that fails for another reason than the user's rights is counted under
/// `reason="error"`: here full memory (`noeviction`), where `override.lua` is refused with `OOM`
/// at its first write. Once memory frees, the next pass puts the freeze back.
#[tokio::test]
async fn a_restore_refused_by_full_memory_is_counted_as_error_and_tried_again() {
    use std::sync::Arc;

    use fleet_budget::control::Keeper;

    let server = RedisServer::start_with(
        &["--maxmemory", "8mb", "--maxmemory-policy", "noeviction"],
        &[],
    );
    let store = RedisStore::new(
        RedisTarget::Single(server.url()),
        PREFIX,
        Duration::from_secs(5),
    )
    .unwrap();
    let keeper = Keeper::new(Arc::new(store), &config(&server), "test").unwrap();
    let registry = prometheus::Registry::new();
    keeper.register(&registry).unwrap();
    freeze(&server, "mail").await;
    assert_eq!(keeper.pass().await.unwrap().kept, 1);
    let written = fill_until_oom(&server);
    // The freeze lost (a DEL frees too little to let a write through).
    let _: () = server.cmd(&["DEL", &key("mail")]);
    let refused = keeper.pass().await.unwrap();
    let (noperm, error) = (
        restore_failures(&registry, "noperm"),
        restore_failures(&registry, "error"),
    );
    // Memory frees: the next pass puts it back.
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    let put_back = keeper.pass().await.unwrap();
    println!(
        "restore under full memory (noeviction; {written} cache keys until OOM): restored {}, \
         failures counted noperm {noperm} error {error}; after memory freed restored {}",
        refused.restored, put_back.restored
    );
    assert_eq!(refused.restored, 0);
    assert_eq!((noperm, error), (0.0, 1.0), "not a refusal of the user");
    assert_eq!(put_back.restored, 1);
    assert!(exists(&server, &key("mail")));
}

/// The log lines written on this thread (a global subscriber writes each event into a buffer of
/// the thread that emitted it, as in `crates/fleet-budget/tests/outage.rs`): a test on a
/// current-thread runtime reads its own lines only.
mod captured {
    use std::io::Write;
    use std::sync::Once;

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

    /// Starts capturing this thread's lines (from empty).
    pub(crate) fn install() {
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
    }

    /// How many of this thread's lines contain `needle`.
    pub(crate) fn count(needle: &str) -> usize {
        LOGS.with(|l| {
            String::from_utf8_lossy(&l.borrow())
                .lines()
                .filter(|l| l.contains(needle))
                .count()
        })
    }
}

/// Lost open breakers are counted, not silently dropped, and not put back (issue 33): the
/// keeper remembers an open breaker and, when `allkeys-lru` evicts its key before its open
/// period ended, counts it in `fleet_budget_breakers_lost_total{dependency}` and logs it once,
/// leaving the key gone (the next failures reopen it). A breaker whose open period had ended
/// before its key went is not counted: it would have half-opened anyway.
#[tokio::test]
async fn the_keeper_counts_an_open_breaker_lost_to_allkeys_lru_and_does_not_put_it_back() {
    use std::sync::Arc;

    use fleet_budget::breaker::{Breaker, BreakerState};
    use fleet_budget::control::Keeper;

    captured::install();
    let server = RedisServer::start_with(
        &["--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru"],
        &[],
    );
    let text = format!(
        "[redis]\nurl = \"{}\"\ntimeout_ms = 5000\nkey_prefix = \"{PREFIX}\"\nheartbeat_ms = 0\n\
         [dependencies.search]\ntasks = [\"index\"]\n[dependencies.search.breaker]\n\
         min_volume = 4\nfailure_ratio = 0.5\nopen_secs = 3600\n\
         [dependencies.mail]\ntasks = [\"send\"]\n[dependencies.mail.breaker]\n\
         min_volume = 4\nfailure_ratio = 0.5\nopen_secs = 1\n",
        server.url()
    );
    let config = Config::from_toml(&text, "test").unwrap();
    let store = Arc::new(
        RedisStore::new(
            RedisTarget::Single(server.url()),
            PREFIX,
            Duration::from_secs(5),
        )
        .unwrap(),
    );
    let keeper = Keeper::new(Arc::clone(&store), &config, "test").unwrap();
    let registry = prometheus::Registry::new();
    keeper.register(&registry).unwrap();
    let lost_series = |dependency: &str| {
        registry
            .gather()
            .iter()
            .find(|f| f.name() == "fleet_budget_breakers_lost_total")
            .and_then(|f| {
                f.get_metric()
                    .iter()
                    .find(|m| {
                        m.get_label()
                            .iter()
                            .any(|l| l.name() == "dependency" && l.value() == dependency)
                    })
                    .map(|m| m.get_counter().get_value())
            })
    };
    assert_eq!(lost_series("search"), Some(0.0), "a series from zero");

    // Both breakers open: search for an hour, mail for a second.
    let breaker = Breaker::new(Arc::clone(&store));
    for name in ["search", "mail"] {
        let policy = config.breakers[&dep(name)];
        for _ in 0..4 {
            breaker
                .record(&dep(name), &policy, false, None)
                .await
                .unwrap();
        }
        assert_eq!(
            breaker.status(&dep(name), &policy).await.unwrap().state,
            BreakerState::Open
        );
    }
    let seen = keeper.pass().await.unwrap();
    assert_eq!(seen.breakers_lost, 0, "both there");
    // Mail's open period ends (by the server's clock) before its key goes.
    let mail_policy = config.breakers[&dep("mail")];
    fleet_budget::testing::eventually(
        "mail's open period ends",
        Duration::from_secs(30),
        async || {
            let status = breaker.status(&dep("mail"), &mail_policy).await.unwrap();
            status.now_ms >= status.open_until_ms
        },
    )
    .await;

    let search_key = format!("{PREFIX}:v1:{{search}}:cb");
    let mail_key = format!("{PREFIX}:v1:{{mail}}:cb");
    let (written, evicted) = fill_cache(&server, 30_000, &[search_key.clone(), mail_key.clone()]);
    let found = keeper.pass().await.unwrap();
    let again = keeper.pass().await.unwrap();
    let search_lost = lost_series("search").unwrap();
    let mail_lost = lost_series("mail").unwrap_or(0.0);
    let logged = captured::count("an open circuit breaker vanished from Redis");
    let put_back = exists(&server, &search_key);
    println!(
        "open breakers under allkeys-lru (maxmemory 8mb): cache keys written {written}, evicted \
         {evicted}; keeper pass after the loss counted {} lost (search {search_lost}, mail, \
         whose open period had ended, {mail_lost}); next pass {}; warnings {logged}; search's \
         breaker put back {put_back}",
        found.breakers_lost, again.breakers_lost
    );
    assert_eq!(found.breakers_lost, 1, "search's, not mail's");
    assert_eq!(search_lost, 1.0);
    assert_eq!(mail_lost, 0.0, "an ended open period is not a loss");
    assert_eq!(again.breakers_lost, 0, "counted once, then forgotten");
    assert_eq!(logged, 1, "logged once");
    assert!(!put_back, "a breaker is not put back");

    // Lost again (reopened by failures, then flushed): counted, not logged again.
    let policy = config.breakers[&dep("search")];
    for _ in 0..4 {
        breaker
            .record(&dep("search"), &policy, false, None)
            .await
            .unwrap();
    }
    assert_eq!(keeper.pass().await.unwrap().breakers_lost, 0);
    let _: () = server.cmd(&["FLUSHALL"]);
    assert_eq!(keeper.pass().await.unwrap().breakers_lost, 1);
    assert_eq!(lost_series("search"), Some(2.0));
    assert_eq!(
        captured::count("an open circuit breaker vanished from Redis"),
        1,
        "once per breaker"
    );
}
