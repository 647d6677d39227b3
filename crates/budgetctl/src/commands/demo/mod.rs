//! `budgetctl demo`: the incident drill, and `--scenario slow|down`.
//!
//! The drill is the `fleet-budget-drill` library: this command parses its arguments, checks
//! which services answer, calls the drill or the scenario, and prints — the plan and the notes
//! on stderr before, the live progress on stderr ([`watch`]), the comparison or the JSON on
//! stdout after ([`print`](mod@print)).

mod print;
mod watch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_drill::scenario::{self, Setup};
use fleet_budget_drill::{DEPENDENCY, Drill, JSON_SCHEMA_VERSION, Mode};

use self::watch::Stderr;
use crate::args::number_in;
use crate::output::print_json;

/// `demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Concurrent workers (the drill; each scenario has its own).
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=256))]
    workers: u32,
    /// Instead of the brownout drill: `slow` (a dependency with a concurrency cap fails slowly:
    /// without and with the concurrency budget) or `down` (the dependency is down for a while:
    /// without and with the circuit breaker). Needs Redis and RabbitMQ.
    #[arg(long, value_enum)]
    scenario: Option<Scenario>,
    /// Length of each phase (healthy, degraded, recovered) of one run, in seconds [default: 6;
    /// 5 for the scenarios].
    #[arg(long, allow_negative_numbers = true, value_parser = phase_secs)]
    phase_secs: Option<f64>,
    /// Jobs submitted per second [default: 200; the scenario's planned load for the scenarios].
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=5000))]
    rate: Option<u32>,
    /// Use the in-process store and an in-memory queue without trying Redis or RabbitMQ.
    #[arg(long)]
    in_process: bool,
    /// Print the comparison as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// A scenario of `demo --scenario`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Scenario {
    /// A dependency with a concurrency cap fails slowly: without and with the concurrency
    /// budget.
    Slow,
    /// The dependency is down for a while: without and with the circuit breaker.
    Down,
}

impl From<Scenario> for scenario::Scenario {
    fn from(s: Scenario) -> Self {
        match s {
            Scenario::Slow => Self::Slow,
            Scenario::Down => Self::Down,
        }
    }
}

fn phase_secs(s: &str) -> Result<f64, String> {
    number_in(s, 0.5..=600.0, "a number of seconds from 0.5 to 600")
}

/// Runs the command.
pub(crate) async fn run(config: &WorkerConfig, args: &DemoArgs) -> anyhow::Result<()> {
    if let Some(scenario) = args.scenario {
        if args.in_process {
            anyhow::bail!(
                "--scenario runs on Redis and RabbitMQ (the leases and the breaker live in Redis); drop --in-process"
            );
        }
        let phase = args.phase_secs.map(Duration::from_secs_f64);
        let setup = Setup::new(scenario.into(), phase, args.rate);
        return run_scenario(config, &setup, args.json).await;
    }
    let defaults = Drill::default();
    let drill = Drill {
        workers: args.workers,
        phase_secs: args.phase_secs.unwrap_or(defaults.phase_secs),
        rate: args.rate.unwrap_or(defaults.rate),
    };
    let mode = Mode::choose(config, args.in_process).await;
    let started = Instant::now();
    let schedule = drill.schedule();
    eprintln!(
        "drill: {} workers, {} jobs/s for {:.0}s; dependency `{DEPENDENCY}` serves {}/s, drops to {}/s from {:.0}s to {:.0}s, then recovers",
        drill.workers,
        drill.rate,
        drill.phase_secs * 3.0,
        schedule.capacity,
        schedule.degraded_capacity,
        drill.phase_secs,
        drill.phase_secs * 2.0
    );
    eprintln!("budget store: {}", print::store_line(&mode));
    eprintln!("queue:        {}", print::queue_line(&mode));
    for note in &mode.notes {
        eprintln!("note: {note}");
    }
    let report = fleet_budget_drill::run(config, &drill, mode, Arc::new(Stderr::new())).await?;
    eprintln!("drill finished in {:.0}s", started.elapsed().as_secs_f64());
    if args.json {
        return print_json(JSON_SCHEMA_VERSION, &report);
    }
    print::drill_comparison(&report);
    Ok(())
}

/// Runs the scenario of `setup` on Redis and RabbitMQ and prints it.
async fn run_scenario(config: &WorkerConfig, setup: &Setup, json: bool) -> anyhow::Result<()> {
    let mode = Mode::choose(config, false).await;
    mode.require_services()?;
    let started = Instant::now();
    let name = setup.scenario.as_str();
    let t = setup.profile.trouble;
    eprintln!(
        "scenario {name}: {} jobs/s for {:.0}s; `{DEPENDENCY}` cap {} calls at once, latency {} ms, callers time out after {} ms; trouble from {:.0}s to {:.0}s ({})",
        setup.rate,
        setup.submit_for.as_secs_f64(),
        setup.profile.cap,
        setup.profile.latency.as_millis(),
        setup.profile.timeout.as_millis(),
        t.from.as_secs_f64(),
        t.until.as_secs_f64(),
        print::trouble_name(&t.kind),
    );
    eprintln!("protection in the second run: {}", setup.protection);
    let report = scenario::run(config, setup, mode, Arc::new(Stderr::new())).await?;
    eprintln!(
        "scenario {name} finished in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    if json {
        return print_json(JSON_SCHEMA_VERSION, &report);
    }
    print::scenario_comparison(&report);
    Ok(())
}
