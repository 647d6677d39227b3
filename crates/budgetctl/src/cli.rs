//! The command line: the global flags and the commands (clap derive). Each command's own
//! arguments live beside its code in [`crate::commands`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::commands::{
    audit::AuditArgs, bench::BenchArgs, budget::BudgetCommand, config::ConfigCommand,
    console::ConsoleArgs, demo::DemoArgs, dlq::DlqCommand, doctor::DoctorArgs,
    exporter::ExporterArgs, incident::IncidentCommand, migrate::MigrateArgs, parked::ParkedCommand,
    plan::PlanArgs, replay::ReplayArgs, simulate::SimulateCommand, status::StatusArgs,
    tune::TuneArgs,
};

/// Operate fleet-wide retry budgets: run the incident drill, model retry storms, watch budgets in
/// Redis, benchmark them, and replay dead-lettered jobs after an incident.
///
/// Exit codes: 0 success; 1 runtime failure (a service unreachable, a broker error); 2 usage or
/// configuration error; `doctor`: 3 a risk found, 4 no risk found but some checks could not run.
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

/// The heading the global flags are listed under, after a command's own options.
const GLOBAL: &str = "Global options";

/// Flags every command accepts.
#[derive(Debug, Args)]
pub(crate) struct GlobalArgs {
    /// The fleet-budget configuration file (TOML). Without it, the built-in defaults.
    #[arg(long, global = true, value_name = "FILE", help_heading = GLOBAL)]
    pub(crate) config: Option<PathBuf>,
    /// Redis URL (overrides `redis.url` of the configuration).
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "FLEET_BUDGET_REDIS_URL",
        hide_env_values = true,
        help_heading = GLOBAL
    )]
    pub(crate) redis_url: Option<String>,
    /// RabbitMQ URL (overrides `amqp.url`/`amqp.urls` of the configuration); a cluster's nodes
    /// by repeating the flag or separated by commas, tried in turn.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "FLEET_BUDGET_AMQP_URL",
        hide_env_values = true,
        value_delimiter = ',',
        help_heading = GLOBAL
    )]
    pub(crate) amqp_url: Vec<String>,
    /// Prefix of the budget keys in Redis (overrides `redis.key_prefix`, default `fb`).
    #[arg(long, global = true, value_name = "P", help_heading = GLOBAL)]
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
    /// The retry schedule of a recovery window or attempt count: attempts, delays with their
    /// jitter, hops through the delay tiers, and the guide's table of windows (no services).
    Plan(PlanArgs),
    /// Live per-dependency budget state read from Redis.
    Status(StatusArgs),
    /// Deterministic load against a budget in Redis, with a PING reference.
    Bench(BenchArgs),
    /// Move dead-lettered jobs back to their queues after an incident.
    Replay(ReplayArgs),
    /// Operators' overrides of a dependency's budget (freeze, set, with expiry), audited.
    #[command(subcommand)]
    Budget(BudgetCommand),
    /// The audit trail of overrides, replays, purges and migrations, kept in Redis.
    Audit(AuditArgs),
    /// Serve the whole fleet on /metrics for Prometheus: every dependency's budget (Redis) and
    /// the dead-letter and parked queues (RabbitMQ), one scrape target.
    Exporter(ExporterArgs),
    /// The incident console in the browser: budgets, breakers, dead letters, overrides and
    /// replay, behind operator and viewer tokens (binds 127.0.0.1:8089 by default).
    Console(ConsoleArgs),
    /// Dead-letter queue commands: counts, and messages one by one.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// The parked queue (what replay will not replay): list, replay, purge.
    #[command(subcommand)]
    Parked(ParkedCommand),
    /// Declare or upgrade the broker topology (exchanges, queues) the workers use.
    Migrate(MigrateArgs),
    /// Check what the budgets depend on in Redis and RabbitMQ (eviction, persistence, rights,
    /// policies on our queues, alarms, timeouts) and say what each risk costs and what to do.
    /// Exit 0 no risk, 3 a risk, 4 some checks could not run.
    Doctor(DoctorArgs),
    /// Configuration commands.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Recommend each dependency's ratio, min_allowance and ceiling from the fleet's own
    /// history in Prometheus, with the rules and the evidence beside each number.
    Tune(TuneArgs),
    /// A dependency's incident for the postmortem (Markdown or HTML, with charts).
    #[command(subcommand)]
    Incident(IncidentCommand),
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// Renders the long help of `budgetctl <path>`.
    fn help(path: &[&str]) -> String {
        let mut command = Cli::command();
        command.build();
        let mut sub = &mut command;
        for name in path {
            sub = sub
                .find_subcommand_mut(name)
                .unwrap_or_else(|| panic!("no command {name}"));
        }
        sub.render_long_help().to_string()
    }

    #[test]
    fn each_command_lists_its_own_options_before_the_global_ones() {
        for path in [
            &["demo"][..],
            &["simulate", "brownout"],
            &["simulate", "capacity"],
            &["plan"],
            &["status"],
            &["budget", "freeze"],
            &["budget", "set"],
            &["audit"],
            &["bench"],
            &["replay"],
            &["dlq", "stats"],
            &["dlq", "peek"],
            &["parked", "list"],
            &["parked", "replay"],
            &["parked", "purge"],
            &["migrate"],
            &["doctor"],
            &["console"],
            &["config", "check"],
            &["tune"],
            &["incident", "report"],
        ] {
            let text = help(path);
            let own = text.find("\nOptions:").unwrap_or_else(|| panic!("{text}"));
            let global = text
                .find(&format!("\n{GLOBAL}:"))
                .unwrap_or_else(|| panic!("{text}"));
            assert!(own < global, "{path:?}:\n{text}");
            let globals = text.get(global..).unwrap_or_default();
            for flag in ["--config", "--redis-url", "--amqp-url", "--key-prefix"] {
                assert!(
                    globals.contains(flag),
                    "{path:?}: {flag} not under {GLOBAL}"
                );
                let own_part = text.get(own..global).unwrap_or_default();
                assert!(
                    !own_part.contains(flag),
                    "{path:?}: {flag} among own options"
                );
            }
        }
    }
}
