//! The Redis store against the physical limit, side by side in one run (issue 3, item 4).
//!
//! ```text
//! cargo run --release -p fleet-budget --example redis_bench -- [--decisions N] [--smoke]
//! ```
//!
//! Starts its own `redis-server` processes through the test harness (a single node and a
//! 3-master cluster, on free ports; never the shared 6379) and prints, each beside its
//! reference measured in the same run:
//!
//! 1. retry-decision latency p50/p99 against `PING` on the same connection (sequential calls);
//! 2. decisions/s from 32 concurrent tasks on one store against `redis-benchmark` calling the same
//!    script by `EVALSHA` with 32 connections and no pipelining (the same 32 requests in flight);
//! 3. the naive client-side GET / INCR / EXPIRE budget: p50 and round trips per decision;
//! 4. Redis round trips per successful job with coalesced deposits at ≥ 1,000 jobs/s;
//! 5. Redis memory per active dependency (`MEMORY USAGE`), and the keys left after two idle windows;
//! 6. decisions/s for 100 dependencies on a 3-master cluster against one node.
//!
//! Round trips are counted by the server (`INFO commandstats` after `CONFIG RESETSTAT`), leaving
//! out the commands a script runs inside the server. `--smoke` runs everything with tiny counts
//! (a few seconds; the idle-window check still waits its two 1 s windows).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::cast_precision_loss
)]

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::store::{BudgetStore, Deposits, RedisStore, RedisTarget, SPEND_SCRIPT};
use fleet_budget::testing::{RedisCluster, RedisServer};
use fleet_budget::{BudgetPolicy, Config, Dependency, FleetBudget};
use redis::aio::ConnectionManager;

const CONCURRENCY: usize = 32;

struct Args {
    decisions: usize,
    latency_calls: usize,
    jobs_seconds: f64,
    smoke: bool,
}

fn args() -> Args {
    let mut a = Args {
        decisions: 200_000,
        latency_calls: 20_000,
        jobs_seconds: 3.0,
        smoke: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--decisions" => {
                a.decisions = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--decisions N");
            }
            "--smoke" => {
                a = Args {
                    decisions: 2_000,
                    latency_calls: 300,
                    jobs_seconds: 0.5,
                    smoke: true,
                };
            }
            other => {
                panic!("unknown argument {other:?}; usage: redis_bench [--decisions N] [--smoke]")
            }
        }
    }
    a
}

fn micros(sorted: &[Duration], p: f64) -> f64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let i = ((sorted.len().saturating_sub(1)) as f64 * p).round() as usize;
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

struct Latency {
    p50: f64,
    p99: f64,
}

fn latency(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    Latency {
        p50: micros(&samples, 0.5),
        p99: micros(&samples, 0.99),
    }
}

/// Client round trips since the last `CONFIG RESETSTAT` (see
/// [`RedisServer::client_round_trips`]).
fn round_trips(server: &RedisServer) -> u64 {
    RedisServer::client_round_trips(&server.command_calls())
}

/// Server CPU time per call of `command` since the last `CONFIG RESETSTAT` (`usec_per_call`).
fn usec_per_call(server: &RedisServer, command: &str) -> f64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|f| f.strip_prefix("usec_per_call="))?
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

fn reset_stats(server: &RedisServer) {
    let _: String = server.cmd(&["CONFIG", "RESETSTAT"]);
}

fn policy_args(p: &BudgetPolicy) -> Vec<String> {
    vec![
        p.window_ms().to_string(),
        p.ratio.to_string(),
        p.min_allowance.to_string(),
        p.deposit.script_code().to_owned(),
        p.mode.as_str().to_owned(),
    ]
}

