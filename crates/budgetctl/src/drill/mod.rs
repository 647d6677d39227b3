//! `budgetctl demo`: the incident drill.
//!
//! Workers consume jobs; each job calls a simulated dependency whose capacity drops to a fifth
//! for a while and then recovers. The drill runs twice — without a budget and with one, budgets
//! in Redis on a short window — and prints the two side by side; then, after recovery, it
//! replays each run's dead-letter queue and accounts for every job:
//! `succeeded + dead-lettered-then-replayed + parked = submitted`, `lost = 0`.
//!
//! Jobs go through RabbitMQ ([`rabbit`]: the library's `Worker`s and `Replayer` on a topology of
//! the drill's own). When Redis does not answer, the budget is kept in this process; when
//! RabbitMQ does not answer, the queue is in memory ([`memory`], same decision order). The
//! output says which URL failed, how to start the services, and which mode ran.

mod memory;
mod progress;
mod rabbit;
mod upstream;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use fleet_budget::store::RedisStore;
use fleet_budget::{
    Backoff, BudgetPolicy, Config, DeadLetterReason, DepositBasis, Failure, FleetBudget, WindowMode,
};
use fleet_budget_amqp::WorkerConfig;
use serde::Serialize;

use self::memory::MemoryBroker;
use self::progress::Progress;
use self::upstream::{CallError, Schedule, Upstream};
use crate::cli::DemoArgs;
use crate::output::{print_json, table, thousands};
use crate::redis_conn;

/// The task every drill job runs.
pub(crate) const TASK: &str = "index_document";
/// The dependency it calls (the task is mapped to it).
pub(crate) const DEPENDENCY: &str = "search";

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

/// Which failure a failed call is, for the budget's decision.
pub(crate) fn job_failure(e: CallError) -> Failure {
    match e {
        CallError::Overloaded => {
            Failure::retryable("search answered 503: over capacity").with_class("http_503")
        }
        CallError::BadInput => {
            Failure::non_retryable("search answered 400: malformed document").with_class("http_400")
        }
    }
}

/// What happened to each job, by id (deliveries are at least once, so ids, not counts).
#[derive(Debug, Default)]
pub(crate) struct JobOutcomes {
    succeeded: Mutex<HashSet<u64>>,
    replay_succeeded: Mutex<HashSet<u64>>,
    dead_lettered: Mutex<BTreeMap<String, u64>>,
    dead_total: AtomicU64,
    successes: AtomicU64,
}

impl JobOutcomes {
    /// A job succeeded; `replayed` when it came back from the dead-letter queue.
    pub(crate) fn succeeded(&self, id: u64, replayed: bool) {
        self.successes.fetch_add(1, Ordering::Relaxed);
        let set = if replayed {
            &self.replay_succeeded
        } else {
            &self.succeeded
        };
        set.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id);
    }

    /// A job was dead-lettered; counted by reason unless it was a replayed one.
    pub(crate) fn dead_lettered(&self, reason: DeadLetterReason, replayed: bool) {
        if !replayed {
            self.dead_total.fetch_add(1, Ordering::Relaxed);
            let mut by = self
                .dead_lettered
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *by.entry(reason.as_str().to_owned()).or_insert(0) += 1;
        }
    }

    fn succeeded_ids(&self) -> HashSet<u64> {
        self.succeeded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn replay_succeeded_ids(&self) -> HashSet<u64> {
        self.replay_succeeded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Successful executions so far.
    pub(crate) fn successes(&self) -> u64 {
        self.successes.load(Ordering::Relaxed)
    }

    /// First-pass dead letters so far.
    pub(crate) fn dead_total(&self) -> u64 {
        self.dead_total.load(Ordering::Relaxed)
    }
}

/// Where the drill keeps budgets and jobs.
#[derive(Debug, Clone, Serialize)]
struct Mode {
    /// `redis` or `in_process`.
    budget_store: &'static str,
    /// The Redis URL (password redacted) when used.
    #[serde(skip_serializing_if = "Option::is_none")]
    redis: Option<String>,
    /// `rabbitmq` or `in_memory`.
    queue: &'static str,
    /// The RabbitMQ URL (password redacted) when used.
    #[serde(skip_serializing_if = "Option::is_none")]
    rabbitmq: Option<String>,
    /// Why a service was not used, if one was not.
    notes: Vec<String>,
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
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = (self.submit_for().as_secs_f64() * f64::from(self.rate)).round() as u64;
        n
    }
}

