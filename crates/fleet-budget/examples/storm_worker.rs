//! A retry storm as one OS process: the worker of the multi-process storms
//! (`crates/fleet-budget/tests/shadow_processes.rs`, `docs/BENCHMARKS.md`, "Shadow beside
//! enforcement in OS processes").
//!
//! ```text
//! storm_worker --config FLEET.toml --task TASK --tasks T --decisions N [--success-every K]
//! ```
//!
//! It builds a `FleetBudget` from the configuration file (TOML as users write it), prints
//! `ready` once Redis answered, and waits for a line on its standard input (so that the
//! processes of a run start their storms together). Then T tasks ask `on_failure` N times in all
//! (shared as evenly as it divides; attempt 1: a fresh job each time, so no ceiling interferes), and with `--success-every K`
//! each reports a success before every K-th of its failures (`on_success`: the allowance grows
//! during the storm). Every task ends with a failure. After `flush`, it prints its accounting
//! as one JSON line:
//!
//! - `decisions`, `granted` (retries the budget granted), `shadow_denied` (refused by the
//!   budget and retried anyway, in shadow), `dead_lettered` by reason, `sources` (decisions by
//!   budget source: `fleet`, `fleet_cache`, or a fallback's when Redis did not answer in time),
//!   `successes`;
//! - `would_deny` and `denied`: the process's `fleet_budget_retries_would_deny_total` and
//!   `fleet_budget_retries_denied_total` for the task's dependency;
//! - `late_successes`: successes whose deposit reached Redis less than `redis.deny_cache_ms`
//!   before the start of the process's last decision. With `redis.deposit_flush_ms = 0` (each
//!   deposit its own call, awaited by `on_success`) the moment `on_success` returns is after the
//!   deposit reached Redis, so this counts every deposit whose grants a deny cache may still
//!   have been holding back when the storm ended (the bound of the test's doc comment);
//! - `secs`: the storm's wall time in this process.
//!
//! With `--jobs-per-tick J [--healthy-failure-percent P] [--retry-delay-ms D] [--seed S]
//! [--metrics ADDR]` it is instead a worker under ordinary traffic for Prometheus to scrape
//! (`crates/budgetctl/tests/tune_prometheus.rs`): see [`traffic`].
//!
//! Run by the tests (`cargo build -p fleet-budget --example storm_worker` first), or by hand
//! against any Redis the configuration names.

#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fleet_budget::metrics::MetricsServer;
use fleet_budget::{BudgetSource, Config, DeadLetterReason, Decision, Failure, FleetBudget};

