//! The retry-storm models of `budgetctl simulate`, run through the project's real budget code:
//! a [`FleetBudget`] on a [`LocalStore`] whose clock only moves when the model says so.
//!
//! * **brownout**: each request makes up to K attempts; each attempt fails independently with
//!   probability P; a failed attempt retries at once if attempts remain and the budget grants.
//!   One window covers the whole run (time is not involved).
//! * **capacity**: each tick, offered = new jobs + retries scheduled for this tick; the dependency
//!   serves `min(offered, capacity)` of them chosen at random; each failed attempt retries next
//!   tick if attempts remain and the budget (a sliding window of W ticks) grants, else it is
//!   dead-lettered.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fleet_budget::clock::ManualClock;
use fleet_budget::store::LocalStore;
use fleet_budget::{
    BudgetPolicy, Config, Decision, DepositBasis, Failure, FleetBudget, WindowMode,
};
use futures::executor::block_on;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::cli::{BrownoutArgs, CapacityArgs};
use crate::output::{print_json, table, thousands};

/// The most jobs one `simulate` command models, so that no input makes it run for hours.
const MAX_MODEL_JOBS: u64 = 20_000_000;

/// The task every simulated job runs, and so the dependency whose budget it spends.
const TASK: &str = "upstream";

/// A retry budget for a model.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BudgetParams {
    /// Retries allowed per deposit.
    pub(crate) ratio: f64,
    /// What earns allowance.
    pub(crate) deposit: DepositBasis,
    /// Retries always allowed per window.
    pub(crate) min_allowance: u64,
}

/// A [`FleetBudget`] kept in this process on a manual clock, with `max_attempts` executions per
/// job and one policy for every dependency.
fn model_budget(
    params: BudgetParams,
    window: Duration,
    max_attempts: u32,
    clock: &ManualClock,
    seed: u64,
) -> FleetBudget {
    let mut config = Config {
        defaults: BudgetPolicy {
            window,
            ratio: params.ratio,
            min_allowance: params.min_allowance,
            deposit: params.deposit,
            mode: WindowMode::Sliding,
        },
        ..Config::default()
    };
    config.ceilings.default.max_attempts = max_attempts;
    FleetBudget::builder(&config)
        .local_store(LocalStore::with_clock(Arc::new(clock.clone())))
        .seed(seed)
        .build()
}

/// What a model's budget said about one failed attempt.
enum RetryVerdict {
    Granted,
    Denied,
    Exhausted,
}

/// Asks `budget` (or, without one, only the attempt ceiling) whether a failed attempt retries.
fn ask(
    budget: Option<&FleetBudget>,
    attempt: u32,
    max_attempts: u32,
) -> anyhow::Result<RetryVerdict> {
    let Some(budget) = budget else {
        return Ok(if attempt >= max_attempts {
            RetryVerdict::Exhausted
        } else {
            RetryVerdict::Granted
        });
    };
    let failure = Failure::retryable("simulated failure");
    Ok(
        match block_on(budget.on_failure(TASK, attempt, &failure))? {
            Decision::Retry { .. } => RetryVerdict::Granted,
            Decision::DeadLetter {
                reason: fleet_budget::DeadLetterReason::BudgetExhausted,
                ..
            } => RetryVerdict::Denied,
            Decision::DeadLetter { .. } => RetryVerdict::Exhausted,
        },
    )
}

// ---------------------------------------------------------------------------------------------
// brownout

/// Parameters of the brownout model.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BrownoutParams {
    pub(crate) requests: u64,
    pub(crate) attempts: u32,
    pub(crate) failure_rate: f64,
    pub(crate) budget: Option<BudgetParams>,
    pub(crate) seed: u64,
}

/// The result of one brownout run.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct BrownoutReport {
    pub(crate) client_requests: u64,
    pub(crate) upstream_calls: u64,
    pub(crate) amplification: f64,
    pub(crate) successes: u64,
    pub(crate) retries_granted: u64,
    pub(crate) retries_denied: u64,
}

/// Runs the brownout model once.
pub(crate) fn brownout(p: &BrownoutParams) -> anyhow::Result<BrownoutReport> {
    let clock = ManualClock::new(0);
    // One window covering the run: the longest window the configuration accepts.
    let window = Duration::from_secs(86_400);
    let budget = p
        .budget
        .map(|b| model_budget(b, window, p.attempts, &clock, p.seed));
    let mut rng = SmallRng::seed_from_u64(p.seed);
    let mut r = BrownoutReport {
        client_requests: p.requests,
        ..BrownoutReport::default()
    };
    for _ in 0..p.requests {
        let mut attempt = 1u32;
        loop {
            r.upstream_calls += 1;
            if let Some(b) = &budget {
                block_on(b.on_attempt(TASK, attempt))?;
            }
            if rng.random::<f64>() >= p.failure_rate {
                r.successes += 1;
                if let Some(b) = &budget {
                    block_on(b.on_success(TASK))?;
                }
                break;
            }
            match ask(budget.as_ref(), attempt, p.attempts)? {
                RetryVerdict::Granted => r.retries_granted += 1,
                RetryVerdict::Denied => {
                    r.retries_denied += 1;
                    break;
                }
                RetryVerdict::Exhausted => break,
            }
            attempt += 1;
        }
    }
    r.amplification = ratio(r.upstream_calls, r.client_requests);
    Ok(r)
}

