//! Issue 11's rolling deploy, in two languages: Python workers (the `lua/README.md` way: the
//! shipped scripts, their own policy in ARGV) on a 2 s window with ratio 0.1 and floor 5, and
//! Rust workers (`FleetBudget`) on a 1 s window with ratio 0.5 and floor 2, alternating calls on
//! one dependency for several windows. Before, each call with the other window length wiped the
//! hash, so every retry was granted. Now the counters survive, the retries granted per window
//! never exceed the larger allowance, and the conflict shows in the metric and in the status.
//!
//! Nothing here depends on the pace of the calls (this machine is loaded): every reply is checked
//! against the calls made before it — the counters of its window hold exactly the decisions made
//! in that window so far, and its allowance is the policy in force's, computed from the deposits it
//! reports — and the retries granted in a window never exceed the largest allowance its replies
//! showed.
//!
//! Needs the Python of `tests/lua_readme_python.rs` (`FLEET_BUDGET_PYTHON` or `.venv`).
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fleet_budget::allowance::allowance;
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

/// The policy in force (Python's): window, ratio, floor.
const IN_FORCE: (u64, f64, u64) = (2000, 0.1, 5);

/// What one decision's reply said, in either language.
struct Reply {
    granted: bool,
    allowance: u64,
    window_index: u64,
    window_ms: u64,
    previous_weight_ms: u64,
    /// Successes of the current and the previous window.
    successes: (u64, u64),
    /// Retries granted and denied in the current window, this decision included.
    decided: (u64, u64),
}

/// Per window index: decisions made in it, retries granted in it, the largest allowance shown.
#[derive(Debug, Default)]
struct Window {
    decisions: u64,
    granted: u64,
    max_allowance: u64,
}

/// Checks `reply` against the decisions made before it and records it.
fn record(windows: &mut BTreeMap<u64, Window>, reply: &Reply, who: &str) {
    let (window_ms, ratio, floor) = IN_FORCE;
    assert_eq!(
        reply.window_ms, window_ms,
        "{who}: served by the policy in force"
    );
    let deposits_scaled = u128::from(reply.successes.0) * u128::from(window_ms)
        + u128::from(reply.successes.1) * u128::from(reply.previous_weight_ms);
    assert_eq!(
        reply.allowance,
        allowance(ratio, floor, deposits_scaled, window_ms),
        "{who}: the allowance of the policy in force, from the deposits the reply shows"
    );
    let w = windows.entry(reply.window_index).or_default();
    w.decisions += 1;
    w.granted += u64::from(reply.granted);
    w.max_allowance = w.max_allowance.max(reply.allowance);
    assert_eq!(
        (reply.decided.0, reply.decided.0 + reply.decided.1),
        (w.granted, w.decisions),
        "{who}: window {}: the counters hold every decision made in it so far (none wiped)",
        reply.window_index
    );
}

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
            "[redis]\nurl = \"{}\"\ndeposit_flush_ms = 0\ntimeout_ms = 5000\n\
             [dependencies.search]\ntasks = [\"index\"]\nwindow_secs = 1\nratio = 0.5\nmin_allowance = 2\n",
            server.url()
        ),
        "inline",
    )
    .unwrap();
    let rust = FleetBudget::from_config(&config).await.unwrap();
    let failure = Failure::retryable("503");
    let store = RedisStore::new(
        RedisTarget::Single(server.url()),
        "fb",
        Duration::from_secs(5),
    )
    .unwrap();

    // Python first: its policy is in force; then both groups alternate for at least 4.5 s, and
    // until the budget has denied retries in two windows (a loaded machine makes fewer calls per
    // window; before, every retry was granted and no window ever denied one). The Rust budget's
    // deadline is generous: this test is about the policy in force, and a decision cut by a
    // stall would come from the fallback, not the shared hash.
    ask("d");
    let mut windows: BTreeMap<u64, Window> = BTreeMap::new();
    let (mut calls, mut denied) = (0u64, 0u64);
    let started = Instant::now();
    let denying = |windows: &BTreeMap<u64, Window>| {
        windows.values().filter(|w| w.granted < w.decisions).count()
    };
    while started.elapsed() < Duration::from_millis(4_500) || denying(&windows) < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no two windows denied a retry within 60 s: {windows:?}"
        );
        let reply = ask("s");
        assert_eq!(reply[14], 0, "Python sends the policy in force: {reply:?}");
        let field = |i: usize| {
            reply[i]
                .as_u64()
                .unwrap_or_else(|| panic!("field {i}: {reply:?}"))
        };
        let python_reply = Reply {
            granted: field(0) == 1,
            allowance: field(1),
            window_index: field(2),
            window_ms: field(3),
            previous_weight_ms: field(5),
            successes: (field(6), field(10)),
            decided: (field(8), field(9)),
        };
        denied += u64::from(!python_reply.granted);
        record(&mut windows, &python_reply, &format!("Python {reply:?}"));
        ask("d");
        rust.on_success("index").await.unwrap();
        let decision = rust.on_failure("index", 1, &failure).await.unwrap();
        let snapshot = match &decision {
            Decision::Retry { snapshot, .. } => *snapshot,
            Decision::DeadLetter { snapshot, .. } => snapshot.unwrap(),
        };
        assert!(snapshot.control.conflict, "{decision:?}");
        denied += u64::from(!decision.is_retry());
        let rust_reply = Reply {
            granted: decision.is_retry(),
            allowance: snapshot.allowance,
            window_index: snapshot.window_index,
            window_ms: snapshot.window_ms,
            previous_weight_ms: snapshot.previous_weight_ms,
            successes: (snapshot.current.successes, snapshot.previous.successes),
            decided: (snapshot.current.retries, snapshot.current.denied),
        };
        record(&mut windows, &rust_reply, &format!("Rust {decision:?}"));
        calls += 2;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The status at once, while the hash is alive: idle for two windows (4 s here) it expires,
    // as it should, and the Python worker's exit can take that long on a loaded machine.
    let status = fleet_status(
        &store,
        &Dependency::new("search").unwrap(),
        &config.policy(&Dependency::new("search").unwrap()),
    )
    .await
    .unwrap();
    drop(py_in);
    py.wait().unwrap();

    // Several windows, retries denied in two or more; in each, the retries granted never exceed
    // the largest allowance of the policy in force that its replies showed
    // (max(5, floor(0.1 × deposits))): before, every retry was granted.
    assert!(windows.len() >= 2, "several windows: {windows:?}");
    assert!(denied > 0 && denying(&windows) >= 2, "{windows:?}");
    for (index, w) in &windows {
        assert!(
            w.granted <= w.max_allowance,
            "window {index}: {w:?}: {windows:?}"
        );
    }
    let total: u64 = windows.values().map(|w| w.granted).sum();
    eprintln!("{total} of {calls} retries granted: {windows:?}");
    assert_eq!(status.policy.window_ms(), 2000, "{status:?}");
    // Counters survived: the two windows hold every decision made in them (none was wiped).
    let s = &status.snapshot;
    let made = |index: u64| windows.get(&index).map_or(0, |w| w.decisions);
    assert_eq!(
        (
            s.current.retries + s.current.denied,
            s.previous.retries + s.previous.denied
        ),
        (
            made(s.window_index),
            s.window_index.checked_sub(1).map_or(0, made)
        ),
        "{status:?}"
    );
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
