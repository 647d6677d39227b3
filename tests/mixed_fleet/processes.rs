//! The mixed fleet's processes and messages: worker processes killed on drop (their logs shown
//! on failure), the Celery queue deleted on drop, and publishing jobs from each language.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use fleet_budget_amqp::testing::{TestBroker, amqp_url};

use crate::common;

/// A child process killed on drop; its output in a file, printed when the test fails.
pub(crate) struct Proc {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

impl Proc {
    pub(crate) fn spawn(name: &str, command: &mut Command, dir: &Path) -> Self {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = command
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        Self {
            name: name.to_owned(),
            child,
            log,
        }
    }

    /// SIGTERM (a graceful stop for both kinds of worker), then SIGKILL after 20 s.
    pub(crate) fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: String = text
                .chars()
                .rev()
                .take(6000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            eprintln!("----- {} ({}) -----\n{tail}", self.name, self.log.display());
        }
    }
}

/// The Celery queue (declared by the Celery worker, not by the topology): deleted on drop, after
/// the worker processes (declared before them), pass or fail.
pub(crate) struct CeleryQueue {
    pub(crate) name: String,
}

impl Drop for CeleryQueue {
    fn drop(&mut self) {
        let deleted = Command::new(python())
            .args([
                "-c",
                "import sys, kombu\n\
                 with kombu.Connection(sys.argv[2], connect_timeout=5) as c:\n    \
                 c.default_channel.queue_delete(sys.argv[1])\n",
            ])
            .arg(&self.name)
            .arg(amqp_url())
            .status();
        if !deleted.is_ok_and(|s| s.success()) {
            eprintln!("test cleanup: could not delete {}", self.name);
        }
    }
}

pub(crate) fn python() -> PathBuf {
    std::env::var_os("FLEET_BUDGET_PYTHON").map_or_else(
        || common::repo_root().join(".venv/bin/python"),
        PathBuf::from,
    )
}

pub(crate) fn budgetctl() -> PathBuf {
    // Built by `cargo test --workspace` (scripts/test) beside this test's binary.
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join(format!("budgetctl{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is not built: run `cargo build -p budgetctl` (scripts/test builds the workspace)",
        bin.display()
    );
    bin
}

/// `n` Rust fleet workers (`fleet-worker-0`, ...) under `config`, calling `upstream`.
pub(crate) fn spawn_rust_workers(n: usize, config: &Path, upstream: &str, dir: &Path) -> Vec<Proc> {
    (0..n)
        .map(|i| {
            Proc::spawn(
                &format!("fleet-worker-{i}"),
                Command::new(env!("CARGO_BIN_EXE_fleet-worker"))
                    .args(["--config", &config.display().to_string()])
                    .args(["--upstream", upstream, "--stats-ms", "5000"])
                    .env_remove("FLEET_BUDGET_REDIS_URL")
                    .env_remove("FLEET_BUDGET_AMQP_URL"),
                dir,
            )
        })
        .collect()
}

/// A Celery worker of `tests/python/celery_fleet.py` consuming `queue` with the `pool` given
/// (`prefork` or `threads`; `None`: no `-P`, Celery's default, prefork) and `concurrency`,
/// under `env`.
pub(crate) fn spawn_celery(
    pool: Option<&str>,
    concurrency: u32,
    queue: &str,
    env: &[(&str, String)],
    dir: &Path,
) -> Proc {
    let mut command = Command::new(python());
    command.args(["-m", "celery", "-A", "celery_fleet", "worker"]);
    if let Some(pool) = pool {
        command.args(["-P", pool]);
    }
    Proc::spawn(
        "celery",
        command
            .args(["-c", &concurrency.to_string(), "-Q", queue])
            .args(["-n", &format!("{queue}@%h")])
            .args([
                "--without-heartbeat",
                "--without-mingle",
                "--without-gossip",
            ])
            .args(["-l", "INFO"])
            .current_dir(common::repo_root().join("tests/python"))
            .env_remove("FLEET_BUDGET_REDIS_URL")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str()))),
        dir,
    )
}

