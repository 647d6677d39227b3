//! The model of an incident report (`budgetctl incident report`, the console's incident page):
//! one dependency over a range of time, from what the fleet recorded in Redis — the audit trail
//! (overrides with who and why, replays and purges with their counts), the dead-letter index
//! (what still waits, by reason and error class) and the dead-letter ledger (what the workers
//! dead-lettered, hour by hour: [`crate::dead_letters::ledger_queue`]) — and, when the caller has
//! a Prometheus, the per-minute counters of the workers.
//!
//! The accounting is the report's point: for each reason × error class, what the workers
//! dead-lettered in the range equals what the replays moved back to work, what was purged, and
//! what still waits in the dead-letter and parked queues; the difference is printed, and is 0
//! when every dead letter is accounted for. A message a replay parks moves from one queue to the
//! other and is counted once, where it is now.
//!
//! Nothing here renders text: [`Report::summary`] and [`Report::sections`] give the text of each
//! line and table cell (unescaped), and [`Report::charts`] the charts (`charts.rs`), for the
//! Markdown, the HTML page and the console to place each its way, so that all three say and
//! draw the same. The per-minute figures are read from Prometheus by
//! [`Report::read_prometheus`] (`prometheus.rs`), for every caller.
//!
//! How the files fit: `mod.rs` the report and its per-minute figures; `redis.rs` what is read
//! from Redis (the audit trail's replays and overrides, the dead-letter index and ledger);
//! `prometheus.rs` the per-minute figures; `accounting.rs` where every dead letter went;
//! `text.rs` the timeline and the words of each section; `charts.rs` the charts.

mod accounting;
mod charts;
mod prometheus;
mod redis;
mod text;

use std::collections::BTreeMap;

use fleet_budget::control::AuditEntry;
use serde::Serialize;

pub use accounting::{Accounting, GroupAccount};
pub use charts::BudgetTurn;
pub use fleet_budget_sim::chart::rfc3339_ms;
pub use prometheus::default_step_ms;
pub use redis::{BREAKDOWN_NOT_RECORDED, ReplayRow, Waiting};

/// One step of the per-minute figures (the workers' counters summed over the fleet).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Minute {
    /// The step's start (Unix ms).
    pub at_ms: u64,
    /// First attempts.
    pub first_attempts: f64,
    /// Executions.
    pub executions: f64,
    /// Successes.
    pub successes: f64,
    /// Retries granted.
    pub retries_granted: f64,
    /// Retries denied.
    pub retries_denied: f64,
    /// Dead-letter decisions by reason.
    pub dead_letters: BTreeMap<String, f64>,
    /// Breaker transitions by the state entered.
    pub breaker: BTreeMap<String, f64>,
}

impl Minute {
    /// Executions over first attempts; `None` without first attempts.
    #[must_use]
    pub fn amplification(&self) -> Option<f64> {
        (self.first_attempts > 0.0).then(|| self.executions / self.first_attempts)
    }

    /// Dead-letter decisions of the step.
    #[must_use]
    pub fn dead_lettered(&self) -> f64 {
        self.dead_letters.values().sum()
    }
}

/// An incident found in the per-minute figures (a stretch with the retry fraction above the
/// ratio or the breaker open).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Span {
    /// Its start (Unix ms).
    pub start_ms: u64,
    /// Its end (Unix ms).
    pub end_ms: u64,
    /// Its length.
    pub duration_ms: u64,
}

/// An event of the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// When (Unix ms).
    pub at_ms: u64,
    /// What happened.
    pub what: String,
}

/// The report, as the renderers read it.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// The dependency.
    pub dependency: String,
    /// The range's start (Unix ms).
    pub since_ms: u64,
    /// The range's end (Unix ms).
    pub until_ms: u64,
    /// The step of the per-minute figures.
    pub step_ms: u64,
    /// The policy in force: its ratio.
    pub ratio: f64,
    /// The policy in force: its floor.
    pub min_allowance: u64,
    /// What each source gave, or why it could not.
    pub sources: Vec<String>,
    /// The per-minute figures (empty without them).
    pub minutes: Vec<Minute>,
    /// Incidents found in them.
    pub incidents: Vec<Span>,
    /// The timeline (after [`Report::finish`]).
    pub timeline: Vec<Event>,
    /// Overrides of this dependency (freeze, set, shadow, ...) with who and why.
    pub overrides: Vec<AuditEntry>,
    /// Replays and purges that concern it.
    pub replays: Vec<ReplayRow>,
    /// What waits now, dead-lettered in the range.
    pub waiting: Vec<Waiting>,
    /// What the ledger counts, dead-lettered in the range: (queue, reason, error class) → n.
    #[serde(skip)]
    pub ledger: BTreeMap<(&'static str, String, String), u64>,
    /// Where the dead letters went (after [`Report::finish`]).
    pub accounting: Accounting,
}

/// Whether a row dead-lettered in `minute` (Unix ms / 60,000) belongs to `since..=until`: those
/// of the range, its first minute included.
fn in_range(minute: u64, since_ms: u64, until_ms: u64) -> bool {
    let at_ms = minute.saturating_mul(60_000);
    at_ms + 60_000 > since_ms && at_ms <= until_ms
}

impl Report {
    /// An empty report of `dependency` over `since_ms..=until_ms`.
    #[must_use]
    pub fn new(dependency: &str, since_ms: u64, until_ms: u64) -> Self {
        Self {
            dependency: dependency.to_owned(),
            since_ms,
            until_ms,
            step_ms: 60_000,
            ..Self::default()
        }
    }

    /// The timeline and the accounting, from what was read.
    pub fn finish(&mut self) {
        self.timeline();
        self.account();
    }
}

/// `x` rounded to a whole count, at least 0.
fn whole(x: f64) -> u64 {
    if x.is_finite() && x > 0.0 {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = x.round() as u64;
        n
    } else {
        0
    }
}
