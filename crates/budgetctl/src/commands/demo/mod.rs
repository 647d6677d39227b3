//! `budgetctl demo`: the incident drill.
//!
//! Workers consume jobs; each job calls a simulated dependency whose capacity drops to a fifth
//! for a while and then recovers. The drill runs twice — without a budget and with one, budgets
//! in Redis on a short window — and prints the two side by side; then, after recovery, it
//! replays each run's dead-letter queue and accounts for every job:
//! `succeeded + dead-lettered-then-replayed + parked = submitted`, `lost = 0`.
//!
//! Jobs go through RabbitMQ ([`rabbit`]: the library's `Worker`s and `Replayer` on a topology of
//! the drill's own, as [`broker`] runs them for the scenarios too). When Redis does not answer, the budget is kept in this process; when
//! RabbitMQ does not answer, the queue is `fleet-budget-sim`'s in-memory one ([`memory`], jobs
//! settled by the worker's own outcome mapping). [`mode`] says which URL failed, how to start
//! the services, and which mode ran. The dependency, the queue and the tally are the models of
//! `fleet-budget-sim`; this module runs them on real time and prints.

mod broker;
mod memory;
mod mode;
mod progress;
mod rabbit;
mod report;
mod scenario;

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use fleet_budget::{
    Backoff, BudgetPolicy, Config, DeadLetterReason, DepositBasis, Failure, FleetBudget, Metrics,
    WindowMode,
};
use fleet_budget_amqp::{AmqpSettings, WorkerConfig};
use fleet_budget_sim::upstream::{CallError, Schedule, Upstream};

use self::mode::Mode;
use self::report::{DemoReport, FirstPass, ReplayTotals, RunReport};
use crate::args::number_in;
use crate::output::print_json;

/// The version of the `--json` shapes of the drill and of `--scenario`
/// (`docs/schemas/demo.schema.json`).
pub(super) const JSON_SCHEMA_VERSION: u32 = 1;

/// `demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Concurrent workers (the drill; each scenario has its own).
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=256))]
    workers: u32,
    /// Instead of the brownout drill: `slow` (a dependency with a concurrency cap fails slowly:
    /// without and with the concurrency budget) or `down` (the dependency is down for a while:
    /// without and with the circuit breaker). Needs Redis and RabbitMQ.
    #[arg(long, value_enum)]
    scenario: Option<scenario::Scenario>,
    /// Length of each phase (healthy, degraded, recovered) of one run, in seconds [default: 6;
    /// 5 for the scenarios].
    #[arg(long, allow_negative_numbers = true, value_parser = phase_secs)]
    phase_secs: Option<f64>,
    /// Jobs submitted per second [default: 200; the scenario's planned load for the scenarios].
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=5000))]
    rate: Option<u32>,
    /// Use the in-process store and an in-memory queue without trying Redis or RabbitMQ.
    #[arg(long)]
    in_process: bool,
    /// Print the comparison as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

fn phase_secs(s: &str) -> Result<f64, String> {
    number_in(s, 0.5..=600.0, "a number of seconds from 0.5 to 600")
}

/// The drill's load, defaults applied.
#[derive(Debug, Clone, Copy)]
struct Drill {
    workers: u32,
    phase_secs: f64,
    rate: u32,
}

/// The task every drill job runs.
const TASK: &str = "index_document";
/// The dependency it calls (the task is mapped to it).
const DEPENDENCY: &str = "search";

/// The budget the "with budget" run uses: 10% of successes over a 2-second sliding window,
/// at least 5 retries per window.
const RATIO: f64 = 0.1;
const WINDOW: Duration = Duration::from_secs(2);
const MIN_ALLOWANCE: u64 = 5;
/// Executions per job at most, including the first.
const MAX_ATTEMPTS: u32 = 4;
/// Replays before a message is parked.
const MAX_REPLAYS: u32 = 1;
/// One job in this many has bad input: the dependency answers 400 whatever its load.
const BAD_INPUT_EVERY: u64 = 200;
/// Retry delay tiers of the drill's topology: short, so that the drill is quick.
const RETRY_TIERS: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
];
/// What one call to the dependency costs a worker, as a real call would.
const CALL_COST: Duration = Duration::from_millis(1);

/// Whether job `id` has bad input.
fn bad_input(id: u64) -> bool {
    id % BAD_INPUT_EVERY == BAD_INPUT_EVERY - 1
}