/// Every job accounted for after the replay.
#[derive(Debug, Clone, Default, Serialize)]
struct Accounting {
    submitted: u64,
    succeeded: u64,
    dead_lettered_then_replayed: u64,
    parked: u64,
    still_dead_lettered: u64,
    lost: u64,
}

impl Accounting {
    /// Jobs that succeeded on the first pass, the replayed ones that succeeded afterwards (and
    /// not before), `parked` and `still_dead_lettered` as counted by the queue; the rest is lost.
    fn tally(
        submitted: u64,
        outcomes: &JobOutcomes,
        parked: u64,
        still_dead_lettered: u64,
    ) -> Self {
        let succeeded = outcomes.succeeded_ids();
        let replayed = outcomes
            .replay_succeeded_ids()
            .difference(&succeeded)
            .count() as u64;
        let succeeded = succeeded.len() as u64;
        let accounted = succeeded + replayed + parked + still_dead_lettered;
        Self {
            submitted,
            succeeded,
            dead_lettered_then_replayed: replayed,
            parked,
            still_dead_lettered,
            lost: submitted.saturating_sub(accounted),
        }
    }
}

/// The result of one run.
#[derive(Debug, Clone, Default, Serialize)]
struct RunReport {
    label: String,
    budget: bool,
    jobs_submitted: u64,
    upstream_calls: u64,
    amplification: f64,
    peak_upstream_calls_per_sec: u64,
    successes: u64,
    retries_granted: u64,
    retries_denied: u64,
    dead_lettered: BTreeMap<String, u64>,
    dead_lettered_total: u64,
    replayed: u64,
    replay_upstream_calls: u64,
    parked: u64,
    accounting: Accounting,
    /// Upstream calls in each second of the run (before the replay).
    upstream_calls_per_second: Vec<u64>,
    seconds: f64,
}

/// The whole drill's output.
#[derive(Debug, Serialize)]
struct DemoReport {
    mode: Mode,
    workers: u32,
    jobs_per_sec: u32,
    capacity_per_sec: u64,
    degraded_capacity_per_sec: u64,
    phase_secs: f64,
    budget_ratio: f64,
    budget_window_secs: f64,
    budget_min_allowance: u64,
    max_attempts: u32,
    runs: Vec<RunReport>,
}

/// `budgetctl demo`.
pub(crate) async fn demo_command(config: &WorkerConfig, args: &DemoArgs) -> anyhow::Result<()> {
    let mode = choose_mode(config, args).await;
    let started = Instant::now();
    let capacity = u64::from(args.rate) * 5 / 4;
    let schedule = Schedule {
        capacity,
        degraded_capacity: (capacity / 5).max(1),
        degraded_from: Duration::from_secs_f64(args.phase_secs),
        degraded_until: Duration::from_secs_f64(args.phase_secs * 2.0),
    };
    let run_id = format!("{}-{}", std::process::id(), unix_ms() % 1_000_000);
    eprintln!(
        "drill: {} workers, {} jobs/s for {:.0}s; dependency `{DEPENDENCY}` serves {}/s, drops to {}/s from {:.0}s to {:.0}s, then recovers",
        args.workers,
        args.rate,
        args.phase_secs * 3.0,
        capacity,
        schedule.degraded_capacity,
        args.phase_secs,
        args.phase_secs * 2.0
    );
    eprintln!("budget store: {}", mode_store_line(&mode));
    eprintln!("queue:        {}", mode_queue_line(&mode));
    for note in &mode.notes {
        eprintln!("note: {note}");
    }
    let mut runs = Vec::new();
    for (label, budget) in [("without budget", false), ("with budget", true)] {
        let settings = RunSettings {
            label,
            budget,
            workers: args.workers,
            rate: args.rate,
            phase: Duration::from_secs_f64(args.phase_secs),
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
            Ok(run_in_memory(&settings, &budget_handle).await)
        };
        let _ = budget_handle.shutdown().await;
        runs.push(report.map_err(|e| {
            anyhow::anyhow!(
                "the drill on RabbitMQ at {} failed: {}",
                fleet_budget::redact::redact_url(&config.amqp.url),
                fleet_budget::redact::redact_text(&format!("{e:#}"))
            )
        })?);
    }
    let report = DemoReport {
        mode,
        workers: args.workers,
        jobs_per_sec: args.rate,
        capacity_per_sec: capacity,
        degraded_capacity_per_sec: schedule.degraded_capacity,
        phase_secs: args.phase_secs,
        budget_ratio: RATIO,
        budget_window_secs: WINDOW.as_secs_f64(),
        budget_min_allowance: MIN_ALLOWANCE,
        max_attempts: MAX_ATTEMPTS,
        runs,
    };
    eprintln!("drill finished in {:.0}s", started.elapsed().as_secs_f64());
    if args.json {
        return print_json(&report);
    }
    print_comparison(&report);
    Ok(())
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0))
}

