//! What the drill reports: each run's figures (the JSON), and the comparison for people: the
//! two runs side by side, then every job accounted for.

use std::collections::BTreeMap;
use std::time::Instant;

use fleet_budget::{DeadLetterReason, FleetBudget};
use fleet_budget_sim::accounting::{Accounting, JobOutcomes};
use fleet_budget_sim::upstream::{Schedule, Upstream};
use serde::Serialize;

use super::mode::Mode;
use super::{
    DEPENDENCY, Drill, MAX_ATTEMPTS, MIN_ALLOWANCE, RATIO, RunSettings, WINDOW, dead_letters,
};
use crate::output::{table, thousands};

/// What a run measured by the end of its first pass, before the replay.
#[derive(Debug)]
pub(super) struct FirstPass {
    calls: u64,
    seconds: f64,
    per_second: Vec<u64>,
    successes: u64,
    retries_granted: u64,
    retries_denied: u64,
    dead_lettered: BTreeMap<String, u64>,
}

impl FirstPass {
    pub(super) fn measure(
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
pub(super) struct ReplayTotals {
    pub(super) moved: u64,
    pub(super) parked: u64,
}

/// The result of one run.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct RunReport {
    label: String,
    budget: bool,
    jobs_submitted: u64,
    /// Calls the dependency received in the first pass: every execution of a job (first
    /// attempts and retries), the word `status`, `simulate` and the metrics use.
    executions: u64,
    /// Executions per job submitted.
    amplification: f64,
    peak_executions_per_sec: u64,
    successes: u64,
    retries_granted: u64,
    retries_denied: u64,
    dead_lettered: BTreeMap<String, u64>,
    dead_lettered_total: u64,
    replayed: u64,
    /// Executions during the replay after recovery.
    replay_executions: u64,
    parked: u64,
    accounting: Accounting,
    /// Executions (calls to the dependency) in each second of the run, before the replay.
    executions_per_second: Vec<u64>,
    seconds: f64,
}

impl RunReport {
    pub(super) fn new(
        s: &RunSettings,
        first: FirstPass,
        upstream: &Upstream,
        replay: &ReplayTotals,
        accounting: Accounting,
    ) -> Self {
        let jobs = s.jobs();
        Self {
            label: s.label.to_owned(),
            budget: s.budget,
            jobs_submitted: jobs,
            executions: first.calls,
            #[allow(clippy::cast_precision_loss)]
            amplification: if jobs == 0 {
                0.0
            } else {
                first.calls as f64 / jobs as f64
            },
            peak_executions_per_sec: first.per_second.iter().copied().max().unwrap_or(0),
            successes: first.successes,
            retries_granted: first.retries_granted,
            retries_denied: first.retries_denied,
            dead_lettered_total: first.dead_lettered.values().sum(),
            dead_lettered: first.dead_lettered,
            replayed: replay.moved,
            replay_executions: upstream.calls().saturating_sub(first.calls),
            parked: replay.parked,
            accounting,
            executions_per_second: first.per_second,
            seconds: first.seconds,
        }
    }
}

/// The whole drill's output.
#[derive(Debug, Serialize)]
pub(super) struct DemoReport {
    mode: Mode,
    workers: u32,
    jobs_per_sec: u32,
    capacity_per_sec: u64,
    degraded_capacity_per_sec: u64,
    phase_secs: f64,
    budget_ratio: f64,
    budget_window_secs: f64,
    budget_min_allowance: u64,
    max_attempts: u32,
    runs: Vec<RunReport>,
}

impl DemoReport {
    pub(super) fn new(mode: Mode, args: &Drill, schedule: &Schedule, runs: Vec<RunReport>) -> Self {
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

/// Prints the comparison of the two runs on stdout.
pub(super) fn print_comparison(r: &DemoReport) {
    let [a, b] = [r.runs.first(), r.runs.get(1)];
    let (Some(a), Some(b)) = (a, b) else { return };
    outln!();
    outln!(
        "Incident drill: {} workers, {} jobs/s; `{DEPENDENCY}` capacity {}/s -> {}/s for {:.0}s -> {}/s",
        r.workers,
        r.jobs_per_sec,
        r.capacity_per_sec,
        r.degraded_capacity_per_sec,
        r.phase_secs,
        r.capacity_per_sec
    );
    outln!("budget store: {}", r.mode.store_line());
    outln!("queue:        {}", r.mode.queue_line());
    outln!(
        "budget: {:.0}% of successes per {}s sliding window (at least {}); up to {} attempts per job",
        r.budget_ratio * 100.0,
        r.budget_window_secs,
        r.budget_min_allowance,
        r.max_attempts
    );
    outln!();
    out!("{}", table(&comparison_rows(a, b)));
    outln!();
    outln!("every job accounted for:");
    for run in [a, b] {
        let acc = &run.accounting;
        let mut line = format!(
            "  {:<15} succeeded {} + dead-lettered then replayed {} + parked {} = {} submitted; lost {}",
            run.label,
            thousands(acc.succeeded),
            thousands(acc.dead_lettered_then_replayed),
            thousands(acc.parked),
            thousands(acc.submitted),
            acc.lost
        );
        if acc.still_dead_lettered > 0 {
            line.push_str(&format!(
                " (still dead-lettered: {})",
                acc.still_dead_lettered
            ));
        }
        outln!("{line}");
    }
}

/// The table of the two runs: one row per figure.
fn comparison_rows(a: &RunReport, b: &RunReport) -> Vec<Vec<String>> {
    let row = |name: &str, f: &dyn Fn(&RunReport) -> String| vec![name.to_owned(), f(a), f(b)];
    let n = |f: fn(&RunReport) -> u64| move |run: &RunReport| thousands(f(run));
    let mut rows = vec![
        vec![
            String::new(),
            "without budget".to_owned(),
            "with budget".to_owned(),
        ],
        row("jobs submitted", &n(|r| r.jobs_submitted)),
        row("upstream calls (executions)", &n(|r| r.executions)),
        row("amplification (calls/job)", &|r| {
            format!("{:.2}x", r.amplification)
        }),
        row("peak upstream calls/s", &n(|r| r.peak_executions_per_sec)),
        row("successes (before replay)", &n(|r| r.successes)),
        row("retries granted", &n(|r| r.retries_granted)),
        row("retries denied", &n(|r| r.retries_denied)),
        row("dead-lettered", &n(|r| r.dead_lettered_total)),
    ];
    for reason in DeadLetterReason::ALL.map(DeadLetterReason::as_str) {
        rows.push(row(&format!("  {reason}"), &|r| {
            thousands(r.dead_lettered.get(reason).copied().unwrap_or(0))
        }));
    }
    rows.push(row("after recovery: replayed", &n(|r| r.replayed)));
    rows.push(row("  parked (came back again)", &n(|r| r.parked)));
    rows
}
