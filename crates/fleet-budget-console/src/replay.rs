//! The console's one door to the replay library (`fleet_budget_amqp::replay`): the dry run, the
//! run with its progress, and the purge of a group. Kept in one file so that a change of the
//! library's API (a progress and cancel handle) changes this file only.
//!
//! A run is the library's started replay (`Replayer::start`, with the configured breakers):
//! a task of the console follows its progress into a [`Job`] that the page polls, and passes
//! on a cancel asked on the page. A purge (of a group, or of one message) is a job too, with
//! the same page, progress and cancel. Ended jobs are kept up to [`JOBS_KEPT`]; a job that has
//! not ended is never dropped from the list (its page and its Cancel keep answering), and at
//! most [`JOBS_RUNNING_MAX`] wait or run at once. Jobs that move messages take turns (a purge
//! beside a replay would read what the other moves): one waiting for its turn says so
//! (`queued`). A dry run reads no message and never waits for them. Each run and purge is recorded in the audit trail with the
//! operator's label, the filter and the queue depths before and after, as `budgetctl replay`
//! records it.
//!
//! Jobs outlive the console that ran them (issue 32: a restart forgot every replay): each job's
//! record (its state and what it was asked: the filter, rate, limit and note) is kept in Redis
//! under the fleet's key prefix ([`jobs_key`]), written when it starts, every 2 s while it runs
//! and when it ends. Each console says it is alive with a key that expires ([`alive_key`],
//! [`ALIVE_FOR`]); a job whose console's key is gone and that never ended is shown
//! **interrupted**, with the counts its last record reached, and an operator may run it again:
//! the replay's claims (`fleet_budget::control::ReplayMoves`) make a second run of a replay
//! that stopped half-way move each message once, and a purge run again removes what is left of
//! its selection. Jobs of another console sharing the prefix are listed too.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_budget::DeadLetterReason;
use fleet_budget::FleetBudget;
use fleet_budget::control::{AuditEntry, AuditLog, DeadLetterIndex, RunJournal};
use fleet_budget::store::RedisStore;
use fleet_budget_amqp::dead_letters::{Changes, Counted};
use fleet_budget_amqp::headers;
use fleet_budget_amqp::replay::{
    Breakers, HoldReason, InspectOptions, Look, Pace, PurgeReport, QueuedMessage, Rate, ReplayMode,
    ReplayOutcome, SourceQueue, audit, inspect_queue_with,
};
use fleet_budget_amqp::{
    AmqpError, ReplayFilter, ReplayOptions, ReplayProgress, Replayer, Topology, WorkerConfig,
    queue_depths,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::access::lock;

/// How often a running replay's page state looks whether RabbitMQ blocks its connection.
const BLOCK_LOOK: Duration = Duration::from_millis(250);

/// Ended jobs kept for their pages.
pub(crate) const JOBS_KEPT: usize = 20;
/// Jobs waiting or running at once; more are refused (the page says so).
pub(crate) const JOBS_RUNNING_MAX: usize = 50;

/// How long a console's "alive" key lasts without being renewed (it is renewed every third of
/// it): a job of a console that stopped is shown interrupted at most this long after.
pub(crate) const ALIVE_FOR: Duration = Duration::from_secs(10);
/// Job records kept in Redis: the ended ones beyond it are dropped, oldest first.
const RECORDS_KEPT: usize = JOBS_KEPT * 5;

/// The Redis hash of the console's job records under `prefix`: job id → its record (JSON).
/// After `v1:` comes `c`, never `{`: never a budget key.
pub(crate) fn jobs_key(prefix: &str) -> String {
    format!(
        "{prefix}:v{}:console:jobs",
        fleet_budget::keys::KEY_SCHEMA_VERSION
    )
}

/// The key that says console `instance` is alive (expires after [`ALIVE_FOR`]).
pub(crate) fn alive_key(prefix: &str, instance: &str) -> String {
    format!(
        "{prefix}:v{}:console:alive:{instance}",
        fleet_budget::keys::KEY_SCHEMA_VERSION
    )
}

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    /// A replay of a selection of the dead-letter queue.
    #[default]
    Replay,
    /// A purge of a selection (a group) of the dead-letter or parked queue.
    Purge,
    /// A replay of one message, by its id.
    MessageReplay,
    /// A purge of one message, by its id.
    MessagePurge,
}

impl Kind {
    pub(crate) fn words(self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::Purge => "purge",
            Self::MessageReplay => "replay of one message",
            Self::MessagePurge => "purge of one message",
        }
    }

    pub(crate) fn is_purge(self) -> bool {
        matches!(self, Self::Purge | Self::MessagePurge)
    }
}

/// What a replay would do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Prediction {
    pub(crate) total: u64,
    pub(crate) matched: u64,
    pub(crate) moved: u64,
    pub(crate) parked: u64,
    pub(crate) skipped: u64,
    pub(crate) failed: u64,
    /// Messages the prediction could not place (0 when exact).
    pub(crate) uncertain: u64,
    /// Why it is an estimate, when it is.
    pub(crate) estimate: Option<String>,
}

