//! The drill's and the scenarios' comparisons for people: the two runs side by side, then
//! every job accounted for; and the lines that name the services and the trouble.

use std::collections::BTreeMap;

use fleet_budget::DeadLetterReason;
use fleet_budget_drill::scenario::{RunFigures, ScenarioReport, TroubleKind};
use fleet_budget_drill::{DEPENDENCY, DemoReport, Mode, WINDOW};
use fleet_budget_sim::accounting::Accounting;

use crate::output::{table, thousands};

/// The budget store, for people.
pub(super) fn store_line(mode: &Mode) -> String {
    match &mode.redis {
        Some(url) => format!("Redis at {url} (window {}s)", WINDOW.as_secs()),
        None => "IN-PROCESS (fleet-budget's local store; no Redis)".to_owned(),
    }
}

/// The queue, for people.
pub(super) fn queue_line(mode: &Mode) -> String {
    match &mode.rabbitmq {
        Some(url) => format!("RabbitMQ at {url}"),
        None => "IN-MEMORY (a queue in this process; no RabbitMQ)".to_owned(),
    }
}

/// The trouble's name, for people.
pub(super) fn trouble_name(kind: &TroubleKind) -> String {
    match kind {
        TroubleKind::FailsSlowly { in_ten } => {
            format!("{} calls in 10 fail after the full latency", in_ten)
        }
        TroubleKind::Down => "down: every call refused".to_owned(),
    }
}

/// Prints the comparison of the two runs on stdout.
pub(super) fn drill_comparison(r: &DemoReport) {
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
    outln!("budget store: {}", store_line(&r.mode));
    outln!("queue:        {}", queue_line(&r.mode));
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

/// Prints the comparison of the two runs on stdout.
pub(super) fn scenario_comparison(r: &ScenarioReport) {
    let (Some(a), Some(b)) = (r.runs.first(), r.runs.get(1)) else {
        return;
    };
    let p = &r.dependency;
    outln!();
    outln!(
        "Scenario {}: {} jobs/s for {:.0}s on {} workers x {}; `{DEPENDENCY}` works on {} calls at once, latency {} ms (+25% at the cap), callers time out after {} ms",
        r.scenario,
        r.jobs_per_sec,
        r.submit_secs,
        r.workers,
        r.prefetch,
        p.cap,
        p.latency.as_millis(),
        p.timeout.as_millis()
    );
    outln!(
        "trouble from {:.0}s to {:.0}s: {}",
        p.trouble.from.as_secs_f64(),
        p.trouble.until.as_secs_f64(),
        trouble_name(&p.trouble.kind)
    );
    outln!("budget store: {}", store_line(&r.mode));
    outln!("queue:        {}", queue_line(&r.mode));
    outln!(
        "both runs: no rate limit on retries, up to {} attempts per job; second run: {}",
        r.max_attempts,
        r.protection
    );
    print_side_by_side(
        &rows(r.scenario, a, b),
        24,
        [
            (a.label.as_str(), &a.accounting),
            (b.label.as_str(), &b.accounting),
        ],
    );
}

fn rows(scenario: &str, a: &RunFigures, b: &RunFigures) -> Vec<Vec<String>> {
    let mut rows = Rows::new([a.label.as_str(), b.label.as_str()], a, b);
    rows.count("jobs submitted", |r| r.jobs_submitted);
    rows.count("first attempts", |r| r.first_attempts);
    rows.count("executions (calls)", |r| r.executions);
    rows.text("amplification (calls/job)", |r| {
        format!("{:.2}x", r.amplification)
    });
    rows.count("successes (before replay)", |r| r.successes);
    rows.count("retries granted", |r| r.retries_granted);
    rows.count("attempts burned (failed calls)", |r| r.attempts_burned);
    if scenario == "slow" {
        rows.count("peak calls in flight", |r| r.peak_in_flight);
        rows.count("timeouts", |r| r.timeouts);
        rows.count("503s", |r| r.failed);
    } else {
        rows.count("calls refused (down)", |r| r.refused);
        rows.count("holds: jobs sent to wait (circuit open)", |r| r.held);
        rows.text("breaker: opened / half-open / closed", |r| {
            let t = r.breaker_transitions;
            format!("{} / {} / {}", t.open, t.half_open, t.closed)
        });
    }
    rows.count("dead-lettered", |r| r.dead_lettered_total);
    rows.dead_letter_reasons(
        |r| &r.dead_lettered,
        |reason| a.dead_lettered.contains_key(reason) || b.dead_lettered.contains_key(reason),
    );
    rows.count("after recovery: replayed", |r| r.replayed);
    rows.count("  parked (came back again)", |r| r.parked);
    rows.text("all done, seconds after recovery", |r| {
        format!("{:.1}", r.drained_secs_after_recovery)
    });
    rows.into_rows()
}

/// The table of two runs side by side, one row per figure: its name, then each run's value.
struct Rows<'a, R> {
    runs: [&'a R; 2],
    rows: Vec<Vec<String>>,
}

impl<'a, R> Rows<'a, R> {
    /// The table of `a` and `b`, headed by their `labels`.
    fn new(labels: [&str; 2], a: &'a R, b: &'a R) -> Self {
        let [la, lb] = labels.map(str::to_owned);
        Self {
            runs: [a, b],
            rows: vec![vec![String::new(), la, lb]],
        }
    }

    /// A row of `name`, each run's value as `value` writes it.
    fn text(&mut self, name: &str, value: impl Fn(&R) -> String) {
        let [a, b] = self.runs;
        self.rows.push(vec![name.to_owned(), value(a), value(b)]);
    }

    /// A row of `name`, each run's count (with thousands separators).
    fn count(&mut self, name: &str, count: impl Fn(&R) -> u64) {
        self.text(name, |r| thousands(count(r)));
    }

    /// A row per dead-letter reason that `shown` selects (given the runs' counts by reason,
    /// `dead_lettered`), indented under the total.
    fn dead_letter_reasons(
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

    fn into_rows(self) -> Vec<Vec<String>> {
        self.rows
    }
}

/// Prints the two runs' table, then every job of each accounted for (labels padded to
/// `label_width`).
fn print_side_by_side(rows: &[Vec<String>], label_width: usize, runs: [(&str, &Accounting); 2]) {
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
