//! `budgetctl bench`: deterministic load against one dependency's budget in Redis.
//!
//! Records N successes (one deposit), then makes M retry requests from C concurrent tasks and
//! times each decision; then times PINGs on the same connection, same run, as the reference
//! for what a round trip costs here.
//!
//! Safe by default: its deposits are fake successes, which would raise a production
//! dependency's allowance. So it refuses a key prefix holding budgets it did not create (those it
//! did are listed in the set `<prefix>:v1:bench-owned`) unless `--i-know-this-is-live`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use fleet_budget::store::{BudgetStore, DEFAULT_MAX_BATCH, Deposits, RedisStore};
use fleet_budget::{Config, Dependency};
use serde::Serialize;

use crate::exit::usage;
use crate::output::print_json;
use crate::redis_conn;

/// The version of this command's `--json` shape (`docs/schemas/bench.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// `bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// The dependency whose budget is exercised.
    #[arg(long)]
    dependency: String,
    /// Successes recorded first (one deposit).
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=1_000_000_000))]
    successes: u64,
    /// Retry requests made afterwards.
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    retries: u64,
    /// Concurrent tasks making them.
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    concurrency: u32,
    /// Run even though the prefix holds budgets bench did not create (live workers' budgets:
    /// the fake successes raise their allowance).
    #[arg(long = "i-know-this-is-live")]
    live: bool,
    /// One `spend.lua` call per decision, for comparison (by default, decisions for the
    /// dependency that arrive while one is in flight go together: group commit).
    #[arg(long)]
    no_group_commit: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// Refuses a prefix with budgets bench did not create (unless `live`); then marks `dependency`
/// as bench's own.
async fn guard_live_prefix(
    store: &RedisStore,
    dependency: &Dependency,
    live: bool,
    fail: &dyn Fn(&dyn std::fmt::Display) -> anyhow::Error,
) -> anyhow::Result<()> {
    let owned_key = format!(
        "{}:v{}:bench-owned",
        store.prefix(),
        fleet_budget::keys::KEY_SCHEMA_VERSION
    );
    if !live {
        let found = store
            .discover_dependencies()
            .await
            .map_err(|e| redis_conn::unreachable(&e.node, &e.source))?;
        let mut smembers = redis::cmd("SMEMBERS");
        smembers.arg(&owned_key);
        let owned: Vec<String> = store.query(&smembers).await.map_err(|e| fail(&e))?;
        let foreign: Vec<String> = found
            .iter()
            .map(ToString::to_string)
            .filter(|d| !owned.contains(d))
            .collect();
        if !foreign.is_empty() {
            return Err(usage(format!(
                "key prefix `{}` holds budgets bench did not create ({}): its fake successes \
                 would raise their allowance. Use another --key-prefix, or \
                 --i-know-this-is-live",
                store.prefix(),
                foreign.join(", ")
            )));
        }
    }
    let mut sadd = redis::cmd("SADD");
    sadd.arg(&owned_key).arg(dependency.as_str());
    let _: u64 = store.query(&sadd).await.map_err(|e| fail(&e))?;
    Ok(())
}

#[derive(Debug, Serialize)]
struct BenchReport {
    dependency: String,
    redis: String,
    /// Successes recorded before the retry requests (the deposit).
    successes: u64,
    retries_requested: u64,
    retries_granted: u64,
    retries_denied: u64,
    decisions_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    ping_p50_us: u64,
    ping_p99_us: u64,
    /// The allowance at the last decision of this process.
    allowance: u64,
    /// The largest batch of the group commit; `null` with `--no-group-commit`.
    group_commit_max_batch: Option<usize>,
    /// Script calls the decisions took (group commit only; 0 without).
    withdrawal_calls: u64,
    /// Deprecated: `successes` under its name before 0.2.0, printed until 0.3.0.
    successes_recorded: u64,
    /// Deprecated: `retries_granted` under its name before 0.2.0, printed until 0.3.0.
    granted: u64,
    /// Deprecated: `retries_denied` under its name before 0.2.0, printed until 0.3.0.
    denied: u64,
}