/// Predicts a replay of the dead-letter queue with `filter` (at most `limit` moved), moving
/// nothing: the library's dry run, counted as `budgetctl replay --dry-run` counts it.
///
/// # Errors
/// The broker failed.
pub(crate) async fn dry_run(
    config: &WorkerConfig,
    store: &Arc<RedisStore>,
    filter: &ReplayFilter,
    limit: Option<u64>,
) -> Result<Prediction, AmqpError> {
    let topology = Topology::new(&config.amqp);
    let mut options = ReplayOptions::new(config);
    options.filter = filter.clone();
    options.limit = limit;
    let r = Replayer::new(config.amqp.connection(), topology, None)
        .with_index(Some(DeadLetterIndex::new(Arc::clone(store))))
        .dry_run(&options)
        .await?;
    Ok(Prediction {
        total: r.total,
        matched: r.would_move + r.would_park_looping + r.would_fail,
        moved: r.would_move,
        parked: r.would_park_looping + r.malformed,
        skipped: r.skipped,
        failed: r.would_fail,
        uncertain: r.uncertain,
        estimate: r.estimate,
    })
}

/// The audit action of a purge of the dead-letter queue (the console's; `budgetctl` purges only
/// the parked queue).
const DLQ_PURGE: &str = "dlq_purge";

/// Where a run stands, for its page.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JobState {
    pub(crate) id: String,
    /// What the job does.
    pub(crate) kind: Kind,
    /// The queue it acts on (`dead` or `parked`).
    pub(crate) queue: String,
    /// When it was asked (Unix ms).
    pub(crate) started_ms: u64,
    /// The console that runs it.
    pub(crate) console: String,
    /// Its console stopped before it ended: the counts are where it stopped.
    pub(crate) interrupted: bool,
    /// The job this one runs again.
    pub(crate) rerun_of: Option<String>,
    /// The message it acts on, when it acts on one.
    pub(crate) message_id: Option<String>,
    /// Waiting for another job that moves messages to end.
    pub(crate) queued: bool,
    /// What the index counted of its selection when it started (purges).
    pub(crate) expected: Option<u64>,
    /// Messages removed for good (purges).
    pub(crate) removed: u64,
    pub(crate) actor: String,
    pub(crate) selected: String,
    /// The dependency the run replays.
    pub(crate) dependency: Option<String>,
    /// The most the run moves per second (the form's rate).
    pub(crate) rate: f64,
    pub(crate) total: u64,
    pub(crate) seen: u64,
    pub(crate) moved: u64,
    pub(crate) parked: u64,
    pub(crate) skipped: u64,
    pub(crate) failed: u64,
    /// The dependency whose budget or breaker the run waits for, while it waits.
    pub(crate) paused_on: Option<String>,
    /// Why it waits (`breaker_open`, `frozen`), while it waits.
    pub(crate) held: Option<String>,
    /// While held by an open breaker: the server time (Unix ms) its open period ends.
    pub(crate) held_until_ms: Option<u64>,
    /// While RabbitMQ blocks the run's connection (a memory or disk alarm): the broker's reason
    /// (`low on memory`). Nothing is published, so nothing moves, until it is unblocked.
    pub(crate) blocked: Option<String>,
    /// The rate moves go at now (messages/s; `None`: nothing decided yet).
    pub(crate) rate_now: Option<f64>,
    /// Why the rate is what it is (the library's wire name: `starting`, `at_rate`, `slowed`,
    /// `recovering`, `probe_pace`, ...).
    pub(crate) pace: Option<String>,
    /// The same in words (the library's, as `budgetctl replay` prints them).
    pub(crate) pace_text: Option<String>,
    /// The messages not yet read, at the rate now, in seconds (`None`: held, or no rate).
    pub(crate) eta_secs: Option<f64>,
    /// Times the rate was cut after the dependency's failures or denials rose.
    pub(crate) slowdowns: u64,
    /// Someone asked to cancel the run (who, with a session of an operator).
    pub(crate) cancel_requested_by: Option<String>,
    /// The run ended cancelled.
    pub(crate) cancelled: bool,
    pub(crate) elapsed_secs: f64,
    pub(crate) done: bool,
    pub(crate) error: Option<String>,
}

impl JobState {
    /// The run's state in a word, for its page: `queued`, `blocked`, `held`, `running`,
    /// `cancelling`, `cancelled`, `done`, `failed` or `interrupted`.
    pub(crate) fn state(&self) -> &'static str {
        if self.interrupted {
            return "interrupted";
        }
        match (self.done, &self.error, self.cancelled) {
            (true, Some(_), _) => "failed",
            (true, None, true) => "cancelled",
            (true, None, false) => "done",
            (false, ..) if self.cancel_requested_by.is_some() => "cancelling",
            (false, ..) if self.queued => "queued",
            (false, ..) if self.blocked.is_some() => "blocked",
            (false, ..) if self.held.is_some() => "held",
            (false, ..) => "running",
        }
    }

    fn follow(&mut self, p: &ReplayProgress) {
        self.total = p.total;
        self.seen = p.seen;
        self.moved = p.moved;
        self.parked = p.parked;
        self.skipped = p.skipped;
        self.failed = p.failed;
        self.paused_on.clone_from(&p.paused_on);
        self.held = p.held.as_ref().map(|h| h.reason.as_str().to_owned());
        self.held_until_ms = p.held.as_ref().and_then(|h| match h.reason {
            HoldReason::BreakerOpen { until_ms } => Some(until_ms),
            _ => None,
        });
        self.rate_now = p.rate.map(Rate::per_sec);
        self.pace = p.pace.map(|s| s.as_str().to_owned());
        self.pace_text = p.pace.map(Pace::describe);
        // No time left to tell while RabbitMQ blocks the run: nothing moves.
        self.eta_secs = p
            .eta()
            .filter(|_| self.blocked.is_none())
            .map(|d| d.as_secs_f64());
        self.slowdowns = p.slowdowns;
    }
}

