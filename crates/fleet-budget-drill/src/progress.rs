//! A run's live progress, handed to the caller's [`Watcher`] as figures: the library measures,
//! the caller draws (`budgetctl demo` redraws one line on a terminal, prints periodic lines
//! otherwise).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_budget::FleetBudget;
use fleet_budget_sim::accounting::JobOutcomes;
use fleet_budget_sim::upstream::Upstream;

use crate::job::dead_letters;
use crate::scenario::ScenarioProgress;

/// Where the progress of the runs goes.
pub trait Watcher: Send + Sync + 'static {
    /// How often a drill run's progress is handed to [`Watcher::drill`].
    fn every(&self) -> Duration;
    /// A drill run's progress; `last` once, after the run ended.
    fn drill(&self, progress: &DrillProgress, last: bool);
    /// A scenario run's progress, every second.
    fn scenario(&self, progress: &ScenarioProgress);
}

/// Where a drill run stands.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DrillProgress {
    /// The run's name.
    pub label: &'static str,
    /// Since the run started.
    pub elapsed: Duration,
    /// The dependency's phase (`healthy`, `degraded`, `recovered`) and capacity per second;
    /// `None` while the dead letters are replayed.
    pub phase: Option<(&'static str, u64)>,
    /// Calls the dependency received in the last second.
    pub calls_last_second: u64,
    /// Jobs submitted so far.
    pub submitted: u64,
    /// Jobs to submit.
    pub jobs: u64,
    /// Jobs that succeeded.
    pub succeeded: u64,
    /// Jobs waiting for a worker or for their retry delay.
    pub waiting: u64,
    /// Dead-letter decisions so far.
    pub dead_lettered: u64,
    /// Jobs in the dead-letter queue.
    pub in_dead_letter_queue: u64,
    /// Parked jobs.
    pub parked: u64,
}

/// Queue depths for the progress, whatever the queue.
pub(crate) trait QueueGauge: Send + Sync {
    /// Jobs waiting for a worker or for their retry delay.
    fn waiting(&self) -> u64;
    /// Jobs in the dead-letter queue.
    fn dead(&self) -> u64;
    /// Parked jobs.
    fn parked(&self) -> u64;
}

/// What the progress reads.
pub(crate) struct Watched {
    /// The run's name.
    pub(crate) label: &'static str,
    /// When the run started.
    pub(crate) started: Instant,
    /// The dependency.
    pub(crate) upstream: Arc<Upstream>,
    /// The queue.
    pub(crate) queue: Arc<dyn QueueGauge>,
    /// The jobs' outcomes.
    pub(crate) outcomes: Arc<JobOutcomes>,
    /// The budget (its metrics count the dead letters).
    pub(crate) budget: FleetBudget,
    /// Jobs submitted so far.
    pub(crate) submitted: Arc<AtomicU64>,
    /// Jobs to submit.
    pub(crate) jobs: u64,
}

impl Watched {
    fn progress(&self, replaying: bool) -> DrillProgress {
        let elapsed = self.started.elapsed();
        let schedule = self.upstream.schedule();
        DrillProgress {
            label: self.label,
            elapsed,
            phase: (!replaying).then(|| {
                (
                    schedule.phase_at(elapsed).as_str(),
                    schedule.capacity_at(elapsed),
                )
            }),
            calls_last_second: self.upstream.last_second(elapsed),
            submitted: self.submitted.load(Ordering::Relaxed),
            jobs: self.jobs,
            succeeded: self.outcomes.successes(),
            waiting: self.queue.waiting(),
            dead_lettered: dead_letters(self.budget.metrics()).values().sum(),
            in_dead_letter_queue: self.queue.dead(),
            parked: self.queue.parked(),
        }
    }
}

/// A running progress report.
pub(crate) struct Progress {
    replaying: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    /// Starts reporting `watched` to `watcher`.
    pub(crate) fn start(watched: Watched, watcher: &Arc<dyn Watcher>) -> Self {
        let replaying = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let task = {
            let (replaying, done) = (Arc::clone(&replaying), Arc::clone(&done));
            let watcher = Arc::clone(watcher);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(watcher.every());
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let finished = done.load(Ordering::Acquire);
                    watcher.drill(
                        &watched.progress(replaying.load(Ordering::Acquire)),
                        finished,
                    );
                    if finished {
                        return;
                    }
                }
            })
        };
        Self {
            replaying,
            done,
            task,
        }
    }

    /// The run's first pass is over: it replays the dead letters now.
    pub(crate) fn replaying(&self) {
        self.replaying.store(true, Ordering::Release);
    }

    /// Reports the last progress and stops.
    pub(crate) async fn finish(self) {
        self.done.store(true, Ordering::Release);
        let _ = self.task.await;
    }
}