/// `budgetctl replay --dependency DEPENDENCY --rate 1000 --json` under `config`: its report,
/// once it exited 0 (else the test fails with its output).
pub(crate) fn replay_json(config: &Path, dependency: &str) -> serde_json::Value {
    let out = Command::new(budgetctl())
        .args(["--config", &config.display().to_string()])
        .args(["replay", "--dependency", dependency])
        .args(["--rate", "1000", "--json"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "replay: {report} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(report.trim()).unwrap()
}

pub(crate) fn wait_until(what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < within, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends Celery tasks `search(i)` with the given task ids, from Python (Celery's own format).
pub(crate) fn send_celery(env: &[(&str, String)], ids: &[String]) {
    let script = "import sys, celery_fleet\n\
                  for i, id in enumerate(sys.argv[1:]):\n    \
                  celery_fleet.app.send_task('search', [i], task_id=id)\n\
                  celery_fleet.budget.close()\n";
    let status = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(ids)
        .current_dir(common::repo_root().join("tests/python"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .status()
        .expect("run Python (scripts/test makes .venv)");
    assert!(status.success(), "sending Celery tasks failed");
}

pub(crate) fn publish_rust(broker: &TestBroker, n: usize) -> Vec<String> {
    common_block_on(async {
        let publisher = broker.publisher().await;
        let mut ids = Vec::new();
        for _ in 0..n {
            ids.push(
                publisher
                    .publish_job(&broker.topology.work_exchange, "index", "index", b"{}")
                    .await
                    .unwrap(),
            );
        }
        publisher.close().await;
        ids
    })
}

pub(crate) fn common_block_on<F: Future>(f: F) -> F::Output {
    fleet_budget_amqp::testing::block_on(f)
}

pub(crate) fn depth(broker: &TestBroker, queue: &str) -> u32 {
    common_block_on(broker.depth(queue))
}

/// A fleet of the test's own: a private redis-server, broker names under a unique prefix
/// (migrated), a key prefix, a folder for the processes' logs and the configuration file they
/// all read.
pub(crate) struct Fleet {
    pub(crate) redis: fleet_budget::testing::RedisServer,
    pub(crate) broker: TestBroker,
    /// The broker names' prefix (`amqp.prefix`).
    pub(crate) prefix: String,
    /// The Redis keys' prefix (`redis.key_prefix`), which also names the folder.
    pub(crate) key_prefix: String,
    pub(crate) dir: PathBuf,
    pub(crate) config: PathBuf,
}

impl Fleet {
    /// Names from `name`; `redis` lines go under `[redis]` (after the URL, the key prefix and a
    /// 2 s deadline), `retry_tiers_secs` (none: the default tiers) under `[amqp]`, and `rest`
    /// (defaults, dependencies, tasks) after it.
    pub(crate) fn start(name: &str, redis: &str, retry_tiers_secs: &[f64], rest: &str) -> Self {
        let server = fleet_budget::testing::RedisServer::start();
        let mut settings = fleet_budget_amqp::AmqpSettings {
            url: amqp_url(),
            prefix: fleet_budget_amqp::testing::unique_prefix(name),
            ..fleet_budget_amqp::AmqpSettings::default()
        };
        let mut tiers = String::new();
        if !retry_tiers_secs.is_empty() {
            settings.retry_tiers = retry_tiers_secs
                .iter()
                .map(|s| Duration::from_secs_f64(*s))
                .collect();
            tiers = format!("retry_tiers_secs = {retry_tiers_secs:?}\n");
        }
        let broker = TestBroker::with_settings(settings);
        common_block_on(broker.migrate());
        let prefix = broker.settings.prefix.clone();
        let key_prefix = format!(
            "fb{name}{}",
            &fleet_budget_amqp::headers::new_message_id()[..8]
        );
        let dir = std::env::temp_dir().join(&key_prefix);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("fleet-budget.toml");
        std::fs::write(
            &config,
            format!(
                "[redis]\nurl = \"{}\"\nkey_prefix = \"{key_prefix}\"\ntimeout_ms = 2000\n{redis}\
                 [amqp]\nurl = \"{}\"\nprefix = \"{prefix}\"\n{tiers}{rest}",
                server.url(),
                amqp_url(),
            ),
        )
        .unwrap();
        Self {
            redis: server,
            broker,
            prefix,
            key_prefix,
            dir,
            config,
        }
    }
}

impl Fleet {
    /// The brownout fleets' (`mixed_fleet`, `three_language_brownout`): `search` for task `index`,
    /// ratio 0.5 with a floor of 2 over a day, retry tiers of 0.1 and 0.4 s, every deposit sent
    /// at once.
    pub(crate) fn brownout(name: &str) -> Self {
        Self::start(
            name,
            "deposit_flush_ms = 0\n",
            &[0.1, 0.4],
            "[defaults]\nwindow_secs = 86400\nratio = 0.5\nmin_allowance = 2\n\
             [dependencies.search]\ntasks = [\"index\"]\n\
             [tasks.index]\nbackoff_base_ms = 100\nbackoff_cap_ms = 400\n\
             [tasks.search]\nbackoff_base_ms = 1000\nbackoff_cap_ms = 2000\nmax_attempts = 2\n",
        )
    }
}

/// The Node.js client's fleet worker (`clients/node/test/workers/bullmq_fleet.mjs`), once
/// `clients/node` is built.
pub(crate) fn node_fleet_worker() -> PathBuf {
    let root = common::repo_root();
    assert!(
        root.join("clients/node/dist/bullmq.js").is_file(),
        "clients/node is not built: run `npm ci && npm run build` in clients/node (scripts/test does)"
    );
    root.join("clients/node/test/workers/bullmq_fleet.mjs")
}
