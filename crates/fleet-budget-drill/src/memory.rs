//! The drill on `fleet-budget-sim`'s in-memory queue, used when RabbitMQ does not answer so
//! that the drill runs on a fresh machine. Workers take a job, call the dependency, report to
//! the budget (`FleetBudget::on_attempt` / `on_success` / `on_failure`), and settle the job by
//! the RabbitMQ worker's own rules: [`Outcome::of_decision`] says whether a failed job waits in a
//! retry tier or is dead-lettered, and the in-memory queue carries that out.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_budget::FleetBudget;
use fleet_budget_amqp::{AmqpSettings, JobContext, Outcome, Topology};
use fleet_budget_sim::accounting::{Accounting, JobOutcomes};
use fleet_budget_sim::queue::{Job, MemoryQueue, Settle};
use fleet_budget_sim::upstream::Upstream;

use crate::job::{bad_input, call, job_failure, submit_paced};
use crate::progress::{Progress, QueueGauge, Watched, Watcher};
use crate::{FirstPass, MAX_REPLAYS, ReplayTotals, RunReport, RunSettings, TASK, amqp_settings};

/// How long an idle worker waits before looking at the queue again, at most.
const POLL: Duration = Duration::from_millis(5);

impl QueueGauge for MemoryQueue {
    fn waiting(&self) -> u64 {
        MemoryQueue::waiting(self)
    }

    fn dead(&self) -> u64 {
        self.dead_depth()
    }

    fn parked(&self) -> u64 {
        self.parked_depth()
    }
}

/// What a worker needs, shared by all of them.
struct Shared {
    queue: Arc<MemoryQueue>,
    /// The drill's topology: the retry tiers a failed job waits in.
    topology: Topology,
    budget: FleetBudget,
    upstream: Arc<Upstream>,
    outcomes: Arc<JobOutcomes>,
    started: Instant,
    stop: AtomicBool,
}

/// One run on the in-memory queue.
pub(crate) async fn run(
    s: &RunSettings,
    budget: &FleetBudget,
    watcher: &Arc<dyn Watcher>,
) -> RunReport {
    let started = Instant::now();
    let shared = Arc::new(Shared {
        queue: Arc::default(),
        topology: Topology::new(&amqp_settings(&AmqpSettings::default(), &s.key_prefix)),
        budget: budget.clone(),
        upstream: Arc::new(Upstream::new(s.schedule)),
        outcomes: Arc::new(JobOutcomes::default()),
        started,
        stop: AtomicBool::new(false),
    });
    let jobs = s.jobs();
    let submitted = Arc::new(AtomicU64::new(0));
    let progress = Progress::start(
        Watched {
            label: s.label,
            started,
            upstream: Arc::clone(&shared.upstream),
            queue: Arc::clone(&shared.queue) as Arc<dyn QueueGauge>,
            outcomes: Arc::clone(&shared.outcomes),
            budget: budget.clone(),
            submitted: Arc::clone(&submitted),
            jobs,
        },
        watcher,
    );
    let workers: Vec<_> = (0..s.workers)
        .map(|_| tokio::spawn(work(Arc::clone(&shared))))
        .collect();

    let queue = &shared.queue;
    // Submitting to memory cannot fail.
    let _ = submit_paced(s.rate, jobs, &submitted, async |ids| {
        for id in ids {
            queue.submit(id, bad_input(id));
        }
        Ok::<(), std::convert::Infallible>(())
    })
    .await;
    // Let the last retries finish (the longest backoff is 1 s per attempt).
    wait_idle(&shared, s.phase.max(Duration::from_secs(5))).await;
    let first = FirstPass::measure(&shared.upstream, started, budget, &shared.outcomes);

    // After recovery: replay the dead-letter queue until it is empty (bad input comes back and
    // is parked on the next pass).
    progress.replaying();
    let mut replay = ReplayTotals::default();
    for _ in 0..=MAX_REPLAYS + 1 {
        if queue.dead_depth() == 0 {
            break;
        }
        let now = started.elapsed();
        let pass = queue.replay(now, s.replay_rate(), MAX_REPLAYS);
        replay.moved += pass.moved;
        replay.parked += pass.parked;
        let pacing = pass.last_due.saturating_sub(now);
        wait_idle(&shared, pacing + Duration::from_secs(10)).await;
    }
    shared.stop.store(true, Ordering::Release);
    for w in workers {
        let _ = w.await;
    }
    progress.finish().await;

    let parked = queue
        .parked_ids()
        .difference(&shared.outcomes.succeeded_ids())
        .count() as u64;
    let still_dead = queue.dead_ids().len() as u64;
    let accounting = Accounting::tally(jobs, &shared.outcomes, parked, still_dead);
    RunReport::new(s, first, &shared.upstream, &replay, accounting)
}

/// Waits until the queue is idle, at most `within`.
async fn wait_idle(shared: &Shared, within: Duration) {
    let deadline = Instant::now() + within;
    while !shared.queue.idle() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One worker: takes ready jobs until told to stop and the queue is idle.
async fn work(shared: Arc<Shared>) {
    loop {
        let now = shared.started.elapsed();
        let Some(job) = shared.queue.take(now) else {
            if shared.stop.load(Ordering::Acquire) && shared.queue.idle() {
                return;
            }
            let wait = shared.queue.next_due().map_or(POLL, |due| {
                due.saturating_sub(now)
                    .clamp(Duration::from_millis(1), POLL)
            });
            tokio::time::sleep(wait).await;
            continue;
        };
        let how = handle(&shared, job).await;
        shared.queue.settle(job, how);
    }
}

/// Runs one job and says how it settles.
async fn handle(shared: &Shared, job: Job) -> Settle {
    let budget = &shared.budget;
    // A task name that is a valid dependency name never fails to resolve.
    let _ = budget.on_attempt(TASK, job.attempt).await;
    let Err(e) = call(&shared.upstream, shared.started, job.bad_input).await else {
        let _ = budget.on_success(TASK).await;
        shared.outcomes.succeeded(job.id, job.replays > 0);
        return Settle::Ack;
    };
    let failure = job_failure(e);
    let now = shared.started.elapsed();
    let context = JobContext {
        task: TASK.to_owned(),
        attempt: job.attempt,
        replays: job.replays,
        now_ms: u64::try_from(now.as_millis()).unwrap_or(u64::MAX),
        ..JobContext::default()
    };
    let outcome = match budget.on_failure(TASK, job.attempt, &failure).await {
        Ok(decision) => Outcome::of_decision(&shared.topology, &context, &failure, &decision),
        Err(error) => Outcome::invalid_task(&context, &error),
    };
    match outcome {
        Outcome::Ack => Settle::Ack,
        // Back after the hops of its delay through the tiers (the first is `tier`).
        Outcome::Retry { tier, record } => Settle::Retry {
            next_attempt: record.attempt,
            due: now
                + shared
                    .topology
                    .hop_plan(Duration::from_millis(record.delay_ms))
                    .iter()
                    .sum::<Duration>()
                    .max(tier.delay),
        },
        // Runs when its time has come, the attempt unchanged.
        Outcome::Wait { not_before_ms, .. } | Outcome::Hold { not_before_ms, .. } => {
            Settle::Retry {
                next_attempt: job.attempt,
                due: Duration::from_millis(not_before_ms).max(now),
            }
        }
        Outcome::DeadLetter(record) => Settle::DeadLetter(record.reason),
        // Put back as it is, to run again.
        Outcome::Requeue => Settle::Retry {
            next_attempt: job.attempt,
            due: now,
        },
    }
}
