//! `fleet-worker`: one worker *process* of a test fleet, built on [`fleet_budget_amqp::Worker`],
//! for tests that need several processes sharing one budget (the game day, the mixed
//! Rust/Python fleet) and for humans who want to watch one.
//!
//! ```sh
//! cargo build -p fleet-budget-e2e --bin fleet-worker
//! target/debug/fleet-worker --config fleet.toml --prefix fbt.mine --key-prefix fbt-mine \
//!     --migrate --upstream 127.0.0.1:7001          # or: --brownout EPOCH_MS,FROM_MS,UNTIL_MS,PERCENT
//! ```
//!
//! In a Rust test of the `fleet-budget-e2e` package, `env!("CARGO_BIN_EXE_fleet-worker")` is its
//! path. Every flag can also be given in the environment (`FLEET_WORKER_<FLAG>`, e.g.
//! `FLEET_WORKER_UPSTREAM`); `--config` is the worker's TOML (`WorkerConfig`, with
//! `FLEET_BUDGET_REDIS_URL` / `FLEET_BUDGET_AMQP_URL` applied), and `--redis-url`, `--amqp-url`,
//! `--prefix`, `--key-prefix` override it; `--metrics-listen ADDR` serves its `/metrics`.
//! SIGTERM or SIGINT stop it gracefully (in-flight jobs settle, counters are flushed); SIGKILL is
//! a crash.
//!
//! **The job.** The body is a JSON object; anything else is a poison message
//! (`Failure::poison`, dead-lettered `non_retryable`). Its fields, all optional:
//!
//! * `"fail"`: `"retryable"`, `"non_retryable"` or `"retry_after"` (with `"retry_after_ms"`):
//!   the handler fails that way while the attempt is below `"until_attempt"` and the job's
//!   replays are below `"until_replay"` (both unbounded when absent);
//! * otherwise the handler calls the **dependency** (unless `"call": false`): with `--upstream
//!   HOST:PORT`, one TCP line `CALL <message id> <task> <attempt> <replays> <pid>` answered by
//!   `OK`, `FAIL <class>` (retryable) or `REJECT <class>` (non-retryable), 2 s at most (the test
//!   process owns the schedule, shared by every worker); with `--brownout EPOCH_MS,FROM_MS,UNTIL_MS,PERCENT`,
//!   a call between `EPOCH_MS + FROM_MS` and `EPOCH_MS + UNTIL_MS` (Unix ms, the machine's clock)
//!   fails with class `http_503` for `PERCENT`% of (job, attempt, replays), picked by a hash that
//!   every process computes alike; with neither, every call succeeds. `--call-ms` makes each call
//!   take that long.
//!
//! **What it prints** on stdout, one JSON object per line, flushed at once (logs go to stderr):
//! `{"event":"run", "ms", "pid", "id", "task", "attempt", "replays", "redelivered", "result"}`
//! per handler execution (`result` is `ok`, or `fail:<class>`), and every `--stats-ms` (and at
//! exit, `"event":"exit"`) `{"event":"stats", "ms", "pid", "counts": WorkerCounts,
//! "dependencies": {name: {retries_granted, retries_denied, fallback_active}},
//! "fallback_decisions"}` for the configured dependencies.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;
use fleet_budget::{Failure, FleetBudget};
use fleet_budget_amqp::{
    Job, Migrations, Topology, Worker, WorkerConfig, WorkerCounts, WorkerOptions, migrate,
};
use serde_json::{Value, json};

