//! The incident at the design's scale (issue 31, item 6): N jobs (40,000 by default) queued for
//! `search`, 4 `fleet-worker` processes while search fails every call, most jobs dead-lettered
//! `budget_exhausted`; the operator's looks (`budgetctl dlq stats`, `replay --dry-run`), the
//! recovery and `budgetctl replay --rate 2000`; every job accounted for from the workers' own
//! lines (lost 0, no job succeeded twice). Each figure is printed beside references measured in
//! the same run: raw `lapin` publish with confirms and drain (consume + ack) of N messages, a
//! Redis `PING`, and a `budgetctl` process that touches no network.
//!
//! ```sh
//! scripts/dead-letter-scale                  # 40,000
//! scripts/dead-letter-scale 4000 40000 400000
//! ```
//!
//! Ignored by default (minutes at 40,000). The sizes come from `FLEET_BUDGET_DLS_SIZES`
//! (numbers separated by spaces or commas). `budgetctl` must be built beside this test's binary
//! (`cargo build -p budgetctl`, same profile; the script does it) or named by
//! `FLEET_BUDGET_BUDGETCTL`. Each size runs on a topology prefix and a Redis key prefix of its
//! own, on the broker of `FLEET_BUDGET_AMQP_URL` and the Redis of `FLEET_BUDGET_REDIS_URL`
//! (defaults: guest on 127.0.0.1:5672, 127.0.0.1:6379), both removed at the end. The figures of
//! each size are kept in `target/tmp/dead-letter-scale-<N>.md` (`CARGO_TARGET_TMPDIR`).
//!
//! The outage and the recovery: the first 4 workers run with `--brownout` covering the whole
//! first pass (search answers `http_503` to every call); once the work queue and the retry
//! tiers are empty they stop (SIGTERM, counters flushed) and 4 workers with a healthy search
//! take their place: the recovery. The replay runs while they consume.

// A test: a failed step panics, and JSON is read with serde_json's forgiving indexing.
#![allow(
    clippy::expect_used,
    clippy::panic,
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::cast_precision_loss,
    clippy::too_many_lines,
    missing_docs
)]

mod common;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleet_budget_amqp::publish::confirmed;
use fleet_budget_amqp::testing::{TestBroker, amqp_url, unique_prefix};
use fleet_budget_amqp::{
    AmqpSettings, ConnectionConfig, Publisher, Topology, WorkerConfig, connect, headers,
    queue_depths,
};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Confirmation};
use serde_json::Value;

/// Worker processes, as in the design's incident.
const WORKERS: usize = 4;
/// The task of every job, mapped to the dependency `search`.
const TASK: &str = "index_document";
/// The budget of the design: 10% of successes, a floor of 100 retries per 60-second window.
const RATIO: f64 = 0.1;
const MIN_ALLOWANCE: u64 = 100;
const WINDOW_SECS: u64 = 60;
const MAX_ATTEMPTS: u64 = 3;
/// Publishes (raw and through `Publisher`) awaiting their confirm at a time.
const CONFIRM_WINDOW: usize = 256;
/// The replay's rate, as the issue asks (`--rate 2000`).
const REPLAY_RATE: u32 = 2000;
/// Each look (`dlq stats`, the dry run) is timed this many times; the median is the figure.
const LOOKS: usize = 3;
/// A job's body: what a search indexing job might carry (the worker calls search for it).
const BODY: &[u8] = br#"{"document":"d-0000000000","tenant":"t-00","op":"index"}"#;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn rate(n: u64, d: Duration) -> String {
    format!("{:.0}/s", n as f64 / d.as_secs_f64().max(1e-9))
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// `/proc/loadavg`'s three averages (the machine is shared: figures move with it).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn redis_url() -> String {
    std::env::var("FLEET_BUDGET_REDIS_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned())
}

/// The sizes to run: `FLEET_BUDGET_DLS_SIZES`, else 40,000.
fn sizes() -> Vec<u64> {
    let text = std::env::var("FLEET_BUDGET_DLS_SIZES").unwrap_or_default();
    let sizes: Vec<u64> = text
        .split([' ', ','])
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.replace('_', "")
                .parse()
                .unwrap_or_else(|e| panic!("FLEET_BUDGET_DLS_SIZES: {s:?}: {e}"))
        })
        .collect();
    if sizes.is_empty() {
        vec![40_000]
    } else {
        sizes
    }
}

fn budgetctl() -> PathBuf {
    common::budgetctl_beside("scripts/dead-letter-scale")
}