#[allow(clippy::cast_precision_loss)]
fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The means of several brownout runs.
#[derive(Debug, Clone, Copy, Default, Serialize)]
struct BrownoutMean {
    client_requests: f64,
    upstream_calls: f64,
    amplification: f64,
    successes: f64,
    retries_granted: f64,
    retries_denied: f64,
    runs: u32,
}

#[allow(clippy::cast_precision_loss)]
fn mean(reports: &[BrownoutReport]) -> BrownoutMean {
    let n = reports.len().max(1) as f64;
    let sum = |f: fn(&BrownoutReport) -> u64| reports.iter().map(f).sum::<u64>() as f64 / n;
    let mut m = BrownoutMean {
        client_requests: sum(|r| r.client_requests),
        upstream_calls: sum(|r| r.upstream_calls),
        successes: sum(|r| r.successes),
        retries_granted: sum(|r| r.retries_granted),
        retries_denied: sum(|r| r.retries_denied),
        runs: u32::try_from(reports.len()).unwrap_or(u32::MAX),
        amplification: 0.0,
    };
    m.amplification = if m.client_requests > 0.0 {
        m.upstream_calls / m.client_requests
    } else {
        0.0
    };
    m
}

/// `budgetctl simulate brownout`.
pub(crate) fn brownout_command(args: &BrownoutArgs) -> anyhow::Result<()> {
    if args.requests.saturating_mul(u64::from(args.runs)) > MAX_MODEL_JOBS {
        return Err(crate::exit::usage(format!(
            "--requests × --runs must be at most {} (the model runs in this process)",
            thousands(MAX_MODEL_JOBS)
        )));
    }
    let budget = args.budget_ratio.map(|ratio| BudgetParams {
        ratio,
        deposit: args.deposit.basis(),
        min_allowance: args.min_allowance,
    });
    let mut reports = Vec::new();
    for i in 0..u64::from(args.runs) {
        let params = BrownoutParams {
            requests: args.requests,
            attempts: args.attempts,
            failure_rate: args.failure_rate,
            budget,
            seed: args.seed.wrapping_add(i),
        };
        reports.push(brownout(&params)?);
    }
    let single = reports.first().copied().unwrap_or_default();
    if args.json {
        if args.runs == 1 {
            return print_json(&single);
        }
        return print_json(&mean(&reports));
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
    let m = mean(&reports);
    let rows = vec![
        vec![
            "client requests".to_owned(),
            format!("{:.0}", m.client_requests),
        ],
        vec![
            "upstream calls".to_owned(),
            format!("{:.1}", m.upstream_calls),
        ],
        vec![
            "amplification".to_owned(),
            format!("{:.3}x", m.amplification),
        ],
        vec!["successes".to_owned(), format!("{:.1}", m.successes)],
        vec![
            "retries granted".to_owned(),
            format!("{:.1}", m.retries_granted),
        ],
        vec![
            "retries denied".to_owned(),
            format!("{:.1}", m.retries_denied),
        ],
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

// ---------------------------------------------------------------------------------------------
// capacity

/// Parameters of the capacity model.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CapacityParams {
    pub(crate) incoming: u64,
    pub(crate) ticks: u32,
    pub(crate) capacity: u64,
    pub(crate) degraded_capacity: u64,
    pub(crate) degraded_from: u32,
    pub(crate) degraded_ticks: u32,
    pub(crate) attempts: u32,
    pub(crate) budget: Option<BudgetParams>,
    pub(crate) window_ticks: u32,
    pub(crate) seed: u64,
}

/// One tick of the capacity model.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct Tick {
    pub(crate) tick: u32,
    pub(crate) offered: u64,
    pub(crate) served: u64,
    pub(crate) failed: u64,
    pub(crate) retries_granted: u64,
    pub(crate) dead_lettered: u64,
}

/// The result of one capacity run.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct CapacityReport {
    pub(crate) ticks: Vec<Tick>,
    pub(crate) peak_offered: u64,
    pub(crate) served_total: u64,
    pub(crate) dead_lettered_total: u64,
}

/// Milliseconds of model time per tick.
const TICK_MS: u64 = 1000;

