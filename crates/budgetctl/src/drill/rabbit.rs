//! The drill on RabbitMQ: a topology of its own (migrated, then deleted at the end), N
//! `fleet_budget_amqp::Worker`s consuming the work queue, jobs published with confirms, and the
//! library `Replayer` after recovery.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use fleet_budget::{DeadLetterReason, FleetBudget};
use fleet_budget_amqp::{
    Job, Migrations, Publisher, ReplayOptions, Replayer, Topology, Worker, WorkerConfig,
    WorkerHandle, WorkerOptions,
};
use lapin::options::{ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{FieldTable, ShortString};

use super::progress::{Progress, QueueGauge};
use super::upstream::Upstream;
use super::{
    Accounting, BAD_INPUT_EVERY, DEPENDENCY, JobOutcomes, MAX_REPLAYS, RunReport, RunSettings,
    TASK, job_failure,
};

/// Retry delay tiers of the drill's topology: short, so that the drill is quick.
const RETRY_TIERS: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
];

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

/// Message counts of the drill's queues.
struct Depths {
    channel: lapin::Channel,
    topology: Topology,
}

impl Depths {
    async fn count(&self, queue: &str) -> anyhow::Result<u64> {
        let q = self
            .channel
            .queue_declare(
                ShortString::try_new(queue)
                    .map_err(|e| anyhow::anyhow!("queue name {queue:?}: {e}"))?,
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("inspect queue {queue}"))?;
        Ok(u64::from(q.message_count()))
    }

    /// Work queue + retry tiers (ready messages only; unacked ones are the workers').
    async fn waiting(&self) -> anyhow::Result<u64> {
        let mut n = self.count(&self.topology.work_queue).await?;
        for tier in &self.topology.retry_tiers {
            n += self.count(&tier.queue).await?;
        }
        Ok(n)
    }

    async fn dead(&self) -> anyhow::Result<u64> {
        self.count(&self.topology.dead_queue).await
    }

    async fn parked(&self) -> anyhow::Result<u64> {
        self.count(&self.topology.parked_queue).await
    }
}

/// Whether every delivery a worker received has been settled.
fn workers_settled(handles: &[WorkerHandle]) -> bool {
    handles.iter().all(|h| {
        let c = h.counts();
        c.deliveries == c.succeeded + c.retried + c.dead_lettered + c.requeued + c.ack_failed
    })
}

/// Waits until nothing is waiting or in flight for `quiet` in a row, at most `within`.
async fn wait_settled(
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

fn payload(id: u64) -> Vec<u8> {
    let bad = id % BAD_INPUT_EVERY == BAD_INPUT_EVERY - 1;
    format!("{{\"document\":{id},\"malformed\":{bad}}}").into_bytes()
}

/// (id, bad input) of a drill payload; `None` for anything else (dead-lettered as non-retryable).
fn parse_payload(payload: &[u8]) -> Option<(u64, bool)> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    Some((v.get("document")?.as_u64()?, v.get("malformed")?.as_bool()?))
}

/// One run of the drill on RabbitMQ.
#[allow(clippy::too_many_lines)]
pub(super) async fn run(
    s: &RunSettings,
    config: &WorkerConfig,
    budget: &FleetBudget,
) -> anyhow::Result<RunReport> {
    let mut c = config.clone();
    c.amqp.prefix.clone_from(&s.key_prefix);
    c.amqp.retry_tiers = RETRY_TIERS.to_vec();
    c.amqp.max_replays = MAX_REPLAYS;
    c.amqp.prefetch = 2;
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
    cleanup(&conn, &topology).await;
    let _ = conn.close(200, ShortString::from("drill done")).await;
    result
}

