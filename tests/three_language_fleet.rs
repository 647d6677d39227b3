//! One exhausted budget, three languages: Rust (`FleetBudget`, in this process), Python
//! (`clients/python`, two processes) and Node.js (`clients/node`, two processes) workers of one
//! dependency, `search`, all with one configuration file (floor 10, ratio 0.5, no successes, so
//! the allowance is the floor; a one-hour window), ask about failed jobs at the same moment in a private
//! redis-server. Retries granted across the three languages are exactly 10, and the budget hash
//! counts every decision: 10 retries and every other one a denial, those each process answered
//! itself from a standing denial (its deny cache) included, sent with its last deposits.
//!
//! Each worker also prints how many decisions per second it made in this contended run (most
//! are answered from the deny cache once the budget is exhausted); `scripts/bench-languages`
//! measures the languages one at a time.
//!
//! Needs the `.venv` of scripts/test (the Python client) and the Node.js package built
//! (`npm ci && npm run build` in clients/node, which scripts/test does). Never skipped.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use fleet_budget::testing::RedisServer;
use fleet_budget::{Config, Decision, Failure, FleetBudget};

/// A Python worker: `python -c PYTHON_WORKER <config.toml> <failures>`, the Node worker's protocol.
const PYTHON_WORKER: &str = r#"
import json, sys, time
from fleet_budget import Config, Failure, FleetBudget, Retry
budget = FleetBudget(Config.from_path(sys.argv[1]))
n = int(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
granted = 0
started = time.perf_counter()
for _ in range(n):
    granted += isinstance(budget.on_failure("index_document", 1, Failure.retryable("503 from search")), Retry)
seconds = time.perf_counter() - started
unsent = budget.close()
print(json.dumps({"granted": granted, "denied": n - granted, "unsent": unsent, "seconds": seconds}), flush=True)
"#;

const PER_WORKER: u64 = 200;

fn python() -> PathBuf {
    std::env::var_os("FLEET_BUDGET_PYTHON").map_or_else(
        || common::repo_root().join(".venv/bin/python"),
        PathBuf::from,
    )
}

struct Worker {
    name: String,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn start(name: &str, command: &mut Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "{name} did not start");
        Self {
            name: name.to_owned(),
            child,
            stdin,
            stdout,
        }
    }

    fn result(mut self) -> serde_json::Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert!(self.child.wait().unwrap().success(), "{} failed", self.name);
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{}: {e}: {line:?}", self.name))
    }
}

#[test]
fn rust_python_and_node_workers_are_granted_exactly_the_allowance_of_one_budget() {
    let server = RedisServer::start();
    let root = common::repo_root();
    let node_worker = root.join("clients/node/test/workers/fleet_worker.mjs");
    assert!(
        root.join("clients/node/dist/index.js").is_file(),
        "clients/node is not built: run `npm ci && npm run build` in clients/node (scripts/test does)"
    );
    let key_prefix = "fb3lang";
    let text = format!(
        r#"
[redis]
url = "{}"
key_prefix = "{key_prefix}"
timeout_ms = 2000
deposit_flush_ms = 50

[dependencies.search]
window_secs = 3600
ratio = 0.5
min_allowance = 10
tasks = ["index_document"]
"#,
        server.url()
    );
    let dir = std::env::temp_dir().join(format!("fb3lang-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fleet-budget.toml");
    std::fs::write(&path, &text).unwrap();

    let mut workers = Vec::new();
    for i in 0..2 {
        workers.push(Worker::start(
            &format!("node {i}"),
            Command::new("node")
                .arg(&node_worker)
                .arg(&path)
                .arg(PER_WORKER.to_string())
                .arg("8"),
        ));
        workers.push(Worker::start(
            &format!("python {i}"),
            Command::new(python())
                .current_dir(&root)
                .args(["-c", PYTHON_WORKER])
                .arg(&path)
                .arg(PER_WORKER.to_string()),
        ));
    }
    let config = Config::from_toml(&text, "rust").unwrap();
    let (rust_granted, rust_seconds) = common::block_on(async {
        let a = FleetBudget::from_config(&config).await.unwrap();
        let b = FleetBudget::from_config(&config).await.unwrap();
        for w in &mut workers {
            writeln!(w.stdin, "go").unwrap();
        }
        let started = Instant::now();
        let ask = |budget: &FleetBudget| {
            let budget = budget.clone();
            tokio::spawn(async move {
                let mut granted = 0u64;
                for _ in 0..PER_WORKER {
                    let failure = Failure::retryable("503 from search");
                    let d = budget
                        .on_failure("index_document", 1, &failure)
                        .await
                        .unwrap();
                    granted += u64::from(matches!(d, Decision::Retry { .. }));
                }
                granted
            })
        };
        let (ga, gb) = (ask(&a), ask(&b));
        let granted = ga.await.unwrap() + gb.await.unwrap();
        let seconds = started.elapsed().as_secs_f64();
        a.shutdown().await.unwrap();
        b.shutdown().await.unwrap();
        (granted, seconds)
    });

    let mut granted = rust_granted;
    let mut by_language = vec![format!(
        "rust (2 budgets): granted {rust_granted}, {:.0} decisions/s",
        2.0 * f64::from(u32::try_from(PER_WORKER).unwrap()) / rust_seconds
    )];
    for w in workers {
        let name = w.name.clone();
        let r = w.result();
        let g = r["granted"].as_u64().unwrap();
        assert_eq!(g + r["denied"].as_u64().unwrap(), PER_WORKER, "{name}");
        assert_eq!(
            r["unsent"].as_u64().unwrap(),
            0,
            "{name} sent its last deposits"
        );
        granted += g;
        by_language.push(format!(
            "{name}: granted {g}, {:.0} decisions/s",
            f64::from(u32::try_from(PER_WORKER).unwrap()) / r["seconds"].as_f64().unwrap()
        ));
    }
    println!("{}", by_language.join("\n"));
    assert_eq!(
        granted, 10,
        "retries granted across the three languages: the floor, exactly"
    );

    let mut redis = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    // The run may cross a window's end: both windows' counts (a one-hour window, so that the
    // previous one's weight barely decays meanwhile).
    let (cr, cd, pr, pd): (u64, u64, Option<u64>, Option<u64>) = redis::cmd("HMGET")
        .arg(format!("{key_prefix}:v1:{{search}}"))
        .arg("cr")
        .arg("cd")
        .arg("pr")
        .arg("pd")
        .query(&mut redis)
        .unwrap();
    let (cr, cd) = (cr + pr.unwrap_or(0), cd + pd.unwrap_or(0));
    assert_eq!(cr, 10, "Redis counted the 10 retries");
    assert_eq!(
        cd,
        6 * PER_WORKER - 10,
        "Redis counted every denial, those answered in the processes included"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
