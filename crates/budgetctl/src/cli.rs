//! The command line: global flags, commands and their arguments (clap derive).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Operate fleet-wide retry budgets: run the incident drill, model retry storms, watch budgets in
/// Redis, benchmark them, and replay dead-lettered jobs after an incident.
///
/// Exit codes: 0 success; 1 runtime failure (a service unreachable, a broker error); 2 usage or
/// configuration error.
#[derive(Debug, Parser)]
#[command(
    name = "budgetctl",
    version,
    propagate_version = true,
    max_term_width = 100
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: GlobalArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Flags every command accepts.
#[derive(Debug, Args)]
pub(crate) struct GlobalArgs {
    /// The fleet-budget configuration file (TOML). Without it, the built-in defaults.
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Redis URL (overrides `redis.url` of the configuration).
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "FLEET_BUDGET_REDIS_URL",
        hide_env_values = true
    )]
    pub(crate) redis_url: Option<String>,
    /// RabbitMQ URL (overrides `amqp.url` of the configuration).
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "FLEET_BUDGET_AMQP_URL",
        hide_env_values = true
    )]
    pub(crate) amqp_url: Option<String>,
    /// Prefix of the budget keys in Redis (overrides `redis.key_prefix`, default `fb`).
    #[arg(long, global = true, value_name = "P")]
    pub(crate) key_prefix: Option<String>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The incident drill (~1 minute): workers on RabbitMQ, budgets in Redis, a dependency that
    /// browns out to a fifth of its capacity and recovers; run without and with a budget, then
    /// replay the dead letters.
    Demo(DemoArgs),
    /// Model retry storms with the project's real budget code (no services needed).
    #[command(subcommand)]
    Simulate(SimulateCommand),
    /// Live per-dependency budget state read from Redis.
    Status(StatusArgs),
    /// Deterministic load against a budget in Redis, with a PING reference.
    Bench(BenchArgs),
    /// Move dead-lettered jobs back to their queues after an incident.
    Replay(ReplayArgs),
    /// Dead-letter queue commands.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Declare or upgrade the broker topology (exchanges, queues) the workers use.
    Migrate(MigrateArgs),
    /// Configuration commands.
    #[command(subcommand)]
    Config(ConfigCommand),
}

/// `simulate` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum SimulateCommand {
    /// Requests with up to K attempts against a dependency failing at a fixed rate.
    Brownout(BrownoutArgs),
    /// Ticks of load against a dependency whose capacity drops for a while, with and without budget.
    Capacity(CapacityArgs),
}

/// What earns retry allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DepositArg {
    /// One deposit per successful job (the project default).
    Success,
    /// One deposit per first attempt (Finagle / gRPC style).
    Request,
}

impl DepositArg {
    pub(crate) fn basis(self) -> fleet_budget::DepositBasis {
        match self {
            Self::Success => fleet_budget::DepositBasis::Success,
            Self::Request => fleet_budget::DepositBasis::Request,
        }
    }
}

/// `simulate brownout`.
#[derive(Debug, Args)]
pub(crate) struct BrownoutArgs {
    /// Client requests (jobs).
    #[arg(long, default_value_t = 2000, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(crate) requests: u64,
    /// Executions per request at most, including the first.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) attempts: u32,
    /// Probability that one attempt fails, from 0 to 1.
    #[arg(long, allow_negative_numbers = true, value_parser = probability)]
    pub(crate) failure_rate: f64,
    /// Retries allowed per deposit; without it, no budget.
    #[arg(long, allow_negative_numbers = true, value_parser = ratio)]
    pub(crate) budget_ratio: Option<f64>,
    /// What earns allowance.
    #[arg(long, value_enum, default_value_t = DepositArg::Success)]
    pub(crate) deposit: DepositArg,
    /// Retries always allowed in the window.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true)]
    pub(crate) min_allowance: u64,
    /// Random seed (of the first run).
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Runs with seeds `seed`, `seed + 1`, ...; the numbers printed are their means.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) runs: u32,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `simulate capacity`.
#[derive(Debug, Args)]
pub(crate) struct CapacityArgs {
    /// New jobs per tick.
    #[arg(long, default_value_t = 900, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub(crate) incoming: u64,
    /// Ticks to simulate.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) ticks: u32,
    /// Calls the dependency serves per tick when healthy.
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    pub(crate) capacity: u64,
    /// Calls it serves per tick while degraded.
    #[arg(long, default_value_t = 200, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    pub(crate) degraded_capacity: u64,
    /// First degraded tick (ticks count from 0).
    #[arg(long, default_value_t = 5)]
    pub(crate) degraded_from: u32,
    /// How many ticks the dependency stays degraded.
    #[arg(long, default_value_t = 3)]
    pub(crate) degraded_ticks: u32,
    /// Executions per job at most, including the first.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) attempts: u32,
    /// Retries allowed per deposit; without it, no budget.
    #[arg(long, allow_negative_numbers = true, value_parser = ratio)]
    pub(crate) budget_ratio: Option<f64>,
    /// What earns allowance.
    #[arg(long, value_enum, default_value_t = DepositArg::Success)]
    pub(crate) deposit: DepositArg,
    /// Length of the budget's sliding window, in ticks.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=86_400))]
    pub(crate) window_ticks: u32,
    /// Retries always allowed per window.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true)]
    pub(crate) min_allowance: u64,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Draw offered load per tick, with and without the budget, to this SVG file.
    #[arg(long, value_name = "FILE")]
    pub(crate) svg: Option<PathBuf>,
}

