//! The drill's comparison for people: the two runs side by side, then every job accounted for.

use fleet_budget::DeadLetterReason;

use super::{DEPENDENCY, DemoReport, RunReport};
use crate::output::{table, thousands};

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
        row("upstream calls", &n(|r| r.upstream_calls)),
        row("amplification (calls/job)", &|r| {
            format!("{:.2}x", r.amplification)
        }),
        row(
            "peak upstream calls/s",
            &n(|r| r.peak_upstream_calls_per_sec),
        ),
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
