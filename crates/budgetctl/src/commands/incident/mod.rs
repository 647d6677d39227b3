//! `budgetctl incident report`: one dependency's incident for the postmortem, from what the
//! fleet recorded: the per-minute counters in Prometheus (denials, amplification, dead letters,
//! breaker transitions; the incidents found as `tune` finds them), the audit trail in Redis
//! (overrides with who and why, replays and purges with their counts), the dead-letter index
//! (what still waits, by reason and error class) and the dead-letter ledger (what the workers
//! dead-lettered). Markdown or HTML, with SVG charts. The model, the accounting and the text of
//! each section, the reading of Prometheus and the charts are the library's
//! (`fleet_budget_amqp::incident`), which the console's incident page renders too.

mod render;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use fleet_budget::Dependency;
use fleet_budget::metrics::Prometheus;
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::incident::Report;
use fleet_budget_amqp::topology::Topology;

use crate::commands::tune::Range;
use crate::exit::usage;
use crate::redis_conn;
use crate::when::{self, When};

/// `incident`.
#[derive(Debug, Subcommand)]
pub(crate) enum IncidentCommand {
    /// A dependency's incident for the postmortem: the budget exhausted and recovered, denials
    /// and amplification per minute, breaker transitions, overrides (who, why), dead letters by
    /// reason and error class, replays and their accounting; Markdown or HTML with charts.
    Report(ReportArgs),
}

/// The format of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Markdown (charts as files in `--chart-dir`, linked).
    Md,
    /// One HTML page, charts inline.
    Html,
}

/// `incident report`.
#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// The dependency.
    #[arg(long, value_name = "NAME")]
    pub(crate) dependency: String,
    /// The start: a duration ago (`2h`) or an RFC 3339 time.
    #[arg(long, value_name = "WHEN", value_parser = when::when)]
    pub(crate) since: When,
    /// The end (default now).
    #[arg(long, value_name = "WHEN", value_parser = when::when)]
    pub(crate) until: Option<When>,
    /// `md` or `html`.
    #[arg(long, value_enum, default_value = "md")]
    pub(crate) format: Format,
    /// Prometheus's URL, for the per-minute figures (without it: the audit trail and the
    /// dead-letter index only, said in the report).
    #[arg(
        long,
        value_name = "URL",
        env = "FLEET_BUDGET_PROMETHEUS_URL",
        hide_env_values = true
    )]
    pub(crate) prometheus: Option<String>,
    /// The step of the per-minute figures (at least twice the scrape interval).
    #[arg(long, value_name = "DURATION", value_parser = when::duration, default_value = "60s")]
    pub(crate) step: Duration,
    /// Deadline of each request to Prometheus.
    #[arg(long, value_name = "DURATION", value_parser = when::duration, default_value = "30s")]
    pub(crate) timeout: Duration,
    /// Write the report here instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
    /// Markdown: write the charts here (`<dependency>-<chart>.svg`) and link them.
    #[arg(long, value_name = "DIR")]
    pub(crate) chart_dir: Option<PathBuf>,
}

/// `budgetctl incident report --dependency D --since T [--until T] [--format md|html]`.
pub(crate) async fn run(config: &WorkerConfig, command: &IncidentCommand) -> anyhow::Result<()> {
    let IncidentCommand::Report(args) = command;
    let dependency =
        Dependency::new(&args.dependency).map_err(|e| usage(format!("--dependency: {e}")))?;
    let range = Range::of(args.since, args.until, Some(args.step))?;
    let policy = config.budget.policy(&dependency);
    let mut report = Report::new(dependency.as_str(), range.start_ms, range.end_ms);
    report.step_ms = range.step_ms;
    report.ratio = policy.ratio;
    report.min_allowance = policy.min_allowance;
    match &args.prometheus {
        Some(url) => {
            let prometheus = Prometheus::parse(url, args.timeout)
                .map_err(|e| usage(format!("--prometheus {e}")))?;
            // Like every source, a Prometheus that fails is said in the report, not fatal: the
            // audit trail and the accounting stand without it.
            if let Err(e) = report.read_prometheus(&prometheus, policy.deposit).await {
                let e = fleet_budget::redact::redact_text(&e);
                eprintln!(
                    "warning: Prometheus could not be read, the report has no per-minute figures: {}",
                    fleet_budget::printable::escape_text(&e)
                );
                report
                    .sources
                    .push(format!("Prometheus could not be read: {e}"));
            }
        }
        None => report.sources.push(
            "no Prometheus (--prometheus): no per-minute figures, incidents or breaker \
             transitions"
                .to_owned(),
        ),
    }
    match redis_conn::connect(&config.budget, redis_conn::cli_timeout(&config.budget)).await {
        Ok(store) => {
            report
                .read_redis(
                    &store,
                    &config.budget.audit.log(),
                    &Topology::new(&config.amqp),
                    &config.budget.redis_display(),
                )
                .await;
        }
        Err(e) => report.sources.push(format!(
            "Redis could not be reached, no audit trail, dead-letter index or ledger: {}",
            fleet_budget::redact::redact_text(&format!("{e:#}"))
        )),
    }
    report.finish();
    // The accounting, one line per reason × error class, beside the report (stderr).
    for line in report.accounting.lines() {
        eprintln!(
            "accounting: {}",
            fleet_budget::printable::escape_text(&line)
        );
    }
    let text = match args.format {
        Format::Md => render::markdown(&report, args.chart_dir.as_deref())?,
        Format::Html => render::html(&report),
    };
    match &args.output {
        Some(path) => std::fs::write(path, text)
            .map_err(|e| anyhow::anyhow!("--output {}: {e}", path.display()))?,
        None => out!("{text}"),
    }
    Ok(())
}
