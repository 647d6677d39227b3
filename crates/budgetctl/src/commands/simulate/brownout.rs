//! `budgetctl simulate brownout`: [`fleet_budget_sim::brownout`], once or as the mean of
//! several seeds.

use clap::Args;
use fleet_budget::DepositBasis;
use fleet_budget_sim::brownout::{self, BrownoutParams};
use serde::Serialize;

use super::{DepositArg, MAX_MODEL_JOBS, budget_params, ratio};
use crate::args::number_in;
use crate::exit::usage;
use crate::output::{print_json, table, thousands};

/// The version of this command's `--json` shape (`docs/schemas/simulate-brownout.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// `simulate brownout`.
#[derive(Debug, Args)]
pub(crate) struct BrownoutArgs {
    /// Client requests (jobs).
    #[arg(long, default_value_t = 2000, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    requests: u64,
    /// Executions per request at most, including the first.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=100))]
    attempts: u32,
    /// Probability that one attempt fails, from 0 to 1.
    #[arg(long, allow_negative_numbers = true, value_parser = probability)]
    failure_rate: f64,
    /// Retries allowed per deposit; without it, no budget.
    #[arg(long, allow_negative_numbers = true, value_parser = ratio)]
    budget_ratio: Option<f64>,
    /// What earns allowance.
    #[arg(long, value_enum, default_value_t = DepositArg::Success)]
    deposit: DepositArg,
    /// Retries always allowed in the window.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true)]
    min_allowance: u64,
    /// Random seed (of the first run).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Runs with seeds `seed`, `seed + 1`, ...; the numbers printed are their means.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// A run's report (or the mean of several) as `--json` prints it: the model's figures, then the
/// names two of them had before 0.2.0.
#[derive(Serialize)]
struct WithOldNames<'a, R, N> {
    #[serde(flatten)]
    report: &'a R,
    /// Deprecated: `first_attempts` under its name before 0.2.0, printed until 0.3.0.
    client_requests: N,
    /// Deprecated: `executions` under its name before 0.2.0, printed until 0.3.0.
    upstream_calls: N,
}

fn probability(s: &str) -> Result<f64, String> {
    number_in(s, 0.0..=1.0, "a probability from 0 to 1")
}

/// Runs the command.
pub(super) fn run(args: &BrownoutArgs) -> anyhow::Result<()> {
    if args.requests.saturating_mul(u64::from(args.runs)) > MAX_MODEL_JOBS {
        return Err(usage(format!(
            "--requests × --runs must be at most {} (the model runs in this process)",
            thousands(MAX_MODEL_JOBS)
        )));
    }
    let budget = args
        .budget_ratio
        .map(|r| budget_params(r, args.deposit, args.min_allowance));
    let mut reports = Vec::new();
    for i in 0..u64::from(args.runs) {
        reports.push(brownout::run(&BrownoutParams {
            requests: args.requests,
            attempts: args.attempts,
            failure_rate: args.failure_rate,
            budget,
            seed: args.seed.wrapping_add(i),
        })?);
    }
    let m = brownout::mean(&reports);
    if args.json {
        return match reports.first() {
            Some(single) if args.runs == 1 => print_json(
                JSON_SCHEMA_VERSION,
                &WithOldNames {
                    report: single,
                    client_requests: single.first_attempts,
                    upstream_calls: single.executions,
                },
            ),
            _ => print_json(
                JSON_SCHEMA_VERSION,
                &WithOldNames {
                    report: &m,
                    client_requests: m.first_attempts,
                    upstream_calls: m.executions,
                },
            ),
        };
    }
    let budget_text = match budget {
        Some(b) => format!(
            "budget {:.0}% of {} (floor {})",
            b.ratio * 100.0,
            match b.deposit {
                DepositBasis::Success => "successes",
                DepositBasis::Request => "first attempts",
            },
            b.min_allowance
        ),
        None => "no budget".to_owned(),
    };
    outln!(
        "brownout: {} requests, up to {} attempts, {:.1}% of attempts fail, {budget_text}",
        thousands(args.requests),
        args.attempts,
        args.failure_rate * 100.0
    );
    let row = |name: &str, value: String| vec![name.to_owned(), value];
    let rows = vec![
        row("first attempts", format!("{:.0}", m.first_attempts)),
        row("executions", format!("{:.1}", m.executions)),
        row("amplification", format!("{:.3}x", m.amplification)),
        row("successes", format!("{:.1}", m.successes)),
        row("retries granted", format!("{:.1}", m.retries_granted)),
        row("retries denied", format!("{:.1}", m.retries_denied)),
    ];
    if args.runs > 1 {
        outln!(
            "mean of {} runs (seeds {}..={})",
            args.runs,
            args.seed,
            args.seed.wrapping_add(u64::from(args.runs) - 1)
        );
    }
    out!("{}", table(&rows));
    Ok(())
}