/// The naive fleet budget a first attempt would write: read the window's retry count, compare,
/// then INCR and EXPIRE. Three round trips, and not atomic (concurrent callers can all pass the
/// GET before any INCR). Window from the *worker's* clock.
async fn naive_decision(c: &mut ConnectionManager, dependency: &str, allowance: u64) -> bool {
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
async fn throughput(
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
fn redis_benchmark(
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
async fn coalescing(
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let mut summary: Vec<String> = Vec::new();
    let server = RedisServer::start();
    let version: String = server.cmd(&["INFO", "server"]);
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    println!(
        "redis_bench: redis-server {version} on 127.0.0.1:{} (private), {} cores, load average {}, decisions={} latency_calls={}{}",
        server.port(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        args.decisions,
        args.latency_calls,
        if args.smoke { " (smoke)" } else { "" }
    );
    let store = Arc::new(
        RedisStore::new(
            RedisTarget::Single(server.url()),
            "fbb",
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    let bench = Dependency::new("bench").unwrap();
    // Always grants: the same path for every call (a denial costs the same script time).
    let policy = BudgetPolicy {
        min_allowance: u64::MAX >> 12,
        ..BudgetPolicy::default()
    };
    for _ in 0..500 {
        store.withdraw(&bench, &policy).await.unwrap();
        store.ping().await.unwrap();
    }

    // 1. Decision latency against PING on the same connection, interleaved.
    reset_stats(&server);
    let (mut pings, mut decisions) = (
        Vec::with_capacity(args.latency_calls),
        Vec::with_capacity(args.latency_calls),
    );
    for _ in 0..args.latency_calls {
        let t = Instant::now();
        store.ping().await.unwrap();
        pings.push(t.elapsed());
        let t = Instant::now();
        store.withdraw(&bench, &policy).await.unwrap();
        decisions.push(t.elapsed());
    }
    let calls = server.command_calls();
    let ours_trips =
        (calls.get("evalsha").copied().unwrap_or(0)) as f64 / args.latency_calls as f64;
    let (ping, decision) = (latency(pings), latency(decisions));
    println!(
        "\n## 1. latency, sequential, one multiplexed ConnectionManager, {} calls each (interleaved)",
        args.latency_calls
    );
    println!(
        "PING (RedisStore::ping)            p50 {:>7.1} µs  p99 {:>7.1} µs",
        ping.p50, ping.p99
    );
    println!(
        "decision (RedisStore::withdraw)    p50 {:>7.1} µs  p99 {:>7.1} µs",
        decision.p50, decision.p99
    );
    let ratio = decision.p50 / ping.p50;
    summary.push(format!(
        "decision p50 / PING p50 = {ratio:.2} (target <= 1.30: {})",
        met(ratio <= 1.3)
    ));
    // The same on a current-thread runtime: the caller and the connection's driver share one
    // thread, so no cross-thread wake-up is paid (how much of the gap is the runtime's).
    let (url, calls) = (server.url(), args.latency_calls);
    let (ping_ct, decision_ct) = tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let store =
                RedisStore::new(RedisTarget::Single(url), "fbb", Duration::from_secs(2)).unwrap();
            let (mut pings, mut decisions) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
            for i in 0..calls + 500 {
                let t = Instant::now();
                store.ping().await.unwrap();
                let p = t.elapsed();
                let t = Instant::now();
                store
                    .withdraw(&Dependency::new("bench").unwrap(), &policy)
                    .await
                    .unwrap();
                if i >= 500 {
                    pings.push(p);
                    decisions.push(t.elapsed());
                }
            }
            (latency(pings), latency(decisions))
        })
    })
    .await
    .unwrap();
    println!("same, on a current-thread runtime:");
    println!(
        "PING (RedisStore::ping)            p50 {:>7.1} µs  p99 {:>7.1} µs",
        ping_ct.p50, ping_ct.p99
    );
    println!(
        "decision (RedisStore::withdraw)    p50 {:>7.1} µs  p99 {:>7.1} µs   ratio {:.2}",
        decision_ct.p50,
        decision_ct.p99,
        decision_ct.p50 / ping_ct.p50
    );

    // 3. The naive GET / INCR / EXPIRE budget on the same kind of connection.
    let mut naive_conn = ConnectionManager::new(redis::Client::open(server.url()).unwrap())
        .await
        .unwrap();
    for _ in 0..200 {
        naive_decision(&mut naive_conn, "bench", u64::MAX).await;
    }
    reset_stats(&server);
    let mut naive = Vec::with_capacity(args.latency_calls);
    for _ in 0..args.latency_calls {
        let t = Instant::now();
        naive_decision(&mut naive_conn, "bench", u64::MAX).await;
        naive.push(t.elapsed());
    }
    let naive_trips = round_trips(&server) as f64 / args.latency_calls as f64;
    let naive = latency(naive);
    println!("\n## 3. naive client-side budget (GET, INCR, EXPIRE; not atomic), same run");
    println!(
        "naive GET/INCR/EXPIRE              p50 {:>7.1} µs  p99 {:>7.1} µs  round trips/decision {naive_trips:.2}",
        naive.p50, naive.p99
    );
    println!(
        "decision (spend.lua)               p50 {:>7.1} µs  p99 {:>7.1} µs  round trips/decision {ours_trips:.2}",
        decision.p50, decision.p99
    );
    let faster = naive.p50 / decision.p50;
    let fewer = naive_trips / ours_trips;
    summary.push(format!(
        "naive p50 / decision p50 = {faster:.2}x (target >= 2: {})",
        met(faster >= 2.0)
    ));
    summary.push(format!(
        "naive round trips / ours = {fewer:.2}x (target >= 2.5: {})",
        met(fewer >= 2.5)
    ));

    // 2. Throughput: 32 tasks on one store against redis-benchmark calling the same script.
    reset_stats(&server);
    let ours = throughput(
        store.clone(),
        std::slice::from_ref(&bench),
        policy,
        args.decisions,
    )
    .await;
    let server_usec = usec_per_call(&server, "evalsha");
    let sha = SPEND_SCRIPT.get_hash().to_owned();
    let loaded: String = server.cmd(&["SCRIPT", "LOAD", include_str!("../../../lua/spend.lua")]);
    assert_eq!(loaded, sha);
    let mut command = vec!["EVALSHA".to_owned(), sha, "1".to_owned(), store.key(&bench)];
    command.extend(policy_args(&policy));
    let (rb, rb_cmd) = redis_benchmark(server.port(), args.decisions, 1, &command);
    let (rb_p16, rb_p16_cmd) = redis_benchmark(server.port(), args.decisions, 16, &command);
    let ours_again = throughput(
        store.clone(),
        std::slice::from_ref(&bench),
        policy,
        args.decisions,
    )
    .await;
    let ours_best = ours.max(ours_again);
    println!(
        "\n## 2. throughput, {} decisions, {CONCURRENCY} in flight",
        args.decisions
    );
    println!(
        "fleet-budget, 32 tasks, 1 store    {ours:>10.0} /s, again after redis-benchmark {ours_again:>10.0} /s"
    );
    println!("redis-benchmark -c 32 -P 1         {rb:>10.0} /s   `{rb_cmd}`");
    println!(
        "redis-benchmark -c 32 -P 16        {rb_p16:>10.0} /s   (server ceiling with pipelining) `{rb_p16_cmd}`"
    );
    println!(
        "server CPU per decision (INFO commandstats usec_per_call of EVALSHA): {server_usec:.2} µs -> at most {:.0} decisions/s per Redis core",
        1e6 / server_usec.max(0.01)
    );
    summary.push(format!(
        "decisions/s, 32 tasks = {ours_best:.0} (target >= 100000: {})",
        met(ours_best >= 100_000.0)
    ));
    summary.push(format!(
        "decisions/s vs redis-benchmark -c 32 -P 1 = {:.0}% (target >= 70%: {})",
        100.0 * ours_best / rb,
        met(ours_best >= 0.7 * rb)
    ));

    // 4. Round trips per successful job with coalesced deposits.
    println!("\n## 4. coalesced deposits (flush every 100 ms), round trips per successful job");
    let mut at_2000 = f64::MAX;
    for (deps, rate) in [(1usize, 1_000u64), (1, 2_000), (1, 10_000), (10, 10_000)] {
        let (achieved, per_job, trips) = coalescing(&server, deps, rate, args.jobs_seconds).await;
        println!(
            "{deps:>3} dependencies at {achieved:>7.0} jobs/s: {trips:>4} round trips, {per_job:.4} per job"
        );
        if deps == 1 && rate == 2_000 {
            at_2000 = per_job;
        }
    }
    summary.push(format!(
        "round trips per job at 2,000 jobs/s = {at_2000:.4} (target <= 0.01: {})",
        met(at_2000 <= 0.01)
    ));

    // 5. Memory per active dependency, and expiry after two idle windows (window 1 s).
    let short = BudgetPolicy {
        window: Duration::from_secs(1),
        ..BudgetPolicy::default()
    };
    let mem_store = RedisStore::new(
        RedisTarget::Single(server.url()),
        "fbmem",
        Duration::from_secs(2),
    )
    .unwrap();
    let n_deps = if args.smoke { 50 } else { 1000 };
    let _: String = server.cmd(&["FLUSHALL"]);
    let used = |s: &RedisServer| -> u64 {
        let info: String = s.cmd(&["INFO", "memory"]);
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let before = used(&server);
    let deps: Vec<Dependency> = (0..n_deps)
        .map(|i| Dependency::new(&format!("dependency-{i:04}")).unwrap())
        .collect();
    for d in &deps {
        mem_store
            .deposit(
                d,
                &short,
                Deposits {
                    successes: 120,
                    first_attempts: 130,
                },
            )
            .await
            .unwrap();
        mem_store.withdraw(d, &short).await.unwrap();
    }
    let after = used(&server);
    let sizes: Vec<u64> = deps
        .iter()
        .map(|d| server.cmd::<u64>(&["MEMORY", "USAGE", &mem_store.key(d), "SAMPLES", "0"]))
        .collect();
    let avg = sizes.iter().sum::<u64>() as f64 / sizes.len() as f64;
    let max = sizes.iter().max().copied().unwrap_or(0);
    let encoding: String = server.cmd(&["OBJECT", "ENCODING", &mem_store.key(&deps[0])]);
    println!(
        "\n## 5. memory per active dependency ({n_deps} dependencies, one deposit + one decision each)"
    );
    println!(
        "MEMORY USAGE per key: avg {avg:.0} B, max {max} B ({encoding}); used_memory growth {:.0} B per dependency",
        (after.saturating_sub(before)) as f64 / n_deps as f64
    );
    summary.push(format!(
        "MEMORY USAGE per dependency = {avg:.0} B avg, {max} B max (target <= 256: {})",
        met(max <= 256)
    ));
    let idle_from = Instant::now();
    tokio::time::sleep(Duration::from_millis(2_050)).await;
    let visible: usize = deps
        .iter()
        .map(|d| server.cmd::<usize>(&["EXISTS", &mem_store.key(d)]))
        .sum();
    let mut dbsize: u64 = server.cmd(&["DBSIZE"]);
    while dbsize > 0 && idle_from.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        dbsize = server.cmd(&["DBSIZE"]);
    }
    println!(
        "after two idle windows (2.05 s at window 1 s): {visible} keys exist; DBSIZE 0 after {:.2} s of idleness",
        idle_from.elapsed().as_secs_f64()
    );
    summary.push(format!(
        "keys after two idle windows = {visible} (target 0: {})",
        met(visible == 0)
    ));

    // 6. 100 dependencies: a 3-master cluster against one node.
    let cluster = RedisCluster::start(3);
    let deps100: Vec<Dependency> = (0..100)
        .map(|i| Dependency::new(&format!("dep-{i:03}")).unwrap())
        .collect();
    let single = Arc::new(
        RedisStore::new(
            RedisTarget::Single(server.url()),
            "fb100",
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    let clustered = Arc::new(
        RedisStore::new(
            RedisTarget::Cluster(cluster.urls()),
            "fb100",
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    for d in &deps100 {
        single.withdraw(d, &policy).await.unwrap();
        clustered.withdraw(d, &policy).await.unwrap();
    }
    let one_node = throughput(single.clone(), &deps100, policy, args.decisions).await;
    let three = throughput(clustered.clone(), &deps100, policy, args.decisions).await;
    let one_node_again = throughput(single, &deps100, policy, args.decisions).await;
    println!(
        "\n## 6. 100 dependencies, 32 tasks, one store, {} decisions",
        args.decisions
    );
    println!(
        "1 node                             {one_node:>10.0} /s, again {one_node_again:>10.0} /s"
    );
    println!("3-master cluster                   {three:>10.0} /s");
    summary.push(format!(
        "cluster / 1 node decisions/s = {:.2} (reported, no target)",
        three / one_node.max(one_node_again)
    ));

    println!("\n## summary");
    for line in summary {
        println!("- {line}");
    }
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}
