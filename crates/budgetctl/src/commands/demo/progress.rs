//! Live progress of a drill run on stderr: one line redrawn in place on a terminal, plain
//! periodic lines otherwise (logs, CI).

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_budget::FleetBudget;
use fleet_budget_sim::accounting::JobOutcomes;
use fleet_budget_sim::upstream::Upstream;

use super::dead_letters;
use crate::output::thousands;

/// Queue depths for the progress line, whatever the queue.
pub(super) trait QueueGauge: Send + Sync {
    /// Jobs waiting for a worker or for their retry delay.
    fn waiting(&self) -> u64;
    /// Jobs in the dead-letter queue.
    fn dead(&self) -> u64;
    /// Parked jobs.
    fn parked(&self) -> u64;
}

/// What the progress line reads.
pub(super) struct Watched {
    /// The run's name.
    pub(super) label: &'static str,
    /// When the run started.
    pub(super) started: Instant,
    /// The dependency.
    pub(super) upstream: Arc<Upstream>,
    /// The queue.
    pub(super) queue: Arc<dyn QueueGauge>,
    /// The jobs' outcomes.
    pub(super) outcomes: Arc<JobOutcomes>,
    /// The budget (its metrics count the dead letters).
    pub(super) budget: FleetBudget,
    /// Jobs submitted so far.
    pub(super) submitted: Arc<AtomicU64>,
    /// Jobs to submit.
    pub(super) jobs: u64,
}

impl Watched {
    fn line(&self, replaying: bool) -> String {
        let elapsed = self.started.elapsed();
        let schedule = self.upstream.schedule();
        let phase = if replaying {
            "replaying dead letters".to_owned()
        } else {
            format!(
                "{} (capacity {}/s)",
                schedule.phase_at(elapsed).as_str(),
                schedule.capacity_at(elapsed)
            )
        };
        format!(
            "[{}] {:>5.1}s {phase:<27} calls {:>5}/s | submitted {}/{} | succeeded {} | waiting {} | dead-lettered {} (in DLQ {}, parked {})",
            self.label,
            elapsed.as_secs_f64(),
            self.upstream.last_second(elapsed),
            thousands(self.submitted.load(Ordering::Relaxed)),
            thousands(self.jobs),
            thousands(self.outcomes.successes()),
            thousands(self.queue.waiting()),
            thousands(dead_letters(self.budget.metrics()).values().sum()),
            thousands(self.queue.dead()),
            thousands(self.queue.parked()),
        )
    }
}

/// A running progress display.
pub(super) struct Progress {
    replaying: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    /// Starts drawing.
    pub(super) fn start(watched: Watched) -> Self {
        let replaying = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let terminal = std::io::stderr().is_terminal();
        let task = {
            let (replaying, done) = (Arc::clone(&replaying), Arc::clone(&done));
            tokio::spawn(async move {
                let every = if terminal {
                    Duration::from_millis(250)
                } else {
                    Duration::from_secs(2)
                };
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let finished = done.load(Ordering::Acquire);
                    let line = watched.line(replaying.load(Ordering::Acquire));
                    let mut err = std::io::stderr().lock();
                    if terminal {
                        let _ = write!(err, "\r\x1b[2K{line}");
                        if finished {
                            let _ = writeln!(err);
                        }
                    } else {
                        let _ = writeln!(err, "{line}");
                    }
                    let _ = err.flush();
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
    pub(super) fn replaying(&self) {
        self.replaying.store(true, Ordering::Release);
    }

    /// Draws the last line and stops.
    pub(super) async fn finish(self) {
        self.done.store(true, Ordering::Release);
        let _ = self.task.await;
    }
}