/// The workers' binary: `FLEET_BUDGET_DLS_WORKER` (`scripts/dead-letter-scale --as-user` builds
/// it from the packaged crates, in `tests/outside-worker`), else this package's `fleet-worker`.
fn worker_binary() -> PathBuf {
    std::env::var("FLEET_BUDGET_DLS_WORKER")
        .ok()
        .filter(|p| !p.is_empty())
        .map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_fleet-worker")),
            PathBuf::from,
        )
}

/// The fleet's configuration (workers and `budgetctl`): the design's budget on `search`.
fn config_toml(key_prefix: &str, amqp_prefix: &str) -> String {
    format!(
        r#"
[redis]
key_prefix = "{key_prefix}"

[amqp]
prefix = "{amqp_prefix}"
retry_tiers_secs = [0.1, 0.25, 0.5, 1.0]

[defaults]
window_secs = {WINDOW_SECS}
ratio = {RATIO}
min_allowance = {MIN_ALLOWANCE}
max_attempts = {MAX_ATTEMPTS}
backoff_base_ms = 200
backoff_cap_ms = 1000

[dependencies.search]
tasks = ["{TASK}"]
"#
    )
}

/// One handler execution, from a worker's `{"event":"run",...}` line.
#[derive(Debug, Clone)]
struct Run {
    ms: u64,
    id: Arc<str>,
    attempt: u32,
    replays: u32,
    ok: bool,
}

/// What one worker process printed: its runs, its last stats line.
#[derive(Debug, Default)]
struct Seen {
    runs: Vec<Run>,
    last_stats: Option<Value>,
}

/// One `fleet-worker` process, its stdout read line by line (only what the accounting needs is
/// kept: at 400,000 jobs the lines themselves would not fit comfortably).
struct WorkerProcess {
    child: Child,
    seen: Arc<Mutex<Seen>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl WorkerProcess {
    fn start(name: &str, config: &Path, logs: &Path, brownout: Option<&str>) -> Self {
        let log = std::fs::File::create(logs.join(format!("{name}.log"))).expect("a worker log");
        let mut cmd = Command::new(worker_binary());
        cmd.arg("--config")
            .arg(config)
            .args(["--redis-url", &redis_url()])
            .args(["--amqp-url", &amqp_url()])
            .args(["--stats-ms", "250"])
            .args(["--name", &format!("dead-letter-scale {name}")])
            .env("RUST_LOG", "warn,lapin=off")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        if let Some(b) = brownout {
            cmd.args(["--brownout", b]);
        }
        let mut child = cmd.spawn().expect("spawn fleet-worker");
        let stdout = child.stdout.take().expect("piped stdout");
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let sink = Arc::clone(&seen);
        let reader = std::thread::spawn(move || {
            let mut ids: HashMap<String, Arc<str>> = HashMap::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let mut s = sink.lock().unwrap_or_else(PoisonError::into_inner);
                if v["event"] == "run" {
                    let raw = v["id"].as_str().unwrap_or("").to_owned();
                    let id = ids
                        .entry(raw)
                        .or_insert_with_key(|k| Arc::from(k.as_str()))
                        .clone();
                    s.runs.push(Run {
                        ms: v["ms"].as_u64().unwrap_or(0),
                        id,
                        attempt: u32::try_from(v["attempt"].as_u64().unwrap_or(0)).unwrap_or(0),
                        replays: u32::try_from(v["replays"].as_u64().unwrap_or(0)).unwrap_or(0),
                        ok: v["result"] == "ok",
                    });
                } else {
                    s.last_stats = Some(v);
                }
            }
        });
        Self {
            child,
            seen,
            reader: Some(reader),
        }
    }

    fn connected(&self) -> bool {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last_stats
            .as_ref()
            .is_some_and(|s| s["counts"]["connections"].as_u64().unwrap_or(0) > 0)
    }

    fn last_run_ms(&self) -> u64 {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .runs
            .last()
            .map_or(0, |r| r.ms)
    }

