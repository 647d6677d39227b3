//! Live progress of a drill run on stderr: one line redrawn in place on a terminal, plain
//! periodic lines otherwise (logs, CI).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fleet_budget::{DeadLetterReason, FleetBudget};

use super::upstream::Upstream;
use super::{DEPENDENCY, JobOutcomes};

/// Queue depths for the progress line, whatever the queue.
pub(super) trait QueueGauge: Send + Sync {
    /// Jobs waiting for a worker or for their retry delay.
    fn waiting(&self) -> u64;
    /// Jobs in the dead-letter queue.
    fn dead(&self) -> u64;
    /// Parked jobs.
    fn parked(&self) -> u64;
}
use crate::output::thousands;

/// A running progress display.
pub(super) struct Progress {
    stage: Arc<Mutex<&'static str>>,
    done: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    /// Starts drawing.
    pub(super) fn start(
        label: &'static str,
        upstream: Arc<Upstream>,
        broker: Arc<dyn QueueGauge>,
        outcomes: Arc<JobOutcomes>,
        budget: FleetBudget,
        submitted: Arc<AtomicU64>,
        jobs: u64,
    ) -> Self {
        let stage = Arc::new(Mutex::new("run"));
        let done = Arc::new(AtomicBool::new(false));
        let terminal = std::io::stderr().is_terminal();
        let task = {
            let (stage, done) = (Arc::clone(&stage), Arc::clone(&done));
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
                    let stage_now = *stage.lock().unwrap_or_else(PoisonError::into_inner);
                    let elapsed = upstream.elapsed();
                    let phase = if stage_now == "replay" {
                        "replaying dead letters".to_owned()
                    } else {
                        format!(
                            "{} (capacity {}/s)",
                            upstream.schedule().phase_at(elapsed),
                            upstream.schedule().capacity_at(elapsed)
                        )
                    };
                    let line = format!(
                        "[{label}] {:>5.1}s {phase:<27} calls {:>5}/s | submitted {}/{} | succeeded {} | waiting {} | dead-lettered {} (in DLQ {}, parked {})",
                        elapsed.as_secs_f64(),
                        upstream.last_second(),
                        thousands(submitted.load(Ordering::Relaxed)),
                        thousands(jobs),
                        thousands(outcomes.successes()),
                        thousands(broker.waiting()),
                        thousands(dead_lettered(&budget)),
                        thousands(broker.dead()),
                        thousands(broker.parked()),
                    );
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
        Self { stage, done, task }
    }

    /// Names what the run is doing now.
    pub(super) fn set_stage(&self, stage: &'static str) {
        *self.stage.lock().unwrap_or_else(PoisonError::into_inner) = stage;
    }

    /// Draws the last line and stops.
    pub(super) async fn finish(self) {
        self.done.store(true, Ordering::Release);
        let _ = self.task.await;
    }
}

/// Dead-letter decisions so far (first pass and replays).
fn dead_lettered(budget: &FleetBudget) -> u64 {
    DeadLetterReason::ALL
        .iter()
        .map(|r| budget.metrics().dead_letters(DEPENDENCY, *r))
        .sum()
}