/// `status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Only this dependency.
    #[arg(long)]
    pub(crate) dependency: Option<String>,
    /// Print one JSON object on stdout.
    #[arg(long, conflicts_with = "watch")]
    pub(crate) json: bool,
    /// Redraw every second until interrupted.
    #[arg(long)]
    pub(crate) watch: bool,
}

/// `bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// The dependency whose budget is exercised.
    #[arg(long)]
    pub(crate) dependency: String,
    /// Successes recorded first (one deposit).
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=1_000_000_000))]
    pub(crate) successes: u64,
    /// Retry requests made afterwards.
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    pub(crate) retries: u64,
    /// Concurrent tasks making them.
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) concurrency: u32,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `replay`.
#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// Replay the dead letters of this dependency.
    #[arg(long)]
    pub(crate) dependency: String,
    /// Only this reason (`budget_exhausted`, `attempts_exhausted`, `non_retryable`).
    #[arg(long, value_parser = reason)]
    pub(crate) reason: Option<String>,
    /// Only messages dead-lettered at or after this time (Unix seconds, or an age like `30m`).
    #[arg(long, value_name = "T")]
    pub(crate) since: Option<String>,
    /// Messages moved per second at most.
    #[arg(long, default_value_t = 50, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) rate: u32,
    /// Move at most this many messages.
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) limit: Option<u64>,
    /// Count what would move, move nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `dlq` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// Dead-letter and parked queue depth, counts by dependency × reason, oldest message age.
    Stats(JsonArg),
}

/// A lone `--json`.
#[derive(Debug, Args)]
pub(crate) struct JsonArg {
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `migrate`.
#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// Show what would be declared, declare nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `config` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Validate a configuration file and print the resolved task → dependency map and policies.
    Check(ConfigCheckArgs),
}

/// `config check`.
#[derive(Debug, Args)]
pub(crate) struct ConfigCheckArgs {
    /// The file to check.
    pub(crate) file: PathBuf,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Concurrent workers.
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) workers: u32,
    /// Length of each phase (healthy, degraded, recovered) of one run, in seconds.
    #[arg(long, default_value_t = 6.0, allow_negative_numbers = true, value_parser = phase_secs)]
    pub(crate) phase_secs: f64,
    /// Jobs submitted per second.
    #[arg(long, default_value_t = 200, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=5000))]
    pub(crate) rate: u32,
    /// Use the in-process store and an in-memory queue without trying Redis or RabbitMQ.
    #[arg(long)]
    pub(crate) in_process: bool,
    /// Print the comparison as one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

fn probability(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("`{s}` must be a probability from 0 to 1"))
    }
}

fn ratio(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && (0.0..=fleet_budget::config::MAX_RATIO).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "`{s}` must be a number from 0 to {} (retries per deposit)",
            fleet_budget::config::MAX_RATIO
        ))
    }
}

fn phase_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && (0.5..=600.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("`{s}` must be a number of seconds from 0.5 to 600"))
    }
}

fn reason(s: &str) -> Result<String, String> {
    match fleet_budget::DeadLetterReason::parse(s) {
        Some(r) => Ok(r.as_str().to_owned()),
        None => Err(format!(
            "`{s}` is not a dead-letter reason (budget_exhausted, attempts_exhausted, non_retryable)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
