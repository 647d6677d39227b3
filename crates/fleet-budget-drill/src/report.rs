//! What the drill reports: each run's figures (the JSON), and the comparison for people: the
//! two runs side by side, then every job accounted for.

use std::collections::BTreeMap;
use std::time::Instant;

use fleet_budget::FleetBudget;
use fleet_budget_sim::accounting::{Accounting, JobOutcomes};
use fleet_budget_sim::upstream::{Schedule, Upstream};
use serde::Serialize;

use crate::job::dead_letters;
use crate::mode::Mode;
use crate::trail::RunTrail;
use crate::{DEPENDENCY, Drill, MAX_ATTEMPTS, MIN_ALLOWANCE, RATIO, RunSettings, WINDOW};

/// What a run measured by the end of its first pass, before the replay.
#[derive(Debug)]
pub(crate) struct FirstPass {
    calls: u64,
    seconds: f64,
    per_second: Vec<u64>,
    successes: u64,
    retries_granted: u64,
    retries_denied: u64,
    dead_lettered: BTreeMap<String, u64>,
}

impl FirstPass {
    pub(crate) fn measure(
        upstream: &Upstream,
        started: Instant,
        budget: &FleetBudget,
        outcomes: &JobOutcomes,
    ) -> Self {
        let metrics = budget.metrics();
        Self {
            calls: upstream.calls(),
            seconds: started.elapsed().as_secs_f64(),
            per_second: upstream.per_second(),
            successes: outcomes.successes(),
            retries_granted: metrics.counter("retries_granted", DEPENDENCY),
            retries_denied: metrics.counter("retries_denied", DEPENDENCY),
            dead_lettered: dead_letters(metrics),
        }
    }
}

/// What the replay after recovery did.
#[derive(Debug, Default)]
pub(crate) struct ReplayTotals {
    pub(crate) moved: u64,
    pub(crate) parked: u64,
}

/// The result of one run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunReport {
    /// The run's name.
    pub label: String,
    /// Whether the run had the drill's budget.
    pub budget: bool,
    /// Jobs submitted.
    pub jobs_submitted: u64,
    /// Calls the dependency received in the first pass: every execution of a job (first
    /// attempts and retries), the word `status`, `simulate` and the metrics use.
    pub executions: u64,
    /// Executions per job submitted.
    pub amplification: f64,
    /// The most executions in one second.
    pub peak_executions_per_sec: u64,
    /// Jobs that succeeded in the first pass.
    pub successes: u64,
    /// Retries the budget granted.
    pub retries_granted: u64,
    /// Retries the budget denied.
    pub retries_denied: u64,
    /// Dead-letter decisions by reason (the reasons seen).
    pub dead_lettered: BTreeMap<String, u64>,
    /// Dead-letter decisions.
    pub dead_lettered_total: u64,
    /// Dead letters the replay after recovery moved back.
    pub replayed: u64,
    /// Executions during the replay after recovery.
    pub replay_executions: u64,
    /// Jobs the replay parked (they came back again).
    pub parked: u64,
    /// Every job accounted for.
    pub accounting: Accounting,
    /// Executions (calls to the dependency) in each second of the run, before the replay.
    pub executions_per_second: Vec<u64>,
    /// Length of the first pass.
    pub seconds: f64,
    /// Deprecated: `executions` under its name before 0.2.0, printed until 0.3.0.
    pub upstream_calls: u64,
    /// Deprecated: `peak_executions_per_sec` under its name before 0.2.0, printed until 0.3.0.
    pub peak_upstream_calls_per_sec: u64,
    /// Deprecated: `replay_executions` under its name before 0.2.0, printed until 0.3.0.
    pub replay_upstream_calls: u64,
    /// Deprecated: `executions_per_second` under its name before 0.2.0, printed until 0.3.0.
    pub upstream_calls_per_second: Vec<u64>,
    /// Where the run left its trail for `budgetctl incident report` (on Redis and RabbitMQ;
    /// `null` otherwise).
    pub trail: Option<RunTrail>,
}

impl RunReport {
    pub(crate) fn new(
        s: &RunSettings,
        first: FirstPass,
        upstream: &Upstream,
        replay: &ReplayTotals,
        accounting: Accounting,
    ) -> Self {
        let jobs = s.jobs();
        let peak = first.per_second.iter().copied().max().unwrap_or(0);
        let replay_executions = upstream.calls().saturating_sub(first.calls);
        Self {
            label: s.label.to_owned(),
            budget: s.budget,
            jobs_submitted: jobs,
            executions: first.calls,
            amplification: amplification(first.calls, jobs),
            peak_executions_per_sec: peak,
            successes: first.successes,
            retries_granted: first.retries_granted,
            retries_denied: first.retries_denied,
            dead_lettered_total: first.dead_lettered.values().sum(),
            dead_lettered: first.dead_lettered,
            replayed: replay.moved,
            replay_executions,
            parked: replay.parked,
            accounting,
            upstream_calls_per_second: first.per_second.clone(),
            executions_per_second: first.per_second,
            seconds: first.seconds,
            upstream_calls: first.calls,
            peak_upstream_calls_per_sec: peak,
            replay_upstream_calls: replay_executions,
            trail: None,
        }
    }

    /// With the trail the run left.
    #[must_use]
    pub(crate) fn with_trail(mut self, trail: Option<RunTrail>) -> Self {
        self.trail = trail;
        self
    }
}

/// The whole drill's output.
#[derive(Debug, Serialize)]
pub struct DemoReport {
    /// Where the budgets and the jobs were kept.
    pub mode: Mode,
    /// Concurrent workers.
    pub workers: u32,
    /// Jobs submitted per second.
    pub jobs_per_sec: u32,
    /// The dependency's healthy capacity.
    pub capacity_per_sec: u64,
    /// Its capacity while degraded.
    pub degraded_capacity_per_sec: u64,
    /// Length of each phase.
    pub phase_secs: f64,
    /// The budget's ratio.
    pub budget_ratio: f64,
    /// The budget's window.
    pub budget_window_secs: f64,
    /// The budget's floor per window.
    pub budget_min_allowance: u64,
    /// Executions per job at most.
    pub max_attempts: u32,
    /// The run without the budget, then the run with it.
    pub runs: Vec<RunReport>,
}

impl DemoReport {
    pub(crate) fn new(mode: Mode, args: &Drill, schedule: &Schedule, runs: Vec<RunReport>) -> Self {
        Self {
            mode,
            workers: args.workers,
            jobs_per_sec: args.rate,
            capacity_per_sec: schedule.capacity,
            degraded_capacity_per_sec: schedule.degraded_capacity,
            phase_secs: args.phase_secs,
            budget_ratio: RATIO,
            budget_window_secs: WINDOW.as_secs_f64(),
            budget_min_allowance: MIN_ALLOWANCE,
            max_attempts: MAX_ATTEMPTS,
            runs,
        }
    }
}

/// Executions per job submitted (0 without jobs).
#[allow(clippy::cast_precision_loss)]
pub(crate) fn amplification(executions: u64, jobs: u64) -> f64 {
    if jobs == 0 {
        0.0
    } else {
        executions as f64 / jobs as f64
    }
}
