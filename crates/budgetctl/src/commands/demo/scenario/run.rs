//! One run of a scenario on RabbitMQ: a topology of its own (migrated, deleted at the end),
//! library `Worker`s calling the simulated [`Dependency`], jobs published with confirms at the
//! scenario's rate, then — once the queues are quiet — the library `Replayer` on the dead
//! letters, and every job accounted for.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_budget::{Failure, FleetBudget};
use fleet_budget_amqp::{
    Job, Migrations, Publisher, ReplayOptions, Replayer, Topology, Worker, WorkerConfig,
    WorkerHandle, WorkerOptions, delete_topology,
};
use fleet_budget_sim::accounting::{Accounting, JobOutcomes};
use futures::future::try_join_all;

use super::Setup;
use super::dependency::{CallFailure, Dependency};
use super::report::{FirstPass, RunFigures};
use crate::commands::demo::rabbit::{Depths, parse_payload, payload, wait_settled};
use crate::commands::demo::{MAX_REPLAYS, ReplayTotals, TASK, amqp_settings, dead_letters};
use crate::output::thousands;

/// Which failure a failed call is, for the budget (and the breaker).
fn failure(e: CallFailure) -> Failure {
    match e {
        CallFailure::Failed => {
            Failure::retryable("search answered 503 after working on it").with_class("http_503")
        }
        CallFailure::TimedOut => {
            Failure::retryable("search did not answer within the timeout").with_class("timeout")
        }
        CallFailure::Refused => {
            Failure::retryable("search refused the connection: it is down").with_class("refused")
        }
        CallFailure::BadInput => {
            Failure::non_retryable("search answered 400: malformed document").with_class("http_400")
        }
    }
}

/// One run: `protected` is the second one.
pub(super) async fn run(
    setup: &Setup,
    label: &'static str,
    protected: bool,
    config: &WorkerConfig,
    budget: &FleetBudget,
    prefix: &str,
) -> anyhow::Result<RunFigures> {
    let mut c = config.clone();
    c.amqp = amqp_settings(&config.amqp, prefix);
    c.amqp.prefetch = setup.prefetch;
    let url = c.amqp.url.clone();
    fleet_budget_amqp::migrate(&url, &c.amqp, &Migrations::embedded()?, false).await?;
    let topology = Topology::new(&c.amqp);
    let conn = fleet_budget_amqp::connect(&url, "budgetctl demo scenario").await?;
    let depths = Depths::new(conn.create_channel().await?, topology.clone());
    let result = drive(setup, label, protected, &c, budget, &topology, &depths).await;
    if let Err(e) = delete_topology(&conn, &topology).await {
        tracing::warn!(error = %e, prefix = %c.amqp.prefix, "the scenario's topology was not deleted");
    }
    let _ = conn.close(200, "scenario done".into()).await;
    result
}

/// What the handlers share.
struct Shared {
    dependency: Arc<Dependency>,
    outcomes: Arc<JobOutcomes>,
    /// Milliseconds since the start at the last success (first pass or replay).
    last_success_ms: AtomicU64,
}

fn start_workers(
    setup: &Setup,
    c: &WorkerConfig,
    budget: &FleetBudget,
    topology: &Topology,
    shared: &Arc<Shared>,
) -> (Vec<WorkerHandle>, Vec<tokio::task::JoinHandle<()>>) {
    let mut options = WorkerOptions::new(c, topology);
    options.name = "budgetctl demo scenario worker".to_owned();
    let mut handles = Vec::new();
    let mut joins = Vec::new();
    for _ in 0..setup.workers {
        let worker = Worker::new(budget.clone(), topology.clone(), options.clone());
        handles.push(worker.handle());
        let shared = Arc::clone(shared);
        joins.push(tokio::spawn(async move {
            let _ = worker
                .run(move |job: Job| {
                    let shared = Arc::clone(&shared);
                    async move {
                        let Some((id, bad)) = parse_payload(&job.payload) else {
                            return Err(Failure::poison("not a scenario job"));
                        };
                        shared.dependency.call(bad).await.map_err(failure)?;
                        shared.outcomes.succeeded(id, job.replays > 0);
                        let ms = u64::try_from(shared.dependency.elapsed().as_millis())
                            .unwrap_or(u64::MAX);
                        shared.last_success_ms.fetch_max(ms, Ordering::Relaxed);
                        Ok(())
                    }
                })
                .await;
        }));
    }
    (handles, joins)
}