fn mode_store_line(mode: &Mode) -> String {
    match &mode.redis {
        Some(url) => format!("Redis at {url} (window {}s)", WINDOW.as_secs()),
        None => "IN-PROCESS (fleet-budget's local store; no Redis)".to_owned(),
    }
}

fn mode_queue_line(mode: &Mode) -> String {
    match &mode.rabbitmq {
        Some(url) => format!("RabbitMQ at {url}"),
        None => "IN-MEMORY (a queue in this process; no RabbitMQ)".to_owned(),
    }
}

/// Checks which services answer; says which URL failed and how to start it.
async fn choose_mode(config: &WorkerConfig, args: &DemoArgs) -> Mode {
    let redis_shown = config.budget.redis_display();
    let mut mode = Mode {
        budget_store: "in_process",
        redis: None,
        queue: "in_memory",
        rabbitmq: None,
        notes: Vec::new(),
    };
    if args.in_process {
        mode.notes
            .push("--in-process: Redis and RabbitMQ were not tried".to_owned());
        return mode;
    }
    let timeout = Duration::from_millis(500);
    match RedisStore::new(
        redis_conn::target(&config.budget),
        &config.budget.redis.key_prefix,
        timeout,
    ) {
        Ok(store) => match store.ping().await {
            Ok(_) => {
                mode.budget_store = "redis";
                mode.redis = Some(redis_shown);
            }
            Err(e) => mode.notes.push(format!(
                "Redis at {redis_shown} does not answer ({}); start Redis and RabbitMQ with `docker compose up -d`. Running the drill with the in-process budget store instead",
                fleet_budget::redact::redact_text(&e.to_string())
            )),
        },
        Err(e) => mode.notes.push(format!("Redis URL {redis_shown} cannot be used ({e}); using the in-process budget store")),
    }
    let amqp_shown = fleet_budget::redact::redact_url(&config.amqp.url);
    let probe = tokio::time::timeout(
        Duration::from_secs(5),
        fleet_budget_amqp::connect(&config.amqp.url, "budgetctl demo probe"),
    )
    .await;
    match probe {
        Ok(Ok(conn)) => {
            let _ = conn.close(200, lapin::types::ShortString::from("probe")).await;
            mode.queue = "rabbitmq";
            mode.rabbitmq = Some(amqp_shown);
        }
        Ok(Err(e)) => mode.notes.push(format!(
            "RabbitMQ at {amqp_shown} does not answer ({}); start Redis and RabbitMQ with `docker compose up -d`. Running the drill with an in-memory queue instead",
            fleet_budget::redact::redact_text(&e.to_string())
        )),
        Err(_) => mode.notes.push(format!(
            "RabbitMQ at {amqp_shown} does not answer within 5s; start Redis and RabbitMQ with `docker compose up -d`. Running the drill with an in-memory queue instead"
        )),
    }
    mode
}

