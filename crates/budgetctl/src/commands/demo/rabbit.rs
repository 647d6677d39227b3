//! The drill on RabbitMQ: a topology of its own (migrated, then deleted at the end), N
//! `fleet_budget_amqp::Worker`s consuming the work queue, jobs published with confirms, and the
//! library `Replayer` after recovery.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_budget::FleetBudget;
use fleet_budget_amqp::{
    AmqpError, Job, Migrations, Publisher, QueueDepths, ReplayOptions, Replayer, Topology, Worker,
    WorkerConfig, WorkerHandle, WorkerOptions, delete_topology, queue_depth,
};
use fleet_budget_sim::accounting::{Accounting, JobOutcomes};
use fleet_budget_sim::upstream::Upstream;
use futures::future::try_join_all;

use super::progress::{Progress, QueueGauge, Watched};
use super::{
    FirstPass, MAX_REPLAYS, ReplayTotals, RunReport, RunSettings, TASK, amqp_settings, bad_input,
    call, dead_letters, job_failure,
};

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

/// Message counts of the drill's queues, on a channel of their own.
pub(super) struct Depths {
    channel: lapin::Channel,
    topology: Topology,
}

impl Depths {
    pub(super) fn new(channel: lapin::Channel, topology: Topology) -> Self {
        Self { channel, topology }
    }

    pub(super) async fn read(&self) -> Result<QueueDepths, AmqpError> {
        QueueDepths::read(&self.channel, &self.topology).await
    }

    /// Ready messages waiting for a worker: the work queue and the retry tiers (unacked ones
    /// are the workers').
    async fn waiting(&self) -> Result<u64, AmqpError> {
        Ok(self.read().await?.waiting())
    }

    pub(super) async fn dead(&self) -> Result<u64, AmqpError> {
        Ok(u64::from(
            queue_depth(&self.channel, &self.topology.dead_queue).await?,
        ))
    }
}

/// Whether every delivery a worker received has been settled (or held in a tier, or parked).
fn workers_settled(handles: &[WorkerHandle]) -> bool {
    handles.iter().all(|h| {
        let c = h.counts();
        c.deliveries
            == c.succeeded
                + c.retried
                + c.dead_lettered
                + c.requeued
                + c.ack_failed
                + c.waited_again
                + c.held
                + c.parked
    })
}

