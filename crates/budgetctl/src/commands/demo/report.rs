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
    /// Deprecated: `executions` under its name before 0.2.0, printed until 0.3.0.
    upstream_calls: u64,
    /// Deprecated: `peak_executions_per_sec` under its name before 0.2.0, printed until 0.3.0.
    peak_upstream_calls_per_sec: u64,
    /// Deprecated: `replay_executions` under its name before 0.2.0, printed until 0.3.0.
    replay_upstream_calls: u64,
    /// Deprecated: `executions_per_second` under its name before 0.2.0, printed until 0.3.0.
    upstream_calls_per_second: Vec<u64>,
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
    let mut rows = Rows::new(["without budget", "with budget"], a, b);
    rows.count("jobs submitted", |r| r.jobs_submitted);
    rows.count("upstream calls (executions)", |r| r.executions);
    rows.text("amplification (calls/job)", |r| {
        format!("{:.2}x", r.amplification)
    });
    rows.count("peak upstream calls/s", |r| r.peak_executions_per_sec);
    rows.count("successes (before replay)", |r| r.successes);
    rows.count("retries granted", |r| r.retries_granted);
    rows.count("retries denied", |r| r.retries_denied);
    rows.count("dead-lettered", |r| r.dead_lettered_total);
    rows.dead_letter_reasons(|r| &r.dead_lettered, |_| true);
    rows.count("after recovery: replayed", |r| r.replayed);
    rows.count("  parked (came back again)", |r| r.parked);
    print_side_by_side(
        &rows.into_rows(),
        15,
        [
            (a.label.as_str(), &a.accounting),
            (b.label.as_str(), &b.accounting),
        ],
    );
}

/// Executions per job submitted (0 without jobs).
#[allow(clippy::cast_precision_loss)]
pub(super) fn amplification(executions: u64, jobs: u64) -> f64 {
    if jobs == 0 {
        0.0
    } else {
        executions as f64 / jobs as f64
    }
}

/// The table of two runs side by side, one row per figure: its name, then each run's value.
pub(super) struct Rows<'a, R> {
    runs: [&'a R; 2],
    rows: Vec<Vec<String>>,
}

impl<'a, R> Rows<'a, R> {
    /// The table of `a` and `b`, headed by their `labels`.
    pub(super) fn new(labels: [&str; 2], a: &'a R, b: &'a R) -> Self {
        let [la, lb] = labels.map(str::to_owned);
        Self {
            runs: [a, b],
            rows: vec![vec![String::new(), la, lb]],
        }
    }

    /// A row of `name`, each run's value as `value` writes it.
    pub(super) fn text(&mut self, name: &str, value: impl Fn(&R) -> String) {
        let [a, b] = self.runs;
        self.rows.push(vec![name.to_owned(), value(a), value(b)]);
    }

    /// A row of `name`, each run's count (with thousands separators).
    pub(super) fn count(&mut self, name: &str, count: impl Fn(&R) -> u64) {
        self.text(name, |r| thousands(count(r)));
    }

    /// A row per dead-letter reason that `shown` selects (given the runs' counts by reason,
    /// `dead_lettered`), indented under the total.
    pub(super) fn dead_letter_reasons(
        &mut self,
        dead_lettered: impl Fn(&R) -> &BTreeMap<String, u64>,
        shown: impl Fn(&str) -> bool,
    ) {
        for reason in DeadLetterReason::ALL.map(DeadLetterReason::as_str) {
            if shown(reason) {
                self.count(&format!("  {reason}"), |r| {
                    dead_lettered(r).get(reason).copied().unwrap_or(0)
                });
            }
        }
    }

    pub(super) fn into_rows(self) -> Vec<Vec<String>> {
        self.rows
    }
}

/// Prints the two runs' table, then every job of each accounted for (labels padded to
/// `label_width`).
pub(super) fn print_side_by_side(
    rows: &[Vec<String>],
    label_width: usize,
    runs: [(&str, &Accounting); 2],
) {
    outln!();
    out!("{}", table(rows));
    outln!();
    outln!("every job accounted for:");
    for (label, acc) in runs {
        let mut line = format!(
            "  {label:<label_width$} succeeded {} + dead-lettered then replayed {} + parked {} = {} submitted; lost {}",
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
