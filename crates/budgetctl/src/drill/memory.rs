//! The drill's in-memory queue: a work queue, delayed retries, a dead-letter queue and a parking
//! lot in this process, with workers that follow the same decision order as the RabbitMQ worker
//! (`FleetBudget::on_attempt` / `on_success` / `on_failure`). Used when RabbitMQ does not answer,
//! so the drill runs on a fresh machine.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fleet_budget::{DeadLetterReason, Decision, FleetBudget};

use super::progress::QueueGauge;
use super::upstream::Upstream;
use super::{JobOutcomes, TASK, job_failure};

/// One job as it travels through the queues.
#[derive(Debug, Clone, Copy)]
struct Job {
    id: u64,
    bad_input: bool,
    attempt: u32,
    replays: u32,
}

/// The queues.
#[derive(Debug, Default)]
pub(crate) struct MemoryBroker {
    work: Mutex<VecDeque<Job>>,
    ready: tokio::sync::Notify,
    dead: Mutex<Vec<(Job, DeadLetterReason)>>,
    parked: Mutex<Vec<Job>>,
    delayed: AtomicU64,
    busy: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MemoryBroker {
    /// Publishes a new job.
    pub(crate) fn submit(&self, id: u64, bad_input: bool) {
        self.push(Job {
            id,
            bad_input,
            attempt: 1,
            replays: 0,
        });
    }

    fn push(&self, job: Job) {
        lock(&self.work).push_back(job);
        self.ready.notify_one();
    }

    fn pop(&self) -> Option<Job> {
        let mut work = lock(&self.work);
        let job = work.pop_front()?;
        self.busy.fetch_add(1, Ordering::AcqRel);
        Some(job)
    }

    /// Jobs waiting in the work queue.
    pub(crate) fn ready_depth(&self) -> u64 {
        lock(&self.work).len() as u64
    }

    /// Retries waiting for their delay.
    pub(crate) fn delayed(&self) -> u64 {
        self.delayed.load(Ordering::Acquire)
    }

    /// Dead-lettered jobs waiting in the dead-letter queue.
    pub(crate) fn dead_depth(&self) -> u64 {
        lock(&self.dead).len() as u64
    }

    /// Parked jobs.
    pub(crate) fn parked_depth(&self) -> u64 {
        lock(&self.parked).len() as u64
    }

    /// Whether nothing is queued, delayed or being processed.
    pub(crate) fn idle(&self) -> bool {
        let work = lock(&self.work);
        work.is_empty()
            && self.delayed.load(Ordering::Acquire) == 0
            && self.busy.load(Ordering::Acquire) == 0
    }

    fn schedule(self: &Arc<Self>, job: Job, delay: Duration) {
        self.delayed.fetch_add(1, Ordering::AcqRel);
        let broker = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            // Push before un-counting, so the broker never looks idle with a retry in between.
            broker.push(job);
            broker.delayed.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// One pass of replay, like the library replayer: bounded to the dead letters present now,
    /// paced at `rate` per second; a message replayed `max_replays` times already is parked;
    /// others go back to the work queue with the attempt counter reset and the replay count
    /// incremented. Returns (moved, parked).
    pub(crate) async fn replay_pass(&self, rate: u32, max_replays: u32) -> (u64, u64) {
        let batch: Vec<(Job, DeadLetterReason)> = std::mem::take(&mut *lock(&self.dead));
        let pause = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
        let (mut moved, mut parked) = (0, 0);
        for (job, _reason) in batch {
            if job.replays >= max_replays {
                lock(&self.parked).push(job);
                parked += 1;
                continue;
            }
            self.push(Job {
                attempt: 1,
                replays: job.replays + 1,
                ..job
            });
            moved += 1;
            tokio::time::sleep(pause).await;
        }
        (moved, parked)
    }

    /// Ids of the parked jobs.
    pub(crate) fn parked_ids(&self) -> HashSet<u64> {
        lock(&self.parked).iter().map(|j| j.id).collect()
    }

    /// Ids of the jobs in the dead-letter queue.
    pub(crate) fn dead_ids(&self) -> HashSet<u64> {
        lock(&self.dead).iter().map(|(j, _)| j.id).collect()
    }
}

impl QueueGauge for MemoryBroker {
    fn waiting(&self) -> u64 {
        self.ready_depth() + self.delayed()
    }

    fn dead(&self) -> u64 {
        self.dead_depth()
    }

    fn parked(&self) -> u64 {
        self.parked_depth()
    }
}

/// Runs `workers` workers until `stop` is set and the broker is idle.
pub(crate) async fn run_workers(
    broker: &Arc<MemoryBroker>,
    workers: u32,
    budget: &FleetBudget,
    upstream: &Arc<Upstream>,
    outcomes: &Arc<JobOutcomes>,
    stop: &Arc<AtomicBool>,
) {
    let mut handles = Vec::new();
    for _ in 0..workers {
        let broker = Arc::clone(broker);
        let budget = budget.clone();
        let upstream = Arc::clone(upstream);
        let outcomes = Arc::clone(outcomes);
        let stop = Arc::clone(stop);
        handles.push(tokio::spawn(async move {
            loop {
                let Some(job) = broker.pop() else {
                    if stop.load(Ordering::Acquire) && broker.idle() {
                        return;
                    }
                    let _ =
                        tokio::time::timeout(Duration::from_millis(20), broker.ready.notified())
                            .await;
                    continue;
                };
                handle(&broker, &budget, &upstream, &outcomes, job).await;
                broker.busy.fetch_sub(1, Ordering::AcqRel);
            }
        }));
    }
    for h in handles {
        let _ = h.await;
    }
}

async fn handle(
    broker: &Arc<MemoryBroker>,
    budget: &FleetBudget,
    upstream: &Upstream,
    outcomes: &JobOutcomes,
    job: Job,
) {
    // A task name that is a valid dependency name never fails to resolve.
    let _ = budget.on_attempt(TASK, job.attempt).await;
    match upstream.call(job.bad_input).await {
        Ok(()) => {
            let _ = budget.on_success(TASK).await;
            outcomes.succeeded(job.id, job.replays > 0);
        }
        Err(e) => match budget.on_failure(TASK, job.attempt, &job_failure(e)).await {
            Ok(Decision::Retry {
                delay,
                next_attempt,
                ..
            }) => {
                broker.schedule(
                    Job {
                        attempt: next_attempt,
                        ..job
                    },
                    delay,
                );
            }
            Ok(Decision::DeadLetter { reason, .. }) => {
                lock(&broker.dead).push((job, reason));
                outcomes.dead_lettered(reason, job.replays > 0);
            }
            Err(error) => {
                tracing::error!(%error, "budget refused the task name; dead-lettering");
                lock(&broker.dead).push((job, DeadLetterReason::NonRetryable));
            }
        },
    }
}
