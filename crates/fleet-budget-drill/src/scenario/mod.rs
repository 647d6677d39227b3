//! The two other ways a dependency goes wrong, each run twice on RabbitMQ and Redis — without
//! and with the mechanism made for it — every job accounted for after the replay, as the drill
//! does.
//!
//! - `slow`: a dependency with a real concurrency cap fails slowly; its latency rises near
//!   the cap and callers time out. Without a budget, retries push the calls in flight past the
//!   cap, queued calls time out, timeouts become retries; with the concurrency budget a retry
//!   runs only on a free retry slot, or is dead-lettered at once and replayed later.
//! - `down`: the dependency is down for a while. Without a breaker every job burns its
//!   attempts and is dead-lettered; with the circuit breaker jobs wait in the delay tiers without
//!   spending an attempt, probes find the recovery, and the backlog drains on its own.
//!
//! `dependency` is the simulated service, `run` one run on the broker, `report` the
//! figures. The mechanisms are the library's (`FleetBudget::admit`, the `Worker`): the
//! scenarios only configure them.

mod dependency;
mod down;
mod report;
mod run;
mod slow;

use std::sync::Arc;
use std::time::Duration;

use fleet_budget::{Config, FleetBudget};
use fleet_budget_amqp::WorkerConfig;

pub use self::dependency::{Profile, Trouble, TroubleKind};
pub use self::report::{RunFigures, ScenarioReport, Transitions};
pub use self::run::ScenarioProgress;
use crate::{DrillError, Mode, UNLIMITED, Watcher, jobs_for, run_config, run_id};

/// A scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// A dependency with a concurrency cap fails slowly: without and with the concurrency
    /// budget.
    Slow,
    /// The dependency is down for a while: without and with the circuit breaker.
    Down,
}

impl Scenario {
    /// Its name: `slow`, `down`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Slow => "slow",
            Self::Down => "down",
        }
    }
}

/// What a scenario runs: the same load twice on the same dependency, the second run protected.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Which scenario.
    pub scenario: Scenario,
    /// The two runs' names (unprotected, protected).
    pub labels: [&'static str; 2],
    /// The dependency.
    pub profile: Profile,
    /// Jobs submitted per second, for `submit_for`.
    pub rate: u32,
    /// How long jobs are submitted.
    pub submit_for: Duration,
    /// Library workers, each handling `prefetch` jobs at once.
    pub workers: u32,
    /// Jobs a worker handles at once.
    pub prefetch: u16,
    /// Dead letters replayed per second after recovery.
    pub replay_rate: u32,
    /// What protects the second run, for people.
    pub protection: String,
    /// Adds the protection to a run's configuration.
    protect: fn(&mut Config) -> Result<(), DrillError>,
}

impl Setup {
    /// `scenario`'s setup, the length of its trouble scaled by `phase`, its load by `rate` when
    /// given.
    #[must_use]
    pub fn new(scenario: Scenario, phase: Option<Duration>, rate: Option<u32>) -> Self {
        match scenario {
            Scenario::Slow => slow::setup(phase, rate),
            Scenario::Down => down::setup(phase, rate),
        }
    }

    fn jobs(&self) -> u64 {
        jobs_for(self.submit_for, self.rate)
    }
}

/// Runs `setup` on the services of `mode` (see [`Mode::require_services`]): the unprotected
/// run, then the protected one, each on keys and queues of its own under `config`'s names;
/// their progress goes to `watcher`.
///
/// # Errors
/// A run's budget cannot be built, or a run failed on the broker ([`DrillError::Broker`]).
pub async fn run(
    config: &WorkerConfig,
    setup: &Setup,
    mode: Mode,
    watcher: Arc<dyn Watcher>,
) -> Result<ScenarioReport, DrillError> {
    let scenario = setup.scenario;
    let run_id = run_id();
    let mut runs = Vec::new();
    for (i, label) in setup.labels.into_iter().enumerate() {
        let protected = i == 1;
        let key_prefix = format!(
            "{}-demo-{}-{run_id}-{}",
            config.budget.redis.key_prefix,
            scenario.as_str(),
            if protected { "p" } else { "u" }
        );
        let budget = scenario_budget(&config.budget, setup, protected, &key_prefix).await?;
        let report = run::run(
            setup,
            label,
            protected,
            config,
            &budget,
            &key_prefix,
            &watcher,
        )
        .await;
        let _ = budget.shutdown().await;
        runs.push(report.map_err(|e| {
            DrillError::on_broker(
                &format!("scenario {}", scenario.as_str()),
                &config.amqp.url,
                &e,
            )
        })?);
    }
    Ok(ScenarioReport::new(mode, setup, runs))
}

/// A run's budget: the same unlimited rate budget in both runs (so that the comparison shows
/// the protection alone) and the rest of [`run_config`], in Redis under the run's own prefix;
/// the protection added to the second run.
async fn scenario_budget(
    config: &Config,
    setup: &Setup,
    protected: bool,
    key_prefix: &str,
) -> Result<FleetBudget, DrillError> {
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
