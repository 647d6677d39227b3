//! What a scenario reports: each run's figures in the vocabulary of the drill, `status` and
//! `simulate` (first attempts, executions, successes, retries granted and denied,
//! amplification), plus what the scenario is about (calls in flight, timeouts, jobs held,
//! breaker transitions); and the two runs side by side for people.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_budget::FleetBudget;
use fleet_budget_amqp::WorkerHandle;
use fleet_budget_sim::accounting::{Accounting, JobOutcomes};
use serde::Serialize;

use super::Setup;
use super::dependency::{Dependency, Profile, TroubleKind};
use crate::commands::demo::mode::Mode;
use crate::commands::demo::report::{Rows, amplification, print_side_by_side};
use crate::commands::demo::{DEPENDENCY, MAX_ATTEMPTS, ReplayTotals, dead_letters};

/// The trouble's name, for people.
pub(super) fn trouble_name(kind: &TroubleKind) -> String {
    match kind {
        TroubleKind::FailsSlowly { in_ten } => {
            format!("{} calls in 10 fail after the full latency", in_ten)
        }
        TroubleKind::Down => "down: every call refused".to_owned(),
    }
}

/// Breaker state changes made in a run.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(super) struct Transitions {
    open: u64,
    half_open: u64,
    closed: u64,
}

/// What a run measured by the end of its first pass, before the replay.
#[derive(Debug)]
pub(super) struct FirstPass {
    executions: u64,
    first_attempts: u64,
    successes: u64,
    retries_granted: u64,
    retries_denied: u64,
    timeouts: u64,
    refused: u64,
    failed: u64,
    held: u64,
    transitions: Transitions,
    dead_lettered: BTreeMap<String, u64>,
    seconds: f64,
}

impl FirstPass {
    pub(super) fn measure(
        dependency: &Dependency,
        budget: &FleetBudget,
        outcomes: &JobOutcomes,
        workers: &[WorkerHandle],
    ) -> Self {
        let m = budget.metrics();
        Self {
            executions: dependency.calls(),
            first_attempts: m.counter("first_attempts", DEPENDENCY),
            successes: outcomes.successes(),
            retries_granted: m.counter("retries_granted", DEPENDENCY),
            retries_denied: m.counter("retries_denied", DEPENDENCY),
            timeouts: dependency.timeouts(),
            refused: dependency.refused(),
            failed: dependency.failed(),
            held: workers.iter().map(|w| w.counts().held).sum(),
            transitions: Transitions {
                open: m.breaker_transitions(DEPENDENCY, "open"),
                half_open: m.breaker_transitions(DEPENDENCY, "half_open"),
                closed: m.breaker_transitions(DEPENDENCY, "closed"),
            },
            dead_lettered: dead_letters(m),
            seconds: dependency.elapsed().as_secs_f64(),
        }
    }
}

/// The result of one run.
#[derive(Debug, Clone, Serialize)]
pub(super) struct RunFigures {
    label: String,
    /// Whether the run had the scenario's protection (the second run).
    protected: bool,
    jobs_submitted: u64,
    /// First executions of jobs, as the budget counted them.
    first_attempts: u64,
    /// Calls the dependency received in the first pass (first attempts and retries).
    executions: u64,
    /// Executions per job submitted.
    amplification: f64,
    /// Jobs that succeeded in the first pass.
    successes: u64,
    retries_granted: u64,
    retries_denied: u64,
    /// Executions that failed in the first pass (timeouts, 503s, refusals, bad input): attempts
    /// spent for nothing.
    attempts_burned: u64,
    /// The most calls the dependency had queued or worked on at once (its cap is the profile's).
    peak_in_flight: u64,
    /// Calls whose caller gave up at the timeout.
    timeouts: u64,
    /// Calls refused while the dependency was down.
    refused: u64,
    /// Calls answered 503.
    failed: u64,
    /// Times a job was held in a delay tier without running (circuit open).
    held: u64,
    breaker_transitions: Transitions,
    dead_lettered: BTreeMap<String, u64>,
    dead_lettered_total: u64,
    replayed: u64,
    /// Executions during the replay.
    replay_executions: u64,
    parked: u64,
    /// From the end of the trouble to the last job done (replay included).
    drained_secs_after_recovery: f64,
    accounting: Accounting,
    /// The most calls in flight in each second of the run.
    in_flight_per_second: Vec<u64>,
    /// Executions in each second of the run.
    executions_per_second: Vec<u64>,
    /// Length of the first pass.
    seconds: f64,
}

impl RunFigures {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        label: &str,
        protected: bool,
        jobs: u64,
        first: FirstPass,
        dependency: &Dependency,
        replay: &ReplayTotals,
        drained: Duration,
        accounting: Accounting,
    ) -> Self {
        Self {
            label: label.to_owned(),
            protected,
            jobs_submitted: jobs,
            first_attempts: first.first_attempts,
            executions: first.executions,
            amplification: amplification(first.executions, jobs),
            successes: first.successes,
            retries_granted: first.retries_granted,
            retries_denied: first.retries_denied,
            attempts_burned: first.executions.saturating_sub(first.successes),
            peak_in_flight: dependency.peak_in_flight(),
            timeouts: first.timeouts,
            refused: first.refused,
            failed: first.failed,
            held: first.held,
            breaker_transitions: first.transitions,
            dead_lettered_total: first.dead_lettered.values().sum(),
            dead_lettered: first.dead_lettered,
            replayed: replay.moved,
            replay_executions: dependency.calls().saturating_sub(first.executions),
            parked: replay.parked,
            drained_secs_after_recovery: drained.as_secs_f64(),
            accounting,
            in_flight_per_second: dependency.peak_in_flight_per_second(),
            executions_per_second: dependency.per_second(),
            seconds: first.seconds,
        }
    }
}

/// A scenario's output.
#[derive(Debug, Serialize)]
pub(super) struct ScenarioReport {
    scenario: &'static str,
    mode: Mode,
    jobs_per_sec: u32,
    submit_secs: f64,
    workers: u32,
    prefetch: u16,
    dependency: Profile,
    max_attempts: u32,
    protection: String,
    runs: Vec<RunFigures>,
}

impl ScenarioReport {
    pub(super) fn new(mode: Mode, setup: &Setup, runs: Vec<RunFigures>) -> Self {
        Self {
            scenario: setup.scenario.as_str(),
            mode,
            jobs_per_sec: setup.rate,
            submit_secs: setup.submit_for.as_secs_f64(),
            workers: setup.workers,
            prefetch: setup.prefetch,
            dependency: setup.profile,
            max_attempts: MAX_ATTEMPTS,
            protection: setup.protection.clone(),
            runs,
        }
    }
}

/// Prints the comparison of the two runs on stdout.
pub(super) fn print_comparison(r: &ScenarioReport) {
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
    outln!("budget store: {}", r.mode.store_line());
    outln!("queue:        {}", r.mode.queue_line());
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