/// What a job was asked: enough to run it again.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Plan {
    /// A purge of the parked queue (else of the dead-letter queue; replays read that one).
    pub(crate) parked: bool,
    pub(crate) dependency: Option<String>,
    pub(crate) reason: Option<String>,
    pub(crate) since_ms: Option<u64>,
    pub(crate) until_ms: Option<u64>,
    pub(crate) task: Option<String>,
    pub(crate) message_id: Option<String>,
    pub(crate) error_contains: Option<String>,
    pub(crate) error_class: Option<String>,
    pub(crate) malformed: bool,
    pub(crate) rate: f64,
    pub(crate) limit: Option<u64>,
    pub(crate) note: String,
}

impl Plan {
    fn of(filter: &ReplayFilter, parked: bool, rate: f64, limit: Option<u64>, note: &str) -> Self {
        Self {
            parked,
            dependency: filter.dependency.clone(),
            reason: filter.reason.map(|r| r.as_str().to_owned()),
            since_ms: filter.since_ms,
            until_ms: filter.until_ms,
            task: filter.task.clone(),
            message_id: filter.message_id.clone(),
            error_contains: filter.error_contains.clone(),
            error_class: filter.error_class.clone(),
            malformed: filter.malformed,
            rate,
            limit,
            note: note.to_owned(),
        }
    }

    /// The filter again (`None`: a reason this build does not know).
    pub(crate) fn filter(&self) -> Option<ReplayFilter> {
        let reason = match &self.reason {
            Some(r) => Some(DeadLetterReason::parse(r)?),
            None => None,
        };
        Some(ReplayFilter {
            dependency: self.dependency.clone(),
            reason,
            since_ms: self.since_ms,
            until_ms: self.until_ms,
            task: self.task.clone(),
            message_id: self.message_id.clone(),
            error_contains: self.error_contains.clone(),
            error_class: self.error_class.clone(),
            malformed: self.malformed,
        })
    }
}

/// A job as kept in Redis.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Record {
    pub(crate) state: JobState,
    pub(crate) plan: Plan,
}

/// A run: its state, what it was asked, and how to ask it to stop.
#[derive(Debug)]
pub(crate) struct Job {
    state: Mutex<JobState>,
    plan: Plan,
    cancel: watch::Sender<bool>,
}

impl Job {
    fn record(&self) -> Record {
        Record {
            state: lock(&self.state).clone(),
            plan: self.plan.clone(),
        }
    }
}

/// What asking a run to stop came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cancel {
    /// Asked; the run stops at its next step (its page shows it).
    Asked,
    /// The run had ended already.
    Ended,
    /// No such run (or it is no longer kept).
    Unknown,
}

/// The runs of this console, newest last, and where their records are kept.
#[derive(Debug)]
pub(crate) struct Jobs {
    jobs: Mutex<VecDeque<Arc<Job>>>,
    /// Where the records are kept (`None`: in memory only).
    store: Option<Arc<RedisStore>>,
    /// This console's id, in its jobs' records and its alive key.
    instance: String,
}

impl Default for Jobs {
    fn default() -> Self {
        Self::new(None)
    }
}

impl Jobs {
    pub(crate) fn new(store: Option<Arc<RedisStore>>) -> Self {
        Self {
            jobs: Mutex::default(),
            store,
            instance: crate::access::random_hex(),
        }
    }

    /// Says this console is alive, every third of [`ALIVE_FOR`], for as long as it runs.
    pub(crate) async fn keep_alive(&self) {
        let Some(store) = &self.store else { return };
        loop {
            let mut cmd = redis::cmd("SET");
            cmd.arg(alive_key(store.prefix(), &self.instance))
                .arg(fleet_budget::clock::now_ms())
                .arg("PX")
                .arg(millis(ALIVE_FOR));
            if let Err(e) = store.query::<()>(&cmd).await {
                tracing::warn!(error = %redact(&e.to_string()), "console: its alive key was not written");
            }
            tokio::time::sleep(ALIVE_FOR / 3).await;
        }
    }