/// Runs the capacity model once.
pub(crate) fn capacity(p: &CapacityParams) -> anyhow::Result<CapacityReport> {
    let clock = ManualClock::new(0);
    let window = Duration::from_millis(TICK_MS.saturating_mul(u64::from(p.window_ticks.max(1))));
    let budget = p
        .budget
        .map(|b| model_budget(b, window, p.attempts, &clock, p.seed));
    let mut rng = SmallRng::seed_from_u64(p.seed);
    let mut report = CapacityReport::default();
    // Attempt numbers of the retries that run next tick.
    let mut scheduled: Vec<u32> = Vec::new();
    let degraded = p.degraded_from..p.degraded_from.saturating_add(p.degraded_ticks);
    for t in 0..p.ticks {
        // Everything of tick t happens in its middle: the sliding window weighs the previous
        // window by the part of it still inside the last W ticks.
        clock.set_ms(u64::from(t) * TICK_MS + TICK_MS / 2);
        let mut offered: Vec<u32> = std::mem::take(&mut scheduled);
        offered.extend(std::iter::repeat_n(
            1,
            usize::try_from(p.incoming).unwrap_or(usize::MAX),
        ));
        let capacity = if degraded.contains(&t) {
            p.degraded_capacity
        } else {
            p.capacity
        };
        let served = usize::try_from(capacity)
            .unwrap_or(usize::MAX)
            .min(offered.len());
        let (served_jobs, failed_jobs) = {
            let (chosen, rest) = offered.partial_shuffle(&mut rng, served);
            (chosen.to_vec(), rest.to_vec())
        };
        let mut tick = Tick {
            tick: t,
            offered: offered.len() as u64,
            served: served_jobs.len() as u64,
            failed: failed_jobs.len() as u64,
            ..Tick::default()
        };
        if let Some(b) = &budget {
            for attempt in &offered {
                block_on(b.on_attempt(TASK, *attempt))?;
            }
            for _ in &served_jobs {
                block_on(b.on_success(TASK))?;
            }
        }
        for attempt in failed_jobs {
            match ask(budget.as_ref(), attempt, p.attempts)? {
                RetryVerdict::Granted => {
                    tick.retries_granted += 1;
                    scheduled.push(attempt + 1);
                }
                RetryVerdict::Denied | RetryVerdict::Exhausted => tick.dead_lettered += 1,
            }
        }
        report.peak_offered = report.peak_offered.max(tick.offered);
        report.served_total += tick.served;
        report.dead_lettered_total += tick.dead_lettered;
        report.ticks.push(tick);
    }
    Ok(report)
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

/// `budgetctl simulate capacity`.
pub(crate) fn capacity_command(args: &CapacityArgs) -> anyhow::Result<()> {
    if args.incoming.saturating_mul(u64::from(args.ticks)) > MAX_MODEL_JOBS {
        return Err(crate::exit::usage(format!(
            "--incoming × --ticks must be at most {} (the model runs in this process)",
            thousands(MAX_MODEL_JOBS)
        )));
    }
    let budget_of = |ratio| BudgetParams {
        ratio,
        deposit: args.deposit.basis(),
        min_allowance: args.min_allowance,
    };
    let params = |budget| CapacityParams {
        incoming: args.incoming,
        ticks: args.ticks,
        capacity: args.capacity,
        degraded_capacity: args.degraded_capacity,
        degraded_from: args.degraded_from,
        degraded_ticks: args.degraded_ticks,
        attempts: args.attempts,
        budget,
        window_ticks: args.window_ticks,
        seed: args.seed,
    };
    let without = capacity(&params(None))?;
    let with_ratio = args
        .budget_ratio
        .or(args.svg.as_ref().map(|_| CHART_DEFAULT_RATIO));
    let with = match with_ratio {
        Some(r) => Some(capacity(&params(Some(budget_of(r))))?),
        None => None,
    };
    if let Some(path) = &args.svg {
        let ratio = with_ratio.unwrap_or(CHART_DEFAULT_RATIO);
        let with_run = with.as_ref().unwrap_or(&without);
        draw_svg(path, &without, with_run, ratio, args)
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
        return print_json(&output);
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
    if shown.is_some() {
        let mut title = vec![String::new(); header.len()];
        if let Some(c) = title.get_mut(1) {
            *c = "no budget:".to_owned();
        }
        title.push("|".to_owned());
        title.push(format!(
            "{:.0}% budget:",
            args.budget_ratio.unwrap_or(0.0) * 100.0
        ));
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
        if let Some(b) = shown.and_then(|w| w.ticks.get(i)) {
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
    out!("{}", table(&rows));
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

/// Draws offered load per tick, with and without the budget, as an SVG line chart.
fn draw_svg(
    path: &Path,
    without: &CapacityReport,
    with: &CapacityReport,
    ratio: f64,
    args: &CapacityArgs,
) -> anyhow::Result<()> {
    use plotters::prelude::*;

    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("{e}");
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let ticks = i64::from(args.ticks.max(1));
    let peak = without
        .peak_offered
        .max(with.peak_offered)
        .max(args.capacity)
        .max(1);
    #[allow(clippy::cast_precision_loss)]
    let y_max = peak as f64 * 1.1;
    let caption = format!(
        "Offered load per tick: {} jobs/tick, capacity {} -> {} for {} ticks",
        args.incoming, args.capacity, args.degraded_capacity, args.degraded_ticks
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0i64..(ticks - 1).max(1), 0f64..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("tick")
        .y_desc("calls offered to the dependency")
        .draw()
        .map_err(|e| err(&e))?;
    #[allow(clippy::cast_precision_loss)]
    let series = |r: &CapacityReport| -> Vec<(i64, f64)> {
        r.ticks
            .iter()
            .map(|t| (i64::from(t.tick), t.offered as f64))
            .collect()
    };
    #[allow(clippy::cast_precision_loss)]
    let capacity_line: Vec<(i64, f64)> = (0..ticks)
        .map(|t| {
            let degraded = t >= i64::from(args.degraded_from)
                && t < i64::from(args.degraded_from) + i64::from(args.degraded_ticks);
            (
                t,
                if degraded {
                    args.degraded_capacity
                } else {
                    args.capacity
                } as f64,
            )
        })
        .collect();
    chart
        .draw_series(LineSeries::new(series(without), RED.stroke_width(2)))
        .map_err(|e| err(&e))?
        .label("without budget")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(series(with), BLUE.stroke_width(2)))
        .map_err(|e| err(&e))?
        .label(format!("with a {:.0}% budget", ratio * 100.0))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(capacity_line, BLACK.mix(0.5)))
        .map_err(|e| err(&e))?
        .label("dependency capacity")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.5)));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brownout_mean(p: f64, budget: Option<BudgetParams>, runs: u64) -> BrownoutMean {
        let reports: Vec<_> = (1..=runs)
            .map(|seed| {
                brownout(&BrownoutParams {
                    requests: 2000,
                    attempts: 3,
                    failure_rate: p,
                    budget,
                    seed,
                })
                .unwrap()
            })
            .collect();
        mean(&reports)
    }

    #[test]
    fn brownout_reproduces_the_published_reference_numbers() {
        let healthy = brownout_mean(0.05, None, 10);
        assert!((healthy.amplification - 1.05).abs() < 0.01, "{healthy:?}");
        let brownout = brownout_mean(0.9, None, 10);
        assert!((brownout.amplification - 2.71).abs() < 0.03, "{brownout:?}");
        let budget = BudgetParams {
            ratio: 0.1,
            deposit: DepositBasis::Request,
            min_allowance: 10,
        };
        let with = brownout_mean(0.9, Some(budget), 10);
        assert!((with.amplification - 1.10).abs() < 0.015, "{with:?}");
        assert!((with.successes - 220.0).abs() < 25.0, "{with:?}");
        let healthy_with = brownout_mean(0.05, Some(budget), 10);
        assert!(
            (healthy_with.amplification - healthy.amplification).abs() < 0.005,
            "{healthy_with:?}"
        );
    }

    fn reference(budget: Option<BudgetParams>) -> CapacityReport {
        capacity(&CapacityParams {
            incoming: 900,
            ticks: 20,
            capacity: 1000,
            degraded_capacity: 200,
            degraded_from: 5,
            degraded_ticks: 3,
            attempts: 3,
            budget,
            window_ticks: 3,
            seed: 7,
        })
        .unwrap()
    }

    #[test]
    fn capacity_reproduces_the_published_reference_numbers() {
        let without = reference(None);
        assert!(
            (2300..=2450).contains(&without.peak_offered),
            "{}",
            without.peak_offered
        );
        let budget = BudgetParams {
            ratio: 0.1,
            deposit: DepositBasis::Success,
            min_allowance: 10,
        };
        let with = reference(Some(budget));
        #[allow(clippy::cast_precision_loss)]
        let cut = 1.0 - with.peak_offered as f64 / without.peak_offered as f64;
        assert!(
            (0.4..=0.6).contains(&cut),
            "peak {} vs {}",
            with.peak_offered,
            without.peak_offered
        );
    }

    #[test]
    fn capacity_accounts_for_every_attempt() {
        let r = reference(Some(BudgetParams {
            ratio: 0.1,
            deposit: DepositBasis::Request,
            min_allowance: 10,
        }));
        for t in &r.ticks {
            assert_eq!(t.offered, t.served + t.failed);
            assert_eq!(t.failed, t.retries_granted + t.dead_lettered);
        }
        let jobs = 900 * 20;
        let in_flight = r.ticks.last().unwrap().retries_granted;
        assert_eq!(r.served_total + r.dead_lettered_total + in_flight, jobs);
    }
}
