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
use crate::broker::{
    Depths, Workers, drill_filter, on_own_topology, publish_paced, replay_dead_letters,
    wait_settled,
};
use crate::job::{dead_letters, malformed_document, parse_payload};
use crate::trail::{Audit, purge_parked};
use crate::{DrillError, Watcher, amqp_settings};

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
    watcher: &Arc<dyn Watcher>,
) -> Result<RunFigures, DrillError> {
    let mut c = config.clone();
    c.amqp = amqp_settings(&config.amqp, prefix);
    c.amqp.prefetch = setup.prefetch;
    on_own_topology(
        &c,
        "budgetctl demo scenario",
        "scenario",
        async |topology, depths| {
            drive(
                setup, label, protected, &c, budget, topology, depths, watcher,
            )
            .await
        },
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

/// Where a scenario run stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScenarioProgress {
    /// The run's name.
    pub label: &'static str,
    /// Since the run started.
    pub elapsed: Duration,
    /// Whether the dependency is in its trouble.
    pub in_trouble: bool,
    /// Calls queued or worked on, abandoned ones included.
    pub in_flight: u64,
    /// The most calls in flight at once so far.
    pub peak_in_flight: u64,
    /// Calls the dependency received.
    pub calls: u64,
    /// Calls whose caller gave up at the timeout.
    pub timeouts: u64,
    /// Jobs submitted so far.
    pub submitted: u64,
    /// Jobs to submit.
    pub jobs: u64,
    /// Jobs that succeeded.
    pub succeeded: u64,
    /// Dead-letter decisions so far.
    pub dead_lettered: u64,
}

/// Hands the run's progress to `watcher` every second until `stop` is set.
fn progress(
    label: &'static str,
    jobs: u64,
    shared: Arc<Shared>,
    budget: FleetBudget,
    submitted: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    watcher: Arc<dyn Watcher>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        while !stop.load(Ordering::Acquire) {
            tick.tick().await;
            let d = &shared.dependency;
            watcher.scenario(&ScenarioProgress {
                label,
                elapsed: d.elapsed(),
                in_trouble: d.in_trouble(),
                in_flight: d.in_flight(),
                peak_in_flight: d.peak_in_flight(),
                calls: d.calls(),
                timeouts: d.timeouts(),
                submitted: submitted.load(Ordering::Relaxed),
                jobs,
                succeeded: shared.outcomes.successes(),
                dead_lettered: dead_letters(budget.metrics()).values().sum(),
            });
        }
    })
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    setup: &Setup,
    label: &'static str,
    protected: bool,
    c: &WorkerConfig,
    budget: &FleetBudget,
    topology: &Topology,
    depths: &Depths,
    watcher: &Arc<dyn Watcher>,
) -> Result<RunFigures, DrillError> {
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
        Arc::clone(watcher),
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
    publish_paced(c, topology, setup.rate, jobs, &submitted).await?;

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

    let trail = Audit::of(
        c,
        budget,
        &format!(
            "scenario {}: the replay after recovery ({label})",
            setup.scenario.as_str()
        ),
    );
    let replay = replay_dead_letters(
        c,
        budget,
        depths,
        &workers,
        (setup.replay_rate.max(1), Duration::from_secs(30)),
        trail.as_ref(),
    )
    .await?;

    workers.stop().await;
    stop.store(true, Ordering::Release);
    let _ = shown.await;

    let accounting = depths.tally(jobs, &shared.outcomes).await?;
    // The run's queues are deleted after this: what is parked is purged first, audited.
    if let Some(t) = &trail {
        purge_parked(c, budget, topology, depths, t, &drill_filter()).await?;
    }
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
