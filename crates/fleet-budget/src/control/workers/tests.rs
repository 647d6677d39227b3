//! The registry against a private redis-server: written by real budgets, read by
//! [`fleet_workers`], hostile entries included.

use std::time::Duration;

use super::*;
use crate::FleetBudget;
use crate::config::Config;
use crate::keys::{workers_key, workers_seen_key};
use crate::testing::{RedisServer, eventually};

fn config(url: &str, heartbeat_ms: u64) -> Config {
    Config::from_toml(
        &format!(
            "[redis]\nurl = \"{url}\"\nheartbeat_ms = {heartbeat_ms}\ntimeout_ms = 1000\n\
             [dependencies.search]\ntasks = [\"find\"]\n[dependencies.mail]\ntasks = [\"send\"]\n"
        ),
        "t",
    )
    .unwrap()
}

fn reader(server: &RedisServer) -> RedisStore {
    RedisStore::new(
        crate::store::RedisTarget::Single(server.url()),
        "fb",
        Duration::from_secs(2),
    )
    .unwrap()
}

async fn find(store: &RedisStore, id: &str) -> Option<WorkerEntry> {
    let read = fleet_workers(store, 10_000).await.unwrap();
    read.workers.into_iter().find(|w| w.id == id)
}

/// A worker whose Redis user may touch the registry but not the budget of `search`: `search`
/// goes into its fallback, and its heartbeat, which never counts as a store failure, lands and
/// says so. Once Redis lets it decide again, the next beat says that too. `shutdown` takes it
/// out of the registry.
#[tokio::test]
async fn a_worker_denied_a_dependency_reports_its_fallback_and_leaves_on_shutdown() {
    let server = RedisServer::start();
    let _: String = server.cmd(&[
        "ACL",
        "SETUSER",
        "w",
        "on",
        ">pw",
        "resetkeys",
        "~fb:v1:workers:*",
        "+@all",
    ]);
    let url = server.url().replacen("redis://", "redis://w:pw@", 1);
    let budget = FleetBudget::from_config(&config(&url, 100)).await.unwrap();
    let id = budget.worker_id().unwrap().to_owned();
    let failure = crate::Failure::retryable("timed out");
    let _ = budget.on_failure("find", 1, &failure).await.unwrap();
    assert!(
        budget.in_fallback(),
        "NOPERM on fb:v1:{{search}} is a store failure"
    );
    let store = reader(&server);
    eventually(
        "the worker reports search in fallback",
        Duration::from_secs(10),
        async || {
            find(&store, &id).await.is_some_and(|w| {
                w.fallback.iter().any(|f| f.dependency == "search") && w.is_fresh()
            })
        },
    )
    .await;
    let w = find(&store, &id).await.unwrap();
    assert!(
        w.in_fallback() && !w.silent && w.unreadable.is_none(),
        "{w:?}"
    );
    assert_eq!(w.fallback.len(), 1, "mail was never asked: {w:?}");
    assert_eq!(
        (w.lang.as_deref(), w.interval_ms),
        (Some("rust"), Some(100))
    );
    assert_eq!(w.pid, Some(u64::from(std::process::id())));
    let read = fleet_workers(&store, 10_000).await.unwrap();
    assert_eq!(
        (read.reporting(), read.in_fallback(), read.silent()),
        (1, 1, 0)
    );
    assert_eq!(read.in_fallback_by_dependency().get("search"), Some(&1));

    // Redis lets the worker read `search` again: its next decision leaves the fallback.
    let _: String = server.cmd(&["ACL", "SETUSER", "w", "~fb:v1:*"]);
    tokio::time::sleep(crate::budget::PROBE_INTERVAL * 2).await;
    let _ = budget.on_failure("find", 1, &failure).await.unwrap();
    assert!(!budget.in_fallback());
    eventually(
        "the worker reports no fallback",
        Duration::from_secs(10),
        async || {
            find(&store, &id)
                .await
                .is_some_and(|w| w.is_fresh() && !w.in_fallback())
        },
    )
    .await;

    budget.shutdown().await.unwrap();
    assert_eq!(
        find(&store, &id).await,
        None,
        "shutdown leaves the registry"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        find(&store, &id).await,
        None,
        "and no beat lands after the leave"
    );
}