    /// The records kept in Redis, by id (at most [`RECORDS_KEPT`] and the unended ones; the
    /// oldest ended beyond them are dropped here). A job whose console is no longer alive and
    /// that never ended is marked interrupted (and its record so written).
    async fn records(&self) -> Vec<Record> {
        let Some(store) = &self.store else {
            return Vec::new();
        };
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(jobs_key(store.prefix()));
        let raw: Vec<(String, String)> = match store.query(&cmd).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %redact(&e.to_string()), "console: the job records could not be read");
                return Vec::new();
            }
        };
        // A record is outside text: one whose ids are not this console's own kind (128 random
        // bits in hex), or whose queue is neither of ours, is not shown (and is dropped).
        let readable = |json: &str| {
            serde_json::from_str::<Record>(json).ok().filter(|r| {
                is_id(&r.state.id)
                    && is_id(&r.state.console)
                    && r.state.rerun_of.as_deref().is_none_or(is_id)
                    && matches!(r.state.queue.as_str(), "dead" | "parked")
            })
        };
        let mut records: Vec<Record> = raw.iter().filter_map(|(_, json)| readable(json)).collect();
        records.sort_by_key(|r| std::cmp::Reverse(r.state.started_ms));
        let mut ended = 0usize;
        let mut dropped = Vec::new();
        for r in &records {
            if r.state.done {
                ended += 1;
                if ended > RECORDS_KEPT {
                    dropped.push(r.state.id.clone());
                }
            }
        }
        // Unreadable records are dropped too: nothing can show them.
        let unreadable = raw
            .iter()
            .filter(|(_, json)| readable(json).is_none())
            .map(|(id, _)| id.clone());
        dropped.extend(unreadable);
        if !dropped.is_empty() {
            let mut del = redis::cmd("HDEL");
            del.arg(jobs_key(store.prefix())).arg(&dropped);
            let _ = store.query::<()>(&del).await;
            records.retain(|r| !dropped.contains(&r.state.id));
        }
        for r in &mut records {
            if r.state.done || r.state.console == self.instance {
                continue;
            }
            let mut exists = redis::cmd("EXISTS");
            exists.arg(alive_key(store.prefix(), &r.state.console));
            if store.query::<u64>(&exists).await.ok() == Some(0) {
                r.state.interrupted = true;
                r.state.done = true;
                r.state.queued = false;
                r.state.held = None;
                r.state.blocked = None;
                r.state.paused_on = None;
                save(Some(store), r).await;
            }
        }
        records
    }

    /// Every job: this console's, and those kept in Redis (other consoles', earlier ones'),
    /// newest first.
    pub(crate) async fn list(&self) -> Vec<JobState> {
        let mut all = self.all();
        let records = self.records().await;
        for r in records {
            if !all.iter().any(|j| j.id == r.state.id) {
                all.push(r.state);
            }
        }
        all.sort_by_key(|j| std::cmp::Reverse(j.started_ms));
        all
    }

    /// Job `id` with what it was asked: this console's, else its record in Redis.
    pub(crate) async fn find_record(&self, id: &str) -> Option<Record> {
        if let Some(job) = self.find(id) {
            return Some(job.record());
        }
        self.records().await.into_iter().find(|r| r.state.id == id)
    }

    /// Job `id`: this console's, else its record in Redis.
    pub(crate) async fn lookup(&self, id: &str) -> Option<JobState> {
        self.find_record(id).await.map(|r| r.state)
    }

    /// Adds `job`, dropping the oldest ended jobs beyond [`JOBS_KEPT`] (never one that has not
    /// ended); refused when [`JOBS_RUNNING_MAX`] have not ended.
    fn add(&self, job: Arc<Job>) -> Result<(), String> {
        let mut jobs = lock(&self.jobs);
        let running = jobs.iter().filter(|j| !lock(&j.state).done).count();
        if running >= JOBS_RUNNING_MAX {
            return Err(format!(
                "{running} replays and purges are waiting or running: wait for one to end"
            ));
        }
        jobs.push_back(job);
        let mut ended = jobs.iter().filter(|j| lock(&j.state).done).count();
        while ended > JOBS_KEPT {
            let Some(i) = jobs.iter().position(|j| lock(&j.state).done) else {
                break;
            };
            jobs.remove(i);
            ended -= 1;
        }
        Ok(())
    }

    fn find(&self, id: &str) -> Option<Arc<Job>> {
        lock(&self.jobs)
            .iter()
            .find(|j| lock(&j.state).id == id)
            .cloned()
    }

    /// Job `id` of this console.
    pub(crate) fn get(&self, id: &str) -> Option<JobState> {
        self.find(id).map(|j| lock(&j.state).clone())
    }

    /// This console's jobs, newest first.
    pub(crate) fn all(&self) -> Vec<JobState> {
        lock(&self.jobs)
            .iter()
            .rev()
            .map(|j| lock(&j.state).clone())
            .collect()
    }

    /// Asks run `id` to stop, on behalf of `actor`. The run puts back what it has not moved
    /// (see `fleet_budget_amqp::replay::handle`).
    pub(crate) fn cancel(&self, id: &str, actor: &str) -> (Cancel, Option<JobState>) {
        let Some(job) = self.find(id) else {
            return (Cancel::Unknown, None);
        };
        let mut state = lock(&job.state);
        if state.done {
            return (Cancel::Ended, Some(state.clone()));
        }
        if state.cancel_requested_by.is_none() {
            state.cancel_requested_by = Some(actor.to_owned());
        }
        job.cancel.send_replace(true);
        (Cancel::Asked, Some(state.clone()))
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

/// What an operator asked of a job.
#[derive(Debug, Clone)]
pub(crate) struct Ask {
    /// Which messages.
    pub(crate) filter: ReplayFilter,
    /// At most this many messages a second (replays).
    pub(crate) rate: f64,
    /// At most this many messages.
    pub(crate) limit: Option<u64>,
    /// Who (the session's label).
    pub(crate) actor: String,
    /// Why (the audit trail's note).
    pub(crate) note: String,
    /// The job this one runs again.
    pub(crate) rerun_of: Option<String>,
}

impl Ask {
    /// What `record` asked, asked again by `actor` (`None`: its filter cannot be read).
    pub(crate) fn again(record: &Record, actor: String) -> Option<Self> {
        Some(Self {
            filter: record.plan.filter()?,
            rate: record.plan.rate,
            limit: record.plan.limit,
            actor,
            note: format!(
                "run again after {} {}: {}",
                record.state.id,
                record.state.state(),
                record.plan.note
            ),
            rerun_of: Some(record.state.id.clone()),
        })
    }
}

/// A new job's record, queued.
fn new_job(jobs: &Jobs, kind: Kind, parked: bool, ask: &Ask) -> (Arc<Job>, watch::Receiver<bool>) {
    let (cancel, cancelled) = watch::channel(false);
    let job = Arc::new(Job {
        state: Mutex::new(JobState {
            id: crate::access::random_hex(),
            kind,
            queue: if parked { "parked" } else { "dead" }.to_owned(),
            started_ms: fleet_budget::clock::now_ms(),
            console: jobs.instance.clone(),
            rerun_of: ask.rerun_of.clone(),
            message_id: ask.filter.message_id.clone(),
            queued: true,
            actor: ask.actor.clone(),
            selected: audit::describe(&ask.filter),
            dependency: ask.filter.dependency.clone(),
            rate: ask.rate,
            ..JobState::default()
        }),
        plan: Plan::of(&ask.filter, parked, ask.rate, ask.limit, &ask.note),
        cancel,
    });
    (job, cancelled)
}

/// Starts a replay of the dead-letter queue that `ask` describes (at most `ask.rate`
/// messages/s, at most `ask.limit` messages) and returns its id at once. As `budgetctl
/// replay`, the run is paced by the live budget, held while the dependency's budget is
/// exhausted or its breaker open, and slowed when its failures rise (the replay library's
/// pace).
///
/// # Errors
/// Too many jobs have not ended ([`JOBS_RUNNING_MAX`]).
pub(crate) fn start(jobs: &Jobs, cx: RunContext, ask: Ask) -> Result<String, String> {
    let kind = if ask.filter.message_id.is_some() {
        Kind::MessageReplay
    } else {
        Kind::Replay
    };
    let (job, cancelled) = new_job(jobs, kind, false, &ask);
    let id = lock(&job.state).id.clone();
    jobs.add(job.clone())?;
    tokio::spawn(async move {
        save(Some(&cx.store), &job.record()).await;
        let started = Instant::now();
        let run = Run {
            cx: &cx,
            job: &job,
            actor: &ask.actor,
            note: &ask.note,
            started,
        };
        let result = run.run(ask.filter, ask.rate, ask.limit, cancelled).await;
        {
            let mut state = lock(&job.state);
            state.done = true;
            state.paused_on = None;
            state.held = None;
            state.held_until_ms = None;
            state.elapsed_secs = started.elapsed().as_secs_f64();
            if let Err(e) = result {
                state.error = Some(redact(&e));
            }
        }
        save(Some(&cx.store), &job.record()).await;
        cx.done.notify_one();
    });
    Ok(id)
}

/// One run of [`start`], in its task.
struct Run<'a> {
    cx: &'a RunContext,
    job: &'a Job,
    actor: &'a str,
    note: &'a str,
    started: Instant,
}