/// One worker process of a test fleet (see the module documentation).
#[derive(Debug, Parser)]
#[command(name = "fleet-worker", version)]
struct Args {
    /// The worker's configuration (TOML: `[redis]`, `[amqp]`, `[defaults]`, `[dependencies.*]`, ...).
    #[arg(long, env = "FLEET_WORKER_CONFIG")]
    config: Option<PathBuf>,
    /// Redis URL (overrides the configuration).
    #[arg(long, env = "FLEET_WORKER_REDIS_URL")]
    redis_url: Option<String>,
    /// RabbitMQ URL (overrides the configuration).
    #[arg(long, env = "FLEET_WORKER_AMQP_URL")]
    amqp_url: Option<String>,
    /// Prefix of exchange and queue names (`amqp.prefix`).
    #[arg(long, env = "FLEET_WORKER_PREFIX")]
    prefix: Option<String>,
    /// Prefix of the budget keys in Redis (`redis.key_prefix`).
    #[arg(long, env = "FLEET_WORKER_KEY_PREFIX")]
    key_prefix: Option<String>,
    /// The queue to consume (default: the topology's work queue).
    #[arg(long, env = "FLEET_WORKER_QUEUE")]
    queue: Option<String>,
    /// Declare the topology (idempotent) before consuming.
    #[arg(long, env = "FLEET_WORKER_MIGRATE")]
    migrate: bool,
    /// The simulated dependency: a line server at HOST:PORT that decides every call.
    #[arg(long, env = "FLEET_WORKER_UPSTREAM", conflicts_with = "brownout")]
    upstream: Option<SocketAddr>,
    /// The simulated dependency: a brownout by wall-clock time, `EPOCH_MS,FROM_MS,UNTIL_MS,PERCENT`.
    #[arg(long, env = "FLEET_WORKER_BROWNOUT", value_parser = Brownout::parse)]
    brownout: Option<Brownout>,
    /// How long each call to the dependency takes, in ms.
    #[arg(long, env = "FLEET_WORKER_CALL_MS", default_value_t = 0)]
    call_ms: u64,
    /// Milliseconds between two stats lines.
    #[arg(long, env = "FLEET_WORKER_STATS_MS", default_value_t = 250,
          value_parser = clap::value_parser!(u64).range(10..=60_000))]
    stats_ms: u64,
    /// Connection name shown by the broker.
    #[arg(long, env = "FLEET_WORKER_NAME", default_value = "fleet-worker")]
    name: String,
    /// Serve the budget's and the worker's metrics on `/metrics` at this address.
    #[arg(long, env = "FLEET_WORKER_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
}

/// A brownout by wall-clock time, the same in every process that is given it.
#[derive(Debug, Clone, Copy)]
struct Brownout {
    from_ms: u64,
    until_ms: u64,
    percent: u64,
}

impl Brownout {
    fn parse(s: &str) -> Result<Self, String> {
        let parts: Vec<u64> = s
            .split(',')
            .map(|p| p.trim().parse::<u64>())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{s:?}: {e}; expected EPOCH_MS,FROM_MS,UNTIL_MS,PERCENT"))?;
        let [epoch, from, until, percent] = parts[..] else {
            return Err(format!(
                "{s:?}: expected four numbers, EPOCH_MS,FROM_MS,UNTIL_MS,PERCENT"
            ));
        };
        if from > until || percent > 100 {
            return Err(format!(
                "{s:?}: FROM_MS must not be after UNTIL_MS, and PERCENT is 0 to 100"
            ));
        }
        Ok(Self {
            from_ms: epoch.saturating_add(from),
            until_ms: epoch.saturating_add(until),
            percent,
        })
    }

    /// Whether this execution of the job fails: the same answer in every process.
    fn fails(&self, now_ms: u64, id: &str, attempt: u32, replays: u32) -> bool {
        if now_ms < self.from_ms || now_ms >= self.until_ms {
            return false;
        }
        // FNV-1a: stable across processes and builds, unlike the standard library's hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in id
            .bytes()
            .chain(attempt.to_le_bytes())
            .chain(replays.to_le_bytes())
        {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        h % 100 < self.percent
    }
}

/// The simulated dependency.
#[derive(Debug, Clone, Copy)]
enum Dependency {
    Upstream(SocketAddr),
    Brownout(Brownout),
    Healthy,
}

/// What the handler of one job does, from its body.
#[derive(Debug, Default)]
struct Plan {
    fail: Option<String>,
    retry_after_ms: u64,
    until_attempt: Option<u64>,
    until_replay: Option<u64>,
    call: bool,
}

impl Plan {
    fn of(payload: &[u8]) -> Option<Self> {
        let v: Value = serde_json::from_slice(payload).ok()?;
        let o = v.as_object()?;
        Some(Self {
            fail: o.get("fail").and_then(Value::as_str).map(str::to_owned),
            retry_after_ms: o.get("retry_after_ms").and_then(Value::as_u64).unwrap_or(0),
            until_attempt: o.get("until_attempt").and_then(Value::as_u64),
            until_replay: o.get("until_replay").and_then(Value::as_u64),
            call: o.get("call").and_then(Value::as_bool).unwrap_or(true),
        })
    }

