//! The console's one door to the replay library (`fleet_budget_amqp::replay`): the dry run, the
//! run with its progress, and the purge of a group. Kept in one file so that a change of the
//! library's API (a progress and cancel handle) changes this file only.
//!
//! A run happens in a task of its own; the page polls its [`Job`] (bounded: the last
//! [`JOBS_KEPT`] runs are kept). Each run and purge is recorded in the audit trail with the
//! operator's label, the filter and the queue depths before and after, as `budgetctl replay`
//! records it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fleet_budget::FleetBudget;
use fleet_budget::control::AuditLog;
use fleet_budget::store::RedisStore;
use fleet_budget_amqp::replay::audit;
use fleet_budget_amqp::replay::purge::purge_queue;
use fleet_budget_amqp::{
    AmqpError, ReplayFilter, ReplayOptions, ReplayProgress, Replayer, Topology, WorkerConfig,
    queue_depths,
};
use serde::Serialize;

use crate::access::lock;

/// Runs kept for their pages.
pub(crate) const JOBS_KEPT: usize = 20;

/// What a replay would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Prediction {
    pub(crate) total: u64,
    pub(crate) matched: u64,
    pub(crate) moved: u64,
    pub(crate) parked: u64,
    pub(crate) skipped: u64,
    pub(crate) failed: u64,
}

/// Predicts a replay of the dead-letter queue with `filter` (at most `limit` moved), moving
/// nothing: the library's dry run, counted as `budgetctl replay --dry-run` counts it.
///
/// # Errors
/// The broker failed.
pub(crate) async fn dry_run(
    config: &WorkerConfig,
    filter: &ReplayFilter,
    limit: Option<u64>,
) -> Result<Prediction, AmqpError> {
    let topology = Topology::new(&config.amqp);
    let mut options = ReplayOptions::new(config);
    options.filter = filter.clone();
    options.limit = limit;
    let r = Replayer::new(config.amqp.connection(), topology, None)
        .dry_run(&options)
        .await?;
    Ok(Prediction {
        total: r.total,
        matched: r.would_move + r.would_park_looping + r.would_fail,
        moved: r.would_move,
        parked: r.would_park_looping + r.malformed,
        skipped: r.skipped,
        failed: r.would_fail,
    })
}

/// Where a run stands, for its page.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct JobState {
    pub(crate) id: String,
    pub(crate) actor: String,
    pub(crate) selected: String,
    pub(crate) rate: f64,
    pub(crate) total: u64,
    pub(crate) seen: u64,
    pub(crate) moved: u64,
    pub(crate) parked: u64,
    pub(crate) skipped: u64,
    pub(crate) failed: u64,
    /// The dependency whose budget the run waits for, while it waits.
    pub(crate) paused_on: Option<String>,
    pub(crate) elapsed_secs: f64,
    pub(crate) done: bool,
    pub(crate) error: Option<String>,
}

/// A run's shared state.
pub(crate) type Job = Arc<Mutex<JobState>>;

/// The runs of this console, newest last.
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    jobs: Mutex<VecDeque<Job>>,
}

impl Jobs {
    fn add(&self, job: Job) {
        let mut jobs = lock(&self.jobs);
        jobs.push_back(job);
        while jobs.len() > JOBS_KEPT {
            jobs.pop_front();
        }
    }

    pub(crate) fn get(&self, id: &str) -> Option<JobState> {
        lock(&self.jobs)
            .iter()
            .map(|j| lock(j).clone())
            .find(|j| j.id == id)
    }

    pub(crate) fn all(&self) -> Vec<JobState> {
        lock(&self.jobs)
            .iter()
            .rev()
            .map(|j| lock(j).clone())
            .collect()
    }
}

/// What a run needs from the console.
pub(crate) struct RunContext {
    pub(crate) config: WorkerConfig,
    pub(crate) store: Arc<RedisStore>,
    pub(crate) audit: AuditLog,
    pub(crate) queue_work: Arc<tokio::sync::Mutex<()>>,
    pub(crate) done: Arc<tokio::sync::Notify>,
}