impl Run<'_> {
    async fn run(
        &self,
        filter: ReplayFilter,
        rate: f64,
        limit: Option<u64>,
        mut cancelled: watch::Receiver<bool>,
    ) -> Result<(), String> {
        let _queue = self.cx.queue_work.lock().await;
        lock(&self.job.state).queued = false;
        let config = &self.cx.config;
        let topology = Topology::new(&config.amqp);
        let before = queue_depths(config.amqp.connection(), &topology)
            .await
            .map_err(|e| e.to_string())?;
        let budget = FleetBudget::from_config(&config.budget)
            .await
            .map_err(|e| e.to_string())?;
        let breakers = Breakers::from_config(&config.budget).map_err(|e| e.to_string())?;
        let mut options = ReplayOptions::new(config);
        options.filter = filter;
        options.rate = Some(rate);
        options.limit = limit;
        // The intent first: who, what selection, how many expected; not recorded, nothing moves.
        let run_id = lock(&self.job.state).id.clone();
        let expected = Replayer::new(config.amqp.connection(), topology.clone(), None)
            .with_index(Some(DeadLetterIndex::new(Arc::clone(&self.cx.store))))
            .dry_run(&options)
            .await
            .map_or(Value::Null, |p| {
                json!({
                    "moved": p.would_move,
                    "parked": p.would_park_looping,
                    "failed": p.would_fail,
                    "exact": p.exact,
                })
            });
        let intent = audit::intent_entry(
            self.actor,
            audit::REPLAY,
            &options.filter,
            self.note,
            &run_id,
            &before,
            &expected,
        );
        if let Err(e) = self.cx.audit.record(&self.cx.store, &intent).await {
            let _ = budget.shutdown().await;
            return Err(format!(
                "nothing moved: the replay's intent could not be audited: {e}"
            ));
        }
        // Claimed and counted in the console's store, whose deadline is an operator tool's,
        // not the workers' 50 ms (see `budgetctl replay`).
        let handle = Replayer::new(
            config.amqp.connection(),
            topology.clone(),
            Some(budget.clone()),
        )
        .with_breakers(breakers)
        .with_index(Some(DeadLetterIndex::new(Arc::clone(&self.cx.store))))
        .start(options.clone(), ReplayMode::Run);
        // Follow the run until its progress sender is gone (the run ended); pass on a cancel.
        let mut updates = handle.subscribe();
        let mut asked = false;
        // Where the run stands, in the run journal every 2 s: a console killed before the
        // run's end entry still leaves where it stopped (`budgetctl audit`).
        let journal = RunJournal::new(Arc::clone(&self.cx.store));
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        // A resource alarm blocks the run's connection without changing its progress (its copies
        // wait): looked at on its own, as often as the library reads the connection's events.
        let mut alarm = tokio::time::interval(BLOCK_LOOK);
        alarm.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let mut due = None;
            tokio::select! {
                _ = alarm.tick() => {
                    let blocked = handle.blocked().map(|b| b.reason);
                    let mut s = lock(&self.job.state);
                    if s.blocked != blocked {
                        match &blocked {
                            Some(reason) => tracing::warn!(job = %s.id, reason = %reason, "console: the replay's connection is blocked by RabbitMQ (a resource alarm); nothing moves until it is unblocked"),
                            None => tracing::info!(job = %s.id, "console: the replay's connection is unblocked"),
                        }
                        s.blocked = blocked;
                        if s.blocked.is_some() {
                            s.eta_secs = None;
                        } else {
                            s.follow(&handle.progress());
                        }
                        s.elapsed_secs = self.started.elapsed().as_secs_f64();
                    }
                }
                _ = tick.tick() => {
                    let s = lock(&self.job.state).clone();
                    due = Some(json!({
                        "at_ms": fleet_budget::clock::now_ms(),
                        "total": s.total,
                        "seen": s.seen,
                        "moved": s.moved,
                        "parked": s.parked,
                        "skipped": s.skipped,
                        "failed": s.failed,
                    }));
                }
                changed = updates.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let p = updates.borrow_and_update().clone();
                    let mut s = lock(&self.job.state);
                    s.follow(&p);
                    s.elapsed_secs = self.started.elapsed().as_secs_f64();
                }
                asked_now = cancelled.wait_for(|c| *c), if !asked => {
                    asked = true;
                    if asked_now.is_ok() {
                        handle.cancel();
                    }
                }
            }
            if let Some(at) = due {
                if let Err(e) = journal.progress(&run_id, &at).await {
                    tracing::debug!(error = %e, "run journal not written");
                }
                save(Some(&self.cx.store), &self.job.record()).await;
            }
        }
        lock(&self.job.state).blocked = None;
        let outcome = handle.wait().await;
        let _ = budget.shutdown().await;
        let r = match outcome {
            Ok(ReplayOutcome::Run(r)) => r,
            Ok(ReplayOutcome::DryRun(_)) => {
                return Err("the replay library returned a dry run's outcome for a run".to_owned());
            }
            Err(e) => {
                // Where it stopped, in the trail: the counts it had reached and the error.
                let after = queue_depths(config.amqp.connection(), &topology)
                    .await
                    .unwrap_or_else(|_| before.clone());
                let s = lock(&self.job.state).clone();
                let reached = fleet_budget_amqp::ReplayReport {
                    total: s.total,
                    seen: s.seen,
                    moved: s.moved,
                    parked: s.parked,
                    skipped: s.skipped,
                    failed: s.failed,
                    ..fleet_budget_amqp::ReplayReport::default()
                };
                let entry = audit::ended(
                    audit::replay_entry(
                        self.actor,
                        audit::REPLAY,
                        &options.filter,
                        self.note,
                        &before,
                        &after,
                        &reached,
                    ),
                    &run_id,
                    &format!(
                        "failed: {}",
                        fleet_budget::redact::redact_text(&e.to_string())
                    ),
                );
                let _ = self.cx.audit.record(&self.cx.store, &entry).await;
                return Err(e.to_string());
            }
        };
        {
            let mut s = lock(&self.job.state);
            s.total = r.total;
            s.seen = r.seen;
            s.moved = r.moved;
            s.parked = r.parked;
            s.skipped = r.skipped;
            s.failed = r.failed;
            s.slowdowns = r.slowdowns;
            s.cancelled = r.cancelled;
        }
        let after = queue_depths(config.amqp.connection(), &topology)
            .await
            .map_err(|e| e.to_string())?;
        let mut entry = audit::ended(
            audit::replay_entry(
                self.actor,
                audit::REPLAY,
                &options.filter,
                self.note,
                &before,
                &after,
                &r,
            ),
            &run_id,
            if r.cancelled {
                "cancelled"
            } else {
                "completed"
            },
        );
        // The closed loop's part in the run, and who stopped it, beside its counts.
        let cancelled_by = lock(&self.job.state).cancel_requested_by.clone();
        if let Some(Value::Object(after)) = &mut entry.after {
            after.insert(
                "held_breaker_secs".to_owned(),
                json!(r.held_breaker.as_secs_f64()),
            );
            after.insert(
                "held_frozen_secs".to_owned(),
                json!(r.held_frozen.as_secs_f64()),
            );
            after.insert("slowdowns".to_owned(), json!(r.slowdowns));
            after.insert(
                "lowest_rate".to_owned(),
                json!(r.lowest_rate.map(Rate::per_sec)),
            );
            after.insert("cancelled".to_owned(), json!(r.cancelled));
            if r.cancelled {
                after.insert("cancelled_by".to_owned(), json!(cancelled_by));
            }
        }
        self.cx
            .audit
            .record(&self.cx.store, &entry)
            .await
            .map_err(|e| format!("the replay ran, but its audit entry was not recorded: {e}"))?;
        Ok(())
    }
}

