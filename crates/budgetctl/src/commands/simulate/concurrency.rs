//! `budgetctl simulate concurrency`: [`fleet_budget_sim::concurrency`], the calls in flight
//! against a dependency's cap with no budget, with separate pools and with the concurrency
//! budget, as a table or JSON; with `--timeline`, [`fleet_budget_sim::slowing`], the same
//! dependency tick by tick while it slows down, without and with the budget (`--svg` draws it).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use fleet_budget_sim::concurrency::{self, ConcurrencyParams, MAX_RETRIES};
use fleet_budget_sim::slowing::{self, SlowingBudget, SlowingParams, SlowingReport};
use serde::Serialize;

use super::timeline_chart::TimelineChart;
use crate::args::number_in;
use crate::exit::usage;
use crate::output::{print_json, table};

/// The version of this command's `--json` shapes, the report and the `--timeline`
/// (`docs/schemas/simulate-concurrency.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// `simulate concurrency`.
#[derive(Debug, Args)]
pub(crate) struct ConcurrencyArgs {
    /// The dependency's cap on calls in flight.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    cap: u64,
    /// Primary calls in flight at planned load (from 1 to the cap).
    #[arg(long, default_value_t = 16.0, allow_negative_numbers = true, value_parser = primary)]
    primary: f64,
    /// Probability that one call fails, from 0 to 1 (default 0.2; with --timeline, 0.05 besides
    /// the timeouts).
    #[arg(long, allow_negative_numbers = true, value_parser = probability)]
    failure_rate: Option<f64>,
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
    /// Run tick by tick while the dependency slows down (latency rises near the cap, calls queue
    /// past it, timeouts become failures), without and with the concurrency budget.
    #[arg(long)]
    timeline: bool,
    /// With --timeline: ticks to run.
    #[arg(long, allow_negative_numbers = true, default_value_t = 600, value_parser = clap::value_parser!(u32).range(1..=i64::from(slowing::MAX_TICKS)))]
    ticks: u32,
    /// With --timeline: length of a tick, ms.
    #[arg(long, default_value_t = 100.0, value_parser = millis)]
    tick_ms: f64,
    /// With --timeline: latency of an unloaded call, ms.
    #[arg(long, default_value_t = 200.0, value_parser = millis)]
    latency_ms: f64,
    /// With --timeline: the caller's timeout, ms.
    #[arg(long, default_value_t = 1000.0, value_parser = millis)]
    timeout_ms: f64,
    /// With --timeline: latency multiplier while the dependency is slow (1 to 1000).
    #[arg(long, default_value_t = 1.08, value_parser = slow_factor)]
    slow_factor: f64,
    /// With --timeline: first slow tick.
    #[arg(long, default_value_t = 50)]
    slow_from: u32,
    /// With --timeline: number of slow ticks.
    #[arg(long, default_value_t = 200)]
    slow_ticks: u32,
    /// Draw the timeline (calls in flight per tick, without and with the budget) to this SVG
    /// file; implies --timeline.
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn millis(s: &str) -> Result<f64, String> {
    number_in(s, 0.001..=1e9, "milliseconds from 0.001 to 10^9")
}

fn slow_factor(s: &str) -> Result<f64, String> {
    number_in(s, 1.0..=1000.0, "a latency multiplier from 1 to 1000")
}

/// The JSON of `--timeline`.
#[derive(Debug, Serialize)]
struct TimelineOutput {
    model: &'static str,
    cap: u64,
    primary: f64,
    failure_rate: f64,
    retries: u32,
    latency_ms: f64,
    timeout_ms: f64,
    slow_factor: f64,
    slow_from: u32,
    slow_ticks: u32,
    tick_ms: f64,
    without_budget: SlowingReport,
    with_budget: SlowingReport,
}

fn timeline(args: &ConcurrencyArgs) -> anyhow::Result<()> {
    let params = SlowingParams {
        cap: args.cap,
        primary: args.primary,
        latency_ms: args.latency_ms,
        timeout_ms: args.timeout_ms,
        failure_rate: args.failure_rate.unwrap_or(0.05),
        retries: args.retries,
        slow_factor: args.slow_factor,
        slow_from: args.slow_from,
        slow_ticks: args.slow_ticks,
        ticks: args.ticks,
        tick_ms: args.tick_ms,
        budget: None,
    };
    let without = slowing::run(&params).map_err(|e| usage(e.to_string()))?;
    let with = slowing::run(&SlowingParams {
        budget: Some(SlowingBudget {
            min_retry_slots: args.min_retry_slots,
            max_retry_fraction: args.max_retry_fraction,
        }),
        ..params
    })
    .map_err(|e| usage(e.to_string()))?;
    if let Some(path) = &args.svg {
        TimelineChart {
            params,
            without: &without,
            with: &with,
        }
        .draw(path)
        .with_context(|| format!("cannot write the chart to {}", path.display()))?;
        eprintln!("chart written to {}", path.display());
    }
    if args.json {
        return print_json(
            JSON_SCHEMA_VERSION,
            &TimelineOutput {
                model: "timeline",
                cap: params.cap,
                primary: params.primary,
                failure_rate: params.failure_rate,
                retries: params.retries,
                latency_ms: params.latency_ms,
                timeout_ms: params.timeout_ms,
                slow_factor: params.slow_factor,
                slow_from: params.slow_from,
                slow_ticks: params.slow_ticks,
                tick_ms: params.tick_ms,
                without_budget: without,
                with_budget: with,
            },
        );
    }
    outln!(
        "timeline: cap {}, {} primary calls in flight, latency {} ms ×{} from tick {} for {} ticks of {} ms, timeout {} ms, {:.0}% other failures, up to {} retries per failure",
        params.cap,
        num(params.primary),
        num(params.latency_ms),
        num(params.slow_factor),
        params.slow_from,
        params.slow_ticks,
        num(params.tick_ms),
        num(params.timeout_ms),
        params.failure_rate * 100.0,
        params.retries
    );
    let recovery = |r: &SlowingReport| {
        r.recovery_ticks.map_or_else(
            || "not within the run".to_owned(),
            |t| format!("{t} ticks after"),
        )
    };
    let row = |name: &str, f: &dyn Fn(&SlowingReport) -> String| {
        vec![name.to_owned(), f(&without), f(&with)]
    };
    let rows = vec![
        ["", "no budget", "concurrency budget"]
            .map(str::to_owned)
            .to_vec(),
        row("peak in flight", &|r| num(r.peak_in_flight)),
        row("peak latency ms", &|r| num(r.peak_latency_ms)),
        row("timeouts", &|r| num(r.timeouts_total)),
        row("failures", &|r| num(r.failures_total)),
        row("succeeded", &|r| num(r.succeeded_total)),
        row("retries started", &|r| num(r.retries_started_total)),
        row("retries refused", &|r| num(r.retries_refused_total)),
        row("in flight at the end", &|r| num(r.in_flight_at_end)),
        row("back to its load before", &recovery),
    ];
    out!("{}", table(&rows));
    Ok(())
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
    if args.timeline || args.svg.is_some() {
        return timeline(args);
    }
    let report = concurrency::analyze(&ConcurrencyParams {
        cap: args.cap,
        primary: args.primary,
        failure_rate: args.failure_rate.unwrap_or(0.2),
        retries: args.retries,
        min_retry_slots: args.min_retry_slots,
        max_retry_fraction: args.max_retry_fraction,
    })
    .map_err(|e| usage(e.to_string()))?;
    if args.json {
        return print_json(JSON_SCHEMA_VERSION, &report);
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
