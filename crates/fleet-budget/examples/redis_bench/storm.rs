//! The retry-storm sections (issue 26): exhausted budgets answered in the process
//! (`redis.deny_cache_ms`) against every denial asked of Redis (`deny_cache_ms = 0`, the code
//! before), through [`FleetBudget::on_failure`], side by side in one run.
//!
//! 9. The storm: 4 budgets (as 4 processes: each its own connection and cache, here in one OS
//!    process on the bench's 2-thread runtime), 32 tasks each, against a budget with no
//!    successes and a floor of 10: script calls per decision and retries granted, 5 runs with
//!    the cache and one without.
//! 10. One budget, 32 tasks: an exhausted budget's denials per second with and without the
//!     cache, the latency of one denial answered in the process (sequential), and the healthy
//!     path (the budget never exhausted) with and without the cache.

use std::sync::Arc;
use std::time::Instant;

use fleet_budget::testing::RedisServer;
use fleet_budget::{BudgetSource, Config, Decision, Failure, FleetBudget};

use crate::Bench;
use crate::measure::{CONCURRENCY, latency, reset_stats, usec_total};
use crate::sections::met;

/// Budgets of the storm, each as one worker process.
const PROCESSES: usize = 4;

/// A budget on the bench's server for `task` mapped to dependency `dependency`, its floor
/// `min_allowance`, with `deny_cache_ms`.
async fn budget(
    server: &RedisServer,
    dependency: &str,
    min_allowance: u64,
    deny_cache_ms: u64,
) -> Arc<FleetBudget> {
    let text = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"fbb\"\ntimeout_ms = 2000\ndeny_cache_ms = {deny_cache_ms}\n\
         [dependencies.{dependency}]\ntasks = [\"{dependency}\"]\nmin_allowance = {min_allowance}\n",
        server.url()
    );
    let config = Config::from_toml(&text, "redis_bench").unwrap();
    let budget = Arc::new(FleetBudget::from_config(&config).await.unwrap());
    // Connected (and the scripts loaded) before anything is counted.
    let dep = budget.dependency(dependency).unwrap();
    let _ = budget.status(&dep).await;
    budget
}

fn source(decision: &Decision) -> BudgetSource {
    match decision {
        Decision::Retry { source, .. } | Decision::DeadLetter { source, .. } => *source,
    }
}

async fn fail(budget: &FleetBudget, task: &str) -> Decision {
    budget
        .on_failure(task, 1, &Failure::retryable("503"))
        .await
        .unwrap()
}

/// `total` decisions of `task` over `CONCURRENCY` tasks per budget in `budgets`: the retries
/// granted and the seconds taken.
async fn run(budgets: &[Arc<FleetBudget>], task: &str, total: usize) -> (u64, f64) {
    let tasks = budgets.len() * CONCURRENCY;
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let budget = budgets[t % budgets.len()].clone();
            let task = task.to_owned();
            let share = total / tasks + usize::from(t < total % tasks);
            tokio::spawn(async move {
                let mut granted = 0u64;
                for _ in 0..share {
                    granted += u64::from(fail(&budget, &task).await.is_retry());
                }
                granted
            })
        })
        .collect();
    let mut granted = 0;
    for h in handles {
        granted += h.await.unwrap();
    }
    (granted, started.elapsed().as_secs_f64())
}

struct Storm {
    calls: u64,
    granted: u64,
    per_second: f64,
}

/// One storm of `total` decisions on a fresh dependency named `name`.
async fn storm(server: &RedisServer, name: &str, deny_cache_ms: u64, total: usize) -> Storm {
    let mut budgets = Vec::new();
    for _ in 0..PROCESSES {
        budgets.push(budget(server, name, 10, deny_cache_ms).await);
    }
    reset_stats(server);
    let (granted, secs) = run(&budgets, name, total).await;
    let (_, calls) = usec_total(server, "evalsha");
    Storm {
        calls,
        granted,
        per_second: total as f64 / secs,
    }
}

/// Section 9: the storm, 5 runs with the cache (the default 100 ms) and one without.
pub(crate) async fn storm_section(b: &Bench, summary: &mut Vec<String>) {
    let total = b.args.decisions;
    println!(
        "\n## 9. retry storm: {PROCESSES} budgets (as processes) x {CONCURRENCY} tasks, {total} decisions, floor 10, no successes"
    );
    let mut worst: f64 = 0.0;
    let mut over = false;
    let mut runs = Vec::new();
    for (i, cache) in [100, 100, 0, 100, 100, 100].into_iter().enumerate() {
        let s = storm(&b.server, &format!("storm-{i}-{cache}"), cache, total).await;
        let per = s.calls as f64 / total as f64;
        let label = if cache == 0 {
            "deny_cache_ms = 0 (before)".to_owned()
        } else {
            format!("deny_cache_ms = {cache}")
        };
        println!(
            "{label:<28} {:>8} script calls  {per:.5} per decision  {:>2} granted (allowance 10)  {:>9.0} decisions/s",
            s.calls, s.granted, s.per_second
        );
        if cache > 0 {
            worst = worst.max(per);
            over |= s.granted > 10;
            runs.push(per);
        } else {
            summary.push(format!(
                "storm without the cache: {:.4} script calls per decision, {} granted",
                per, s.granted
            ));
        }
    }
    summary.push(format!(
        "storm with the cache, 5 runs: at most {worst:.5} script calls per decision (target <= 0.005: {}), grants above the allowance: {} ({})",
        met(worst <= 0.005),
        if over { "yes" } else { "none" },
        met(!over)
    ));
}