/// Prints a progress line on stderr every second until `stop` is set.
fn progress(
    label: &'static str,
    jobs: u64,
    shared: Arc<Shared>,
    budget: FleetBudget,
    submitted: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        while !stop.load(Ordering::Acquire) {
            tick.tick().await;
            let d = &shared.dependency;
            eprintln!(
                "[{label}] {:>5.1}s {:<9} in flight {:>3} (peak {}) | calls {} | timeouts {} | submitted {}/{} | succeeded {} | dead-lettered {}",
                d.elapsed().as_secs_f64(),
                if d.in_trouble() { "TROUBLE" } else { "ok" },
                d.in_flight(),
                d.peak_in_flight(),
                thousands(d.calls()),
                thousands(d.timeouts()),
                thousands(submitted.load(Ordering::Relaxed)),
                thousands(jobs),
                thousands(shared.outcomes.successes()),
                thousands(dead_letters(budget.metrics()).values().sum()),
            );
        }
    })
}

async fn drive(
    setup: &Setup,
    label: &'static str,
    protected: bool,
    c: &WorkerConfig,
    budget: &FleetBudget,
    topology: &Topology,
    depths: &Depths,
) -> anyhow::Result<RunFigures> {
    let url = c.amqp.url.clone();
    let shared = Arc::new(Shared {
        dependency: Arc::new(Dependency::new(setup.profile)),
        outcomes: Arc::default(),
        last_success_ms: AtomicU64::new(0),
    });
    let jobs = setup.jobs();
    let submitted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let shown = progress(
        label,
        jobs,
        Arc::clone(&shared),
        budget.clone(),
        Arc::clone(&submitted),
        Arc::clone(&stop),
    );
    let (handles, joins) = start_workers(setup, c, budget, topology, &shared);

    // Jobs go out once every worker consumes, so that the run does not start with a burst.
    let connecting = Instant::now();
    while handles.iter().any(|h| h.counts().connections == 0)
        && connecting.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let publisher = Publisher::connect(&url).await?;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let started = Instant::now();
    let mut next_id = 0u64;
    while next_id < jobs {
        tick.tick().await;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let due = ((started.elapsed().as_secs_f64() * f64::from(setup.rate)) as u64).min(jobs);
        let payloads: Vec<Vec<u8>> = (next_id..due).map(payload).collect();
        try_join_all(
            payloads
                .iter()
                .map(|p| publisher.publish_job(&topology.work_exchange, TASK, TASK, p)),
        )
        .await?;
        next_id = next_id.max(due);
        submitted.store(next_id, Ordering::Relaxed);
    }
    publisher.close().await;

    // The first pass: until nothing waits in the queues (held jobs wait in the tiers) and
    // every delivery is settled, bounded by the breaker's longest wait and the trouble.
    let trouble_left = setup
        .profile
        .trouble
        .until
        .saturating_sub(shared.dependency.elapsed());
    wait_settled(depths, &handles, trouble_left + Duration::from_secs(150)).await?;
    let first = FirstPass::measure(&shared.dependency, budget, &shared.outcomes, &handles);

    let mut replay_options = ReplayOptions::new(c);
    replay_options.rate = Some(f64::from(setup.replay_rate.max(1)));
    replay_options.max_replays = MAX_REPLAYS;
    replay_options.idle_timeout = Duration::from_secs(2);
    let replayer = Replayer::new(url.clone(), topology.clone(), Some(budget.clone()));
    let mut replay = ReplayTotals::default();
    for _ in 0..=MAX_REPLAYS + 1 {
        if depths.dead().await? == 0 {
            break;
        }
        let r = replayer.run(&replay_options, |_| {}).await?;
        replay.moved += r.moved;
        replay.parked += r.parked;
        wait_settled(depths, &handles, Duration::from_secs(30)).await?;
    }

    for h in &handles {
        h.shutdown();
    }
    for j in joins {
        let _ = j.await;
    }
    stop.store(true, Ordering::Release);
    let _ = shown.await;

    let left = depths.read().await?;
    let accounting = Accounting::tally(
        jobs,
        &shared.outcomes,
        u64::from(left.parked),
        u64::from(left.dead),
    );
    let drained = Duration::from_millis(shared.last_success_ms.load(Ordering::Relaxed))
        .saturating_sub(setup.profile.trouble.until);
    Ok(RunFigures::new(
        label,
        protected,
        jobs,
        first,
        &shared.dependency,
        &replay,
        drained,
        accounting,
    ))
}
