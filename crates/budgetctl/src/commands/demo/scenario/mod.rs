//! `budgetctl demo --scenario slow|down`: the two other ways a dependency goes wrong, each run
//! twice on RabbitMQ and Redis — without and with the mechanism made for it — and printed side
//! by side, every job accounted for after the replay, as the drill does.
//!
//! - [`slow`]: a dependency with a real concurrency cap fails slowly; its latency rises near
//!   the cap and callers time out. Without a budget, retries push the calls in flight past the
//!   cap, queued calls time out, timeouts become retries; with the concurrency budget a retry
//!   runs only on a free retry slot, or is dead-lettered at once and replayed later.
//! - [`down`]: the dependency is down for a while. Without a breaker every job burns its
//!   attempts and is dead-lettered; with the circuit breaker jobs wait in the delay tiers without
//!   spending an attempt, probes find the recovery, and the backlog drains on its own.
//!
//! `dependency` is the simulated service, `run` one run on the broker, `report` the
//! figures and the comparison. The mechanisms are the library's (`FleetBudget::admit`, the
//! `Worker`): the scenarios only configure them.

mod dependency;
mod down;
mod report;
mod run;
mod slow;

use std::time::{Duration, Instant};

use clap::ValueEnum;
use fleet_budget::{Config, FleetBudget};
use fleet_budget_amqp::WorkerConfig;

use self::dependency::Profile;
use self::report::ScenarioReport;
use super::mode::{self, Mode};
use super::{DEPENDENCY, UNLIMITED, failed_on_broker, jobs_for, run_config, run_id};
use crate::output::print_json;

/// A scenario of `demo --scenario`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Scenario {
    /// A dependency with a concurrency cap fails slowly: without and with the concurrency
    /// budget.
    Slow,
    /// The dependency is down for a while: without and with the circuit breaker.
    Down,
}

impl Scenario {
    fn as_str(self) -> &'static str {
        match self {
            Self::Slow => "slow",
            Self::Down => "down",
        }
    }
}

/// What a scenario runs: the same load twice on the same dependency, the second run protected.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    scenario: Scenario,
    /// The two runs' names (unprotected, protected).
    labels: [&'static str; 2],
    profile: Profile,
    /// Jobs submitted per second, for `submit_for`.
    rate: u32,
    submit_for: Duration,
    /// Library workers, each handling `prefetch` jobs at once.
    workers: u32,
    prefetch: u16,
    /// Dead letters replayed per second after recovery.
    replay_rate: u32,
    /// What protects the second run, for people.
    protection: String,
    /// Adds the protection to a run's configuration.
    protect: fn(&mut Config) -> anyhow::Result<()>,
}

impl Setup {
    fn jobs(&self) -> u64 {
        jobs_for(self.submit_for, self.rate)
    }
}

/// Runs `scenario` (the length of its trouble scaled by `phase`, its load by `rate` when given).
pub(crate) async fn run(
    config: &WorkerConfig,
    scenario: Scenario,
    phase: Option<Duration>,
    rate: Option<u32>,
    json: bool,
) -> anyhow::Result<()> {
    let setup = match scenario {
        Scenario::Slow => slow::setup(phase, rate),
        Scenario::Down => down::setup(phase, rate),
    };
    let mode = mode::choose(config, false).await;
    require_services(&mode)?;
    let started = Instant::now();
    let run_id = run_id();
    let t = setup.profile.trouble;
    eprintln!(
        "scenario {}: {} jobs/s for {:.0}s; `{DEPENDENCY}` cap {} calls at once, latency {} ms, callers time out after {} ms; trouble from {:.0}s to {:.0}s ({})",
        scenario.as_str(),
        setup.rate,
        setup.submit_for.as_secs_f64(),
        setup.profile.cap,
        setup.profile.latency.as_millis(),
        setup.profile.timeout.as_millis(),
        t.from.as_secs_f64(),
        t.until.as_secs_f64(),
        report::trouble_name(&t.kind),
    );
    eprintln!("protection in the second run: {}", setup.protection);
    let mut runs = Vec::new();
    for (i, label) in setup.labels.into_iter().enumerate() {
        let protected = i == 1;
        let key_prefix = format!(
            "{}-demo-{}-{run_id}-{}",
            config.budget.redis.key_prefix,
            scenario.as_str(),
            if protected { "p" } else { "u" }
        );
        let budget = scenario_budget(&config.budget, &setup, protected, &key_prefix).await?;
        let report = run::run(&setup, label, protected, config, &budget, &key_prefix).await;
        let _ = budget.shutdown().await;
        runs.push(report.map_err(|e| {
            failed_on_broker(&format!("scenario {}", scenario.as_str()), config, &e)
        })?);
    }
    let report = ScenarioReport::new(mode, &setup, runs);
    eprintln!(
        "scenario {} finished in {:.0}s",
        scenario.as_str(),
        started.elapsed().as_secs_f64()
    );
    if json {
        return print_json(super::JSON_SCHEMA_VERSION, &report);
    }
    report::print_comparison(&report);
    Ok(())
}

/// The scenarios need what they show: leases and breaker state in Redis, jobs on RabbitMQ.
fn require_services(mode: &Mode) -> anyhow::Result<()> {
    if mode.redis.is_some() && mode.rabbitmq.is_some() {
        return Ok(());
    }
    anyhow::bail!(
        "the scenarios run on Redis and RabbitMQ (the concurrency budget and the breaker keep their state in Redis): {}",
        mode.notes.join("; ")
    )
}

/// A run's budget: the same unlimited rate budget in both runs (so that the comparison shows
/// the protection alone) and the rest of [`run_config`], in Redis under the run's own prefix;
/// the protection added to the second run.
async fn scenario_budget(
    config: &Config,
    setup: &Setup,
    protected: bool,
    key_prefix: &str,
) -> anyhow::Result<FleetBudget> {
    let mut base = config.clone();
    base.policies.clear();
    base.concurrency.clear();
    base.breakers.clear();
    let mut c = run_config(&base, UNLIMITED, key_prefix)?;
    if protected {
        (setup.protect)(&mut c)?;
    }
    Ok(FleetBudget::from_config(&c).await?)
}
