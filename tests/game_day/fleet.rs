//! The worker processes: `fleet-worker` (the binary of this package) started with the game
//! day's configuration, their stdout events collected line by line, stopped gracefully with
//! SIGTERM or crashed with SIGKILL.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;

/// What every worker is started with.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub(crate) config: PathBuf,
    pub(crate) redis_url: String,
    pub(crate) amqp_url: String,
    pub(crate) upstream: std::net::SocketAddr,
    pub(crate) call_ms: u64,
    pub(crate) logs: PathBuf,
}

/// One worker process and everything it printed.
#[derive(Debug)]
pub(crate) struct WorkerProcess {
    pub(crate) index: usize,
    /// Where it serves `/metrics`.
    pub(crate) metrics_port: u16,
    child: Option<Child>,
    events: Arc<Mutex<Vec<Value>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    pub(crate) killed: bool,
}

impl WorkerProcess {
    pub(crate) fn start(index: usize, launch: &Launch) -> Self {
        let metrics_port = fleet_budget::testing::free_port();
        let log = std::fs::File::create(launch.logs.join(format!("worker-{index}.log")))
            .expect("create the worker's log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet-worker"));
        cmd.arg("--config")
            .arg(&launch.config)
            .args(["--redis-url", &launch.redis_url])
            .args(["--amqp-url", &launch.amqp_url])
            .args(["--upstream", &launch.upstream.to_string()])
            .args(["--call-ms", &launch.call_ms.to_string()])
            .args(["--stats-ms", "100"])
            .args(["--name", &format!("game day worker {index}")])
            .env("RUST_LOG", "warn,lapin=off")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        cmd.args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")]);
        let mut child = cmd.spawn().expect("spawn fleet-worker");
        let stdout = child.stdout.take().expect("piped stdout");
        let events: Arc<Mutex<Vec<Value>>> = Arc::default();
        let sink = Arc::clone(&events);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // A SIGKILL can cut the last line short: it is not JSON and is skipped.
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    sink.lock().unwrap_or_else(PoisonError::into_inner).push(v);
                }
            }
        });
        Self {
            index,
            metrics_port,
            child: Some(child),
            events,
            reader: Some(reader),
            killed: false,
        }
    }

    pub(crate) fn events(&self) -> Vec<Value> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The last stats (or exit) line.
    pub(crate) fn last_stats(&self) -> Option<Value> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .rev()
            .find(|e| matches!(e["event"].as_str(), Some("stats" | "exit")))
            .cloned()
    }

    /// Deliveries received and not yet settled, by the last stats line.
    pub(crate) fn in_flight(&self) -> u64 {
        self.last_stats().map_or(0, |s| in_flight(&s["counts"]))
    }

    /// Whether the worker is consuming (a connection made).
    pub(crate) fn connected(&self) -> bool {
        self.last_stats()
            .is_some_and(|s| s["counts"]["connections"].as_u64().unwrap_or(0) > 0)
    }

    /// SIGKILL: a crash, mid-batch.
    pub(crate) fn kill(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.killed = true;
        self.join_reader();
    }

    /// SIGTERM, then waits for the graceful exit (in-flight jobs settle, counters flushed).
    pub(crate) fn stop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.join_reader();
    }

    fn join_reader(&mut self) {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Deliveries not settled in a `counts` object of a stats line.
pub(crate) fn in_flight(c: &Value) -> u64 {
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    n("deliveries").saturating_sub(
        n("succeeded")
            + n("retried")
            + n("dead_lettered")
            + n("requeued")
            + n("ack_failed")
            + n("waited_again")
            + n("parked"),
    )
}
