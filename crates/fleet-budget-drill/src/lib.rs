//! The incident drill of fleet-budget, as a library `budgetctl demo` calls.
//!
//! Workers consume jobs; each job calls a simulated dependency whose capacity drops to a fifth
//! for a while and then recovers. The drill runs twice — without a budget and with one, budgets
//! in Redis on a short window — and reports the two side by side; then, after recovery, it
//! replays each run's dead-letter queue and accounts for every job:
//! `succeeded + dead-lettered-then-replayed + parked = submitted`, `lost = 0`.
//!
//! Jobs go through RabbitMQ (`rabbit`: the library's `Worker`s and `Replayer` on a topology of
//! the drill's own, as `broker` runs them for the scenarios too). When Redis does not answer,
//! the budget is kept in this process; when RabbitMQ does not answer, the queue is
//! `fleet-budget-sim`'s in-memory one (`memory`, jobs settled by the worker's own outcome
//! mapping). [`Mode`] says which URL failed and which mode ran. The dependency, the queue and
//! the tally are the models of `fleet-budget-sim`; this crate runs them on real time. The
//! [`scenario`]s are the two other ways a dependency goes wrong.
//!
//! Nothing here prints: a run's progress goes to the caller's [`Watcher`], its figures come back
//! as a [`DemoReport`] (or a [`scenario::ScenarioReport`]), serializable as the `--json` shape.

mod broker;
mod error;
mod job;
mod memory;
mod mode;
mod progress;
mod rabbit;
mod report;
pub mod scenario;
mod trail;

use std::sync::Arc;
use std::time::Duration;

use fleet_budget::{Backoff, BudgetPolicy, Config, DepositBasis, FleetBudget, WindowMode};
use fleet_budget_amqp::{AmqpSettings, WorkerConfig};
use fleet_budget_sim::upstream::Schedule;

pub use self::error::DrillError;
pub use self::mode::Mode;
pub use self::progress::{DrillProgress, Watcher};
pub use self::report::{DemoReport, RunReport};
use self::report::{FirstPass, ReplayTotals};
pub use self::scenario::ScenarioProgress;
pub use self::trail::RunTrail;

/// The version of the `--json` shapes of the drill and of the scenarios
/// (`docs/schemas/demo.schema.json`).
pub const JSON_SCHEMA_VERSION: u32 = 1;

/// The drill's load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drill {
    /// Concurrent workers.
    pub workers: u32,
    /// Length of each phase (healthy, degraded, recovered) of one run, in seconds.
    pub phase_secs: f64,
    /// Jobs submitted per second.
    pub rate: u32,
}

impl Default for Drill {
    /// 8 workers, 200 jobs per second, phases of 6 seconds.
    fn default() -> Self {
        Self {
            workers: 8,
            phase_secs: 6.0,
            rate: 200,
        }
    }
}

impl Drill {
    /// The dependency of this load: it serves 5/4 of the rate, a fifth of that while degraded
    /// (the second phase), then recovers.
    #[must_use]
    pub fn schedule(&self) -> Schedule {
        let capacity = u64::from(self.rate) * 5 / 4;
        Schedule {
            capacity,
            degraded_capacity: (capacity / 5).max(1),
            degraded_from: Duration::from_secs_f64(self.phase_secs),
            degraded_until: Duration::from_secs_f64(self.phase_secs * 2.0),
        }
    }
}

/// The task every drill job runs.
pub const TASK: &str = "index_document";
/// The dependency it calls (the task is mapped to it).
pub const DEPENDENCY: &str = "search";

/// The budget the "with budget" run uses: 10% of successes over a 2-second sliding window,
/// at least 5 retries per window.
pub const RATIO: f64 = 0.1;
/// The budget's window.
pub const WINDOW: Duration = Duration::from_secs(2);
/// The budget's floor per window.
pub const MIN_ALLOWANCE: u64 = 5;
/// Executions per job at most, including the first.
pub const MAX_ATTEMPTS: u32 = 4;
/// Replays before a message is parked.
const MAX_REPLAYS: u32 = 1;
/// Retry delay tiers of the drill's topology: short, so that the drill is quick.
const RETRY_TIERS: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
];

/// The drill's `[amqp]` settings: `base` (the broker) with names of the run's own, the drill's
/// short retry tiers, and [`MAX_REPLAYS`].
fn amqp_settings(base: &AmqpSettings, prefix: &str) -> AmqpSettings {
    AmqpSettings {
        prefix: prefix.to_owned(),
        retry_tiers: RETRY_TIERS.to_vec(),
        max_replays: MAX_REPLAYS,
        prefetch: 2,
        ..base.clone()
    }
}

/// One run's settings.
#[derive(Debug, Clone)]
struct RunSettings {
    label: &'static str,
    budget: bool,
    workers: u32,
    rate: u32,
    phase: Duration,
    schedule: Schedule,
    key_prefix: String,
}

