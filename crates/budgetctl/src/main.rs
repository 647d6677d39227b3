//! `budgetctl`: the operator CLI of fleet-budget.
//!
//! A thin binary over the libraries: it parses, resolves the configuration, calls
//! `fleet-budget` / `fleet-budget-amqp`, and prints. Exit codes: 0 success, 1 runtime failure (a
//! service unreachable, a broker error), 2 usage or configuration error; `doctor` adds 3 (a risk
//! found) and 4 (no risk found, some checks could not run). With `--json` exactly
//! one JSON object goes to stdout; logs and progress go to stderr.

#[macro_use]
mod output;
mod amqp_conn;
mod args;
mod cli;
mod commands;
mod exit;
mod redis_conn;
mod settings;
mod when;

use std::process::ExitCode;

use clap::Parser;
use fleet_budget_amqp::WorkerConfig;

use crate::cli::{Cli, Command, GlobalArgs};
use crate::commands::config::ConfigCommand;
use crate::commands::dlq::DlqCommand;
use crate::commands::{
    audit, bench, budget, console, demo, dlq, doctor, exporter, incident, migrate, parked, plan,
    replay, simulate, status, tune,
};
use crate::exit::UsageError;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // clap prints help and version on stdout (exit 0) and usage errors on stderr (exit 2).
        Err(e) => e.exit(),
    };
    init_logging();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<exit::Verdict>().is_some() => ExitCode::from(
            e.downcast_ref::<exit::Verdict>()
                .map_or(exit::FAILURE, |v| v.0),
        ),
        Err(e) => {
            let usage = e.downcast_ref::<UsageError>().is_some();
            eprintln!(
                "error: {}",
                fleet_budget::redact::redact_text(&format!("{e:#}"))
            );
            ExitCode::from(if usage { exit::USAGE } else { exit::FAILURE })
        }
    }
}

/// Logs go to stderr, `warn` and up unless `RUST_LOG` says otherwise. lapin's own log is off
/// unless `RUST_LOG` names it: it reports expected outcomes as errors (a passive declare of a
/// missing queue; the topology check's probe of a queue's arguments, every 5 minutes in the
/// console), and the libraries return every real failure anyway.
fn init_logging() {
    let spec = log_spec(std::env::var("RUST_LOG").ok().as_deref());
    let filter = tracing_subscriber::EnvFilter::try_new(&spec)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG));
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr())
        .with_env_filter(filter)
        .try_init();
}

/// The log filter when `RUST_LOG` says nothing.
const DEFAULT_LOG: &str = "warn,lapin=off";

/// The filter for `RUST_LOG` (`None`: unset): lapin off unless it names lapin.
fn log_spec(rust_log: Option<&str>) -> String {
    match rust_log.map(str::trim) {
        None | Some("") => DEFAULT_LOG.to_owned(),
        Some(spec) if spec.contains("lapin") => spec.to_owned(),
        Some(spec) => format!("{spec},lapin=off"),
    }
}

/// Colour codes only on a terminal, and never when `NO_COLOR` is set to anything but empty
/// (<https://no-color.org>): a log file or a pipe gets plain text.
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let global = &cli.global;
    match cli.command {
        Command::Simulate(command) => simulate::run(&command),
        Command::Plan(args) => plan::run(&args),
        Command::Config(ConfigCommand::Check(args)) => commands::config::check(&args),
        Command::Status(args) => with_config(global, async |c| status::run(&c.budget, &args).await),
        Command::Bench(args) => with_config(global, async |c| bench::run(&c.budget, &args).await),
        Command::Demo(args) => with_config(global, async |c| demo::run(c, &args).await),
        Command::Replay(args) => with_config(global, async |c| replay::run(c, &args).await),
        Command::Dlq(DlqCommand::Stats(args)) => {
            with_config(global, async |c| dlq::stats(c, args.json).await)
        }
        Command::Dlq(DlqCommand::Peek(args)) => {
            with_config(global, async |c| dlq::peek(c, &args).await)
        }
        Command::Dlq(DlqCommand::Reindex(args)) => {
            with_config(global, async |c| dlq::reindex(c, args.json).await)
        }
        Command::Parked(command) => with_config(global, async |c| parked::run(c, &command).await),
        Command::Budget(command) => {
            with_config(global, async |c| budget::run(&c.budget, &command).await)
        }
        Command::Audit(args) => with_config(global, async |c| audit::run(&c.budget, &args).await),
        Command::Exporter(args) => with_config(global, async |c| exporter::run(c, &args).await),
        Command::Console(args) => with_config(global, async |c| console::run(c, &args).await),
        Command::Migrate(args) => with_config(global, async |c| migrate::run(c, &args).await),
        Command::Doctor(args) => with_config(global, async |c| doctor::run(c, &args).await),
        Command::Incident(command) => {
            with_config(global, async |c| incident::run(c, &command).await)
        }
        Command::Tune(args) => with_config(global, async |c| tune::run(&c.budget, &args).await),
    }
}

/// Runs a command that talks to Redis or RabbitMQ: with the resolved configuration, on a
/// runtime of its own.
fn with_config(
    global: &GlobalArgs,
    command: impl AsyncFnOnce(&WorkerConfig) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let config = settings::resolve(global)?;
    runtime()?.block_on(command(&config))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::log_spec;

    #[test]
    fn lapin_stays_off_unless_rust_log_names_it() {
        assert_eq!(log_spec(None), "warn,lapin=off");
        assert_eq!(log_spec(Some(" ")), "warn,lapin=off");
        assert_eq!(log_spec(Some("info")), "info,lapin=off");
        assert_eq!(
            log_spec(Some("warn,fleet_budget=debug")),
            "warn,fleet_budget=debug,lapin=off"
        );
        assert_eq!(log_spec(Some("info,lapin=debug")), "info,lapin=debug");
    }
}
