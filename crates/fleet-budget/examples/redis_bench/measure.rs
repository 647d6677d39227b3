//! What the sections measure with: percentiles, the server's own counters, the naive budget,
//! concurrent decisions, `redis-benchmark`, and a coalescing budget driven at a job rate.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::store::{BudgetStore, RedisStore};
use fleet_budget::testing::RedisServer;
use fleet_budget::{BudgetPolicy, Config, Dependency, FleetBudget};
use redis::aio::ConnectionManager;

/// Decisions in flight in the throughput runs (tasks, or `redis-benchmark` connections).
pub(crate) const CONCURRENCY: usize = 32;

fn micros(sorted: &[Duration], p: f64) -> f64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let i = ((sorted.len().saturating_sub(1)) as f64 * p).round() as usize;
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

pub(crate) struct Latency {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
}

pub(crate) fn latency(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    Latency {
        p50: micros(&samples, 0.5),
        p99: micros(&samples, 0.99),
    }
}

/// Client round trips since the last `CONFIG RESETSTAT` (see
/// [`RedisServer::client_round_trips`]).
pub(crate) fn round_trips(server: &RedisServer) -> u64 {
    RedisServer::client_round_trips(&server.command_calls())
}

/// Server CPU time (µs) spent in `command` since the last `CONFIG RESETSTAT` (`usec`), with the
/// calls it counts.
pub(crate) fn usec_total(server: &RedisServer, command: &str) -> (f64, u64) {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:");
    let field = |rest: &str, name: &str| -> Option<f64> {
        rest.split(',')
            .find_map(|f| f.strip_prefix(name))?
            .parse()
            .ok()
    };
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or((0.0, 0), |rest| {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let calls = field(rest, "calls=").unwrap_or(0.0) as u64;
            (field(rest, "usec=").unwrap_or(0.0), calls)
        })
}

pub(crate) fn reset_stats(server: &RedisServer) {
    let _: String = server.cmd(&["CONFIG", "RESETSTAT"]);
}

/// The naive fleet budget a first attempt would write: read the window's retry count, compare,
/// then INCR and EXPIRE. Three round trips, and not atomic (concurrent callers can all pass the
/// GET before any INCR). Window from the *worker's* clock.
pub(crate) async fn naive_decision(
    c: &mut ConnectionManager,
    dependency: &str,
    allowance: u64,
) -> bool {
    let window = fleet_budget::clock::now_ms() / 60_000;
    let key = format!("naive:{{{dependency}}}:retries:{window}");
    let used: Option<u64> = redis::cmd("GET").arg(&key).query_async(c).await.unwrap();
    if used.unwrap_or(0) >= allowance {
        return false;
    }
    let _: u64 = redis::cmd("INCR").arg(&key).query_async(c).await.unwrap();
    let _: bool = redis::cmd("EXPIRE")
        .arg(&key)
        .arg(120)
        .query_async(c)
        .await
        .unwrap();
    true
}

/// `total` decisions from 32 tasks sharing `store`, over `dependencies`; decisions per second.
pub(crate) async fn throughput(
    store: Arc<RedisStore>,
    dependencies: &[Dependency],
    policy: BudgetPolicy,
    total: usize,
) -> f64 {
    let deps: Arc<Vec<Dependency>> = Arc::new(dependencies.to_vec());
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|t| {
            let (store, deps) = (store.clone(), deps.clone());
            tokio::spawn(async move {
                for i in 0..total / CONCURRENCY {
                    let d = &deps[(t + i * CONCURRENCY) % deps.len()];
                    store.withdraw(d, &policy).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (total / CONCURRENCY * CONCURRENCY) as f64 / started.elapsed().as_secs_f64()
}

/// Runs `redis-benchmark` and returns its requests per second.
pub(crate) fn redis_benchmark(
    port: u16,
    requests: usize,
    pipeline: usize,
    command: &[String],
) -> (f64, String) {
    let mut cmd = Command::new("redis-benchmark");
    cmd.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-n",
        &requests.to_string(),
        "-c",
        &CONCURRENCY.to_string(),
    ])
    .args(["-P", &pipeline.to_string(), "-q"])
    .args(command);
    let shown = format!(
        "redis-benchmark -h 127.0.0.1 -p PORT -n {requests} -c {CONCURRENCY} -P {pipeline} -q {}",
        command
            .iter()
            .map(|a| if a.contains('{') {
                format!("'{a}'")
            } else {
                a.clone()
            })
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = cmd
        .output()
        .expect("run redis-benchmark (package redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    // The last "\r"-separated progress line holds the result: "<name>: 12345.67 requests per second, ..."
    let rate = text
        .split(['\r', '\n'])
        .filter_map(|l| {
            l.split_once(": ")?
                .1
                .split_once(" requests per second")?
                .0
                .trim()
                .parse::<f64>()
                .ok()
        })
        .next_back()
        .unwrap_or_else(|| panic!("no rate in redis-benchmark output: {text}"));
    (rate, shown)
}

/// Drives `rate` successful jobs per second over `dependencies` for `seconds` through a
/// coalescing [`FleetBudget`]; returns (jobs/s achieved, round trips per job).
pub(crate) async fn coalescing(
    server: &RedisServer,
    dependencies: usize,
    rate: u64,
    seconds: f64,
) -> (f64, f64, u64) {
    let mut config = Config::default();
    config.redis.url = server.url();
    config.redis.key_prefix = format!("fbc{dependencies}x{rate}");
    config.redis.timeout = Duration::from_millis(200);
    reset_stats(server);
    let budget = FleetBudget::from_config(&config).await.unwrap();
    let tasks: Vec<String> = (0..dependencies).map(|i| format!("dep-{i}")).collect();
    let per_tick = rate / 100; // every 10 ms
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let total = (rate as f64 * seconds) as u64;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let started = Instant::now();
    let mut done = 0u64;
    while done < total {
        tick.tick().await;
        for _ in 0..per_tick {
            budget
                .on_success(&tasks[usize::try_from(done).unwrap() % tasks.len()])
                .await
                .unwrap();
            done += 1;
        }
    }
    let achieved = done as f64 / started.elapsed().as_secs_f64();
    budget.shutdown().await.unwrap();
    let trips = round_trips(server);
    let calls: BTreeMap<String, u64> = server
        .command_calls()
        .into_iter()
        .filter(|(n, _)| !n.starts_with("config"))
        .collect();
    println!("    commands seen by the server: {calls:?}");
    (achieved, trips as f64 / done as f64, trips)
}