/// Waits until nothing is waiting or in flight for `quiet` in a row, at most `within`.
pub(super) async fn wait_settled(
    depths: &Depths,
    handles: &[WorkerHandle],
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    let mut quiet_since: Option<Instant> = None;
    while Instant::now() < deadline {
        let idle = depths.waiting().await? == 0 && workers_settled(handles);
        match (idle, quiet_since) {
            (true, Some(t)) if t.elapsed() >= Duration::from_millis(600) => return Ok(()),
            (true, None) => quiet_since = Some(Instant::now()),
            (false, _) => quiet_since = None,
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

pub(super) fn payload(id: u64) -> Vec<u8> {
    format!("{{\"document\":{id},\"malformed\":{}}}", bad_input(id)).into_bytes()
}

/// (id, bad input) of a drill payload; `None` for anything else (dead-lettered as non-retryable).
pub(super) fn parse_payload(payload: &[u8]) -> Option<(u64, bool)> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    Some((v.get("document")?.as_u64()?, v.get("malformed")?.as_bool()?))
}

/// One run of the drill on RabbitMQ.
pub(super) async fn run(
    s: &RunSettings,
    config: &WorkerConfig,
    budget: &FleetBudget,
) -> anyhow::Result<RunReport> {
    let mut c = config.clone();
    c.amqp = amqp_settings(&config.amqp, &s.key_prefix);
    let url = c.amqp.url.clone();
    let migrations = Migrations::embedded()?;
    fleet_budget_amqp::migrate(&url, &c.amqp, &migrations, false).await?;
    let topology = Topology::new(&c.amqp);
    let conn = fleet_budget_amqp::connect(&url, "budgetctl demo").await?;
    let depths = Depths {
        channel: conn.create_channel().await?,
        topology: topology.clone(),
    };
    let result = drill(s, &c, budget, &topology, &depths).await;
    if let Err(e) = delete_topology(&conn, &topology).await {
        tracing::warn!(error = %e, prefix = %c.amqp.prefix, "the drill's topology was not deleted");
    }
    let _ = conn.close(200, "drill done".into()).await;
    result
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
) -> (Vec<WorkerHandle>, Vec<tokio::task::JoinHandle<()>>) {
    let mut options = WorkerOptions::new(c, topology);
    options.name = "budgetctl demo worker".to_owned();
    let mut handles = Vec::new();
    let mut joins = Vec::new();
    for _ in 0..s.workers {
        let worker = Worker::new(budget.clone(), topology.clone(), options.clone());
        handles.push(worker.handle());
        let (upstream, outcomes) = (Arc::clone(upstream), Arc::clone(outcomes));
        joins.push(tokio::spawn(async move {
            let _ = worker
                .run(move |job: Job| {
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
                })
                .await;
        }));
    }
    (handles, joins)
}

async fn drill(
    s: &RunSettings,
    c: &WorkerConfig,
    budget: &FleetBudget,
    topology: &Topology,
    depths: &Depths,
) -> anyhow::Result<RunReport> {
    let url = c.amqp.url.clone();
    let started = Instant::now();
    let upstream = Arc::new(Upstream::new(s.schedule));
    let outcomes = Arc::new(JobOutcomes::default());
    let gauge = Arc::new(RabbitGauge::default());
    let jobs = s.jobs();
    let submitted = Arc::new(AtomicU64::new(0));
    let progress = Progress::start(Watched {
        label: s.label,
        started,
        upstream: Arc::clone(&upstream),
        queue: Arc::clone(&gauge) as Arc<dyn QueueGauge>,
        outcomes: Arc::clone(&outcomes),
        budget: budget.clone(),
        submitted: Arc::clone(&submitted),
        jobs,
    });
    let polling = Arc::new(AtomicBool::new(true));
    let poller = poll_depths(
        Arc::clone(&gauge),
        Arc::clone(&polling),
        Depths {
            channel: depths.channel.clone(),
            topology: topology.clone(),
        },
    );
    let (handles, joins) = start_workers(s, c, budget, topology, &upstream, &outcomes, started);

    // Submit `rate` jobs per second, evenly; each batch's confirms are awaited together.
    let publisher = Publisher::connect(&url).await?;
    let publisher = &publisher;
    s.submit_paced(&submitted, async |ids| {
        let payloads: Vec<Vec<u8>> = ids.map(payload).collect();
        try_join_all(
            payloads
                .iter()
                .map(|p| publisher.publish_job(&topology.work_exchange, TASK, TASK, p)),
        )
        .await?;
        Ok(())
    })
    .await?;
    publisher.close().await;

    // First pass done: every job succeeded or was dead-lettered, and the queues are quiet.
    let metrics = budget.metrics();
    let deadline = Instant::now() + s.phase.max(Duration::from_secs(10));
    while (outcomes.succeeded_ids().len() as u64) + dead_letters(metrics).values().sum::<u64>()
        < jobs
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_settled(depths, &handles, Duration::from_secs(5)).await?;
    let first = FirstPass::measure(&upstream, started, budget, &outcomes);

    // After recovery: the library replayer, until the dead-letter queue is empty.
    progress.replaying();
    let mut replay_options = ReplayOptions::new(c);
    replay_options.rate = Some(f64::from(s.replay_rate()));
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
        wait_settled(depths, &handles, Duration::from_secs(10)).await?;
    }

    for h in &handles {
        h.shutdown();
    }
    for j in joins {
        let _ = j.await;
    }
    polling.store(false, Ordering::Release);
    let _ = poller.await;
    progress.finish().await;

    let left = depths.read().await?;
    let accounting = Accounting::tally(
        jobs,
        &outcomes,
        u64::from(left.parked),
        u64::from(left.dead),
    );
    Ok(RunReport::new(s, first, &upstream, &replay, accounting))
}