#[allow(clippy::too_many_lines)]
async fn drill(
    s: &RunSettings,
    c: &WorkerConfig,
    budget: &FleetBudget,
    topology: &Topology,
    depths: &Depths,
) -> anyhow::Result<RunReport> {
    let url = c.amqp.url.clone();
    let upstream = Arc::new(Upstream::new(s.schedule));
    let outcomes = Arc::new(JobOutcomes::default());
    let gauge = Arc::new(RabbitGauge::default());
    let jobs = s.jobs();
    let submitted = Arc::new(AtomicU64::new(0));
    let progress = Progress::start(
        s.label,
        Arc::clone(&upstream),
        Arc::clone(&gauge) as Arc<dyn QueueGauge>,
        Arc::clone(&outcomes),
        budget.clone(),
        Arc::clone(&submitted),
        jobs,
    );
    // Poll queue depths for the progress line.
    let polling = Arc::new(AtomicBool::new(true));
    let poller = {
        let (gauge, polling, channel, topology) = (
            Arc::clone(&gauge),
            Arc::clone(&polling),
            depths.channel.clone(),
            topology.clone(),
        );
        tokio::spawn(async move {
            let depths = Depths { channel, topology };
            while polling.load(Ordering::Acquire) {
                if let (Ok(w), Ok(d), Ok(p)) = (
                    depths.waiting().await,
                    depths.dead().await,
                    depths.parked().await,
                ) {
                    gauge.waiting.store(w, Ordering::Relaxed);
                    gauge.dead.store(d, Ordering::Relaxed);
                    gauge.parked.store(p, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        })
    };

    // N workers, each with a connection of its own.
    let mut options = WorkerOptions::new(c, topology);
    options.name = "budgetctl demo worker".to_owned();
    let mut handles = Vec::new();
    let mut joins = Vec::new();
    for _ in 0..s.workers {
        let worker = Worker::new(budget.clone(), topology.clone(), options.clone());
        handles.push(worker.handle());
        let (upstream, outcomes) = (Arc::clone(&upstream), Arc::clone(&outcomes));
        joins.push(tokio::spawn(worker.run(move |job: Job| {
            let (upstream, outcomes) = (Arc::clone(&upstream), Arc::clone(&outcomes));
            async move {
                let Some((id, bad)) = parse_payload(&job.payload) else {
                    return Err(fleet_budget::Failure::poison("not a drill job"));
                };
                match upstream.call(bad).await {
                    Ok(()) => {
                        outcomes.succeeded(id, job.replays > 0);
                        Ok(())
                    }
                    Err(e) => Err(job_failure(e)),
                }
            }
        })));
    }

    // Submit `rate` jobs per second, evenly, with publisher confirms.
    let publisher = Publisher::connect(&url).await?;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let started = Instant::now();
    let mut next_id = 0u64;
    while next_id < jobs {
        tick.tick().await;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let due = ((started.elapsed().as_secs_f64() * f64::from(s.rate)) as u64).min(jobs);
        let mut pending = Vec::new();
        while next_id < due {
            let mut props =
                fleet_budget_amqp::headers::with_message_id(lapin::BasicProperties::default());
            let mut table = FieldTable::default();
            fleet_budget_amqp::headers::set_str(&mut table, fleet_budget_amqp::headers::TASK, TASK);
            props = props
                .with_type(ShortString::from(TASK))
                .with_delivery_mode(2)
                .with_headers(table);
            pending.push(
                publisher
                    .send(&topology.work_exchange, TASK, &payload(next_id), props)
                    .await?,
            );
            next_id += 1;
        }
        for p in pending {
            fleet_budget_amqp::publish::confirmed(p).await?;
        }
        submitted.store(next_id, Ordering::Relaxed);
    }
    publisher.close().await;

    // First pass done: every job succeeded or was dead-lettered, and the queues are quiet.
    let metrics = budget.metrics();
    let dead_total = || {
        DeadLetterReason::ALL
            .iter()
            .map(|r| metrics.dead_letters(DEPENDENCY, *r))
            .sum::<u64>()
    };
    let deadline = Instant::now() + s.phase.max(Duration::from_secs(10));
    while (outcomes.succeeded_ids().len() as u64) + dead_total() < jobs && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_settled(depths, &handles, Duration::from_secs(5)).await?;
    let first_pass_calls = upstream.calls();
    let seconds = upstream.elapsed().as_secs_f64();
    let dead_lettered: std::collections::BTreeMap<String, u64> = DeadLetterReason::ALL
        .iter()
        .map(|r| (r.as_str().to_owned(), metrics.dead_letters(DEPENDENCY, *r)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let dead_lettered_total = dead_lettered.values().sum();
    let successes = outcomes.successes();
    let retries_granted = metrics.counter("retries_granted", DEPENDENCY);
    let retries_denied = metrics.counter("retries_denied", DEPENDENCY);

    // After recovery: the library replayer, until the dead-letter queue is empty.
    progress.set_stage("replay");
    let mut replay_options = ReplayOptions::new(c);
    replay_options.rate = Some(s.schedule.capacity as f64 * 0.8);
    replay_options.max_replays = MAX_REPLAYS;
    replay_options.idle_timeout = Duration::from_secs(2);
    let replayer = Replayer::new(url.clone(), topology.clone(), Some(budget.clone()));
    let (mut replayed, mut parked) = (0, 0);
    for _ in 0..=MAX_REPLAYS + 1 {
        if depths.dead().await? == 0 {
            break;
        }
        let r = replayer.run(&replay_options, |_| {}).await?;
        replayed += r.moved;
        parked += r.parked;
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

    let parked_now = depths.parked().await?;
    let still_dead = depths.dead().await?;
    Ok(RunReport {
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
        peak_upstream_calls_per_sec: upstream.peak_per_second(),
        successes,
        retries_granted,
        retries_denied,
        dead_lettered,
        dead_lettered_total,
        replayed,
        replay_upstream_calls: upstream.calls() - first_pass_calls,
        parked,
        accounting: Accounting::tally(jobs, &outcomes, parked_now, still_dead),
        upstream_calls_per_second: upstream.per_second(),
        seconds,
    })
}

/// Deletes the drill's queues and exchanges.
async fn cleanup(conn: &lapin::Connection, topology: &Topology) {
    let Ok(ch) = conn.create_channel().await else {
        return;
    };
    for q in topology.queues() {
        if let Ok(name) = ShortString::try_new(q.as_str()) {
            let _ = ch.queue_delete(name, QueueDeleteOptions::default()).await;
        }
    }
    for e in topology.exchanges() {
        if let Ok(name) = ShortString::try_new(e.as_str()) {
            let _ = ch
                .exchange_delete(name, ExchangeDeleteOptions::default())
                .await;
        }
    }
    let _ = ch.close(200, ShortString::from("cleaned up")).await;
}