/// Runs the command.
pub(crate) async fn run(config: &Config, args: &BenchArgs) -> anyhow::Result<()> {
    let dependency = Dependency::new(&args.dependency).map_err(|e| {
        usage(format!(
            "--dependency {:?}: a dependency name {e}",
            args.dependency
        ))
    })?;
    let policy = config.policy(&dependency);
    let shown = config.redis_display();
    let timeout = redis_conn::cli_timeout(config).max(Duration::from_secs(2));
    let store = redis_conn::connect(config, timeout).await?;
    let max_batch = (!args.no_group_commit).then_some(DEFAULT_MAX_BATCH);
    let store = match Arc::try_unwrap(store) {
        Ok(store) => Arc::new(store.with_group_commit(max_batch)),
        Err(_) => anyhow::bail!("bench: the Redis store is shared"),
    };
    let fail = |e: &dyn std::fmt::Display| redis_conn::unreachable(&shown, e);
    guard_live_prefix(&store, &dependency, args.live, &fail).await?;

    if args.successes > 0 {
        store
            .deposit(
                &dependency,
                &policy,
                Deposits {
                    successes: args.successes,
                    first_attempts: 0,
                },
            )
            .await
            .map_err(|e| fail(&e))?;
    }
    let mode = match max_batch {
        Some(n) => format!("group commit on, batches of up to {n}; --no-group-commit to compare"),
        None => "group commit off: one spend.lua call per decision".to_owned(),
    };
    eprintln!(
        "bench: {} retry requests for {dependency} from {} tasks against {shown} ({mode})",
        args.retries, args.concurrency
    );

    let left = Arc::new(AtomicU64::new(args.retries));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let store = Arc::clone(&store);
        let left = Arc::clone(&left);
        let dependency = dependency.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let (mut granted, mut denied, mut allowance) = (0u64, 0u64, 0u64);
            while take(&left) {
                let t = Instant::now();
                let w = store.withdraw(&dependency, &policy).await?;
                latencies.push(micros(t.elapsed()));
                if w.granted {
                    granted += 1;
                } else {
                    denied += 1;
                }
                allowance = w.snapshot.allowance;
            }
            Ok::<_, fleet_budget::StoreError>((latencies, granted, denied, allowance))
        }));
    }
    let mut latencies = Vec::new();
    let (mut granted, mut denied, mut allowance) = (0u64, 0u64, 0u64);
    for task in tasks {
        let (l, g, d, a) = task.await?.map_err(|e| fail(&e))?;
        latencies.extend(l);
        granted += g;
        denied += d;
        allowance = allowance.max(a);
    }
    let elapsed = started.elapsed();

    let pings = ping_reference(&store, args.retries.clamp(100, 10_000), args.concurrency)
        .await
        .map_err(|e| fail(&e))?;
    latencies.sort_unstable();
    let report = BenchReport {
        dependency: dependency.to_string(),
        redis: shown.clone(),
        successes: args.successes,
        retries_requested: args.retries,
        retries_granted: granted,
        retries_denied: denied,
        #[allow(clippy::cast_precision_loss)]
        decisions_per_sec: if elapsed.is_zero() {
            0.0
        } else {
            (granted + denied) as f64 / elapsed.as_secs_f64()
        },
        p50_us: percentile(&latencies, 50),
        p99_us: percentile(&latencies, 99),
        ping_p50_us: percentile(&pings, 50),
        ping_p99_us: percentile(&pings, 99),
        allowance,
        group_commit_max_batch: max_batch,
        withdrawal_calls: store.group_commit_stats().calls,
        successes_recorded: args.successes,
        granted,
        denied,
    };
    if args.json {
        return print_json(JSON_SCHEMA_VERSION, &report);
    }
    outln!("dependency          {}", report.dependency);
    outln!("successes recorded  {}", report.successes);
    outln!("retries requested   {}", report.retries_requested);
    outln!(
        "retries granted / denied  {} / {} (allowance {})",
        report.retries_granted,
        report.retries_denied,
        report.allowance
    );
    outln!("decisions per sec   {:.0}", report.decisions_per_sec);
    match report.group_commit_max_batch {
        Some(n) => outln!(
            "group commit        on (batches up to {n}): {} script calls",
            report.withdrawal_calls
        ),
        None => outln!("group commit        off (--no-group-commit): one call per decision"),
    }
    outln!(
        "decision p50 / p99  {} µs / {} µs",
        report.p50_us,
        report.p99_us
    );
    outln!(
        "PING p50 / p99      {} µs / {} µs (same connection, same run)",
        report.ping_p50_us,
        report.ping_p99_us
    );
    Ok(())
}

/// Takes one request from the shared count; false when none are left.
fn take(left: &AtomicU64) -> bool {
    left.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

async fn ping_reference(
    store: &Arc<RedisStore>,
    count: u64,
    concurrency: u32,
) -> Result<Vec<u64>, fleet_budget::StoreError> {
    let left = Arc::new(AtomicU64::new(count));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let store = Arc::clone(store);
        let left = Arc::clone(&left);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while take(&left) {
                latencies.push(micros(store.ping().await?));
            }
            Ok::<_, fleet_budget::StoreError>(latencies)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        if let Ok(result) = task.await {
            all.extend(result?);
        }
    }
    all.sort_unstable();
    Ok(all)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The `p`th percentile of sorted values (nearest rank); 0 when empty.
fn percentile(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() * p).div_ceil(100).max(1) - 1;
    sorted.get(rank.min(sorted.len() - 1)).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50), 50);
        assert_eq!(percentile(&v, 99), 99);
        assert_eq!(percentile(&[7], 99), 7);
        assert_eq!(percentile(&[], 50), 0);
    }
}
