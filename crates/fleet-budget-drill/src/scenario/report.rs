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
use super::dependency::{Dependency, Profile};
use crate::job::dead_letters;
use crate::report::amplification;
use crate::{DEPENDENCY, MAX_ATTEMPTS, Mode, ReplayTotals};

/// Breaker state changes made in a run.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Transitions {
    /// Times it opened.
    pub open: u64,
    /// Times it went half-open.
    pub half_open: u64,
    /// Times it closed.
    pub closed: u64,
}

/// What a run measured by the end of its first pass, before the replay.
#[derive(Debug)]
pub(crate) struct FirstPass {
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
    pub(crate) fn measure(
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
pub struct RunFigures {
    /// The run's name.
    pub label: String,
    /// Whether the run had the scenario's protection (the second run).
    pub protected: bool,
    /// Jobs submitted.
    pub jobs_submitted: u64,
    /// First executions of jobs, as the budget counted them.
    pub first_attempts: u64,
    /// Calls the dependency received in the first pass (first attempts and retries).
    pub executions: u64,
    /// Executions per job submitted.
    pub amplification: f64,
    /// Jobs that succeeded in the first pass.
    pub successes: u64,
    /// Retries granted.
    pub retries_granted: u64,
    /// Retries denied.
    pub retries_denied: u64,
    /// Executions that failed in the first pass (timeouts, 503s, refusals, bad input): attempts
    /// spent for nothing.
    pub attempts_burned: u64,
    /// The most calls the dependency had queued or worked on at once (its cap is the profile's).
    pub peak_in_flight: u64,
    /// Calls whose caller gave up at the timeout.
    pub timeouts: u64,
    /// Calls refused while the dependency was down.
    pub refused: u64,
    /// Calls answered 503.
    pub failed: u64,
    /// Times a job was held in a delay tier without running (circuit open).
    pub held: u64,
    /// Breaker state changes in the run.
    pub breaker_transitions: Transitions,
    /// Dead-letter decisions by reason (the reasons seen).
    pub dead_lettered: BTreeMap<String, u64>,
    /// Dead-letter decisions.
    pub dead_lettered_total: u64,
    /// Dead letters the replay after recovery moved back.
    pub replayed: u64,
    /// Executions during the replay.
    pub replay_executions: u64,
    /// Jobs the replay parked (they came back again).
    pub parked: u64,
    /// From the end of the trouble to the last job done (replay included).
    pub drained_secs_after_recovery: f64,
    /// Every job accounted for.
    pub accounting: Accounting,
    /// The most calls in flight in each second of the run.
    pub in_flight_per_second: Vec<u64>,
    /// Executions in each second of the run.
    pub executions_per_second: Vec<u64>,
    /// Length of the first pass.
    pub seconds: f64,
}

impl RunFigures {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
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
pub struct ScenarioReport {
    /// The scenario's name.
    pub scenario: &'static str,
    /// Where the budgets and the jobs were kept.
    pub mode: Mode,
    /// Jobs submitted per second.
    pub jobs_per_sec: u32,
    /// How long jobs were submitted.
    pub submit_secs: f64,
    /// Library workers.
    pub workers: u32,
    /// Jobs a worker handled at once.
    pub prefetch: u16,
    /// The dependency.
    pub dependency: Profile,
    /// Executions per job at most.
    pub max_attempts: u32,
    /// What protected the second run, for people.
    pub protection: String,
    /// The unprotected run, then the protected one.
    pub runs: Vec<RunFigures>,
}

impl ScenarioReport {
    pub(crate) fn new(mode: Mode, setup: &Setup, runs: Vec<RunFigures>) -> Self {
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