/// The command line.
struct Args {
    config: String,
    task: String,
    tasks: u64,
    decisions: u64,
    success_every: u64,
    /// Traffic mode: jobs started every 10 ms (0: the storm).
    jobs_per_tick: u64,
    healthy_failure_percent: u64,
    retry_delay_ms: u64,
    seed: u64,
    /// Where to serve `/metrics` (traffic mode; port 0 for a free one).
    metrics: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let (mut config, mut task) = (None, None);
    let (mut tasks, mut decisions, mut success_every) = (32, 3200, 0);
    let (mut jobs_per_tick, mut healthy_failure_percent, mut retry_delay_ms, mut seed) =
        (0, 10, 200, 1);
    let mut metrics = None;
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag.as_str() {
            "--config" => config = Some(value),
            "--task" => task = Some(value),
            "--tasks" => tasks = number()?,
            "--decisions" => decisions = number()?,
            "--success-every" => success_every = number()?,
            "--jobs-per-tick" => jobs_per_tick = number()?,
            "--healthy-failure-percent" => healthy_failure_percent = number()?.min(100),
            "--retry-delay-ms" => retry_delay_ms = number()?,
            "--seed" => seed = number()?,
            "--metrics" => metrics = Some(value),
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if tasks == 0 {
        return Err("--tasks must be at least 1".to_owned());
    }
    Ok(Args {
        config: config.ok_or("--config FILE is required")?,
        task: task.ok_or("--task NAME is required")?,
        tasks,
        decisions,
        success_every,
        jobs_per_tick,
        healthy_failure_percent,
        retry_delay_ms,
        seed,
        metrics,
    })
}

/// Microseconds since the Unix epoch (the processes of a run share the machine's clock).
fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// What one task saw.
#[derive(Default)]
struct Seen {
    granted: u64,
    shadow_denied: u64,
    dead_lettered: BTreeMap<&'static str, u64>,
    /// Decisions by budget source (`fleet`, `fleet_cache`, a fallback's).
    sources: BTreeMap<&'static str, u64>,
    successes: u64,
    /// When each success's deposit had reached Redis (`on_success` returned).
    deposited_us: Vec<u64>,
    /// When the task's last decision started.
    last_decision_us: u64,
}

async fn task(budget: Arc<FleetBudget>, name: Arc<str>, failures: u64, every: u64) -> Seen {
    let failure = Failure::retryable("503");
    let mut seen = Seen::default();
    for i in 0..failures {
        if every > 0 && i % every == every - 1 {
            if let Err(e) = budget.on_success(&name).await {
                eprintln!("on_success: {e}");
                std::process::exit(2);
            }
            seen.successes += 1;
            seen.deposited_us.push(unix_us());
        }
        seen.last_decision_us = unix_us();
        let decision = match budget.on_failure(&name, 1, &failure).await {
            Ok(decision) => decision,
            Err(e) => {
                eprintln!("on_failure: {e}");
                std::process::exit(2);
            }
        };
        let source = match decision {
            Decision::Retry {
                shadow_denied,
                source,
                ..
            } => {
                if shadow_denied.is_some() {
                    seen.shadow_denied += 1;
                } else {
                    seen.granted += 1;
                }
                source
            }
            Decision::DeadLetter { reason, source, .. } => {
                *seen.dead_lettered.entry(reason.as_str()).or_default() += 1;
                source
            }
        };
        *seen.sources.entry(source.as_str()).or_default() += 1;
    }
    seen
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("storm_worker: {e}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args().map_err(|e| {
        format!(
            "{e}\nusage: storm_worker --config FILE --task NAME --tasks T --decisions N \
             [--success-every K]\n       storm_worker --config FILE --task NAME --jobs-per-tick J \
             [--healthy-failure-percent P] [--retry-delay-ms D] [--seed S] [--metrics ADDR]"
        )
    })?;
    let config = Config::from_path(std::path::Path::new(&args.config))?;
    let budget = Arc::new(FleetBudget::from_config(&config).await?);
    let dependency = budget.dependency(&args.task)?;
    // Connected (and the scripts loaded) before anything is counted.
    let (_, source) = budget.status(&dependency).await;
    if source != BudgetSource::Fleet {
        return Err(format!("Redis did not answer (budget source {})", source.as_str()).into());
    }
    if args.jobs_per_tick > 0 {
        return traffic(&args, budget).await;
    }
    let staleness_us = u64::try_from(config.redis.deny_cache.as_micros()).unwrap_or(u64::MAX);
    println!("ready");
    let mut go = String::new();
    if std::io::stdin().lock().read_line(&mut go)? == 0 {
        // Whoever started it is gone before the storm: nothing to do.
        budget.shutdown().await?;
        return Ok(());
    }

    let started = Instant::now();
    let name: Arc<str> = Arc::from(args.task.as_str());
    let handles: Vec<_> = (0..args.tasks)
        .map(|t| {
            let share = args.decisions / args.tasks + u64::from(t < args.decisions % args.tasks);
            tokio::spawn(task(
                Arc::clone(&budget),
                Arc::clone(&name),
                share,
                args.success_every,
            ))
        })
        .collect();
    let mut all = Seen::default();
    for h in handles {
        let s = h.await?;
        all.granted += s.granted;
        all.shadow_denied += s.shadow_denied;
        for (reason, n) in s.dead_lettered {
            *all.dead_lettered.entry(reason).or_default() += n;
        }
        for (source, n) in s.sources {
            *all.sources.entry(source).or_default() += n;
        }
        all.successes += s.successes;
        all.deposited_us.extend(s.deposited_us);
        all.last_decision_us = all.last_decision_us.max(s.last_decision_us);
    }
    let secs = started.elapsed().as_secs_f64();
    budget.flush().await?;
    let since = all.last_decision_us.saturating_sub(staleness_us);
    let late = all.deposited_us.iter().filter(|at| **at > since).count();
    let metrics = budget.metrics();
    let line = serde_json::json!({
        "task": args.task,
        "dependency": dependency.as_str(),
        "decisions": args.decisions,
        "granted": all.granted,
        "shadow_denied": all.shadow_denied,
        "dead_lettered": all.dead_lettered,
        "sources": all.sources,
        "successes": all.successes,
        "late_successes": late,
        "would_deny": metrics.counter("retries_would_deny", dependency.as_str()),
        "denied": metrics.counter("retries_denied", dependency.as_str()),
        "secs": secs,
    });
    println!("{line}");
    budget.shutdown().await?;
    Ok(())
}