/// A budget that is dropped leaves the registry too (its task holds it only weakly); one in a
/// process that stops (here: its runtime, and so its task, gone without a word) turns silent.
#[tokio::test]
async fn a_dropped_budget_leaves_and_a_stopped_one_turns_silent() {
    let server = RedisServer::start();
    let store = reader(&server);
    let dropped = FleetBudget::from_config(&config(&server.url(), 100))
        .await
        .unwrap();
    let id = dropped.worker_id().unwrap().to_owned();
    eventually("the worker reports", Duration::from_secs(10), async || {
        find(&store, &id).await.is_some()
    })
    .await;
    drop(dropped);
    eventually(
        "the dropped worker leaves",
        Duration::from_secs(10),
        async || find(&store, &id).await.is_none(),
    )
    .await;

    let url = server.url();
    let (id_tx, id_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let stopped = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let budget = rt
            .block_on(FleetBudget::from_config(&config(&url, 100)))
            .unwrap();
        id_tx.send(budget.worker_id().unwrap().to_owned()).unwrap();
        stop_rx.recv().unwrap();
        rt.shutdown_background();
        drop(budget);
    });
    let id = id_rx.recv().unwrap();
    eventually(
        "the other worker reports",
        Duration::from_secs(10),
        async || find(&store, &id).await.is_some_and(|w| w.is_fresh()),
    )
    .await;
    stop_tx.send(()).unwrap();
    stopped.join().unwrap();
    eventually(
        "the stopped worker turns silent",
        Duration::from_secs(10),
        async || find(&store, &id).await.is_some_and(|w| w.silent),
    )
    .await;
    let w = find(&store, &id).await.unwrap();
    assert!(
        w.unreadable.is_none() && !w.is_fresh() && w.age_ms.unwrap() > 300,
        "{w:?}"
    );
    let read = fleet_workers(&store, 10_000).await.unwrap();
    assert_eq!((read.reporting(), read.silent()), (0, 1));
}

