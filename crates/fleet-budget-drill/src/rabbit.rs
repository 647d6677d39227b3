//! The drill on RabbitMQ: a topology of its own (migrated, then deleted at the end), N
//! `fleet_budget_amqp::Worker`s consuming the work queue, jobs published with confirms, and the
//! library `Replayer` after recovery.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_budget::FleetBudget;
use fleet_budget_amqp::{Job, Topology, WorkerConfig};
use fleet_budget_sim::accounting::JobOutcomes;
use fleet_budget_sim::upstream::Upstream;

use crate::broker::{
    Depths, Workers, drill_filter, on_own_topology, publish_paced, replay_dead_letters,
    wait_settled,
};
use crate::job::{call, dead_letters, job_failure, parse_payload};
use crate::progress::{Progress, QueueGauge, Watched, Watcher};
use crate::trail::{Audit, RunTrail, purge_parked};
use crate::{DEPENDENCY, DrillError, FirstPass, RunReport, RunSettings, amqp_settings};

/// Queue depths, polled from the broker in the background.
#[derive(Debug, Default)]
struct RabbitGauge {
    waiting: AtomicU64,
    dead: AtomicU64,
    parked: AtomicU64,
}

impl QueueGauge for RabbitGauge {
    fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    fn dead(&self) -> u64 {
        self.dead.load(Ordering::Relaxed)
    }

    fn parked(&self) -> u64 {
        self.parked.load(Ordering::Relaxed)
    }
}

/// One run of the drill on RabbitMQ.
pub(crate) async fn run(
    s: &RunSettings,
    config: &WorkerConfig,
    budget: &FleetBudget,
    watcher: &Arc<dyn Watcher>,
) -> Result<RunReport, DrillError> {
    let mut c = config.clone();
    c.amqp = amqp_settings(&config.amqp, &s.key_prefix);
    on_own_topology(&c, "budgetctl demo", "drill", async |topology, depths| {
        drill(s, &c, budget, topology, depths, watcher).await
    })
    .await
}

/// Polls the queue depths for the progress line until `polling` is cleared.
fn poll_depths(
    gauge: Arc<RabbitGauge>,
    polling: Arc<AtomicBool>,
    depths: Depths,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while polling.load(Ordering::Acquire) {
            if let Ok(d) = depths.read().await {
                gauge.waiting.store(d.waiting(), Ordering::Relaxed);
                gauge.dead.store(u64::from(d.dead), Ordering::Relaxed);
                gauge.parked.store(u64::from(d.parked), Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    })
}

/// Starts `s.workers` library workers, each with a connection of its own, running the drill's
/// job: call the dependency.
fn start_workers(
    s: &RunSettings,
    c: &WorkerConfig,
    budget: &FleetBudget,
    topology: &Topology,
    upstream: &Arc<Upstream>,
    outcomes: &Arc<JobOutcomes>,
    started: Instant,
) -> Workers {
    let (upstream, outcomes) = (Arc::clone(upstream), Arc::clone(outcomes));
    let handler = move |job: Job| {
        let (upstream, outcomes) = (Arc::clone(&upstream), Arc::clone(&outcomes));
        async move {
            let Some((id, bad)) = parse_payload(&job.payload) else {
                return Err(fleet_budget::Failure::poison("not a drill job"));
            };
            match call(&upstream, started, bad).await {
                Ok(()) => {
                    outcomes.succeeded(id, job.replays > 0);
                    Ok(())
                }
                Err(e) => Err(job_failure(e)),
            }
        }
    };
    Workers::start(
        s.workers,
        "budgetctl demo worker",
        c,
        budget,
        topology,
        handler,
    )
}

async fn drill(
    s: &RunSettings,
    c: &WorkerConfig,
    budget: &FleetBudget,
    topology: &Topology,
    depths: &Depths,
    watcher: &Arc<dyn Watcher>,
) -> Result<RunReport, DrillError> {
    let started = Instant::now();
    let since_ms = fleet_budget::clock::now_ms();
    let trail = Audit::of(
        c,
        budget,
        &format!("the drill's replay after recovery ({})", s.label),
    );
    let upstream = Arc::new(Upstream::new(s.schedule));
    let outcomes = Arc::new(JobOutcomes::default());
    let gauge = Arc::new(RabbitGauge::default());
    let jobs = s.jobs();
    let submitted = Arc::new(AtomicU64::new(0));
    let progress = Progress::start(
        Watched {
            label: s.label,
            started,
            upstream: Arc::clone(&upstream),
            queue: Arc::clone(&gauge) as Arc<dyn QueueGauge>,
            outcomes: Arc::clone(&outcomes),
            budget: budget.clone(),
            submitted: Arc::clone(&submitted),
            jobs,
        },
        watcher,
    );
    let polling = Arc::new(AtomicBool::new(true));
    let poller = poll_depths(Arc::clone(&gauge), Arc::clone(&polling), depths.clone());
    let workers = start_workers(s, c, budget, topology, &upstream, &outcomes, started);

    publish_paced(c, topology, s.rate, jobs, &submitted).await?;

    // First pass done: every job succeeded or was dead-lettered, and the queues are quiet.
    let metrics = budget.metrics();
    let deadline = Instant::now() + s.phase.max(Duration::from_secs(10));
    while (outcomes.succeeded_ids().len() as u64) + dead_letters(metrics).values().sum::<u64>()
        < jobs
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_settled(depths, workers.handles(), Duration::from_secs(5)).await?;
    let first = FirstPass::measure(&upstream, started, budget, &outcomes);

    // After recovery: the library replayer, until the dead-letter queue is empty.
    progress.replaying();
    let replay = replay_dead_letters(
        c,
        budget,
        depths,
        &workers,
        (s.replay_rate(), Duration::from_secs(10)),
        trail.as_ref(),
    )
    .await?;

    workers.stop().await;
    polling.store(false, Ordering::Release);
    let _ = poller.await;
    progress.finish().await;

    let accounting = depths.tally(jobs, &outcomes).await?;
    // The run's queues are deleted after this: what is parked is purged first, audited, so
    // that the trail accounts for it.
    let run_trail = match &trail {
        Some(t) => {
            purge_parked(c, budget, topology, depths, t, &drill_filter()).await?;
            Some(RunTrail {
                key_prefix: s.key_prefix.clone(),
                amqp_prefix: c.amqp.prefix.clone(),
                dependency: DEPENDENCY.to_owned(),
                since_ms,
                until_ms: fleet_budget::clock::now_ms(),
                dead_letter_decisions: dead_letters(metrics).values().sum(),
            })
        }
        None => None,
    };
    Ok(RunReport::new(s, first, &upstream, &replay, accounting).with_trail(run_trail))
}
