//! What every demo run on RabbitMQ does, the drill's ([`super::rabbit`]) and the scenarios'
//! (`scenario::run`): a topology of the run's own (migrated, then deleted), library `Worker`s
//! consuming its work queue, jobs published with confirms at a steady rate, the library
//! `Replayer` on the dead letters after recovery, and every job accounted for from the queues
//! left.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use fleet_budget::{Failure, FleetBudget};
use fleet_budget_amqp::replay::{ReplayFilter, audit};
use fleet_budget_amqp::{
    AmqpError, Job, Migrations, Publisher, QueueDepths, ReplayOptions, ReplayReport, Replayer,
    Topology, Worker, WorkerConfig, WorkerHandle, WorkerOptions, delete_topology, queue_depth,
};
use fleet_budget_sim::accounting::{Accounting, JobOutcomes};
use futures::future::try_join_all;

use crate::job::{payload, submit_paced};
use crate::trail::{ACTOR, Audit};
use crate::{DEPENDENCY, DrillError, MAX_REPLAYS, ReplayTotals, TASK};

/// Message counts of a run's queues, on a channel of their own.
#[derive(Clone)]
pub(crate) struct Depths {
    channel: lapin::Channel,
    topology: Topology,
}

impl Depths {
    pub(crate) async fn read(&self) -> Result<QueueDepths, AmqpError> {
        QueueDepths::read(&self.channel, &self.topology).await
    }

    /// Ready messages waiting for a worker: the work queue and the retry tiers (unacked ones
    /// are the workers').
    async fn waiting(&self) -> Result<u64, AmqpError> {
        Ok(self.read().await?.waiting())
    }

    pub(crate) async fn dead(&self) -> Result<u64, AmqpError> {
        Ok(u64::from(
            queue_depth(&self.channel, &self.topology.dead_queue).await?,
        ))
    }

    /// Every one of `jobs` accounted for: `outcomes`, and what is left parked and dead-lettered.
    pub(crate) async fn tally(
        &self,
        jobs: u64,
        outcomes: &JobOutcomes,
    ) -> Result<Accounting, AmqpError> {
        let left = self.read().await?;
        Ok(Accounting::tally(
            jobs,
            outcomes,
            u64::from(left.parked),
            u64::from(left.dead),
        ))
    }
}

/// Runs `body` on a topology of the run's own, as `c.amqp` names it: migrated first, deleted
/// afterwards whatever `body` returned. `name` names the connection that reads the queue depths;
/// `run` (`drill`, `scenario`) the run in what is logged.
pub(crate) async fn on_own_topology<R>(
    c: &WorkerConfig,
    name: &str,
    run: &str,
    body: impl AsyncFnOnce(&Topology, &Depths) -> Result<R, DrillError>,
) -> Result<R, DrillError> {
    fleet_budget_amqp::migrate(&c.amqp.url, &c.amqp, &Migrations::embedded()?, false).await?;
    let topology = Topology::new(&c.amqp);
    let conn = fleet_budget_amqp::connect(c.amqp.connection(), name).await?;
    let depths = Depths {
        channel: conn.create_channel().await?,
        topology: topology.clone(),
    };
    let result = body(&topology, &depths).await;
    if let Err(e) = delete_topology(&conn, &topology).await {
        tracing::warn!(error = %e, prefix = %c.amqp.prefix, "the {run}'s topology was not deleted");
    }
    let _ = conn.close(200, format!("{run} done").as_str().into()).await;
    result
}

/// A run's library workers, each with a connection of its own.
pub(crate) struct Workers {
    handles: Vec<WorkerHandle>,
    joins: Vec<tokio::task::JoinHandle<()>>,
}

impl Workers {
    /// Starts `n` workers named `name` on `topology`, each running `handler` on every job.
    pub(crate) fn start<H, F>(
        n: u32,
        name: &str,
        c: &WorkerConfig,
        budget: &FleetBudget,
        topology: &Topology,
        handler: H,
    ) -> Self
    where
        H: Fn(Job) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Result<(), Failure>> + Send + 'static,
    {
        let mut options = WorkerOptions::new(c, topology);
        options.name = name.to_owned();
        let mut handles = Vec::new();
        let mut joins = Vec::new();
        for _ in 0..n {
            let worker = Worker::new(budget.clone(), topology.clone(), options.clone());
            handles.push(worker.handle());
            let handler = handler.clone();
            joins.push(tokio::spawn(async move {
                let _ = worker.run(handler).await;
            }));
        }
        Self { handles, joins }
    }