/// Records in the audit trail that `actor` asked run `job` to stop (action `replay_cancel`):
/// who stopped a replay is on the trail even when the run's own entry comes later.
///
/// # Errors
/// Redis failed.
pub(crate) async fn audit_cancel(
    cx: &RunContext,
    job: &JobState,
    actor: &str,
) -> Result<(), String> {
    let entry = AuditEntry::new(
        actor,
        CANCEL,
        job.dependency.as_deref(),
        &format!(
            "cancelled the {} {} ({}) started by {}",
            job.kind.words(),
            job.id,
            job.selected,
            job.actor
        ),
    );
    cx.audit
        .record(&cx.store, &entry)
        .await
        .map(|_| ())
        .map_err(|e| format!("the cancel's audit entry was not recorded (nothing cancelled): {e}"))
}

/// The audit action of a cancel asked on the replay page.
pub(crate) const CANCEL: &str = "replay_cancel";

/// Starts a purge of the messages of the dead-letter (or parked) queue that `ask.filter`
/// selects (at most `ask.limit`) as a job of its own, and returns its id at once: its page
/// follows it (read, removed), a Cancel stops it at its next message, and a request's deadline
/// never cuts it off (a read dropped half-way would leave copies beside their originals).
/// Recorded as `budgetctl parked purge` records it (action `dlq_purge` or `parked_purge`), the
/// intent before the first message goes.
///
/// # Errors
/// Too many jobs have not ended ([`JOBS_RUNNING_MAX`]).
pub(crate) fn start_purge(
    jobs: &Jobs,
    cx: RunContext,
    parked: bool,
    ask: Ask,
) -> Result<String, String> {
    let kind = if ask.filter.message_id.is_some() {
        Kind::MessagePurge
    } else {
        Kind::Purge
    };
    let (job, cancelled) = new_job(jobs, kind, parked, &ask);
    let id = lock(&job.state).id.clone();
    jobs.add(job.clone())?;
    tokio::spawn(async move {
        save(Some(&cx.store), &job.record()).await;
        let started = Instant::now();
        let result = purge(&cx, &job, parked, &ask, cancelled).await;
        {
            let mut state = lock(&job.state);
            state.done = true;
            state.queued = false;
            state.elapsed_secs = started.elapsed().as_secs_f64();
            if let Err(e) = result {
                state.error = Some(redact(&e));
            }
        }
        save(Some(&cx.store), &job.record()).await;
        cx.done.notify_one();
    });
    Ok(id)
}