    /// The failure this execution is told to end in, if any.
    fn failure(&self, attempt: u32, replays: u32) -> Option<Failure> {
        let kind = self.fail.as_deref()?;
        let applies = self.until_attempt.is_none_or(|a| u64::from(attempt) < a)
            && self.until_replay.is_none_or(|r| u64::from(replays) < r);
        if !applies {
            return None;
        }
        Some(match kind {
            "non_retryable" => Failure::non_retryable("the job says: fail, do not retry")
                .with_class("told_non_retryable"),
            "retry_after" => Failure::retry_after(
                Duration::from_millis(self.retry_after_ms),
                "the job says: retry after",
            )
            .with_class("told_retry_after"),
            _ => Failure::retryable("the job says: fail").with_class("told_retryable"),
        })
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One line of JSON on stdout, flushed (a SIGKILL loses at most the line being written).
fn emit(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// One call to the line server: `CALL ...` → `OK` | `FAIL class` | `REJECT class`.
fn call_upstream(addr: SocketAddr, line: &str) -> Result<(), Failure> {
    let unreachable = |e: std::io::Error| {
        Failure::retryable(format!("dependency at {addr}: {e}"))
            .with_class("dependency_unreachable")
    };
    let deadline = Duration::from_secs(2);
    let mut stream = TcpStream::connect_timeout(&addr, deadline).map_err(unreachable)?;
    stream
        .set_read_timeout(Some(deadline))
        .map_err(unreachable)?;
    stream
        .set_write_timeout(Some(deadline))
        .map_err(unreachable)?;
    stream
        .write_all(format!("{line}\n").as_bytes())
        .map_err(unreachable)?;
    // One line of at most 256 bytes: a garbling dependency cannot grow it.
    let mut answer = String::new();
    BufReader::new(std::io::Read::take(stream, 256))
        .read_line(&mut answer)
        .map_err(unreachable)?;
    let mut words = answer.split_whitespace();
    match (words.next(), words.next()) {
        (Some("OK"), _) => Ok(()),
        (Some("REJECT"), class) => Err(Failure::non_retryable("the dependency refused the call")
            .with_class(class.unwrap_or("rejected"))),
        (Some("FAIL"), class) => Err(Failure::retryable("the dependency failed the call")
            .with_class(class.unwrap_or("failed"))),
        _ => Err(
            Failure::retryable(format!("dependency at {addr} answered {answer:?}"))
                .with_class("dependency_garbled"),
        ),
    }
}

async fn call(dependency: Dependency, job: &Job, call_ms: u64) -> Result<(), Failure> {
    if call_ms > 0 {
        tokio::time::sleep(Duration::from_millis(call_ms)).await;
    }
    let id = job.message_id.clone().unwrap_or_default();
    match dependency {
        Dependency::Healthy => Ok(()),
        Dependency::Brownout(b) => {
            if b.fails(now_ms(), &id, job.attempt, job.replays) {
                Err(Failure::retryable("search answered 503").with_class("http_503"))
            } else {
                Ok(())
            }
        }
        Dependency::Upstream(addr) => {
            // Names on the line are single words: a task with spaces is sent as `-`.
            let word = |s: &str| {
                if s.is_empty() || s.contains(char::is_whitespace) || s.len() > 300 {
                    "-".to_owned()
                } else {
                    s.to_owned()
                }
            };
            let line = format!(
                "CALL {} {} {} {} {}",
                word(&id),
                word(&job.task),
                job.attempt,
                job.replays,
                std::process::id()
            );
            tokio::task::spawn_blocking(move || call_upstream(addr, &line))
                .await
                .unwrap_or_else(|e| {
                    Err(Failure::retryable(format!("dependency call: {e}")).with_class("panic"))
                })
        }
    }
}

/// The handler: the job's own failure if its body says so, else the dependency's answer.
async fn handle(dependency: Dependency, call_ms: u64, job: Job) -> Result<(), Failure> {
    let result = match Plan::of(&job.payload) {
        None => Err(Failure::poison("the body is not a JSON object").with_class("poison")),
        Some(plan) => match plan.failure(job.attempt, job.replays) {
            Some(f) => Err(f),
            None if plan.call => call(dependency, &job, call_ms).await,
            None => Ok(()),
        },
    };
    emit(&json!({
        "event": "run",
        "ms": now_ms(),
        "pid": std::process::id(),
        "id": job.message_id,
        "task": job.task,
        "attempt": job.attempt,
        "replays": job.replays,
        "redelivered": job.redelivered,
        "result": match &result {
            Ok(()) => "ok".to_owned(),
            Err(f) => format!("fail:{}", f.class),
        },
    }));
    result
}

fn counts_json(c: WorkerCounts) -> Value {
    json!({
        "deliveries": c.deliveries, "succeeded": c.succeeded, "retried": c.retried,
        "dead_lettered": c.dead_lettered, "requeued": c.requeued, "ack_failed": c.ack_failed,
        "connections": c.connections, "waited_again": c.waited_again, "parked": c.parked,
    })
}

/// `fleet_budget_fallback_decisions_total`, all modes, from the rendered metrics.
fn fallback_decisions(budget: &FleetBudget) -> u64 {
    budget
        .metrics()
        .render()
        .lines()
        .filter(|l| l.starts_with("fleet_budget_fallback_decisions_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| {
            // Counter values are whole numbers.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = v as u64;
            n
        })
        .sum()
}

fn stats(event: &str, budget: &FleetBudget, dependencies: &[String], c: WorkerCounts) -> Value {
    let m = budget.metrics();
    let deps: serde_json::Map<String, Value> = dependencies
        .iter()
        .map(|d| {
            (
                d.clone(),
                json!({
                    "retries_granted": m.counter("retries_granted", d),
                    "retries_denied": m.counter("retries_denied", d),
                    "fallback_active": m.fallback_is_active(d),
                }),
            )
        })
        .collect();
    json!({
        "event": event,
        "ms": now_ms(),
        "pid": std::process::id(),
        "counts": counts_json(c),
        "dependencies": deps,
        "fallback_decisions": fallback_decisions(budget),
    })
}

fn config(args: &Args) -> anyhow::Result<WorkerConfig> {
    let mut config = match &args.config {
        Some(path) => WorkerConfig::from_path(path)?,
        None => {
            let mut c = WorkerConfig::default();
            c.apply_env(|name| std::env::var(name).ok())
                .map_err(|p| anyhow::anyhow!("{p}"))?;
            c
        }
    };
    if let Some(url) = &args.redis_url {
        config
            .budget
            .set_redis_url(url)
            .map_err(|p| anyhow::anyhow!("--redis-url: {p}"))?;
    }
    if let Some(url) = &args.amqp_url {
        // One broker, or a cluster's nodes separated by commas (the broker game day).
        let nodes: Vec<String> = url.split(',').map(str::to_owned).collect();
        config
            .amqp
            .set_urls("--amqp-url", &nodes)
            .map_err(|p| anyhow::anyhow!("--amqp-url: {p}"))?;
    }
    if let Some(prefix) = &args.prefix {
        config.amqp.prefix.clone_from(prefix);
    }
    if let Some(prefix) = &args.key_prefix {
        config
            .budget
            .set_key_prefix(prefix)
            .map_err(|p| anyhow::anyhow!("--key-prefix: {p}"))?;
    }
    if let Some(addr) = args.metrics_listen {
        config.budget.metrics.listen = Some(addr);
    }
    Ok(config)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,lapin=off"));
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .try_init();
    let args = Args::parse();
    let config = config(&args)?;
    let topology = Topology::new(&config.amqp);
    if args.migrate {
        migrate(
            &config.amqp.url,
            &config.amqp,
            &Migrations::embedded()?,
            false,
        )
        .await
        .context("declare the topology (--migrate)")?;
    }
    let budget = FleetBudget::from_config(&config.budget).await?;
    let mut options = WorkerOptions::new(&config, &topology);
    options.name.clone_from(&args.name);
    if let Some(queue) = &args.queue {
        options.queue.clone_from(queue);
    }
    let dependency = match (args.upstream, args.brownout) {
        (Some(addr), _) => Dependency::Upstream(addr),
        (None, Some(b)) => Dependency::Brownout(b),
        (None, None) => Dependency::Healthy,
    };
    let dependencies: Vec<String> = config
        .budget
        .map
        .entries()
        .into_iter()
        .map(|(_, d)| d.as_str().to_owned())
        .chain(config.budget.policies.keys().map(|d| d.as_str().to_owned()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();

    let worker = Worker::new(budget.clone(), topology, options);
    let handle = worker.handle();
    let call_ms = args.call_ms;
    let run = tokio::spawn(worker.run(move |job| handle_job(dependency, call_ms, job)));

    // Stats until a signal; then a graceful stop.
    let mut tick = tokio::time::interval(Duration::from_millis(args.stats_ms));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let deps = Arc::new(dependencies);
    loop {
        tokio::select! {
            _ = tick.tick() => emit(&stats("stats", &budget, &deps, handle.counts())),
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    handle.shutdown();
    let counts = run.await??;
    if let Err(e) = budget.shutdown().await {
        tracing::warn!(error = %e, "budget counters not flushed at exit");
    }
    emit(&stats("exit", &budget, &deps, counts));
    Ok(())
}

/// The handler as the worker calls it.
fn handle_job(
    dependency: Dependency,
    call_ms: u64,
    job: Job,
) -> impl Future<Output = Result<(), Failure>> + Send {
    handle(dependency, call_ms, job)
}