/// Whatever anyone wrote into the registry, it is read without a panic, each bad entry marked
/// and its text escaped; a value larger than any report is never fetched.
#[tokio::test]
async fn hostile_entries_are_read_and_marked() {
    let server = RedisServer::start();
    let (hash, seen) = (workers_key("fb"), workers_seen_key("fb"));
    let now: Vec<String> = server.cmd(&["TIME"]);
    let now_ms = now[0].parse::<u64>().unwrap() * 1000;
    let fresh = now_ms.to_string();
    let huge = "x".repeat(1 << 20);
    // Deeper than serde_json's recursion limit, within the size bound.
    let deep = "[".repeat(4000);
    let hostile_text = r#"{"v":1,"pid":1,"interval_ms":5000,"host":"<script>alert(1)</script>\u202e","lang":"r\u0000ust","fallback":[{"dependency":"sea\u200brch","for_ms":5},{"dependency":7},"x"],"fallback_more":18446744073709551615}"#;
    for (id, score, report) in [
        ("garbage", fresh.as_str(), "not json {"),
        ("deep", fresh.as_str(), deep.as_str()),
        ("huge", fresh.as_str(), huge.as_str()),
        ("array", fresh.as_str(), "[1,2]"),
        (
            "v2",
            fresh.as_str(),
            r#"{"v":2,"pid":1,"interval_ms":5000}"#,
        ),
        ("hostile\u{202e}<b>", fresh.as_str(), hostile_text),
        ("inf", "inf", r#"{"v":1,"pid":1,"interval_ms":5000}"#),
        ("future", "1e300", r#"{"v":1,"pid":1,"interval_ms":5000}"#),
        ("negative", "-5", r#"{"v":1,"pid":1,"interval_ms":5000}"#),
    ] {
        let _: u64 = server.cmd(&["ZADD", &seen, score, id]);
        let _: u64 = server.cmd(&["HSET", &hash, id, report]);
    }
    let _: u64 = server.cmd(&["ZADD", &seen, &fresh, "no-report"]);
    let read = fleet_workers(&reader(&server), 10_000).await.unwrap();
    assert_eq!(read.total, 10);
    assert!(!read.truncated);
    let by_id: BTreeMap<&str, &WorkerEntry> =
        read.workers.iter().map(|w| (w.id.as_str(), w)).collect();
    let why = |id: &str| by_id[id].unreadable.clone().unwrap_or_default();
    assert!(why("garbage").contains("not JSON"), "{}", why("garbage"));
    assert!(why("deep").contains("not JSON"), "{}", why("deep"));
    assert!(why("huge").contains("1048576 bytes"), "{}", why("huge"));
    assert!(why("array").contains("not a JSON object"));
    assert!(why("v2").contains("version 2"));
    assert!(why("no-report").contains("no report"));
    assert!(why("inf").contains("not a time") && by_id["inf"].silent);
    assert!(why("negative").contains("not a time"));
    assert!(why("future").contains("ahead") && by_id["future"].silent);
    let h = by_id["hostile\\u{202e}<b>"];
    assert!(h.unreadable.is_none() && h.is_fresh(), "{h:?}");
    assert_eq!(
        h.host.as_deref(),
        Some("<script>alert(1)</script>\\u{202e}")
    );
    assert_eq!(h.lang.as_deref(), Some("r\\u{0}ust"));
    assert_eq!(
        h.fallback,
        vec![FallbackEntry {
            dependency: "sea\\u{200b}rch".to_owned(),
            for_ms: 5
        }]
    );
    assert_eq!(h.fallback_more, u64::MAX, "saturated, not overflowed");
    assert_eq!(read.in_fallback(), 1, "only the readable, fresh one");
    // Bounded: a limit of 3 reads 3 and says so.
    let three = fleet_workers(&reader(&server), 3).await.unwrap();
    assert_eq!((three.workers.len(), three.truncated), (3, true));
    // A registry key of another type is an error, not a panic.
    let _: () = server.cmd(&["DEL", &seen]);
    let _: () = server.cmd(&["SET", &seen, "x"]);
    assert!(fleet_workers(&reader(&server), 10).await.is_err());
}

/// A beat prunes entries last seen longer ago than the retention, or ahead of it, 16 at most,
/// and both keys expire with the retention. The registry is no budget: discovery skips it.
#[tokio::test]
async fn a_beat_prunes_at_most_16_old_entries() {
    let server = RedisServer::start();
    let (hash, seen) = (workers_key("fb"), workers_seen_key("fb"));
    for i in 0..30 {
        let id = format!("old-{i}");
        let _: u64 = server.cmd(&["ZADD", &seen, "1", &id]);
        let _: u64 = server.cmd(&["HSET", &hash, &id, "{}"]);
    }
    let _: u64 = server.cmd(&["ZADD", &seen, "1e300", "ahead"]);
    let store = reader(&server);
    let beat = async || store.heartbeat_beat("me", "{}", 60_000).await.unwrap().1;
    assert_eq!(beat().await, 16);
    assert_eq!(
        beat().await,
        14 + 1,
        "the rest of the old ones, then the one ahead"
    );
    assert_eq!(beat().await, 0);
    let left: Vec<String> = server.cmd(&["ZRANGE", &seen, "0", "-1"]);
    assert_eq!(left, vec!["me"]);
    assert_eq!(server.cmd::<u64>(&["HLEN", &hash]), 1);
    let ttl: i64 = server.cmd(&["PTTL", &hash]);
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
    let found = store.discover_dependencies().await.unwrap();
    assert!(found.is_empty(), "{found:?}");
    assert!(store.heartbeat_leave("me").await.unwrap());
    assert!(!store.heartbeat_leave("me").await.unwrap());
}
