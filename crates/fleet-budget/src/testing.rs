//! A test harness that runs private `redis-server` processes (feature `test-harness`).
//!
//! Each server listens on a free port with its own temporary directory and `--save ""`, is
//! killed when dropped, and prints its log if the test is failing. Tests can run in parallel and
//! never touch the shared server on 6379. [`RedisCluster`] makes a Redis Cluster of such servers
//! with `redis-cli --cluster create`.
#![allow(
    clippy::missing_panics_doc,
    clippy::expect_used,
    clippy::panic,
    clippy::unwrap_used
)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::clock::ManualClock;
use crate::store::RedisStore;
use crate::{Config, Dependency, FleetBudget};

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

pub mod tls;

/// Where Debian installs libfaketime (package `faketime`). It cannot shift redis-server
/// itself (jemalloc recurses into it at start-up), so tests skew the *client* process instead.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A `redis-server` process of the test's own.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

/// A port nobody listens on right now.
#[must_use]
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// The workspace example `name` of `package`, built by cargo for a test that runs it as its own
/// OS process (`examples/storm_worker.rs` as the fleet's worker processes), with the profile the
/// test was built with (`test`, or `bench` for `--release`): its dependencies are the ones
/// already compiled for the test, and the build is a no-op when it is up to date (the `dev`
/// profile would compile the library again, and `cargo test` then again).
#[must_use]
pub fn workspace_example(package: &str, name: &str) -> PathBuf {
    let profile = if cfg!(debug_assertions) {
        "test"
    } else {
        "bench"
    };
    let mut build = Command::new(env!("CARGO"));
    build
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args(["build", "--quiet", "--profile", profile])
        .args(["-p", package, "--example", name]);
    // What cargo set for the test's own run (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, …) is not the
    // nested build's environment: ring's build script is rerun when it changes, and with it the
    // whole tree, here and again at the next `cargo test`. Only what finds the toolchain and the
    // target directory passes.
    build.env_clear();
    for (key, value) in std::env::vars_os() {
        let var = key.to_string_lossy();
        if ["PATH", "HOME", "TMPDIR", "RUSTFLAGS", "RUSTDOCFLAGS"].contains(&var.as_ref())
            || var.starts_with("RUSTUP_")
            || var == "CARGO_HOME"
            || var.starts_with("CARGO_TARGET_DIR")
            || var.starts_with("CARGO_BUILD_")
            || var.starts_with("CARGO_NET_")
            || var.starts_with("CARGO_REGISTRIES_")
            || var.starts_with("CARGO_PROFILE_")
        {
            build.env(&key, &value);
        }
    }
    let status = build.status().expect("run cargo");
    assert!(
        status.success(),
        "cargo build -p {package} --example {name}: {status}"
    );
    // The test is `<target>/<profile>/deps/<test>-…`; examples sit beside `deps`.
    let example = std::env::current_exe()
        .expect("the test's own path")
        .parent()
        .and_then(std::path::Path::parent)
        .expect("the test sits in <target>/<profile>/deps")
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(example.exists(), "{} not built", example.display());
    example
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(&[], &[])
    }

    /// Starts a server with extra arguments and environment.
    #[must_use]
    pub fn start_with(args: &[&str], env: &[(&str, &str)]) -> Self {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        // A cluster node also listens on its port + 10000 (the cluster bus): above 55535 it
        // cannot start, and each such try cost the 10 s wait below.
        let cluster = args.contains(&"--cluster-enabled");
        for _ in 0..5 {
            let port = loop {
                let port = free_port();
                if !cluster || port <= 55_535 {
                    break port;
                }
            };
            let dir = std::env::temp_dir().join(format!(
                "fleet-budget-redis-{}-{id}-{port}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).expect("create the server's directory");
            let mut server = Self {
                port,
                dir,
                args: args.iter().map(|s| (*s).to_owned()).collect(),
                env: env
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                child: None,
            };
            server.spawn();
            if server.wait_ready(Duration::from_secs(10)) {
                return server;
            }
            // The port was taken between probing and binding: try another.
            server.stop();
        }
        panic!("could not start redis-server on a free port");
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(
            cmd.spawn()
                .expect("spawn redis-server (is it installed? .ci/run installs it)"),
        );
    }

    fn wait_ready(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                return false;
            }
            if let Ok(mut c) = self.connection()
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return self.answered_by_own_child(&mut c);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Whether the server that answered on the port is this one's child. Two tests can probe
    /// the same free port: the second `redis-server` then fails to bind, but before it exits
    /// the first one answers its `PING`, and the two tests share one server (CI of stop 40:
    /// another test's kill cut the pause test's connections, "unexpected end of file"). A
    /// server whose `INFO` the default user may not read is taken at its word.
    fn answered_by_own_child(&self, c: &mut redis::Connection) -> bool {
        let Some(own) = self.child.as_ref().map(Child::id) else {
            return false;
        };
        let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(c) else {
            return true;
        };
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse::<u32>().ok())
            .is_none_or(|pid| pid == own)
    }

    /// The port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A blocking connection for assertions.
    ///
    /// Its deadline (10 s, connect and the client's handshake) catches a server that hangs, not
    /// a slow one: with 1 s, a cluster node that took longer to answer the handshake at load 25
    /// (clean-clone run 7 of session 9, `EAGAIN` from the timed-out read) failed a test that
    /// asserted nothing about speed.
    ///
    /// # Errors
    /// The server does not accept connections.
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        client.get_connection_with_timeout(Duration::from_secs(10))
    }

    /// Runs a command and returns its reply (panics on failure: tests only).
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = self.connection().expect("connect to the test server");
        let mut cmd = redis::cmd(args.first().copied().unwrap_or("PING"));
        for a in args.iter().skip(1) {
            cmd.arg(*a);
        }
        cmd.query(&mut c)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// Kills the server (SIGKILL): an outage.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server (SIGSTOP) until [`RedisServer::thaw`]: it answers nothing, and what
    /// clients send meanwhile waits in their sockets and runs, in order, when it is thawed.
    ///
    /// `CLIENT PAUSE` holds commands too, but for a fixed time (on Redis 7.0 `CLIENT UNPAUSE`
    /// is held as well), so a test built on it races that time on a loaded machine; a frozen
    /// server waits for the test to say so.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    /// Resumes a server [`RedisServer::freeze`] froze (SIGCONT).
    pub fn thaw(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let pid = self
            .child
            .as_ref()
            .expect("the server is running")
            .id()
            .to_string();
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(&pid)
            .stdin(Stdio::null())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {pid}: {status}");
    }

    /// Starts the server again on the same port (empty: nothing is saved).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
        assert!(
            self.wait_ready(Duration::from_secs(10)),
            "redis-server did not come back on port {}",
            self.port
        );
    }

    /// `INFO commandstats` as command → calls since start or `CONFIG RESETSTAT` (subcommands
    /// as `script|load`). Commands a script runs count too.
    #[must_use]
    pub fn command_calls(&self) -> std::collections::BTreeMap<String, u64> {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest
                    .split(',')
                    .find_map(|f| f.strip_prefix("calls="))?
                    .parse()
                    .ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    }

    /// Round trips clients made, from [`RedisServer::command_calls`]: every command except
    /// those the fleet-budget scripts run inside one `EVALSHA` and the harness's own `INFO` /
    /// `CONFIG`.
    #[must_use]
    pub fn client_round_trips(calls: &std::collections::BTreeMap<String, u64>) -> u64 {
        const INSIDE_SCRIPTS_OR_OURS: [&str; 9] = [
            "time",
            "hmget",
            "hset",
            "hincrby",
            "pexpire",
            "pexpireat",
            "pttl",
            "info",
            "config",
        ];
        calls
            .iter()
            .filter(|(name, _)| {
                let base = name.split('|').next().unwrap_or("");
                !INSIDE_SCRIPTS_OR_OURS.contains(&base)
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// The server's log so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "---- redis-server log (port {}) ----\n{}\n---- end of log ----",
                self.port,
                self.log()
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of test servers: masters, and replicas if asked for.
#[derive(Debug)]
pub struct RedisCluster {
    /// The nodes.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` cluster-enabled servers, creates the cluster and waits until every
    /// slot is served.
    #[must_use]
    pub fn start(masters: usize) -> Self {
        Self::start_with(masters, &[])
    }

    /// As [`RedisCluster::start`], each server also given `extra` arguments (for instance
    /// `--cluster-require-full-coverage no`, so that the healthy masters go on serving their slots
    /// once the cluster has marked a stopped master as failed).
    #[must_use]
    pub fn start_with(masters: usize, extra: &[&str]) -> Self {
        Self::start_with_replicas(masters, 0, extra)
    }

    /// As [`RedisCluster::start_with`], with `replicas` replicas of each master (`redis-cli
    /// --cluster create --cluster-replicas`): `masters * (1 + replicas)` servers, for tests of
    /// a failover. `extra` comes after the harness's own arguments, so it may override them
    /// (`--cluster-node-timeout`, 2000 ms by default). Returns once every slot is served; the
    /// replicas may still be syncing.
    #[must_use]
    pub fn start_with_replicas(masters: usize, replicas: usize, extra: &[&str]) -> Self {
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ];
                args.extend_from_slice(extra);
                RedisServer::start_with(&args, &[])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = Self { nodes };
        cluster.wait_ok(Duration::from_secs(20));
        cluster
    }

    /// Waits until every node says `cluster_state:ok` with all 16384 slots assigned.
    pub fn wait_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self.nodes.iter().all(|n| {
                n.connection()
                    .ok()
                    .and_then(|mut c| {
                        redis::cmd("CLUSTER")
                            .arg("INFO")
                            .query::<String>(&mut c)
                            .ok()
                    })
                    .is_some_and(|info| {
                        info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                    })
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster did not become ok within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until node `observer` has marked a stopped master as failed (flag `fail`, no longer
    /// `fail?`): from then on the cluster's state no longer changes by itself (about
    /// cluster-node-timeout, 2 s, after the stop; `within` is only a guard against a hang).
    pub fn wait_marked_failed(&self, observer: usize, within: Duration) {
        let observer = self
            .nodes
            .get(observer)
            .expect("an observer among the nodes");
        let deadline = Instant::now() + within;
        loop {
            let nodes: String = observer.cmd(&["CLUSTER", "NODES"]);
            if nodes.lines().any(|l| l.contains("master,fail ")) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no master marked failed within {within:?}: {nodes}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The seed URLs.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node serving `slot`, by index into [`RedisCluster::nodes`].
    #[must_use]
    pub fn node_of_slot(&self, slot: u16) -> Option<usize> {
        let first = self.nodes.first()?;
        let slots: redis::Value = first.cmd(&["CLUSTER", "SLOTS"]);
        let redis::Value::Array(ranges) = slots else {
            return None;
        };
        for range in ranges {
            let redis::Value::Array(items) = range else {
                continue;
            };
            let (
                Some(redis::Value::Int(lo)),
                Some(redis::Value::Int(hi)),
                Some(redis::Value::Array(node)),
            ) = (items.first(), items.get(1), items.get(2))
            else {
                continue;
            };
            if i64::from(slot) >= *lo && i64::from(slot) <= *hi {
                let Some(redis::Value::Int(port)) = node.get(1) else {
                    return None;
                };
                return self.nodes.iter().position(|n| i64::from(n.port()) == *port);
            }
        }
        None
    }
}

/// A budget on the fleet store `config` describes that keeps time with `clock`: tests move the
/// clock past probe intervals and window ages instead of sleeping them out.
///
/// # Panics
/// A Redis URL that cannot be parsed.
#[must_use]
pub fn budget_on_clock(config: &Config, clock: &ManualClock) -> FleetBudget {
    let store = RedisStore::from_settings(&config.redis).expect("a usable Redis URL");
    FleetBudget::builder(config)
        .fleet_store(Arc::new(store))
        .clock(Arc::new(clock.clone()))
        .build()
}

/// Waits until `condition` holds, checking every 5 ms; panics naming `what` after `within`.
///
/// For events the test does not control (a restarted server accepting connections, a
/// background task's work), never to wait out an interval of the budget's clock: move the
/// clock for those.
pub async fn eventually(what: &str, within: Duration, mut condition: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !condition().await {
        assert!(started.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (at most 10 s) until the budget's fleet store answers a direct call for `dependency`:
/// the server is back and the store's connection made again. The budget's own view (its
/// health) is left alone.
pub async fn until_store_answers(budget: &FleetBudget, dependency: &str) {
    let store = budget.fleet_store().expect("a budget with a fleet store");
    let dependency = Dependency::new(dependency).expect("a valid dependency name");
    let policy = budget.policy(&dependency);
    eventually(
        "the fleet store answers again",
        Duration::from_secs(10),
        async || store.status(&dependency, &policy).await.is_ok(),
    )
    .await;
}
