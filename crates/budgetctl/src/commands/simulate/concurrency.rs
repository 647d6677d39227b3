//! `budgetctl simulate concurrency`: [`fleet_budget_sim::concurrency`], the calls in flight
//! against a dependency's cap with no budget, with separate pools and with the concurrency
//! budget, as a table or JSON.

use clap::Args;
use fleet_budget_sim::concurrency::{self, ConcurrencyParams, MAX_RETRIES};

use crate::args::number_in;
use crate::exit::usage;
use crate::output::{print_json, table};

/// `simulate concurrency`.
#[derive(Debug, Args)]
pub(crate) struct ConcurrencyArgs {
    /// The dependency's cap on calls in flight.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    cap: u64,
    /// Primary calls in flight at planned load (from 1 to the cap).
    #[arg(long, default_value_t = 16.0, allow_negative_numbers = true, value_parser = primary)]
    primary: f64,
    /// Probability that one call fails, from 0 to 1.
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true, value_parser = probability)]
    failure_rate: f64,
    /// Retries per failure at most (a failed retry is retried again).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_RETRIES)))]
    retries: u32,
    /// Retry slots always allowed, however few primary calls are in flight.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=1_000_000_000))]
    min_retry_slots: u64,
    /// Retry slots per primary call in flight; without it, (cap − primary) / primary.
    #[arg(long, allow_negative_numbers = true, value_parser = fraction)]
    max_retry_fraction: Option<f64>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

fn primary(s: &str) -> Result<f64, String> {
    number_in(s, 1.0..=1e9, "a number of calls from 1 to the cap")
}

fn probability(s: &str) -> Result<f64, String> {
    number_in(s, 0.0..=1.0, "a probability from 0 to 1")
}

fn fraction(s: &str) -> Result<f64, String> {
    number_in(
        s,
        0.0..=1000.0,
        "a number from 0 to 1000 (retry slots per primary call)",
    )
}

/// Runs the command.
pub(super) fn run(args: &ConcurrencyArgs) -> anyhow::Result<()> {
    let report = concurrency::analyze(&ConcurrencyParams {
        cap: args.cap,
        primary: args.primary,
        failure_rate: args.failure_rate,
        retries: args.retries,
        min_retry_slots: args.min_retry_slots,
        max_retry_fraction: args.max_retry_fraction,
    })
    .map_err(|e| usage(e.to_string()))?;
    if args.json {
        return print_json(&report);
    }
    let r = &report;
    outln!(
        "concurrency: cap {}, {} primary calls in flight, {:.0}% failures, up to {} retries per failure",
        r.cap,
        num(r.primary),
        r.failure_rate * 100.0,
        r.retries
    );
    outln!(
        "max retry fraction {} ({} retry slots, at least {})",
        num(r.max_retry_fraction),
        r.retry_slots,
        args.min_retry_slots
    );
    let over = |v: f64| {
        #[allow(clippy::cast_precision_loss)]
        let cap = r.cap as f64;
        if v > cap { "over the cap" } else { "" }.to_owned()
    };
    #[allow(clippy::cast_precision_loss)]
    let pools = r.separate_pools_worst_case as f64;
    let rows = vec![
        ["retrying", "in flight", ""].map(str::to_owned).to_vec(),
        vec![
            "no budget".to_owned(),
            num(r.offered_in_flight),
            over(r.offered_in_flight),
        ],
        vec![
            "separate pools, worst case".to_owned(),
            num(pools),
            over(pools),
        ],
        vec![
            "concurrency budget".to_owned(),
            num(r.offered_in_flight_with_budget),
            format!("{} retries refused", num(r.retries_refused)),
        ],
    ];
    out!("{}", table(&rows));
    Ok(())
}

/// A number with at most two decimals and no trailing zeros.
fn num(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}