/// xorshift64*: the worker's own draws, no dependency.
struct Rng(u64);

impl Rng {
    fn percent(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % 100
    }
}

/// Each success and each retry asked (granted or denied by the budget), at the Unix ms it was
/// decided.
type Tally = Mutex<Vec<(u64, bool)>>;

fn tally(tally: &Tally, success: bool) {
    let at = unix_us() / 1000;
    tally
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((at, success));
}

/// One job of the traffic mode: attempts until it succeeds, or the budget or the ceiling
/// dead-letters it; an attempt fails while the dependency is failing, else
/// `--healthy-failure-percent` of the time.
async fn job(
    budget: Arc<FleetBudget>,
    name: Arc<str>,
    failing: Arc<AtomicBool>,
    counted: Arc<Tally>,
    (seed, healthy_failure_percent, retry_delay): (u64, u64, Duration),
) -> Result<(), fleet_budget::Error> {
    let mut rng = Rng(seed | 1);
    let mut attempt = 1;
    loop {
        budget.on_attempt(&name, attempt).await?;
        let fails = failing.load(Ordering::Relaxed) || rng.percent() < healthy_failure_percent;
        if !fails {
            budget.on_success(&name).await?;
            tally(&counted, true);
            return Ok(());
        }
        match budget
            .on_failure(&name, attempt, &Failure::retryable("unavailable"))
            .await?
        {
            Decision::Retry { next_attempt, .. } => {
                tally(&counted, false);
                attempt = next_attempt;
                tokio::time::sleep(retry_delay).await;
            }
            Decision::DeadLetter { reason, .. } => {
                if reason == DeadLetterReason::BudgetExhausted {
                    tally(&counted, false);
                }
                return Ok(());
            }
        }
    }
}

/// The traffic mode (`--jobs-per-tick J`): serves `/metrics` (`--metrics ADDR`), prints
/// `ready ADDR`, and takes its orders one a line on its standard input: `start` (jobs every
/// 10 ms), `fail` and `heal` (the dependency fails every attempt, or only the healthy rate),
/// `stop` (no new jobs), `exit` (prints the tally as one JSON line, `{"tally": [[unix_ms,
/// success], …]}`, and ends; so does the end of its input).
async fn traffic(args: &Args, budget: Arc<FleetBudget>) -> Result<(), Box<dyn std::error::Error>> {
    let addr = args.metrics.as_deref().unwrap_or("127.0.0.1:0").parse()?;
    let server = MetricsServer::bind(addr, budget.metrics().registry().clone()).await?;
    println!("ready {}", server.local_addr());
    let (orders_tx, mut orders) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if orders_tx.send(line.trim().to_owned()).is_err() {
                break;
            }
        }
    });
    let name: Arc<str> = Arc::from(args.task.as_str());
    let failing = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let counted: Arc<Tally> = Arc::default();
    let (jobs_per_tick, percent) = (args.jobs_per_tick, args.healthy_failure_percent);
    let retry_delay = Duration::from_millis(args.retry_delay_ms);
    let mut seed = args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut driver = None;
    while let Some(order) = orders.recv().await {
        match order.as_str() {
            "start" if driver.is_none() => {
                let (budget, name, failing, stop, counted) = (
                    Arc::clone(&budget),
                    Arc::clone(&name),
                    Arc::clone(&failing),
                    Arc::clone(&stop),
                    Arc::clone(&counted),
                );
                driver = Some(tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_millis(10));
                    while !stop.load(Ordering::Relaxed) {
                        tick.tick().await;
                        for _ in 0..jobs_per_tick {
                            seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
                            let job = job(
                                Arc::clone(&budget),
                                Arc::clone(&name),
                                Arc::clone(&failing),
                                Arc::clone(&counted),
                                (seed, percent, retry_delay),
                            );
                            tokio::spawn(async move {
                                if let Err(e) = job.await {
                                    eprintln!("job: {e}");
                                }
                            });
                        }
                    }
                }));
            }
            "fail" => failing.store(true, Ordering::Relaxed),
            "heal" => failing.store(false, Ordering::Relaxed),
            "stop" => stop.store(true, Ordering::Relaxed),
            "exit" => break,
            other => eprintln!("storm_worker: unknown order {other:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(driver) = driver {
        driver.await?;
    }
    let counted = counted
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    println!("{}", serde_json::json!({ "tally": counted }));
    server.shutdown().await;
    budget.shutdown().await?;
    Ok(())
}
