//! Issue 11's rolling deploy, in two languages: Python workers (the `lua/README.md` way: the
//! shipped scripts, their own policy in ARGV) on a 2 s window with ratio 0.1 and floor 5, and
//! Rust workers (`FleetBudget`) on a 1 s window with ratio 0.5 and floor 2, alternating calls on
//! one dependency for several windows. Before, each call with the other window length wiped the
//! hash, so every retry was granted. Now the counters survive, the retries granted per window
//! never exceed the larger allowance, and the conflict shows in the metric and in the status.
//!
//! Needs the Python of `tests/lua_readme_python.rs` (`FLEET_BUDGET_PYTHON` or `.venv`).
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fleet_budget::control::fleet_status;
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{Config, Decision, Dependency, Failure, FleetBudget};

/// A Python worker: one line in (`d` deposit a success, `s` ask for a retry), one JSON reply out.
const WORKER: &str = r#"
import json, os, pathlib, sys, redis
r = redis.Redis.from_url(os.environ["REDIS_URL"])
spend = r.register_script(pathlib.Path("lua/spend.lua").read_text())
deposit = r.register_script(pathlib.Path("lua/deposit.lua").read_text())
key = "fb:v1:{search}"
policy = [2000, "0.1", 5, "s", "sliding"]
for line in sys.stdin:
    if line.strip() == "d":
        reply = deposit(keys=[key], args=[policy[0], 1, 0] + policy[1:])
    else:
        reply = spend(keys=[key], args=policy)
    print(json.dumps([int(x) if not isinstance(x, bytes) else x.decode() for x in reply]), flush=True)
"#;

fn python() -> PathBuf {
    std::env::var_os("FLEET_BUDGET_PYTHON").map_or_else(
        || common::repo_root().join(".venv/bin/python"),
        PathBuf::from,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_languages_with_different_windows_and_ratios_share_one_policy_in_force() {
    let server = RedisServer::start();
    let mut py = Command::new(python())
        .args(["-c", WORKER])
        .current_dir(common::repo_root())
        .env("REDIS_URL", server.url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the Python of lua/README.md (FLEET_BUDGET_PYTHON or .venv, see scripts/test)");
    let mut py_in = py.stdin.take().unwrap();
    let mut py_out = BufReader::new(py.stdout.take().unwrap());
    let mut ask = |what: &str| -> Vec<serde_json::Value> {
        writeln!(py_in, "{what}").unwrap();
        let mut line = String::new();
        py_out.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };

    let config = Config::from_toml(
        &format!(
            "[redis]\nurl = \"{}\"\ndeposit_flush_ms = 0\n\
             [dependencies.search]\ntasks = [\"index\"]\nwindow_secs = 1\nratio = 0.5\nmin_allowance = 2\n",
            server.url()
        ),
        "inline",
    )
    .unwrap();
    let rust = FleetBudget::from_config(&config).await.unwrap();
    let failure = Failure::retryable("503");

    // Python first: its policy is in force; then both groups alternate for about 4.5 s.
    ask("d");
    let mut granted: BTreeMap<(i64, i64), u64> = BTreeMap::new();
    let (mut calls, mut denied) = (0u64, 0u64);
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(4_500) {
        let reply = ask("s");
        assert_eq!(reply[14], 0, "Python sends the policy in force: {reply:?}");
        assert_eq!(reply[3], 2000, "{reply:?}");
        let key = (reply[3].as_i64().unwrap(), reply[2].as_i64().unwrap());
        *granted.entry(key).or_default() += reply[0].as_u64().unwrap();
        denied += u64::from(reply[0] == 0);
        ask("d");
        rust.on_success("index").await.unwrap();
        let decision = rust.on_failure("index", 1, &failure).await.unwrap();
        let snapshot = match &decision {
            Decision::Retry { snapshot, .. } => *snapshot,
            Decision::DeadLetter { snapshot, .. } => snapshot.unwrap(),
        };
        assert!(snapshot.control.conflict, "{decision:?}");
        assert_eq!(snapshot.window_ms, 2000, "served by the policy in force");
        let key = (2000, i64::try_from(snapshot.window_index).unwrap());
        *granted.entry(key).or_default() += u64::from(decision.is_retry());
        denied += u64::from(!decision.is_retry());
        calls += 2;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(py_in);
    py.wait().unwrap();

    // Deposits: one success per call of each group, ~25 per 2 s window each at this pace; the
    // larger allowance of the two policies over those is at most 0.5 × all deposits of two
    // windows, and far below the calls made. Per window index, the grants respect the policy in
    // force: max(5, floor(0.1 × deposits)).
    assert!(granted.len() >= 2, "several windows: {granted:?}");
    let total: u64 = granted.values().sum();
    assert!(
        denied > 0 && total < calls / 2,
        "{total} of {calls} granted: {granted:?}"
    );
    let store = RedisStore::new(
        RedisTarget::Single(server.url()),
        "fb",
        Duration::from_secs(5),
    )
    .unwrap();
    let status = fleet_status(
        &store,
        &Dependency::new("search").unwrap(),
        &config.policy(&Dependency::new("search").unwrap()),
    )
    .await
    .unwrap();
    let deposits = status.snapshot.current.successes + status.snapshot.previous.successes;
    for (window, n) in &granted {
        assert!(
            *n <= 5.max(deposits / 10 + 1) && *n <= 5.max(deposits / 2),
            "window {window:?}: {n} granted, deposits {deposits}: {granted:?}"
        );
    }
    // Counters survived: the two windows hold every call of their span (none was wiped).
    let s = &status.snapshot;
    let counted = s.current.retries + s.current.denied + s.previous.retries + s.previous.denied;
    assert!(counted >= 20, "{status:?}");
    assert_eq!(status.policy.window_ms(), 2000, "{status:?}");
    assert!(status.conflicts >= calls / 2 - 1, "{status:?}");
    assert_eq!(
        status.conflicting_policy.as_deref(),
        Some("1000 0.5 2 s sliding"),
        "{status:?}"
    );
    assert!(rust.metrics().counter("policy_conflicts", "search") >= calls / 2);
    assert!(
        rust.metrics()
            .render()
            .contains("fleet_budget_policy_conflicts_total{dependency=\"search\"}"),
    );
}
