//! `budgetctl simulate capacity`: [`fleet_budget_sim::capacity`] without a budget, and with one
//! beside it when asked, as a table per tick, JSON, or an SVG chart.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use fleet_budget_sim::BudgetParams;
use fleet_budget_sim::capacity::{self, CapacityParams, CapacityReport};
use serde::Serialize;

use super::chart;
use super::{DepositArg, MAX_MODEL_JOBS, budget_params, ratio};
use crate::exit::usage;
use crate::output::{print_json, table, thousands};

/// The version of this command's `--json` shape (`docs/schemas/simulate-capacity.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// `simulate capacity`.
#[derive(Debug, Args)]
pub(crate) struct CapacityArgs {
    /// New jobs per tick.
    #[arg(long, default_value_t = 900, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    incoming: u64,
    /// Ticks to simulate.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    ticks: u32,
    /// Calls the dependency serves per tick when healthy.
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    capacity: u64,
    /// Calls it serves per tick while degraded.
    #[arg(long, default_value_t = 200, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    degraded_capacity: u64,
    /// First degraded tick (ticks count from 0).
    #[arg(long, default_value_t = 5)]
    degraded_from: u32,
    /// How many ticks the dependency stays degraded.
    #[arg(long, default_value_t = 3)]
    degraded_ticks: u32,
    /// Executions per job at most, including the first.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=100))]
    attempts: u32,
    /// Retries allowed per deposit; without it, no budget.
    #[arg(long, allow_negative_numbers = true, value_parser = ratio)]
    budget_ratio: Option<f64>,
    /// What earns allowance.
    #[arg(long, value_enum, default_value_t = DepositArg::Success)]
    deposit: DepositArg,
    /// Length of the budget's sliding window, in ticks.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=86_400))]
    window_ticks: u32,
    /// Retries always allowed per window.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true)]
    min_allowance: u64,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Draw offered load per tick, with and without the budget, to this SVG file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

impl CapacityArgs {
    /// The model's parameters with `budget`.
    fn params(&self, budget: Option<BudgetParams>) -> CapacityParams {
        CapacityParams {
            incoming: self.incoming,
            ticks: self.ticks,
            capacity: self.capacity,
            degraded_capacity: self.degraded_capacity,
            degraded_from: self.degraded_from,
            degraded_ticks: self.degraded_ticks,
            attempts: self.attempts,
            budget,
            window_ticks: self.window_ticks,
            seed: self.seed,
        }
    }
}

/// The JSON of `simulate capacity`: the run as asked, and the run without a budget beside it
/// when a budget was asked for.
#[derive(Debug, Serialize)]
struct CapacityOutput {
    #[serde(flatten)]
    run: CapacityReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    without_budget: Option<CapacityReport>,
}

/// The budget ratio drawn in the SVG when none is given.
const CHART_DEFAULT_RATIO: f64 = 0.1;

/// Runs the command.
pub(super) fn run(args: &CapacityArgs) -> anyhow::Result<()> {
    if args.incoming.saturating_mul(u64::from(args.ticks)) > MAX_MODEL_JOBS {
        return Err(usage(format!(
            "--incoming × --ticks must be at most {} (the model runs in this process)",
            thousands(MAX_MODEL_JOBS)
        )));
    }
    let without = capacity::run(&args.params(None))?;
    let with_ratio = args
        .budget_ratio
        .or(args.svg.as_ref().map(|_| CHART_DEFAULT_RATIO));
    let with = match with_ratio {
        Some(r) => {
            let budget = budget_params(r, args.deposit, args.min_allowance);
            Some(capacity::run(&args.params(Some(budget)))?)
        }
        None => None,
    };
    if let Some(path) = &args.svg {
        let chart = chart::Chart {
            params: args.params(None),
            without: &without,
            with: with.as_ref().unwrap_or(&without),
            ratio: with_ratio.unwrap_or(CHART_DEFAULT_RATIO),
        };
        chart
            .draw(path)
            .with_context(|| format!("cannot write the chart to {}", path.display()))?;
        eprintln!("chart written to {}", path.display());
    }
    if args.json {
        let output = match (args.budget_ratio, with) {
            (Some(_), Some(with)) => CapacityOutput {
                run: with,
                without_budget: Some(without),
            },
            _ => CapacityOutput {
                run: without,
                without_budget: None,
            },
        };
        return print_json(JSON_SCHEMA_VERSION, &output);
    }
    outln!(
        "capacity: {} jobs/tick, capacity {} dropping to {} for {} ticks from tick {}, up to {} attempts",
        thousands(args.incoming),
        thousands(args.capacity),
        thousands(args.degraded_capacity),
        args.degraded_ticks,
        args.degraded_from,
        args.attempts
    );
    let shown = args.budget_ratio.and(with.as_ref());
    out!("{}", table(&tick_rows(&without, shown, args.budget_ratio)));
    outln!(
        "no budget:   peak offered {} per tick, served {}, dead-lettered {}",
        thousands(without.peak_offered),
        thousands(without.served_total),
        thousands(without.dead_lettered_total)
    );
    if let (Some(w), Some(ratio)) = (shown, args.budget_ratio) {
        #[allow(clippy::cast_precision_loss)]
        let cut = if without.peak_offered == 0 {
            0.0
        } else {
            100.0 * (1.0 - w.peak_offered as f64 / without.peak_offered as f64)
        };
        outln!(
            "budget {:.0}%: peak offered {} per tick ({cut:.0}% lower), served {}, dead-lettered {}",
            ratio * 100.0,
            thousands(w.peak_offered),
            thousands(w.served_total),
            thousands(w.dead_lettered_total)
        );
    }
    Ok(())
}

/// The table of ticks: the run without a budget, and the run with `ratio` beside it.
fn tick_rows(
    without: &CapacityReport,
    with: Option<&CapacityReport>,
    ratio: Option<f64>,
) -> Vec<Vec<String>> {
    let header = [
        "tick",
        "offered",
        "served",
        "failed",
        "retried",
        "dead-lettered",
    ]
    .map(str::to_owned);
    let mut rows = Vec::new();
    if with.is_some() {
        let mut title = vec![String::new(); header.len()];
        if let Some(c) = title.get_mut(1) {
            *c = "no budget:".to_owned();
        }
        title.push("|".to_owned());
        title.push(format!("{:.0}% budget:", ratio.unwrap_or(0.0) * 100.0));
        rows.push(title);
        let mut h = header.to_vec();
        h.push("|".to_owned());
        h.extend(header.iter().skip(1).cloned());
        rows.push(h);
    } else {
        rows.push(header.to_vec());
    }
    for (i, t) in without.ticks.iter().enumerate() {
        let mut row = vec![
            t.tick.to_string(),
            thousands(t.offered),
            thousands(t.served),
            thousands(t.failed),
            thousands(t.retries_granted),
            thousands(t.dead_lettered),
        ];
        if let Some(b) = with.and_then(|w| w.ticks.get(i)) {
            row.extend([
                "|".to_owned(),
                thousands(b.offered),
                thousands(b.served),
                thousands(b.failed),
                thousands(b.retries_granted),
                thousands(b.dead_lettered),
            ]);
        }
        rows.push(row);
    }
    rows
}