/// Section 10: one budget, exhausted and healthy, with and without the cache.
pub(crate) async fn one_process(b: &Bench, summary: &mut Vec<String>) {
    let total = b.args.decisions;
    let cached_total = total * 5;
    println!(
        "\n## 10. one budget, {CONCURRENCY} tasks: exhausted (floor 1, no successes) and healthy, with and without the cache, alternating"
    );
    // Exhausted: one dependency, its floor spent and its first denial asked of Redis.
    let on = budget(&b.server, "exhausted", 1, 100).await;
    let off = budget(&b.server, "exhausted", 1, 0).await;
    while source(&fail(&on, "exhausted").await) != BudgetSource::FleetCache {}
    let mut best_on: f64 = 0.0;
    let mut best_off: f64 = 0.0;
    for round in 0..2 {
        let (granted, secs) = run(std::slice::from_ref(&on), "exhausted", cached_total).await;
        let rate = cached_total as f64 / secs;
        best_on = best_on.max(rate);
        println!(
            "exhausted, deny_cache_ms = 100     {rate:>10.0} denials/s  ({cached_total} decisions, {granted} granted)"
        );
        let (granted, secs) = run(std::slice::from_ref(&off), "exhausted", total).await;
        let rate = total as f64 / secs;
        best_off = best_off.max(rate);
        println!(
            "exhausted, deny_cache_ms = 0       {rate:>10.0} denials/s  ({total} decisions, {granted} granted){}",
            if round == 0 { "  (before)" } else { "" }
        );
    }
    // One denial answered in the process, sequential.
    let calls = b.args.latency_calls;
    let mut samples = Vec::with_capacity(calls);
    let mut asked = 0;
    while samples.len() < calls {
        let t = Instant::now();
        let d = fail(&on, "exhausted").await;
        let took = t.elapsed();
        asked += 1;
        if source(&d) == BudgetSource::FleetCache {
            samples.push(took);
        }
    }
    let cached = latency(samples);
    let mut samples = Vec::with_capacity(calls);
    for _ in 0..calls.min(5000) {
        let t = Instant::now();
        fail(&off, "exhausted").await;
        samples.push(t.elapsed());
    }
    let asked_redis = latency(samples);
    println!(
        "one denial in the process          p50 {:>8.2} µs  p99 {:>8.2} µs  ({calls} of {asked} answered in the process)",
        cached.p50, cached.p99
    );
    println!(
        "one denial asked of Redis          p50 {:>8.2} µs  p99 {:>8.2} µs",
        asked_redis.p50, asked_redis.p99
    );
    // Healthy: never exhausted (the largest floor), every decision a grant.
    let on = budget(&b.server, "healthy", 1_000_000_000, 100).await;
    let off = budget(&b.server, "healthy", 1_000_000_000, 0).await;
    let (mut healthy_on, mut healthy_off) = (Vec::new(), Vec::new());
    for round in 0..4 {
        // Alternating, and which goes first alternates too.
        let mut pair = [
            (&on, &mut healthy_on, "deny_cache_ms = 100"),
            (&off, &mut healthy_off, "deny_cache_ms = 0  "),
        ];
        if round % 2 == 1 {
            pair.reverse();
        }
        for (budget, rates, label) in pair {
            let (granted, secs) = run(std::slice::from_ref(budget), "healthy", total).await;
            assert_eq!(granted, total as u64, "the healthy path grants every retry");
            let rate = total as f64 / secs;
            rates.push(rate);
            println!("healthy, {label}          {rate:>10.0} decisions/s");
        }
    }
    summary.push(format!(
        "one budget exhausted: {best_on:.0} denials/s with the cache (target >= 1000000: {}) against {best_off:.0}/s without ({:.1}x)",
        met(best_on >= 1_000_000.0),
        best_on / best_off.max(1.0)
    ));
    summary.push(format!(
        "one denial in the process: p50 {:.2} µs (target < 2: {}), p99 {:.2} µs; asked of Redis p50 {:.2} µs",
        cached.p50,
        met(cached.p50 < 2.0),
        cached.p99,
        asked_redis.p50
    ));
    summary.push(format!(
        "healthy path, 32 tasks: {} decisions/s with the cache against {} without (reported)",
        rates(&healthy_on),
        rates(&healthy_off)
    ));
}

fn rates(v: &[f64]) -> String {
    v.iter()
        .map(|r| format!("{r:.0}"))
        .collect::<Vec<_>>()
        .join(" and ")
}
