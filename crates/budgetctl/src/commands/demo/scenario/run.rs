//! One run of a scenario on RabbitMQ: a topology of its own (migrated, deleted at the end),
//! library `Worker`s calling the simulated [`Dependency`], jobs published with confirms at the
//! scenario's rate, then — once the queues are quiet — the library `Replayer` on the dead
//! letters, and every job accounted for.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_budget::{Failure, FleetBudget};
use fleet_budget_amqp::{Job, Topology, WorkerConfig};
use fleet_budget_sim::accounting::JobOutcomes;

use super::Setup;
use super::dependency::{CallFailure, Dependency};
use super::report::{FirstPass, RunFigures};
use crate::commands::demo::broker::{
    Depths, Workers, on_own_topology, parse_payload, publish_paced, replay_dead_letters,
    wait_settled,
};
use crate::commands::demo::{amqp_settings, dead_letters, malformed_document};
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
        CallFailure::BadInput => malformed_document(),
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
    on_own_topology(
        &c,
        "budgetctl demo scenario",
        "scenario",
        async |topology, depths| drive(setup, label, protected, &c, budget, topology, depths).await,
    )
    .await
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
) -> Workers {
    let shared = Arc::clone(shared);
    let handler = move |job: Job| {
        let shared = Arc::clone(&shared);
        async move {
            let Some((id, bad)) = parse_payload(&job.payload) else {
                return Err(Failure::poison("not a scenario job"));
            };
            shared.dependency.call(bad).await.map_err(failure)?;
            shared.outcomes.succeeded(id, job.replays > 0);
            let ms = u64::try_from(shared.dependency.elapsed().as_millis()).unwrap_or(u64::MAX);
            shared.last_success_ms.fetch_max(ms, Ordering::Relaxed);
            Ok(())
        }
    };
    Workers::start(
        setup.workers,
        "budgetctl demo scenario worker",
        c,
        budget,
        topology,
        handler,
    )
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
    let workers = start_workers(setup, c, budget, topology, &shared);

    // Jobs go out once every worker consumes, so that the run does not start with a burst.
    let connecting = Instant::now();
    while workers
        .handles()
        .iter()
        .any(|h| h.counts().connections == 0)
        && connecting.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    publish_paced(&c.amqp.url, topology, setup.rate, jobs, &submitted).await?;

    // The first pass: until nothing waits in the queues (held jobs wait in the tiers) and
    // every delivery is settled, bounded by the breaker's longest wait and the trouble.
    let trouble_left = setup
        .profile
        .trouble
        .until
        .saturating_sub(shared.dependency.elapsed());
    wait_settled(
        depths,
        workers.handles(),
        trouble_left + Duration::from_secs(150),
    )
    .await?;
    let first = FirstPass::measure(
        &shared.dependency,
        budget,
        &shared.outcomes,
        workers.handles(),
    );

    let replay = replay_dead_letters(
        c,
        budget,
        depths,
        &workers,
        setup.replay_rate.max(1),
        Duration::from_secs(30),
    )
    .await?;

    workers.stop().await;
    stop.store(true, Ordering::Release);
    let _ = shown.await;

    let accounting = depths.tally(jobs, &shared.outcomes).await?;
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
