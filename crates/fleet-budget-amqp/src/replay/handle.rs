//! A replay run by a caller that does something else meanwhile (a web console, a chat bot): it
//! starts the run on the runtime, reads where it stands whenever it likes, and may cancel it.
//!
//! ```no_run
//! # async fn demo(replayer: fleet_budget_amqp::Replayer, options: fleet_budget_amqp::ReplayOptions) {
//! use fleet_budget_amqp::replay::{ReplayMode, ReplayOutcome};
//!
//! let handle = replayer.start(options, ReplayMode::Run);
//! let mut updates = handle.subscribe();
//! while updates.changed().await.is_ok() {
//!     let p = updates.borrow().clone();
//!     println!("moved {} of {}, held: {:?}", p.moved, p.total, p.held);
//!     if p.moved > 1000 {
//!         handle.cancel();
//!     }
//! }
//! if let Ok(ReplayOutcome::Run(report)) = handle.wait().await {
//!     println!("moved {}, cancelled: {}", report.moved, report.cancelled);
//! }
//! # }
//! ```
//!
//! Cancelling stops the run the way it stops at its bound: it reads no further message, puts
//! back a message that was waiting at a hold or for its pace (counted skipped), settles the
//! copies in flight and returns its report, marked `cancelled`. Nothing is dropped.
//!
//! While a RabbitMQ resource alarm blocks the run's connection its copies wait (the progress
//! does not change); [`ReplayHandle::blocked`] says so, with the broker's reason, for a caller
//! that shows the run (the console).

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Replayer;
use super::dry_run::DryRunReport;
use super::report::{ReplayProgress, ReplayReport};
use super::select::ReplayOptions;
use crate::connection::{Blocked, ConnectionWatch};
use crate::error::AmqpError;

/// The watch of the connection a started run opened, shared with its handle (empty until the
/// run has connected).
#[derive(Debug, Clone, Default)]
pub(super) struct Opened(Arc<Mutex<Option<ConnectionWatch>>>);

impl Opened {
    pub(super) fn set(&self, watch: &ConnectionWatch) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(watch.clone());
    }

    fn blocked(&self) -> Option<Blocked> {
        // Cloned out of the lock: reading the watch's events takes the watch's own locks.
        let watch = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        watch.filter(|w| !w.is_lost()).and_then(|w| w.blocked())
    }
}

/// Whether a started replay moves anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayMode {
    /// Count what a run would do ([`Replayer::dry_run`]); progress shows the messages read,
    /// and at the end the prediction (`moved`: would move; `parked`: would park, looping or
    /// malformed, or from the parked queue looping only; `failed`: would fail).
    DryRun,
    /// Move ([`Replayer::run`]).
    Run,
}

/// How a started replay ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// The dry run's prediction.
    DryRun(DryRunReport),
    /// The run's report.
    Run(ReplayReport),
}

/// A cancellation request, as the run sees it (none for a run nobody can cancel).
#[derive(Debug, Clone, Default)]
pub(super) struct Stop(Option<watch::Receiver<bool>>);

impl Stop {
    /// Whether a cancel was asked for.
    pub(super) fn is_requested(&self) -> bool {
        self.0.as_ref().is_some_and(|r| *r.borrow())
    }

    /// Resolves once a cancel is asked for (never, for a run nobody can cancel, or once its
    /// handle is gone without asking).
    pub(super) async fn requested(&mut self) {
        if let Some(r) = &mut self.0
            && r.wait_for(|c| *c).await.is_ok()
        {
            return;
        }
        std::future::pending::<()>().await;
    }
}

/// A replay started by [`Replayer::start`]. Dropping it does not stop the run; [`cancel`]
/// does.
///
/// [`cancel`]: ReplayHandle::cancel
#[derive(Debug)]
pub struct ReplayHandle {
    progress: watch::Receiver<ReplayProgress>,
    cancel: watch::Sender<bool>,
    task: JoinHandle<Result<ReplayOutcome, AmqpError>>,
    opened: Opened,
}

impl ReplayHandle {
    /// Where the run stands now (all zero until it has read the queue's depth).
    #[must_use]
    pub fn progress(&self) -> ReplayProgress {
        self.progress.borrow().clone()
    }

    /// A receiver that sees every change of the progress (the latest one, when the reader is
    /// slower than the run).
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<ReplayProgress> {
        self.progress.clone()
    }

    /// Asks the run to stop (see the module documentation); [`ReplayHandle::wait`] then
    /// returns its report.
    pub fn cancel(&self) {
        self.cancel.send_replace(true);
    }

    /// The broker's block of the run's connection in force (a memory or disk alarm), with its
    /// reason: meanwhile nothing is published, so nothing moves, and the run waits for the
    /// unblock (its copies' deadlines count unblocked time only). `None` when it is not
    /// blocked, not connected yet, or ended.
    #[must_use]
    pub fn blocked(&self) -> Option<Blocked> {
        if self.task.is_finished() {
            return None;
        }
        self.opened.blocked()
    }

    /// Whether the run has ended.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the run's end.
    ///
    /// # Errors
    /// As [`Replayer::run`] or [`Replayer::dry_run`]; a run whose task panicked or was aborted
    /// is [`AmqpError::Broker`] naming it (nothing it had not acked is lost).
    pub async fn wait(self) -> Result<ReplayOutcome, AmqpError> {
        match self.task.await {
            Ok(outcome) => outcome,
            Err(e) => Err(AmqpError::broker(
                format!("replay (its task ended without a report: {e})"),
                lapin::ErrorKind::InvalidChannelState(lapin::ChannelState::Error, "replay task")
                    .into(),
            )),
        }
    }
}

impl Replayer {
    /// Starts a replay (or a dry run) with `options` on the current tokio runtime and returns
    /// at once; the handle reads its progress, cancels it and waits for its report.
    ///
    /// # Panics
    /// Outside a tokio runtime (as `tokio::spawn`).
    #[must_use]
    pub fn start(&self, options: ReplayOptions, mode: ReplayMode) -> ReplayHandle {
        let (progress_tx, progress) = watch::channel(ReplayProgress::default());
        let (cancel, cancelled) = watch::channel(false);
        let opened = Opened::default();
        let mut replayer = self.clone();
        replayer.opened = Some(opened.clone());
        let from_parked = self.from_parked;
        let task = tokio::spawn(async move {
            let publish = |p: &ReplayProgress| {
                progress_tx.send_replace(p.clone());
            };
            match mode {
                ReplayMode::DryRun => replayer.dry_run(&options).await.map(|r| {
                    // What it read, and its prediction as a run's counts.
                    // From the parked queue, unreadable messages stay where they are.
                    let (parked, skipped) = if from_parked {
                        (r.would_park_looping, r.skipped + r.malformed)
                    } else {
                        (r.would_park_looping + r.malformed, r.skipped)
                    };
                    progress_tx.send_modify(|p| {
                        (p.total, p.seen, p.moved) = (r.total, r.seen, r.would_move);
                        (p.parked, p.skipped, p.failed) = (parked, skipped, r.would_fail);
                    });
                    ReplayOutcome::DryRun(r)
                }),
                ReplayMode::Run => replayer
                    .run_until(&options, publish, Stop(Some(cancelled)))
                    .await
                    .map(ReplayOutcome::Run),
            }
        });
        ReplayHandle {
            progress,
            cancel,
            task,
            opened,
        }
    }
}