/// Removes the messages of the dead-letter (or parked) queue that `filter` selects, as the
/// library's `purge_queue` does (the messages present at the start that `filter` selects are
/// acked without a copy, every other one read is put back), following its progress into `job`;
/// with a `limit` it stops reading once that many are removed. Records it with `actor`.
///
/// # Errors
/// The broker failed; or the audit record did (the purge happened: the error says so).
async fn purge(
    cx: &RunContext,
    job: &Job,
    parked: bool,
    ask: &Ask,
    cancelled: watch::Receiver<bool>,
) -> Result<(), String> {
    let (filter, limit, actor, note) = (
        &ask.filter,
        ask.limit,
        ask.actor.as_str(),
        ask.note.as_str(),
    );
    let _queue = cx.queue_work.lock().await;
    lock(&job.state).queued = false;
    let config = &cx.config;
    let topology = Topology::new(&config.amqp);
    let queue = if parked {
        topology.parked_queue.clone()
    } else {
        topology.dead_queue.clone()
    };
    let before = queue_depths(config.amqp.connection(), &topology)
        .await
        .map_err(|e| e.to_string())?;
    let index = DeadLetterIndex::new(Arc::clone(&cx.store));
    let counted = if parked {
        Counted::Parked
    } else {
        Counted::DeadLetters
    };
    let action = if parked {
        audit::PARKED_PURGE
    } else {
        DLQ_PURGE
    };
    // The intent first; not recorded, nothing is deleted.
    let run_id = lock(&job.state).id.clone();
    let source = Replayer::of(
        SourceQueue::parked_if(parked),
        config.amqp.connection(),
        topology.clone(),
        None,
    );
    let expected = source.with_index(Some(index.clone())).counts().await.ok();
    let expected_count = expected.as_ref().map(|c| {
        let n = c.matching(|row| filter.selects_row(row) != Some(false));
        limit.map_or(n, |l| n.min(l))
    });
    {
        let mut s = lock(&job.state);
        s.expected = expected_count;
        s.total = before_depth(&before, parked);
    }
    let expected = expected.as_ref().map_or(Value::Null, |c| {
        json!({
            "purged": expected_count,
            "exact": c.exact() && filter.message_id.is_none() && filter.error_contains.is_none(),
        })
    });
    let intent = audit::intent_entry(actor, action, filter, note, &run_id, &before, &expected);
    cx.audit
        .record(&cx.store, &intent)
        .await
        .map_err(|e| format!("nothing deleted: the purge's intent could not be audited: {e}"))?;
    // The read, in a task of its own; its counters followed here every 250 ms.
    let seen = Arc::new(AtomicU64::new(0));
    let removed = Arc::new(AtomicU64::new(0));
    let read = {
        let (seen, removed, filter) = (seen.clone(), removed.clone(), filter.clone());
        let class = filter.error_class.clone();
        let unclassed = ReplayFilter {
            error_class: None,
            ..filter.clone()
        };
        let (to, queue) = (config.amqp.connection(), queue.clone());
        let cancelled = cancelled.clone();
        tokio::spawn(async move {
            let mut chosen = 0u64;
            let mut changes = Changes::default();
            let inspection = inspect_queue_with(to, &queue, &InspectOptions::default(), |d| {
                seen.fetch_add(1, Ordering::Relaxed);
                if *cancelled.borrow() || limit.is_some_and(|l| chosen >= l) {
                    return Look::Stop;
                }
                // The id checked here too: the library's selection lets any unreadable message
                // through a filter with `malformed`, whatever its id.
                let id_matches = filter
                    .message_id
                    .as_deref()
                    .is_none_or(|id| headers::message_id(&d.properties) == Some(id));
                let m = QueuedMessage::read(d);
                // The error class as given, or as the index keeps it (cut at 256 bytes): a row's
                // Purge selects the row's messages even when their class is longer.
                let class_matches = class.as_deref().is_none_or(|c| {
                    let have = m.error_class.as_deref().unwrap_or("");
                    have == c || crate::dead_letters::row_text(have) == c
                });
                if id_matches && class_matches && m.selected_by(&unclassed) {
                    chosen += 1;
                    removed.fetch_add(1, Ordering::Relaxed);
                    changes.add(&queue, counted, &headers::table(&d.properties), -1);
                    Look::Remove
                } else {
                    Look::Next
                }
            })
            .await;
            (inspection, chosen, changes)
        })
    };
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut ticks = 0u64;
    let mut read = read;
    let (inspection, chosen, mut changes) = loop {
        tokio::select! {
            _ = tick.tick() => {
                {
                    let mut s = lock(&job.state);
                    s.seen = seen.load(Ordering::Relaxed);
                    s.removed = removed.load(Ordering::Relaxed);
                }
                // Where it stands, in its record every 2 s (what a restart shows).
                ticks += 1;
                if ticks.is_multiple_of(8) {
                    save(Some(&cx.store), &job.record()).await;
                }
            }
            done = &mut read => break done.map_err(|e| format!("the purge's read ended without a report: {e}"))?,
        }
    };
    let inspection = inspection.map_err(|e| e.to_string())?;
    // The index is changed only when every chosen message was removed (as the library's purge).
    if inspection.removed == chosen {
        changes.apply(Some(&index)).await;
    } else {
        tracing::warn!(
            removed = inspection.removed,
            selected = chosen,
            "not every selected message was removed; the dead-letter index is left as it was"
        );
    }
    let report = PurgeReport {
        total: inspection.total,
        seen: inspection.seen,
        removed: inspection.removed,
        kept: inspection.put_back + inspection.requeued,
        index_unrecorded: changes.unrecorded,
    };
    let was_cancelled = *cancelled.borrow();
    {
        let mut s = lock(&job.state);
        s.total = report.total;
        s.seen = report.seen;
        s.removed = report.removed;
        s.skipped = report.kept;
        s.cancelled = was_cancelled;
    }
    let after = queue_depths(config.amqp.connection(), &topology)
        .await
        .map_err(|e| e.to_string())?;
    let mut entry = audit::ended(
        audit::purge_entry(actor, filter, note, &before, &after, &report),
        &run_id,
        if was_cancelled {
            "cancelled"
        } else {
            "completed"
        },
    );
    if !parked {
        DLQ_PURGE.clone_into(&mut entry.action);
    }
    if was_cancelled && let Some(Value::Object(after)) = &mut entry.after {
        let by = lock(&job.state).cancel_requested_by.clone();
        after.insert("cancelled".to_owned(), json!(true));
        after.insert("cancelled_by".to_owned(), json!(by));
    }
    cx.audit
        .record(&cx.store, &entry)
        .await
        .map_err(|e| format!("the purge happened, but its audit entry was not recorded: {e}"))?;
    Ok(())
}

