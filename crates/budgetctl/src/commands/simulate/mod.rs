//! `budgetctl simulate`: the retry-storm models of `fleet-budget-sim`, with their arguments,
//! tables and chart.

mod brownout;
mod capacity;
mod chart;
mod concurrency;
mod svg;
mod timeline_chart;

use clap::{Subcommand, ValueEnum};
use fleet_budget::DepositBasis;
use fleet_budget::config::MAX_RATIO;
use fleet_budget_sim::BudgetParams;

pub(crate) use self::brownout::BrownoutArgs;
pub(crate) use self::capacity::CapacityArgs;
pub(crate) use self::concurrency::ConcurrencyArgs;
use crate::args::number_in;

/// The most jobs one `simulate` command models, so that no input makes it run for hours.
const MAX_MODEL_JOBS: u64 = 20_000_000;

/// `simulate` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum SimulateCommand {
    /// Requests with up to K attempts against a dependency failing at a fixed rate.
    Brownout(BrownoutArgs),
    /// Ticks of load against a dependency whose capacity drops for a while, with and without budget.
    Capacity(CapacityArgs),
    /// Calls in flight against a dependency's cap: no budget, separate pools, concurrency budget.
    Concurrency(ConcurrencyArgs),
}

/// Runs a `simulate` subcommand.
pub(crate) fn run(command: &SimulateCommand) -> anyhow::Result<()> {
    match command {
        SimulateCommand::Brownout(args) => brownout::run(args),
        SimulateCommand::Capacity(args) => capacity::run(args),
        SimulateCommand::Concurrency(args) => concurrency::run(args),
    }
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
    fn basis(self) -> DepositBasis {
        match self {
            Self::Success => DepositBasis::Success,
            Self::Request => DepositBasis::Request,
        }
    }
}

/// The model budget of `--budget-ratio R --deposit D --min-allowance M`.
fn budget_params(ratio: f64, deposit: DepositArg, min_allowance: u64) -> BudgetParams {
    BudgetParams {
        ratio,
        deposit: deposit.basis(),
        min_allowance,
    }
}

/// `--budget-ratio`: retries per deposit, as the configuration accepts them.
fn ratio(s: &str) -> Result<f64, String> {
    number_in(
        s,
        0.0..=MAX_RATIO,
        &format!("a number from 0 to {MAX_RATIO} (retries per deposit)"),
    )
}