    pub(crate) fn handles(&self) -> &[WorkerHandle] {
        &self.handles
    }

    /// Shuts every worker down and waits for it.
    pub(crate) async fn stop(self) {
        for h in &self.handles {
            h.shutdown();
        }
        for j in self.joins {
            let _ = j.await;
        }
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
pub(crate) async fn wait_settled(
    depths: &Depths,
    handles: &[WorkerHandle],
    within: Duration,
) -> Result<(), DrillError> {
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

/// Publishes jobs `0..jobs` to `topology`'s work exchange on the broker of `c` at `rate` per
/// second, evenly (see
/// [`submit_paced`]); each batch's confirms are awaited together. `submitted` counts them.
pub(crate) async fn publish_paced(
    c: &WorkerConfig,
    topology: &Topology,
    rate: u32,
    jobs: u64,
    submitted: &AtomicU64,
) -> Result<(), DrillError> {
    let publisher = Publisher::connect(c.amqp.connection()).await?;
    let publisher = &publisher;
    submit_paced(rate, jobs, submitted, async |ids| {
        let payloads: Vec<Vec<u8>> = ids.map(payload).collect();
        try_join_all(
            payloads
                .iter()
                .map(|p| publisher.publish_job(&topology.work_exchange, TASK, TASK, p)),
        )
        .await?;
        Ok::<(), DrillError>(())
    })
    .await?;
    publisher.close().await;
    Ok(())
}

/// After recovery: the library replayer on the dead letters at `rate` per second, pass after
/// pass until the dead-letter queue is empty (at most [`MAX_REPLAYS`] + 2 passes), waiting up
/// to `settle_within` after each for the workers to settle what it moved. Its moves are counted
/// in the budget's dead-letter index, and each pass is audited in `trail` (when the run has
/// Redis) as `budgetctl replay` audits it.
pub(crate) async fn replay_dead_letters(
    c: &WorkerConfig,
    budget: &FleetBudget,
    depths: &Depths,
    workers: &Workers,
    (rate, settle_within): (u32, Duration),
    trail: Option<&Audit>,
) -> Result<ReplayTotals, DrillError> {
    let mut options = ReplayOptions::new(c);
    options.rate = Some(f64::from(rate));
    options.max_replays = MAX_REPLAYS;
    options.idle_timeout = Duration::from_secs(2);
    options.filter = drill_filter();
    let replayer = Replayer::new(
        c.amqp.connection(),
        depths.topology.clone(),
        Some(budget.clone()),
    )
    .with_index(budget.dead_letter_index().cloned());
    let mut replay = ReplayTotals::default();
    for _ in 0..=MAX_REPLAYS + 1 {
        if depths.dead().await? == 0 {
            break;
        }
        let before = depths.read().await?;
        let run = fleet_budget_amqp::headers::new_message_id();
        if let Some(t) = trail {
            t.record(&audit::intent_entry(
                ACTOR,
                audit::REPLAY,
                &options.filter,
                t.note(),
                &run,
                &before,
                &serde_json::Value::Null,
            ))
            .await?;
        }
        let r = match replayer.run(&options, |_| {}).await {
            Ok(r) => r,
            Err(e) => {
                if let Some(t) = trail {
                    let after = depths.read().await.unwrap_or_else(|_| before.clone());
                    let entry = audit::ended(
                        audit::replay_entry(
                            ACTOR,
                            audit::REPLAY,
                            &options.filter,
                            t.note(),
                            &before,
                            &after,
                            &ReplayReport::default(),
                        ),
                        &run,
                        &format!(
                            "failed: {}",
                            fleet_budget::redact::redact_text(&e.to_string())
                        ),
                    );
                    let _ = t.record(&entry).await;
                }
                return Err(e.into());
            }
        };
        replay.moved += r.moved;
        replay.parked += r.parked;
        wait_settled(depths, workers.handles(), settle_within).await?;
        if let Some(t) = trail {
            let after = depths.read().await?;
            t.record(&audit::ended(
                audit::replay_entry(
                    ACTOR,
                    audit::REPLAY,
                    &options.filter,
                    t.note(),
                    &before,
                    &after,
                    &r,
                ),
                &run,
                if r.cancelled {
                    "cancelled"
                } else {
                    "completed"
                },
            ))
            .await?;
        }
    }
    Ok(replay)
}

/// What the drill's replays and purges select: its dependency's messages (all of them).
pub(crate) fn drill_filter() -> ReplayFilter {
    ReplayFilter {
        dependency: Some(DEPENDENCY.to_owned()),
        ..ReplayFilter::default()
    }
}