/// Whether `s` is an id of this console's making: 32 lower-case hex digits.
fn is_id(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn redact(s: &str) -> String {
    fleet_budget::redact::redact_text(s)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Writes `record` into the job records (a failure is logged).
async fn save(store: Option<&RedisStore>, record: &Record) {
    let Some(store) = store else { return };
    let Ok(json) = serde_json::to_string(record) else {
        return;
    };
    let mut cmd = redis::cmd("HSET");
    cmd.arg(jobs_key(store.prefix()))
        .arg(&record.state.id)
        .arg(json);
    if let Err(e) = store.query::<()>(&cmd).await {
        tracing::warn!(error = %redact(&e.to_string()), "console: a job's record was not written");
    }
}

fn before_depth(d: &fleet_budget_amqp::QueueDepths, parked: bool) -> u64 {
    u64::from(if parked { d.parked } else { d.dead })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, done: bool) -> Arc<Job> {
        Arc::new(Job {
            state: Mutex::new(JobState {
                id: id.to_owned(),
                done,
                ..JobState::default()
            }),
            plan: Plan::default(),
            cancel: watch::channel(false).0,
        })
    }

    #[test]
    fn a_job_that_has_not_ended_is_never_dropped_from_the_list() {
        let jobs = Jobs::default();
        jobs.add(job("held", false)).unwrap();
        for i in 0..(JOBS_KEPT * 2) {
            jobs.add(job(&format!("ended-{i}"), true)).unwrap();
        }
        assert!(jobs.get("held").is_some(), "the held replay keeps its page");
        assert_eq!(jobs.all().len(), JOBS_KEPT + 1);
        assert!(jobs.get("ended-0").is_none(), "the oldest ended ones go");
        assert_eq!(jobs.cancel("held", "ann").0, Cancel::Asked);
        for i in 1..JOBS_RUNNING_MAX {
            jobs.add(job(&format!("running-{i}"), false)).unwrap();
        }
        assert!(
            jobs.add(job("one-too-many", false)).is_err(),
            "at most {JOBS_RUNNING_MAX} wait or run"
        );
        assert!(jobs.get("held").is_some());
    }
}
