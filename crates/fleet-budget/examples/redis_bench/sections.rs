//! Sections 1, 3, 4 and 5 (latency, the naive budget, coalesced deposits, memory); each prints its
//! table and adds its summary lines. The throughput sections (group commit, the script's cost,
//! the cluster) are in `throughput.rs`.

use std::time::{Duration, Instant};

use fleet_budget::BudgetPolicy;
use fleet_budget::Dependency;
use fleet_budget::store::{BudgetStore, Deposits, RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use redis::aio::ConnectionManager;

use crate::Bench;
use crate::measure::{
    Latency, coalescing as drive_jobs, latency as percentiles, naive_decision, reset_stats,
    round_trips,
};

/// Sequential retry decisions as section 1 measured them.
pub(crate) struct Sequential {
    latency: Latency,
    round_trips: f64,
}

pub(crate) fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// Section 1: decision latency against PING on the same connection, interleaved; then the
/// same on a current-thread runtime.
pub(crate) async fn latency(b: &Bench, summary: &mut Vec<String>) -> Sequential {
    let (server, store, bench, policy) = (&b.server, &b.store, &b.dependency, b.policy);
    reset_stats(server);
    let calls = b.args.latency_calls;
    let (mut pings, mut decisions) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
    for _ in 0..calls {
        let t = Instant::now();
        store.ping().await.unwrap();
        pings.push(t.elapsed());
        let t = Instant::now();
        store.withdraw(bench, &policy).await.unwrap();
        decisions.push(t.elapsed());
    }
    let stats = server.command_calls();
    let ours_trips = (stats.get("evalsha").copied().unwrap_or(0)) as f64 / calls as f64;
    let (ping, decision) = (percentiles(pings), percentiles(decisions));
    println!(
        "\n## 1. latency, sequential, one multiplexed ConnectionManager, {calls} calls each (interleaved)"
    );
    println!(
        "PING (RedisStore::ping)            p50 {:>7.1} µs  p99 {:>7.1} µs",
        ping.p50, ping.p99
    );
    println!(
        "decision (RedisStore::withdraw)    p50 {:>7.1} µs  p99 {:>7.1} µs   ratio {:.2}",
        decision.p50,
        decision.p99,
        decision.p50 / ping.p50
    );
    let (floor, v2) = split_decision(b).await;
    let ratio = decision.p50 / ping.p50;
    summary.push(format!(
        "1 task: decision p50 / PING p50 = {ratio:.2} (target <= 1.25: {}); p99 {:.1} / PING p99 {:.1} µs = {:.2}",
        met(ratio <= 1.25),
        decision.p99,
        ping.p99,
        decision.p99 / ping.p99
    ));
    summary.push(format!(
        "  the floor of the key layout here: TIME, HMGET of the 16 fields, HSET of 2, nothing else: {floor:.2}x PING p50"
    ));
    summary.push(format!(
        "  a v2 layout's least cost (v2_prototype.lua: packed counters and reply, no checks): {v2:.2}x PING p50"
    ));
    // The same on a current-thread runtime: the caller and the connection's driver share one
    // thread, so no cross-thread wake-up is paid (how much of the gap is the runtime's).
    let (url, calls) = (server.url(), b.args.latency_calls);
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
            (percentiles(pings), percentiles(decisions))
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
    Sequential {
        latency: decision,
        round_trips: ours_trips,
    }
}

/// Where a decision's time goes, each beside the PING sent just before it on the same
/// connection (rounds of PING then the call, the calls taken in turn), all with the same key
/// and arguments:
///
/// - `spend.lua` by `EVALSHA` without the store's code, then three variants of it that are not
///   the contract, made from its text: replying `granted` alone; replying the same 17 numbers
///   packed into one string (`struct.pack`); and that, with the fast path's checks of the
///   stored counters left out;
/// - `v2_prototype.lua`: the least a decision could cost on another key layout (the policy in
///   one field, the counters packed into one, the reply packed, no checks);
/// - the least any script on the v1 key layout does (`TIME`, the `HMGET` of the 16 fields the
///   fast path reads, an `HSET` of the 2 it writes, no arithmetic, reply 1), then the same
///   replying 17 numbers as a table and packed;
/// - `EVALSHA` of a script that only returns 1.
///
/// Returns the ratios to PING p50 of the v1 floor and of the v2 prototype.
async fn split_decision(b: &Bench) -> (f64, f64) {
    const FLOOR: &str = "local t = redis.call('TIME') \
        local h = redis.call('HMGET', KEYS[1], 'w', 'i', 'cs', 'ca', 'cr', 'cd', 'ps', 'pa', \
        'pr', 'pd', 'r', 'm', 'b', 'o', 'fu', 'su') \
        redis.call('HSET', KEYS[1], 'cr', h[5], 'h', t[1]) return 1";
    const SEVENTEEN: &str =
        "1, 5, 29000000, 60000, 1234, 58766, 100, 0, 3, 0, 100, 0, 7, 0, 0, 0, 0";
    const PACK17: &str = "struct.pack('<i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8', ";
    const SPEND: &str = include_str!("../../lua/spend.lua");
    const REPLY: &str = "reply[1] = granted\nreturn reply";
    let packed = format!(
        "return {PACK17}granted, allowance, i, window, elapsed, pw, cur[1], cur[2], cur[3], \
         cur[4], prev[1], prev[2], prev[3], prev[4], conflict, frozen, overridden)"
    );
    let spend_packed = variant(SPEND, REPLY, &packed);
    // The fast path's checks of the nine stored counters (lengths, one pattern over them all).
    let checks_from = spend_packed
        .find("\n    and #h[2] <= 18")
        .expect("spend.lua's fast path checks the counters' lengths");
    let checks_to = spend_packed[checks_from..]
        .find(" then\n")
        .expect("spend.lua's fast path condition ends")
        + checks_from;
    let unchecked = format!(
        "{}{}",
        &spend_packed[..checks_from],
        &spend_packed[checks_to..]
    );
    let rows = [
        ("spend.lua by EVALSHA, no store code", SPEND.to_owned()),
        (
            "spend.lua replying `granted` only",
            variant(SPEND, REPLY, "return granted"),
        ),
        ("spend.lua replying 17 packed", spend_packed),
        ("spend.lua packed, counters unchecked", unchecked),
        (
            "v2 prototype (v2_prototype.lua)",
            include_str!("v2_prototype.lua").to_owned(),
        ),
        ("v1 floor: TIME + HMGET 16 + HSET 2", FLOOR.to_owned()),
        (
            "v1 floor replying 17 numbers",
            variant(FLOOR, "return 1", &format!("return {{{SEVENTEEN}}}")),
        ),
        (
            "v1 floor replying 17 packed",
            variant(FLOOR, "return 1", &format!("return {PACK17}{SEVENTEEN})")),
        ),
        ("EVALSHA of `return 1`", "return 1".to_owned()),
    ];
    let (store, policy) = (&b.store, b.policy);
    let mut calls = Vec::new();
    for (name, script) in rows {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(load(store, &script).await)
            .arg(1)
            .arg(store.key(&b.dependency))
            .arg(policy.window_ms())
            .arg(&fleet_budget::store::policy_args(&policy));
        calls.push((name, cmd, Vec::new(), Vec::new()));
    }
    for _ in 0..b.args.latency_calls {
        for (_, cmd, pings, times) in &mut calls {
            let t = Instant::now();
            store.ping().await.unwrap();
            pings.push(t.elapsed());
            let t = Instant::now();
            let _: redis::Value = store.query(cmd).await.unwrap();
            times.push(t.elapsed());
        }
    }
    println!("where a decision's time goes, each call after its own PING:");
    let (mut floor, mut v2) = (0.0, 0.0);
    for (name, _, pings, times) in calls {
        let (ping, time) = (percentiles(pings), percentiles(times));
        let ratio = time.p50 / ping.p50;
        println!(
            "  {name:<38} p50 {:>7.1} µs  PING before it p50 {:>7.1} µs   ratio {ratio:.2}",
            time.p50, ping.p50
        );
        if name.starts_with("v1 floor:") {
            floor = ratio;
        } else if name.starts_with("v2 prototype") {
            v2 = ratio;
        }
    }
    (floor, v2)
}

/// `script` with `from` replaced by `to`; panics when `from` is not there (a variant that
/// silently measured the unchanged script would mislead).
fn variant(script: &str, from: &str, to: &str) -> String {
    assert!(
        script.contains(from),
        "redis_bench: the script no longer holds {from:?}"
    );
    script.replacen(from, to, 1)
}

async fn load(store: &RedisStore, script: &str) -> String {
    store
        .query(redis::cmd("SCRIPT").arg("LOAD").arg(script))
        .await
        .unwrap()
}

/// Section 3: the naive GET / INCR / EXPIRE budget on the same kind of connection, beside
/// section 1's decisions.
pub(crate) async fn naive(b: &Bench, ours: &Sequential, summary: &mut Vec<String>) {
    let server = &b.server;
    let mut naive_conn = ConnectionManager::new(redis::Client::open(server.url()).unwrap())
        .await
        .unwrap();
    for _ in 0..200 {
        naive_decision(&mut naive_conn, "bench", u64::MAX).await;
    }
    reset_stats(server);
    let mut naive = Vec::with_capacity(b.args.latency_calls);
    for _ in 0..b.args.latency_calls {
        let t = Instant::now();
        naive_decision(&mut naive_conn, "bench", u64::MAX).await;
        naive.push(t.elapsed());
    }
    let naive_trips = round_trips(server) as f64 / b.args.latency_calls as f64;
    let naive = percentiles(naive);
    let (decision, ours_trips) = (&ours.latency, ours.round_trips);
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
}

/// Section 4: round trips per successful job with coalesced deposits.
pub(crate) async fn coalescing(b: &Bench, summary: &mut Vec<String>) {
    println!("\n## 4. coalesced deposits (flush every 100 ms), round trips per successful job");
    let mut at_2000 = f64::MAX;
    for (deps, rate) in [(1usize, 1_000u64), (1, 2_000), (1, 10_000), (10, 10_000)] {
        let (achieved, per_job, trips) =
            drive_jobs(&b.server, deps, rate, b.args.jobs_seconds).await;
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
}

/// Section 5: memory per active dependency, and expiry after two idle windows (window 1 s).
pub(crate) async fn memory(b: &Bench, summary: &mut Vec<String>) {
    let server = &b.server;
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
    let n_deps = if b.args.smoke { 50 } else { 1000 };
    let _: String = server.cmd(&["FLUSHALL"]);
    let used = |s: &RedisServer| -> u64 {
        let info: String = s.cmd(&["INFO", "memory"]);
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let before = used(server);
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
    let after = used(server);
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
}
