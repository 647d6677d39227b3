//! The workers as OS processes: `crates/fleet-budget/examples/storm_worker.rs` in its traffic
//! mode, each its own `FleetBudget` serving `/metrics`, for the tests that let Prometheus scrape
//! real worker processes (`tune_prometheus`). Included with `#[path]`.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The worker, built by cargo (`fleet_budget::testing::workspace_example`).
pub(crate) fn build() -> PathBuf {
    fleet_budget::testing::workspace_example("fleet-budget", "storm_worker")
}

/// A worker process, killed on drop.
pub(crate) struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Where it serves `/metrics`.
    pub(crate) metrics: String,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Worker {
    /// Starts `worker` with `args` (after `--metrics 127.0.0.1:0`) and waits for its `ready`.
    pub(crate) fn start(worker: &Path, args: &[String]) -> Self {
        let mut child = Command::new(worker)
            .args(["--metrics", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut worker = Self {
            child,
            stdin,
            stdout,
            metrics: String::new(),
        };
        let ready = worker.line();
        worker.metrics = ready
            .trim()
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("not ready: {ready:?}"))
            .to_owned();
        worker
    }

    /// Gives an order (`start`, `fail`, `heal`, `stop`).
    pub(crate) fn order(&mut self, order: &str) {
        writeln!(self.stdin, "{order}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// `exit`: what it counted, each success and each retry asked at the Unix ms it was decided.
    pub(crate) fn exit(mut self) -> Vec<(u64, bool)> {
        self.order("exit");
        let doc: serde_json::Value = serde_json::from_str(&self.line()).unwrap();
        assert!(self.child.wait().unwrap().success());
        doc["tally"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e[0].as_u64().unwrap(), e[1].as_bool().unwrap()))
            .collect()
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert!(
            !line.is_empty(),
            "the worker ended early: {:?}",
            self.child.wait()
        );
        line
    }
}