/// Which failure a failed call is, for the budget's decision.
fn job_failure(e: CallError) -> Failure {
    match e {
        CallError::Overloaded => {
            Failure::retryable("search answered 503: over capacity").with_class("http_503")
        }
        CallError::BadInput => malformed_document(),
    }
}

/// The failure of a job with bad input, in the drill and the scenarios: 400, whatever the load.
fn malformed_document() -> Failure {
    Failure::non_retryable("search answered 400: malformed document").with_class("http_400")
}

/// One call to the dependency, now in the run that started at `started`.
async fn call(upstream: &Upstream, started: Instant, bad_input: bool) -> Result<(), CallError> {
    let answer = upstream.call(started.elapsed(), bad_input);
    tokio::time::sleep(CALL_COST).await;
    answer
}

/// Dead-letter decisions of the drill's dependency so far, by reason (the reasons seen).
fn dead_letters(metrics: &Metrics) -> BTreeMap<String, u64> {
    DeadLetterReason::ALL
        .iter()
        .map(|r| (r.as_str().to_owned(), metrics.dead_letters(DEPENDENCY, *r)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The drill's `[amqp]` settings: `base` (the broker) with names of the run's own, the drill's
/// short retry tiers, and [`MAX_REPLAYS`].
fn amqp_settings(base: &AmqpSettings, prefix: &str) -> AmqpSettings {
    AmqpSettings {
        prefix: prefix.to_owned(),
        retry_tiers: RETRY_TIERS.to_vec(),
        max_replays: MAX_REPLAYS,
        prefetch: 2,
        ..base.clone()
    }
}

/// One run's settings.
#[derive(Debug, Clone)]
struct RunSettings {
    label: &'static str,
    budget: bool,
    workers: u32,
    rate: u32,
    phase: Duration,
    schedule: Schedule,
    key_prefix: String,
}

impl RunSettings {
    fn submit_for(&self) -> Duration {
        self.phase.saturating_mul(3)
    }

    fn jobs(&self) -> u64 {
        jobs_for(self.submit_for(), self.rate)
    }

    /// Messages replayed per second: a little under the dependency's healthy capacity.
    fn replay_rate(&self) -> u32 {
        u32::try_from(self.schedule.capacity * 4 / 5)
            .unwrap_or(u32::MAX)
            .max(1)
    }
}

/// How many jobs `rate` per second submits in `submit_for`.
fn jobs_for(submit_for: Duration, rate: u32) -> u64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = (submit_for.as_secs_f64() * f64::from(rate)).round() as u64;
    n
}

/// Submits jobs `0..jobs` at `rate` per second, evenly: every 10 ms, the ids due by then go to
/// `submit`; `submitted` counts them for the progress line.
async fn submit_paced(
    rate: u32,
    jobs: u64,
    submitted: &AtomicU64,
    mut submit: impl AsyncFnMut(Range<u64>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let started = Instant::now();
    let mut next_id = 0u64;
    while next_id < jobs {
        tick.tick().await;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let due = ((started.elapsed().as_secs_f64() * f64::from(rate)) as u64).min(jobs);
        submit(next_id..due).await?;
        next_id = next_id.max(due);
        submitted.store(next_id, Ordering::Relaxed);
    }
    Ok(())
}

/// A name for this run of the command, unique enough to keep its keys and queues apart from
/// another's.
fn run_id() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        fleet_budget::clock::now_ms() % 1_000_000
    )
}

/// The error of `run` (`the drill`, `scenario slow`) failed on the broker, redacted.
fn failed_on_broker(run: &str, config: &WorkerConfig, e: &anyhow::Error) -> anyhow::Error {
    anyhow::anyhow!(
        "{run} on RabbitMQ at {} failed: {}",
        fleet_budget::redact::redact_url(&config.amqp.url),
        fleet_budget::redact::redact_text(&format!("{e:#}"))
    )
}

/// Runs the command.
pub(crate) async fn run(config: &WorkerConfig, args: &DemoArgs) -> anyhow::Result<()> {
    if let Some(scenario) = args.scenario {
        if args.in_process {
            anyhow::bail!(
                "--scenario runs on Redis and RabbitMQ (the leases and the breaker live in Redis); drop --in-process"
            );
        }
        let phase = args.phase_secs.map(Duration::from_secs_f64);
        return scenario::run(config, scenario, phase, args.rate, args.json).await;
    }
    let drill = Drill {
        workers: args.workers,
        phase_secs: args.phase_secs.unwrap_or(6.0),
        rate: args.rate.unwrap_or(200),
    };
    let mode = mode::choose(config, args.in_process).await;
    let started = Instant::now();
    let capacity = u64::from(drill.rate) * 5 / 4;
    let schedule = Schedule {
        capacity,
        degraded_capacity: (capacity / 5).max(1),
        degraded_from: Duration::from_secs_f64(drill.phase_secs),
        degraded_until: Duration::from_secs_f64(drill.phase_secs * 2.0),
    };
    let run_id = run_id();
    eprintln!(
        "drill: {} workers, {} jobs/s for {:.0}s; dependency `{DEPENDENCY}` serves {}/s, drops to {}/s from {:.0}s to {:.0}s, then recovers",
        drill.workers,
        drill.rate,
        drill.phase_secs * 3.0,
        capacity,
        schedule.degraded_capacity,
        drill.phase_secs,
        drill.phase_secs * 2.0
    );
    eprintln!("budget store: {}", mode.store_line());
    eprintln!("queue:        {}", mode.queue_line());
    for note in &mode.notes {
        eprintln!("note: {note}");
    }
    let mut runs = Vec::new();
    for (label, budget) in [("without budget", false), ("with budget", true)] {
        let settings = RunSettings {
            label,
            budget,
            workers: drill.workers,
            rate: drill.rate,
            phase: Duration::from_secs_f64(drill.phase_secs),
            schedule,
            key_prefix: format!(
                "{}-demo-{run_id}-{}",
                config.budget.redis.key_prefix,
                if budget { "b" } else { "n" }
            ),
        };
        let budget_handle = drill_budget(&config.budget, &mode, &settings).await?;
        let report = if mode.rabbitmq.is_some() {
            rabbit::run(&settings, config, &budget_handle).await
        } else {
            Ok(memory::run(&settings, &budget_handle).await)
        };
        let _ = budget_handle.shutdown().await;
        runs.push(report.map_err(|e| failed_on_broker("the drill", config, &e))?);
    }
    let report = DemoReport::new(mode, &drill, &schedule, runs);
    eprintln!("drill finished in {:.0}s", started.elapsed().as_secs_f64());
    if args.json {
        return print_json(JSON_SCHEMA_VERSION, &report);
    }
    report::print_comparison(&report);
    Ok(())
}

/// The budget of one run: the drill's policy (or an unlimited one for the run without a
/// budget, so both runs go through the same code), in Redis when it answers.
async fn drill_budget(
    config: &Config,
    mode: &Mode,
    settings: &RunSettings,
) -> anyhow::Result<FleetBudget> {
    let policy = if settings.budget {
        BudgetPolicy {
            window: WINDOW,
            ratio: RATIO,
            min_allowance: MIN_ALLOWANCE,
            deposit: DepositBasis::Success,
            mode: WindowMode::Sliding,
        }
    } else {
        UNLIMITED
    };
    let c = run_config(config, policy, &settings.key_prefix)?;
    if mode.redis.is_some() {
        Ok(FleetBudget::from_config(&c).await?)
    } else {
        Ok(FleetBudget::local(&c))
    }
}

/// A budget that never refuses a retry, on the drill's window: every run without a rate budget
/// has it, so that all runs go through the same code.
const UNLIMITED: BudgetPolicy = BudgetPolicy {
    window: WINDOW,
    ratio: 0.0,
    min_allowance: 1_000_000_000,
    deposit: DepositBasis::Success,
    mode: WindowMode::Sliding,
};

/// `config` for one run: `policy` for the demo's dependency (and as the default), [`TASK`]
/// mapped to it, up to [`MAX_ATTEMPTS`] executions per job with short backoffs, Redis keys under
/// `key_prefix` with a timeout and a deposit flush made for a quick run.
fn run_config(config: &Config, policy: BudgetPolicy, key_prefix: &str) -> anyhow::Result<Config> {
    let mut c = config.clone();
    let dependency = fleet_budget::Dependency::new(DEPENDENCY)?;
    c.defaults = policy;
    c.policies.insert(dependency.clone(), policy);
    c.map.insert(TASK, dependency);
    c.ceilings.default.max_attempts = MAX_ATTEMPTS;
    c.ceilings.default.backoff = Backoff {
        base: Duration::from_millis(100),
        factor: 2.0,
        cap: Duration::from_secs(1),
    };
    c.ceilings.tasks.clear();
    key_prefix.clone_into(&mut c.redis.key_prefix);
    c.redis.timeout = c.redis.timeout.max(Duration::from_millis(250));
    c.redis.deposit_flush = Duration::from_millis(50);
    Ok(c)
}