/// Starts a replay of the dead-letter queue with `filter` at `rate` messages/s (at most
/// `limit`), paced by the live budget as `budgetctl replay` is; returns its id at once.
pub(crate) fn start(
    jobs: &Jobs,
    cx: RunContext,
    filter: ReplayFilter,
    rate: f64,
    limit: Option<u64>,
    actor: String,
    note: String,
) -> String {
    let id = crate::access::random_hex();
    let job: Job = Arc::new(Mutex::new(JobState {
        id: id.clone(),
        actor: actor.clone(),
        selected: audit::describe(&filter),
        rate,
        ..JobState::default()
    }));
    jobs.add(job.clone());
    tokio::spawn(async move {
        let started = Instant::now();
        let result = run(&cx, &job, filter, rate, limit, &actor, &note, started).await;
        let mut state = lock(&job);
        state.done = true;
        state.paused_on = None;
        state.elapsed_secs = started.elapsed().as_secs_f64();
        if let Err(e) = result {
            state.error = Some(fleet_budget::redact::redact_text(&e));
        }
        drop(state);
        cx.done.notify_one();
    });
    id
}

#[allow(clippy::too_many_arguments)]
async fn run(
    cx: &RunContext,
    job: &Job,
    filter: ReplayFilter,
    rate: f64,
    limit: Option<u64>,
    actor: &str,
    note: &str,
    started: Instant,
) -> Result<(), String> {
    let _queue = cx.queue_work.lock().await;
    let config = &cx.config;
    let topology = Topology::new(&config.amqp);
    let before = queue_depths(config.amqp.connection(), &topology)
        .await
        .map_err(|e| e.to_string())?;
    let budget = FleetBudget::from_config(&config.budget)
        .await
        .map_err(|e| e.to_string())?;
    let mut options = ReplayOptions::new(config);
    options.filter = filter;
    options.rate = Some(rate);
    options.limit = limit;
    let replayer = Replayer::new(
        config.amqp.connection(),
        topology.clone(),
        Some(budget.clone()),
    );
    let report = replayer
        .run(&options, |p: &ReplayProgress| {
            let mut s = lock(job);
            s.total = p.total;
            s.seen = p.seen;
            s.moved = p.moved;
            s.parked = p.parked;
            s.skipped = p.skipped;
            s.failed = p.failed;
            s.paused_on.clone_from(&p.paused_on);
            s.elapsed_secs = started.elapsed().as_secs_f64();
        })
        .await;
    let _ = budget.shutdown().await;
    let r = report.map_err(|e| e.to_string())?;
    {
        let mut s = lock(job);
        s.total = r.total;
        s.seen = r.seen;
        s.moved = r.moved;
        s.parked = r.parked;
        s.skipped = r.skipped;
        s.failed = r.failed;
    }
    let after = queue_depths(config.amqp.connection(), &topology)
        .await
        .map_err(|e| e.to_string())?;
    let entry = audit::replay_entry(
        actor,
        audit::REPLAY,
        &options.filter,
        note,
        &before,
        &after,
        &r,
    );
    cx.audit
        .record(&cx.store, &entry)
        .await
        .map_err(|e| format!("the replay ran, but its audit entry was not recorded: {e}"))?;
    Ok(())
}

/// What a purge removed.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Purged {
    pub(crate) removed: u64,
    pub(crate) kept: u64,
}

/// Removes the messages of the dead-letter (or parked) queue that `filter` selects, and
/// records it (action `dlq_purge` or `parked_purge`) with `actor`.
///
/// # Errors
/// The broker failed; or the audit record did (the purge happened: the error says so).
pub(crate) async fn purge(
    cx: &RunContext,
    parked: bool,
    filter: &ReplayFilter,
    actor: &str,
    note: &str,
) -> Result<Purged, String> {
    let _queue = cx.queue_work.lock().await;
    let config = &cx.config;
    let topology = Topology::new(&config.amqp);
    let queue = if parked {
        &topology.parked_queue
    } else {
        &topology.dead_queue
    };
    let before = queue_depths(config.amqp.connection(), &topology)
        .await
        .map_err(|e| e.to_string())?;
    let report = purge_queue(config.amqp.connection(), queue, filter, None)
        .await
        .map_err(|e| e.to_string())?;
    let after = queue_depths(config.amqp.connection(), &topology)
        .await
        .map_err(|e| e.to_string())?;
    let mut entry = audit::purge_entry(actor, filter, note, &before, &after, &report);
    if !parked {
        "dlq_purge".clone_into(&mut entry.action);
    }
    cx.audit
        .record(&cx.store, &entry)
        .await
        .map_err(|e| format!("the purge happened, but its audit entry was not recorded: {e}"))?;
    Ok(Purged {
        removed: report.removed,
        kept: report.kept,
    })
}
