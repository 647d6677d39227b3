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