/// The budget of one run: the drill's policy (or an unlimited one for the run without a
/// budget, so both runs go through the same code), in Redis when it answers.
async fn drill_budget(
    config: &Config,
    mode: &Mode,
    settings: &RunSettings,
) -> anyhow::Result<FleetBudget> {
    let mut c = config.clone();
    let policy = if settings.budget {
        BudgetPolicy {
            window: WINDOW,
            ratio: RATIO,
            min_allowance: MIN_ALLOWANCE,
            deposit: DepositBasis::Success,
            mode: WindowMode::Sliding,
        }
    } else {
        BudgetPolicy {
            window: WINDOW,
            ratio: 0.0,
            min_allowance: 1_000_000_000,
            deposit: DepositBasis::Success,
            mode: WindowMode::Sliding,
        }
    };
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
    c.redis.key_prefix.clone_from(&settings.key_prefix);
    c.redis.timeout = c.redis.timeout.max(Duration::from_millis(250));
    c.redis.deposit_flush = Duration::from_millis(50);
    if mode.redis.is_some() {
        Ok(FleetBudget::from_config(&c).await?)
    } else {
        Ok(FleetBudget::local(&c))
    }
}

/// Waits until the broker is idle, at most `within`.
async fn wait_idle(broker: &MemoryBroker, within: Duration) {
    let deadline = Instant::now() + within;
    while !broker.idle() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One run on the in-memory queue.
async fn run_in_memory(s: &RunSettings, budget: &FleetBudget) -> RunReport {
    let upstream = Arc::new(Upstream::new(s.schedule));
    let broker = Arc::new(MemoryBroker::default());
    let outcomes = Arc::new(JobOutcomes::default());
    let stop = Arc::new(AtomicBool::new(false));
    let jobs = s.jobs();
    let submitted = Arc::new(AtomicU64::new(0));
    let progress = Progress::start(
        s.label,
        Arc::clone(&upstream),
        Arc::clone(&broker) as Arc<dyn progress::QueueGauge>,
        Arc::clone(&outcomes),
        budget.clone(),
        Arc::clone(&submitted),
        jobs,
    );

    let workers = {
        let (broker, budget, upstream, outcomes, stop) = (
            Arc::clone(&broker),
            budget.clone(),
            Arc::clone(&upstream),
            Arc::clone(&outcomes),
            Arc::clone(&stop),
        );
        let n = s.workers;
        tokio::spawn(async move {
            memory::run_workers(&broker, n, &budget, &upstream, &outcomes, &stop).await;
        })
    };

    // Submit `rate` jobs per second, evenly, for three phases.
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let started = Instant::now();
    let mut next_id = 0u64;
    while next_id < jobs {
        tick.tick().await;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let due = ((started.elapsed().as_secs_f64() * f64::from(s.rate)) as u64).min(jobs);
        while next_id < due {
            broker.submit(next_id, next_id % BAD_INPUT_EVERY == BAD_INPUT_EVERY - 1);
            next_id += 1;
        }
        submitted.store(next_id, Ordering::Relaxed);
    }
    // Let the last retries finish (the longest backoff is 1 s per attempt).
    wait_idle(&broker, s.phase.max(Duration::from_secs(5))).await;
    let first_pass_calls = upstream.calls();
    let seconds = upstream.elapsed().as_secs_f64();
    let per_second = upstream.per_second();
    let peak = upstream.peak_per_second();
    let successes = outcomes.successes();
    let dead_lettered = outcomes
        .dead_lettered
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let dead_lettered_total = outcomes.dead_total();
    let metrics = budget.metrics();
    let retries_granted = metrics.counter("retries_granted", DEPENDENCY);
    let retries_denied = metrics.counter("retries_denied", DEPENDENCY);

    // After recovery: replay the dead-letter queue until it is empty (bad input comes back and
    // is parked on the next pass).
    progress.set_stage("replay");
    let replay_rate = u32::try_from(s.schedule.capacity * 4 / 5)
        .unwrap_or(u32::MAX)
        .max(1);
    let (mut replayed, mut parked) = (0, 0);
    for _ in 0..=MAX_REPLAYS + 1 {
        if broker.dead_depth() == 0 {
            break;
        }
        let (m, p) = broker.replay_pass(replay_rate, MAX_REPLAYS).await;
        replayed += m;
        parked += p;
        wait_idle(&broker, Duration::from_secs(10)).await;
    }
    stop.store(true, Ordering::Release);
    let _ = workers.await;
    progress.finish().await;

    let parked_ids = broker
        .parked_ids()
        .difference(&outcomes.succeeded_ids())
        .count() as u64;
    let accounting = Accounting::tally(jobs, &outcomes, parked_ids, broker.dead_ids().len() as u64);
    RunReport {
        label: s.label.to_owned(),
        budget: s.budget,
        jobs_submitted: jobs,
        upstream_calls: first_pass_calls,
        #[allow(clippy::cast_precision_loss)]
        amplification: if jobs == 0 {
            0.0
        } else {
            first_pass_calls as f64 / jobs as f64
        },
        peak_upstream_calls_per_sec: peak,
        successes,
        retries_granted,
        retries_denied,
        dead_lettered,
        dead_lettered_total,
        replayed,
        replay_upstream_calls: upstream.calls() - first_pass_calls,
        parked,
        accounting,
        upstream_calls_per_second: per_second,
        seconds,
    }
}

fn print_comparison(r: &DemoReport) {
    let [a, b] = [r.runs.first(), r.runs.get(1)];
    let (Some(a), Some(b)) = (a, b) else { return };
    outln!();
    outln!(
        "Incident drill: {} workers, {} jobs/s; `{DEPENDENCY}` capacity {}/s -> {}/s for {:.0}s -> {}/s",
        r.workers,
        r.jobs_per_sec,
        r.capacity_per_sec,
        r.degraded_capacity_per_sec,
        r.phase_secs,
        r.capacity_per_sec
    );
    outln!("budget store: {}", mode_store_line(&r.mode));
    outln!("queue:        {}", mode_queue_line(&r.mode));
    outln!(
        "budget: {:.0}% of successes per {}s sliding window (at least {}); up to {} attempts per job",
        r.budget_ratio * 100.0,
        r.budget_window_secs,
        r.budget_min_allowance,
        r.max_attempts
    );
    outln!();
    let n = |v: u64| thousands(v);
    let reason = |run: &RunReport, key: &str| n(run.dead_lettered.get(key).copied().unwrap_or(0));
    let mut rows = vec![
        vec![
            String::new(),
            "without budget".to_owned(),
            "with budget".to_owned(),
        ],
        vec![
            "jobs submitted".to_owned(),
            n(a.jobs_submitted),
            n(b.jobs_submitted),
        ],
        vec![
            "upstream calls".to_owned(),
            n(a.upstream_calls),
            n(b.upstream_calls),
        ],
        vec![
            "amplification (calls/job)".to_owned(),
            format!("{:.2}x", a.amplification),
            format!("{:.2}x", b.amplification),
        ],
        vec![
            "peak upstream calls/s".to_owned(),
            n(a.peak_upstream_calls_per_sec),
            n(b.peak_upstream_calls_per_sec),
        ],
        vec![
            "successes (before replay)".to_owned(),
            n(a.successes),
            n(b.successes),
        ],
        vec![
            "retries granted".to_owned(),
            n(a.retries_granted),
            n(b.retries_granted),
        ],
        vec![
            "retries denied".to_owned(),
            n(a.retries_denied),
            n(b.retries_denied),
        ],
        vec![
            "dead-lettered".to_owned(),
            n(a.dead_lettered_total),
            n(b.dead_lettered_total),
        ],
    ];
    for reason_name in DeadLetterReason::ALL.map(DeadLetterReason::as_str) {
        rows.push(vec![
            format!("  {reason_name}"),
            reason(a, reason_name),
            reason(b, reason_name),
        ]);
    }
    rows.push(vec![
        "after recovery: replayed".to_owned(),
        n(a.replayed),
        n(b.replayed),
    ]);
    rows.push(vec![
        "  parked (came back again)".to_owned(),
        n(a.parked),
        n(b.parked),
    ]);
    out!("{}", table(&rows));
    outln!();
    outln!("every job accounted for:");
    for run in [a, b] {
        let acc = &run.accounting;
        let mut line = format!(
            "  {:<15} succeeded {} + dead-lettered then replayed {} + parked {} = {} submitted; lost {}",
            run.label,
            n(acc.succeeded),
            n(acc.dead_lettered_then_replayed),
            n(acc.parked),
            n(acc.submitted),
            acc.lost
        );
        if acc.still_dead_lettered > 0 {
            line.push_str(&format!(
                " (still dead-lettered: {})",
                acc.still_dead_lettered
            ));
        }
        outln!("{line}");
    }
}