impl RunSettings {
    fn submit_for(&self) -> Duration {
        self.phase.saturating_mul(3)
    }

    fn jobs(&self) -> u64 {
        jobs_for(self.submit_for(), self.rate)
    }

    /// Messages replayed per second: a little under the dependency's healthy capacity.
    fn replay_rate(&self) -> u32 {
        u32::try_from(self.schedule.capacity * 4 / 5)
            .unwrap_or(u32::MAX)
            .max(1)
    }
}

/// How many jobs `rate` per second submits in `submit_for`.
fn jobs_for(submit_for: Duration, rate: u32) -> u64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = (submit_for.as_secs_f64() * f64::from(rate)).round() as u64;
    n
}

/// A name for this run of the command, unique enough to keep its keys and queues apart from
/// another's.
fn run_id() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        fleet_budget::clock::now_ms() % 1_000_000
    )
}

/// Runs the drill of `drill` on the services of `mode` (see [`Mode::choose`]): the run without a
/// budget, then the run with one, each on keys and queues of its own under `config`'s names;
/// their progress goes to `watcher`.
///
/// # Errors
/// A run's budget cannot be built, or a run failed on the broker ([`DrillError::Broker`]).
pub async fn run(
    config: &WorkerConfig,
    drill: &Drill,
    mode: Mode,
    watcher: Arc<dyn Watcher>,
) -> Result<DemoReport, DrillError> {
    let schedule = drill.schedule();
    let run_id = run_id();
    let mut runs = Vec::new();
    for (label, budget) in [("without budget", false), ("with budget", true)] {
        let settings = RunSettings {
            label,
            budget,
            workers: drill.workers,
            rate: drill.rate,
            phase: Duration::from_secs_f64(drill.phase_secs),
            schedule,
            key_prefix: format!(
                "{}-demo-{run_id}-{}",
                config.budget.redis.key_prefix,
                if budget { "b" } else { "n" }
            ),
        };
        let budget_handle = drill_budget(&config.budget, &mode, &settings).await?;
        let report = if mode.rabbitmq.is_some() {
            rabbit::run(&settings, config, &budget_handle, &watcher).await
        } else {
            Ok(memory::run(&settings, &budget_handle, &watcher).await)
        };
        let _ = budget_handle.shutdown().await;
        runs.push(report.map_err(|e| DrillError::on_broker("the drill", &config.amqp.url, &e))?);
    }
    Ok(DemoReport::new(mode, drill, &schedule, runs))
}

/// The budget of one run: the drill's policy (or an unlimited one for the run without a
/// budget, so both runs go through the same code), in Redis when it answers.
async fn drill_budget(
    config: &Config,
    mode: &Mode,
    settings: &RunSettings,
) -> Result<FleetBudget, DrillError> {
    let policy = if settings.budget {
        BudgetPolicy {
            window: WINDOW,
            ratio: RATIO,
            min_allowance: MIN_ALLOWANCE,
            deposit: DepositBasis::Success,
            mode: WindowMode::Sliding,
        }
    } else {
        UNLIMITED
    };
    let c = run_config(config, policy, &settings.key_prefix)?;
    if mode.redis.is_some() {
        Ok(FleetBudget::from_config(&c).await?)
    } else {
        Ok(FleetBudget::local(&c))
    }
}

/// A budget that never refuses a retry, on the drill's window: every run without a rate budget
/// has it, so that all runs go through the same code.
const UNLIMITED: BudgetPolicy = BudgetPolicy {
    window: WINDOW,
    ratio: 0.0,
    min_allowance: 1_000_000_000,
    deposit: DepositBasis::Success,
    mode: WindowMode::Sliding,
};

/// `config` for one run: `policy` for the demo's dependency (and as the default), [`TASK`]
/// mapped to it, up to [`MAX_ATTEMPTS`] executions per job with short backoffs, Redis keys under
/// `key_prefix` with a timeout and a deposit flush made for a quick run.
fn run_config(
    config: &Config,
    policy: BudgetPolicy,
    key_prefix: &str,
) -> Result<Config, DrillError> {
    let mut c = config.clone();
    let dependency = fleet_budget::Dependency::new(DEPENDENCY)?;
    c.defaults = policy;
    c.policies.insert(dependency.clone(), policy);
    c.map.insert(TASK, dependency);
    c.ceilings.default.max_attempts = MAX_ATTEMPTS;
    c.ceilings.default.backoff = Backoff {
        base: Duration::from_millis(100),
        factor: 2.0,
        cap: Duration::from_secs(1),
    };
    c.ceilings.tasks.clear();
    key_prefix.clone_into(&mut c.redis.key_prefix);
    c.redis.timeout = c.redis.timeout.max(Duration::from_millis(250));
    c.redis.deposit_flush = Duration::from_millis(50);
    Ok(c)
}
