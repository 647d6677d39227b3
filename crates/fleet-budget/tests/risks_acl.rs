//! The start-up risk check under the least-privilege users of `lua/README.md` (read from it, not
//! copied), on a private redis-server: a worker (`fleet-worker`) and the exporter
//! (`fleet-readonly`) read the eviction policy and AOF from `INFO memory` and `INFO persistence`,
//! name what they found, and leave `ACL LOG` empty. A user with an older line (no `INFO`) gets
//! the checks "not checked" with what to grant, and the exporter asks it once, not per scrape.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fleet_budget::metrics::ExporterSource;
use fleet_budget::risks::{
    Finding, RedisCheck, RedisRiskSource, read_redis_risks_with_client_rights,
};
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::{RedisServer, eventually};
use fleet_budget::{Config, FleetBudget};
use prometheus::Registry;

const PASSWORD: &str = "risks-acl-pw";

/// The `ACL SETUSER` lines of lua/README.md, with the test's password.
fn documented_users() -> Vec<Vec<String>> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../lua/README.md"))
            .expect("read lua/README.md");
    readme
        .lines()
        .filter(|l| l.starts_with("ACL SETUSER "))
        .map(|l| {
            l.split_whitespace()
                .map(|w| {
                    if w == ">CHANGE-ME" {
                        format!(">{PASSWORD}")
                    } else {
                        w.to_owned()
                    }
                })
                .collect()
        })
        .collect()
}

fn server_with_users(args: &[&str]) -> RedisServer {
    let server = RedisServer::start_with(args, &[]);
    for user in documented_users() {
        let args: Vec<&str> = user.iter().map(String::as_str).collect();
        let ok: String = server.cmd(&args);
        assert_eq!(ok, "OK", "{args:?}");
    }
    let _: String = server.cmd(&["ACL", "LOG", "RESET"]);
    server
}

fn store_as(server: &RedisServer, user: &str) -> RedisStore {
    RedisStore::new(
        RedisTarget::Single(format!(
            "redis://{user}:{PASSWORD}@127.0.0.1:{}",
            server.port()
        )),
        "fb",
        Duration::from_secs(5),
    )
    .unwrap()
}

/// Every entry of `ACL LOG` since the last reset, with its count.
fn refused(server: &RedisServer) -> Vec<String> {
    let log: Vec<redis::Value> = server.cmd(&["ACL", "LOG"]);
    log.iter().map(|entry| format!("{entry:?}")).collect()
}

/// How many times users other than the test's admin connection sent `INFO` (accepted or
/// refused), from `INFO commandstats`: each reading is itself an `INFO`, counted by the server
/// after it answers, so the readings made before are taken off.
struct InfoCalls<'a> {
    server: &'a RedisServer,
    readings: AtomicU64,
}

impl<'a> InfoCalls<'a> {
    fn of(server: &'a RedisServer) -> Self {
        Self {
            server,
            readings: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        let stats: String = self.server.cmd(&["INFO", "commandstats"]);
        let before = self.readings.fetch_add(1, Ordering::SeqCst);
        let total = stats
            .lines()
            .find(|l| l.starts_with("cmdstat_info:"))
            .map_or(0, |l| {
                let field = |name: &str| -> u64 {
                    l.split([':', ','])
                        .find_map(|kv| kv.strip_prefix(name))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0)
                };
                field("calls=") + field("rejected_calls=")
            });
        total.saturating_sub(before)
    }
}

/// The refusals `ACL LOG` holds (the sum of its entries' counts).
fn refusals(server: &RedisServer) -> i64 {
    let log: Vec<Vec<redis::Value>> = server.cmd(&["ACL", "LOG"]);
    log.iter()
        .filter_map(|entry| {
            entry.chunks_exact(2).find_map(|pair| match pair {
                [redis::Value::BulkString(k), redis::Value::Int(n)] if k == b"count" => Some(*n),
                _ => None,
            })
        })
        .sum()
}