    /// SIGTERM, the graceful exit (in-flight jobs settle, counters flushed); then what it saw.
    fn stop(mut self) -> Seen {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_workers(
    phase: &str,
    config: &Path,
    logs: &Path,
    brownout: Option<&str>,
) -> Vec<WorkerProcess> {
    let workers: Vec<WorkerProcess> = (0..WORKERS)
        .map(|i| WorkerProcess::start(&format!("{phase}-{i}"), config, logs, brownout))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !workers.iter().all(WorkerProcess::connected) {
        assert!(
            Instant::now() < deadline,
            "the workers did not connect within 60 s (logs in {})",
            logs.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    workers
}

/// Waits until the work queue and every retry tier are empty and no handler ran for `quiet`;
/// returns when that began to hold (the last handler run), or `None` after `within`.
async fn wait_drained(
    to: &ConnectionConfig,
    topology: &Topology,
    workers: &[WorkerProcess],
    quiet: Duration,
    within: Duration,
) -> Option<u64> {
    let deadline = Instant::now() + within;
    let quiet_ms = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX);
    while Instant::now() < deadline {
        let last = workers
            .iter()
            .map(WorkerProcess::last_run_ms)
            .max()
            .unwrap_or(0);
        if now_ms().saturating_sub(last) >= quiet_ms
            && let Ok(d) = queue_depths(to, topology).await
            && d.work == 0
            && d.retry.iter().all(|(_, n)| *n == 0)
        {
            return Some(last);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// A job's properties: persistent, its id, its task (as `Publisher::publish_job` sets them).
fn job_properties(id: &str) -> BasicProperties {
    let mut t = FieldTable::default();
    headers::set_str(&mut t, headers::TASK, TASK);
    BasicProperties::default()
        .with_message_id(ShortString::from(id))
        .with_type(ShortString::from(TASK))
        .with_delivery_mode(2)
        .with_headers(t)
}

/// The raw reference queue: a quorum queue as `migrations/` declares the work queue.
async fn declare_reference(ch: &lapin::Channel, queue: &str) {
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString("quorum".into()),
    );
    ch.queue_declare(
        ShortString::from(queue),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        args,
    )
    .await
    .expect("declare the reference queue");
}

/// Raw lapin: `n` publishes with confirms (`CONFIRM_WINDOW` in flight) to `queue` through the
/// default exchange, the jobs' properties and body. Returns the time.
async fn raw_publish(url: &str, queue: &str, n: u64) -> Duration {
    let conn = connect(url, "dead-letter-scale raw publish")
        .await
        .expect("connect");
    let ch = conn.create_channel().await.expect("a channel");
    declare_reference(&ch, queue).await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    let start = Instant::now();
    let mut inflight = VecDeque::new();
    for i in 0..n {
        let confirm = ch
            .basic_publish(
                ShortString::from(""),
                ShortString::from(queue),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                BODY,
                job_properties(&format!("raw-{i:07}")),
            )
            .await
            .expect("raw publish");
        inflight.push_back(confirm);
        while inflight.len() >= CONFIRM_WINDOW {
            let c = inflight.pop_front().unwrap().await;
            assert!(
                matches!(c, Ok(Confirmation::Ack(None))),
                "raw confirm: {c:?}"
            );
        }
    }
    while let Some(c) = inflight.pop_front() {
        let c = c.await;
        assert!(
            matches!(c, Ok(Confirmation::Ack(None))),
            "raw confirm: {c:?}"
        );
    }
    let took = start.elapsed();
    let _ = ch.close(200, ShortString::from("bye")).await;
    let _ = conn.close(200, ShortString::from("bye")).await;
    took
}

/// Raw lapin: consume and ack `n` messages of `queue` (prefetch 256, each acked on arrival), then
/// deletes the queue. Returns the time.
async fn raw_drain(url: &str, queue: &str, n: u64) -> Duration {
    let conn = connect(url, "dead-letter-scale raw drain")
        .await
        .expect("connect");
    let ch = conn.create_channel().await.expect("a channel");
    ch.basic_qos(256, BasicQosOptions::default())
        .await
        .expect("qos");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let start = Instant::now();
    let consumer = ch
        .basic_consume(
            ShortString::from(queue),
            ShortString::from("dead-letter-scale-raw"),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume the reference queue");
    consumer.set_delegate(move |delivery: lapin::message::DeliveryResult| {
        let tx = tx.clone();
        async move {
            if let Ok(Some(d)) = delivery {
                let _ = tx.send(d);
            }
        }
    });
    let mut got = 0;
    while got < n {
        let d = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("the reference queue's messages within 60 s")
            .expect("the consumer");
        d.acker.ack(BasicAckOptions::default()).await.expect("ack");
        got += 1;
    }
    let took = start.elapsed();
    let _ = ch
        .queue_delete(ShortString::from(queue), QueueDeleteOptions::default())
        .await;
    let _ = ch.close(200, ShortString::from("bye")).await;
    let _ = conn.close(200, ShortString::from("bye")).await;
    took
}

/// The jobs, through the crate's `Publisher` (`send`, then `confirmed`, `CONFIRM_WINDOW` in
/// flight). Returns their ids and the time.
async fn publish_jobs(
    url: &str,
    topology: &Topology,
    run: &str,
    n: u64,
) -> (Vec<String>, Duration) {
    let publisher = Publisher::connect(url).await.expect("a publisher");
    let ids: Vec<String> = (0..n).map(|i| format!("{run}-{i:07}")).collect();
    let start = Instant::now();
    let mut inflight = VecDeque::new();
    for id in &ids {
        let pending = publisher
            .send(&topology.work_exchange, TASK, BODY, job_properties(id))
            .await
            .expect("publish a job");
        inflight.push_back(pending);
        while inflight.len() >= CONFIRM_WINDOW {
            confirmed(inflight.pop_front().unwrap())
                .await
                .expect("a job confirmed");
        }
    }
    while let Some(p) = inflight.pop_front() {
        confirmed(p).await.expect("a job confirmed");
    }
    let took = start.elapsed();
    publisher.close().await;
    (ids, took)
}

/// One Redis PING round trip (median of 100 on one connection).
async fn redis_ping() -> Duration {
    let client = redis::Client::open(redis_url()).expect("the Redis URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("Redis");
    let mut times = Vec::new();
    for _ in 0..100 {
        let t = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .expect("PING");
        times.push(t.elapsed());
    }
    median(times)
}

/// Deletes the run's keys from Redis.
async fn delete_keys(prefix: &str) {
    let Ok(client) = redis::Client::open(redis_url()) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let mut cursor: u64 = 0;
    loop {
        let Ok((next, keys)): redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
        else {
            return;
        };
        if !keys.is_empty() {
            let _: redis::RedisResult<u64> =
                redis::cmd("DEL").arg(&keys).query_async(&mut conn).await;
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
}

/// A `budgetctl` command on the run's configuration: its time, stdout and stderr.
struct Ctl {
    took: Duration,
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
}

impl Ctl {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "budgetctl's JSON: {e}\nstdout: {}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

async fn budgetctl_run(config: &Path, args: &[&str]) -> Ctl {
    let mut cmd = tokio::process::Command::new(budgetctl());
    cmd.arg("--config")
        .arg(config)
        .args(["--redis-url", &redis_url()])
        .args(["--amqp-url", &amqp_url()])
        .args(args)
        .env("RUST_LOG", "warn,lapin=off")
        .stdin(Stdio::null());
    let start = Instant::now();
    let out = cmd.output().await.expect("run budgetctl");
    Ctl {
        took: start.elapsed(),
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The accounting of the run, from the workers' lines.
#[derive(Debug, Default)]
struct Accounting {
    published: u64,
    /// Published jobs with at least one successful execution.
    succeeded: u64,
    lost: u64,
    /// Jobs that succeeded more than once.
    succeeded_twice: u64,
    /// Executions of an id nobody published.
    foreign: u64,
    /// Executions of the first pass (the outage).
    outage_executions: u64,
    /// Executions after the recovery, and of them of replayed jobs.
    recovery_executions: u64,
    recovery_replayed: u64,
    /// The same (job, attempt, replays) run twice.
    duplicate_executions: u64,
}

fn account(ids: &[String], outage: &[Run], recovery: &[Run]) -> Accounting {
    let mut oks: HashMap<&str, u64> = ids.iter().map(|i| (i.as_str(), 0)).collect();
    let mut a = Accounting {
        published: ids.len() as u64,
        outage_executions: outage.len() as u64,
        recovery_executions: recovery.len() as u64,
        recovery_replayed: recovery.iter().filter(|r| r.replays >= 1).count() as u64,
        ..Accounting::default()
    };
    let mut executions: HashMap<(&str, u32, u32), u64> = HashMap::new();
    for r in outage.iter().chain(recovery) {
        *executions.entry((&r.id, r.attempt, r.replays)).or_default() += 1;
        match oks.get_mut(&*r.id) {
            Some(n) => *n += u64::from(r.ok),
            None => a.foreign += 1,
        }
    }
    a.duplicate_executions = executions.values().map(|n| n - 1).sum();
    a.succeeded = oks.values().filter(|n| **n >= 1).count() as u64;
    a.succeeded_twice = oks.values().filter(|n| **n >= 2).count() as u64;
    a.lost = a.published - a.succeeded;
    a
}

/// Replayed executions per second from the replay's start: the first second at 90% of the
/// asked rate or more, and the best second.
fn replay_pace(recovery: &[Run], start_ms: u64) -> (Option<u64>, u64) {
    let mut per_sec: BTreeMap<u64, u64> = BTreeMap::new();
    for r in recovery.iter().filter(|r| r.replays >= 1) {
        *per_sec
            .entry(r.ms.saturating_sub(start_ms) / 1000)
            .or_default() += 1;
    }
    let target = u64::from(REPLAY_RATE) * 9 / 10;
    let first = per_sec.iter().find(|(_, n)| **n >= target).map(|(s, _)| *s);
    (first, per_sec.values().copied().max().unwrap_or(0))
}

/// Figures of one size, for the report and the summary table.
#[derive(Debug, Default)]
struct Figures {
    n: u64,
    raw_publish: Duration,
    raw_drain: Duration,
    ping: Duration,
    ctl_noop: Duration,
    publish: Duration,
    dead_lettering: Duration,
    stats: Vec<Duration>,
    dry_run: Vec<Duration>,
    replay: Duration,
}

async fn one_size(n: u64, summary: &mut Vec<Figures>, problems: &mut Vec<String>) {
    let run = unique_prefix("dls");
    let key_prefix = run.replace('.', "-");
    let toml = config_toml(&key_prefix, &run);
    let config = WorkerConfig::from_toml(&toml, "dead-letter-scale").expect("the configuration");
    let broker = TestBroker::with_settings(AmqpSettings {
        url: amqp_url(),
        ..config.amqp.clone()
    });
    broker.migrate().await;
    let topology = broker.topology.clone();
    let to = ConnectionConfig::from(amqp_url().as_str());
    let logs = std::env::temp_dir().join(format!("fleet-budget-{run}"));
    std::fs::create_dir_all(&logs).expect("the run's folder");
    let config_path = logs.join("fleet.toml");
    std::fs::write(&config_path, &toml).expect("write the configuration");
    let mut f = Figures {
        n,
        ..Figures::default()
    };
    let mut report = String::new();
    let mut say = |line: String| {
        println!("{line}");
        report.push_str(&line);
        report.push('\n');
    };
    say(format!(
        "# Dead letters at the design's scale: {} jobs, {WORKERS} worker processes\n",
        thousands(n)
    ));
    say(format!("workers: {}", worker_binary().display()));
    say(format!("load average at the start: {}", load_average()));
    say(format!(
        "topology prefix `{run}`, Redis key prefix `{key_prefix}`; budget of `search`: ratio {RATIO}, \
         min_allowance {MIN_ALLOWANCE}, {WINDOW_SECS}-s windows, max_attempts {MAX_ATTEMPTS}; \
         worker logs in {}\n",
        logs.display()
    ));

    // 1. The references.
    let reference = format!("{run}.reference");
    f.raw_publish = raw_publish(&amqp_url(), &reference, n).await;
    f.ping = redis_ping().await;
    let noop = budgetctl_run(
        &config_path,
        &["config", "check", &config_path.to_string_lossy()],
    )
    .await;
    f.ctl_noop = noop.took;
    say(format!(
        "reference: raw lapin publish of {} with confirms: {} ({}); Redis PING: {:.0} µs; \
         `budgetctl config check` (a process, no network): {}",
        thousands(n),
        secs(f.raw_publish),
        rate(n, f.raw_publish),
        f.ping.as_secs_f64() * 1e6,
        secs(f.ctl_noop)
    ));

    // 2. The incident: N jobs queued, search down for the whole first pass.
    let (ids, publish) = publish_jobs(&amqp_url(), &topology, &run, n).await;
    f.publish = publish;
    say(format!(
        "publish {} jobs (Publisher::send + confirmed): {} ({}), raw lapin {}",
        thousands(n),
        secs(publish),
        rate(n, publish),
        secs(f.raw_publish)
    ));
    let brownout = format!("{},0,{},100", now_ms(), 365 * 24 * 3_600_000u64);
    let workers = start_workers("outage", &config_path, &logs, Some(&brownout)).await;
    let started_ms = now_ms();
    let within = Duration::from_secs(120 + n / 200);
    let last = wait_drained(&to, &topology, &workers, Duration::from_secs(2), within).await;
    if last.is_none() {
        problems.push(format!(
            "N={n}: the first pass did not drain within {} s",
            within.as_secs()
        ));
    }
    let last_ms = last.unwrap_or_else(now_ms);
    f.dead_lettering = Duration::from_millis(last_ms.saturating_sub(started_ms));
    // The index's tallies are sent every 250 ms and at the stop.
    let outage: Vec<Seen> = workers.into_iter().map(WorkerProcess::stop).collect();
    let depths = queue_depths(&to, &topology).await.expect("queue depths");
    let sum = |k: &str| -> u64 {
        outage
            .iter()
            .map(|s| {
                s.last_stats
                    .as_ref()
                    .map_or(0, |v| v["counts"][k].as_u64().unwrap_or(0))
            })
            .sum()
    };
    let dep = |k: &str| -> u64 {
        outage
            .iter()
            .map(|s| {
                s.last_stats
                    .as_ref()
                    .map_or(0, |v| v["dependencies"]["search"][k].as_u64().unwrap_or(0))
            })
            .sum()
    };
    let dead_lettered = sum("dead_lettered");
    // Decisions the per-process fallback took (the store did not answer within its timeout):
    // each process may then grant up to the floor per window on its own (docs/semantics.md,
    // "Fallback"), so the bound is the fleet's allowance plus that slack.
    let fallback: u64 = outage
        .iter()
        .map(|s| {
            s.last_stats
                .as_ref()
                .map_or(0, |v| v["fallback_decisions"].as_u64().unwrap_or(0))
        })
        .sum();
    let granted = dep("retries_granted");
    let denied = dep("retries_denied");
    let outage_runs: Vec<Run> = outage.into_iter().flat_map(|s| s.runs).collect();
    let first_run = outage_runs.iter().map(|r| r.ms).min().unwrap_or(started_ms);
    let last_run = outage_runs.iter().map(|r| r.ms).max().unwrap_or(started_ms);
    let window_ms = WINDOW_SECS * 1000;
    let windows = last_run / window_ms - first_run / window_ms + 1;
    let executions = outage_runs.len() as u64;
    say(format!(
        "outage: {} executions for {} jobs (amplification {:.3}), {} of them retries; \
         retries granted {granted} (workers' counters) of an allowance of {} \
         ({MIN_ALLOWANCE} per window, {windows} window(s) touched, no success to deposit), \
         denied {denied}; decisions taken by the per-process fallback {fallback}; \
         dead-lettered {} (workers' counters), dead-letter queue {}, parked {}; \
         time from the workers' start to the last execution: {} ({}) — raw lapin publish \
         {}, drain measured below",
        thousands(executions),
        thousands(n),
        executions as f64 / n as f64,
        outage_runs.iter().filter(|r| r.attempt >= 2).count(),
        MIN_ALLOWANCE * windows,
        thousands(dead_lettered),
        thousands(u64::from(depths.dead)),
        depths.parked,
        secs(f.dead_lettering),
        rate(n, f.dead_lettering),
        secs(f.raw_publish)
    ));
    let slack = if fallback > 0 {
        WORKERS as u64 * MIN_ALLOWANCE * windows
    } else {
        0
    };
    if granted > MIN_ALLOWANCE * windows + slack {
        problems.push(format!(
            "N={n}: {granted} retries granted, over the allowance {} + fallback slack {slack}",
            MIN_ALLOWANCE * windows
        ));
    }
    if u64::from(depths.dead) != dead_lettered {
        problems.push(format!(
            "N={n}: the dead-letter queue holds {}, the workers dead-lettered {dead_lettered}",
            depths.dead
        ));
    }

    // 3. The looks.
    for i in 0..LOOKS {
        let stats = budgetctl_run(&config_path, &["dlq", "stats", "--json"]).await;
        f.stats.push(stats.took);
        let j = stats.json();
        let d = &j["dead_letter"];
        if i == 0 {
            let by_reason = d["by_dependency_reason"]
                .as_array()
                .map(|rows| {
                    rows.iter()
                        .map(|r| {
                            format!(
                                "{} × {}: {}",
                                r["dependency"].as_str().unwrap_or("?"),
                                r["reason"].as_str().unwrap_or("?"),
                                r["count"]
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            say(format!(
                "dlq stats: depth {}, read {}, indexed {}, difference {}, exact {}, estimate {}; {by_reason}",
                d["depth"], d["read"], d["indexed"], d["difference"], d["exact"], d["estimate"]
            ));
        }
        if !stats.status.success()
            || d["exact"] != true
            || d["read"] != 0
            || d["depth"].as_u64() != Some(dead_lettered)
        {
            problems.push(format!(
                "N={n}: `budgetctl dlq stats --json` (look {}): {}, dead_letter depth {} \
                 (workers dead-lettered {dead_lettered}), read {}, exact {}, estimate {}",
                i + 1,
                stats.status,
                d["depth"],
                d["read"],
                d["exact"],
                d["estimate"]
            ));
        }
        let dry = budgetctl_run(
            &config_path,
            &["replay", "--dependency", "search", "--dry-run", "--json"],
        )
        .await;
        f.dry_run.push(dry.took);
        let j = dry.json();
        if i == 0 {
            say(format!(
                "replay --dry-run: total {}, moved {}, parked {}, skipped {}, failed {}, exact {}, \
                 uncertain {}, estimate {}",
                j["total"],
                j["moved"],
                j["parked"],
                j["skipped"],
                j["failed"],
                j["exact"],
                j["uncertain"],
                j["estimate"]
            ));
        }
        if !dry.status.success()
            || j["exact"] != true
            || j["uncertain"] != 0
            || j["moved"].as_u64() != Some(dead_lettered)
        {
            problems.push(format!(
                "N={n}: `budgetctl replay --dependency search --dry-run --json` (look {}): {}, \
                 moved {} (dead-lettered {dead_lettered}), exact {}, uncertain {}, estimate {}",
                i + 1,
                dry.status,
                j["moved"],
                j["exact"],
                j["uncertain"],
                j["estimate"]
            ));
        }
    }
    let after_looks = queue_depths(&to, &topology).await.expect("queue depths");
    if after_looks.dead != depths.dead {
        problems.push(format!(
            "N={n}: the looks changed the dead-letter queue: {} before, {} after",
            depths.dead, after_looks.dead
        ));
    }
    say(format!(
        "looks ({LOOKS} each, median; all): dlq stats {} ({}), dry run {} ({}) — beside Redis \
         PING {:.0} µs and a budgetctl process without network {}; dead-letter queue {} before \
         and {} after the looks",
        secs(median(f.stats.clone())),
        f.stats
            .iter()
            .map(|d| secs(*d))
            .collect::<Vec<_>>()
            .join(", "),
        secs(median(f.dry_run.clone())),
        f.dry_run
            .iter()
            .map(|d| secs(*d))
            .collect::<Vec<_>>()
            .join(", "),
        f.ping.as_secs_f64() * 1e6,
        secs(f.ctl_noop),
        thousands(u64::from(depths.dead)),
        thousands(u64::from(after_looks.dead)),
    ));

    // The raw drain reference, just before the replay.
    f.raw_drain = raw_drain(&amqp_url(), &reference, n).await;
    say(format!(
        "reference: raw lapin drain (consume + ack) of {}: {} ({})",
        thousands(n),
        secs(f.raw_drain),
        rate(n, f.raw_drain)
    ));

    // 4. The recovery and the replay.
    let workers = start_workers("recovery", &config_path, &logs, None).await;
    let replay_start_ms = now_ms();
    let replay = budgetctl_run(
        &config_path,
        &[
            "replay",
            "--dependency",
            "search",
            "--rate",
            &REPLAY_RATE.to_string(),
            "--json",
            "--actor",
            "dead-letter-scale",
            "--note",
            "issue 31 item 6",
        ],
    )
    .await;
    f.replay = replay.took;
    let rj = replay.json();
    let progress: Vec<&str> = replay.stderr.lines().collect();
    let paused_lines = progress.iter().filter(|l| l.contains("PAUSED")).count();
    let slowed_lines = progress.iter().filter(|l| l.contains("SLOWED")).count();
    std::fs::write(logs.join("replay.stderr"), &replay.stderr).ok();
    say(format!(
        "replay --rate {REPLAY_RATE}: {} ({} on average) — raw lapin drain {}; {}; moved {}, \
         parked {}, skipped {}, failed {}, not_ready {}, paused_secs {}, slowdowns {}, \
         lowest_rate {}; progress lines {} ({} PAUSED, {} SLOWED)",
        secs(f.replay),
        rj["moved"]
            .as_u64()
            .map_or("?".to_owned(), |m| rate(m, f.replay)),
        secs(f.raw_drain),
        replay.status,
        rj["moved"],
        rj["parked"],
        rj["skipped"],
        rj["failed"],
        rj["not_ready"],
        rj["paused_secs"],
        rj["slowdowns"],
        rj["lowest_rate"],
        progress.len(),
        paused_lines,
        slowed_lines
    ));
    if !replay.status.success() || rj["moved"].as_u64() != Some(dead_lettered) {
        problems.push(format!(
            "N={n}: `budgetctl replay --dependency search --rate {REPLAY_RATE} --json`: {}, \
             moved {} of {dead_lettered}; last progress lines: {:?}",
            replay.status,
            rj["moved"],
            progress.iter().rev().take(3).collect::<Vec<_>>()
        ));
    }
    if paused_lines > 0 || slowed_lines > 0 {
        problems.push(format!(
            "N={n}: the replay said PAUSED {paused_lines} times and SLOWED {slowed_lines} times \
             while search answered every call (progress in {})",
            logs.join("replay.stderr").display()
        ));
    }

    // Every job run OK once: wait for the last replayed jobs.
    let within = Duration::from_secs(120 + n / 500);
    if wait_drained(&to, &topology, &workers, Duration::from_secs(2), within)
        .await
        .is_none()
    {
        problems.push(format!(
            "N={n}: the replayed jobs did not drain within {} s",
            within.as_secs()
        ));
    }
    let all_ok_ms = workers
        .iter()
        .map(WorkerProcess::last_run_ms)
        .max()
        .unwrap_or(0);
    let recovery: Vec<Run> = workers
        .into_iter()
        .map(WorkerProcess::stop)
        .flat_map(|s| s.runs)
        .collect();
    let (first_fast, best) = replay_pace(&recovery, replay_start_ms);
    // Issue 31's targets for the replay of 40,000 after recovery with `--rate 2000`.
    if n == 40_000 {
        if first_fast.is_none_or(|s| s >= 15) {
            problems.push(format!(
                "N={n}: the replayed jobs did not run at {}/s or more within 15 s of the replay's \
                 start (first such second: {first_fast:?}, best {best}/s)",
                REPLAY_RATE * 9 / 10
            ));
        }
        if f.replay > Duration::from_secs(40) {
            problems.push(format!(
                "N={n}: the replay took {} (target: all moved within 40 s)",
                secs(f.replay)
            ));
        }
    }
    let end = queue_depths(&to, &topology).await.expect("queue depths");
    let a = account(&ids, &outage_runs, &recovery);
    say(format!(
        "replayed jobs executed per second: best {best}/s, first second at ≥ {}/s: {}; every job \
         run OK {} after the replay's start",
        REPLAY_RATE * 9 / 10,
        first_fast.map_or("never".to_owned(), |s| format!("second {s}")),
        secs(Duration::from_millis(
            all_ok_ms.saturating_sub(replay_start_ms)
        ))
    ));
    say(String::new());
    say("| jobs | published | succeeded | lost | succeeded twice | executions (outage + recovery) | of them replayed | same execution twice | foreign ids | left: work, dead, parked |".to_owned());
    say("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|".to_owned());
    say(format!(
        "| search | {} | {} | **{}** | **{}** | {} + {} | {} | {} | {} | {}, {}, {} |",
        thousands(a.published),
        thousands(a.succeeded),
        a.lost,
        a.succeeded_twice,
        thousands(a.outage_executions),
        thousands(a.recovery_executions),
        thousands(a.recovery_replayed),
        a.duplicate_executions,
        a.foreign,
        end.work,
        end.dead,
        end.parked
    ));
    say(String::new());
    if a.lost > 0 || a.succeeded_twice > 0 || a.foreign > 0 {
        problems.push(format!(
            "N={n}: lost {}, succeeded twice {}, executions of foreign ids {}",
            a.lost, a.succeeded_twice, a.foreign
        ));
    }

    // 5. The figures.
    say("| figure | this run | reference, same run |".to_owned());
    say("|---|---:|---|".to_owned());
    say(format!(
        "| publish {} jobs (`Publisher`, confirms) | {} | raw lapin publish {} |",
        thousands(n),
        secs(f.publish),
        secs(f.raw_publish)
    ));
    say(format!(
        "| dead-lettering (4 workers' start to the last execution) | {} | raw lapin publish {}, drain {} |",
        secs(f.dead_lettering),
        secs(f.raw_publish),
        secs(f.raw_drain)
    ));
    say(format!(
        "| `dlq stats --json` (median of {LOOKS}) | {} | Redis PING {:.0} µs; `budgetctl config check` {} |",
        secs(median(f.stats.clone())),
        f.ping.as_secs_f64() * 1e6,
        secs(f.ctl_noop)
    ));
    say(format!(
        "| `replay --dry-run --json` (median of {LOOKS}) | {} | the same |",
        secs(median(f.dry_run.clone()))
    ));
    say(format!(
        "| `replay --rate {REPLAY_RATE}` (all moved) | {} | raw lapin drain {} |",
        secs(f.replay),
        secs(f.raw_drain)
    ));
    say(format!(
        "| retries granted / allowance (+ fallback slack: {fallback} fallback decisions); amplification | {granted} / {} (+ {slack}); {:.3} | — |",
        MIN_ALLOWANCE * windows,
        executions as f64 / n as f64
    ));
    say(format!(
        "| lost; succeeded twice | {}; {} | — |",
        a.lost, a.succeeded_twice
    ));
    say(format!("\nload average at the end: {}", load_average()));
    let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("dead-letter-scale-{n}.md"));
    std::fs::write(&kept, &report).expect("write the figures");
    println!("(kept in {})\n", kept.display());
    summary.push(f);
    drop(broker);
    delete_keys(&key_prefix).await;
}

#[test]
#[ignore = "minutes at 40,000 jobs: run it with scripts/dead-letter-scale"]
fn dead_letters_at_the_designs_scale() {
    common::block_on(async {
        let mut summary = Vec::new();
        let mut problems = Vec::new();
        for n in sizes() {
            one_size(n, &mut summary, &mut problems).await;
        }
        let mut s = String::new();
        let _ = writeln!(
            s,
            "| N | publish, raw lapin | publish, Publisher | dead-lettering | dlq stats | dry run | replay --rate {REPLAY_RATE} | drain, raw lapin |\n|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for f in &summary {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                thousands(f.n),
                secs(f.raw_publish),
                secs(f.publish),
                secs(f.dead_lettering),
                secs(median(f.stats.clone())),
                secs(median(f.dry_run.clone())),
                secs(f.replay),
                secs(f.raw_drain)
            );
        }
        println!("{s}");
        assert!(
            problems.is_empty(),
            "the incident at scale broke the contract:\n  {}",
            problems.join("\n  ")
        );
    });
}