fn finding(risks: &[fleet_budget::risks::RedisRisk], check: RedisCheck) -> Finding {
    risks
        .iter()
        .find(|r| r.check == check)
        .map(|r| r.finding.clone())
        .expect("every check is reported")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_users_read_the_eviction_policy_and_aof_with_acl_log_empty() {
    let server = server_with_users(&["--maxmemory-policy", "allkeys-lru", "--maxmemory", "64mb"]);
    let info_calls = InfoCalls::of(&server);

    // The worker's user: the policy read from INFO memory, AOF off (INFO cannot show RDB).
    let worker = store_as(&server, "fleet-worker");
    let risks = read_redis_risks_with_client_rights(&worker).await;
    println!("fleet-worker, allkeys-lru, AOF off: {risks:#?}");
    match finding(&risks, RedisCheck::MaxmemoryPolicy) {
        Finding::Risk { found, .. } => {
            assert!(found.contains("allkeys-lru"), "{found}");
            assert!(found.contains("INFO memory"), "{found}");
        }
        other => panic!("the eviction policy must be a risk, found {other:?}"),
    }
    match finding(&risks, RedisCheck::Persistence) {
        Finding::NotChecked { why } => {
            assert!(why.contains("AOF off"), "{why}");
            assert!(why.contains("rdb_saves 0"), "{why}");
        }
        other => panic!("AOF off through INFO is not checked, found {other:?}"),
    }

    // AOF on and noeviction: no risk, read the same way.
    let _: String = server.cmd(&["CONFIG", "SET", "appendonly", "yes"]);
    let _: String = server.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let risks = read_redis_risks_with_client_rights(&worker).await;
    println!("fleet-worker, noeviction, AOF on: {risks:#?}");
    assert!(
        risks
            .iter()
            .all(|r| matches!(r.finding, Finding::Ok { .. })),
        "{risks:?}"
    );

    // The exporter's user, through the exporter's source: the gauge says 1 for the policy.
    let _: String = server.cmd(&["CONFIG", "SET", "maxmemory-policy", "volatile-lru"]);
    let registry = Registry::new();
    let source =
        RedisRiskSource::register(Arc::new(store_as(&server, "fleet-readonly")), &registry)
            .unwrap();
    source.read().await.unwrap();
    #[allow(clippy::cast_possible_truncation, reason = "a 0 or 1 gauge, clamped")]
    let gauges: Vec<(String, i64)> = registry
        .gather()
        .iter()
        .filter(|f| f.name() == "fleet_budget_redis_risk")
        .flat_map(|f| f.get_metric().iter())
        .map(|m| {
            (
                m.get_label()[0].value().to_owned(),
                m.get_gauge().get_value().round().clamp(0.0, 1.0) as i64,
            )
        })
        .collect();
    println!("fleet-readonly, exporter: {gauges:?}");
    assert!(
        gauges.contains(&("maxmemory_policy".to_owned(), 1)),
        "{gauges:?}"
    );
    assert!(
        gauges.contains(&("persistence".to_owned(), 0)),
        "{gauges:?}"
    );

    // A worker's start-up check, spawned when its store is made.
    let text = format!(
        "[redis]\nurl = \"redis://fleet-worker:{PASSWORD}@127.0.0.1:{}\"\nkey_prefix = \"fb\"\n\
         heartbeat_ms = 0\n[dependencies.search]\ntasks = [\"index\"]\n",
        server.port()
    );
    let before = info_calls.now();
    let budget = FleetBudget::from_config(&Config::from_toml(&text, "acl.toml").unwrap())
        .await
        .unwrap();
    eventually(
        "the worker's start-up check",
        Duration::from_secs(20),
        async || info_calls.now() >= before + 2,
    )
    .await;
    drop(budget);
    println!(
        "INFO sent by the users in all: {} (two per reading: memory, persistence)",
        info_calls.now()
    );
    assert_eq!(
        refused(&server),
        Vec::<String>::new(),
        "nothing may be refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_info_is_told_what_to_grant_and_the_exporter_asks_once() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"], &[]);
    // The worker's line as it was before INFO was granted.
    let old_line = documented_users()
        .into_iter()
        .find(|u| u.get(2).map(String::as_str) == Some("fleet-worker"))
        .expect("the worker's line")
        .into_iter()
        .filter(|w| !w.starts_with("+info|"))
        .collect::<Vec<_>>();
    let args: Vec<&str> = old_line.iter().map(String::as_str).collect();
    let _: String = server.cmd(&args);
    let _: String = server.cmd(&["ACL", "LOG", "RESET"]);

    let store = Arc::new(store_as(&server, "fleet-worker"));
    let risks = read_redis_risks_with_client_rights(&store).await;
    println!("fleet-worker without INFO: {risks:#?}");
    for risk in &risks {
        match &risk.finding {
            Finding::NotChecked { why } => {
                assert!(why.contains("+info|memory +info|persistence"), "{why}");
                assert!(!why.contains(PASSWORD), "{why}");
            }
            other => panic!("nothing can be read without INFO, found {other:?}"),
        }
    }
    let _: String = server.cmd(&["ACL", "LOG", "RESET"]);
    let registry = Registry::new();
    let source = RedisRiskSource::register(Arc::clone(&store), &registry).unwrap();
    let info_calls = InfoCalls::of(&server);
    let before = info_calls.now();
    for _ in 0..5 {
        source.read().await.unwrap();
    }
    let asked = info_calls.now() - before;
    println!(
        "5 scrapes sent INFO {asked} times; ACL LOG holds {} refusals",
        refusals(&server)
    );
    // The first scrape asks both sections, refused; the later ones ask nothing.
    assert_eq!(asked, 2, "only the first scrape asks");
    assert_eq!(refusals(&server), 2, "two refusals in ACL LOG, not ten");
    assert!(
        registry
            .gather()
            .iter()
            .filter(|f| f.name() == "fleet_budget_redis_risk")
            .all(|f| f.get_metric().is_empty()),
        "no series for checks not made"
    );
}
