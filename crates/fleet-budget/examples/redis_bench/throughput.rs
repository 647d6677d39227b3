//! The throughput sections (issue 14): what one script call costs the server, before and after
//! the leaner script; decisions/s with group commit against one call per decision and against
//! `redis-benchmark`; many dependencies; a 3-master cluster.

use std::sync::Arc;
use std::time::Duration;

use fleet_budget::Dependency;
use fleet_budget::store::{BudgetStore, RedisStore, RedisTarget, SPEND_SCRIPT, policy_args};
use fleet_budget::testing::{RedisCluster, RedisServer};

use crate::Bench;
use crate::measure::{
    CONCURRENCY, redis_benchmark, reset_stats, throughput as decisions_per_second, usec_total,
};
use crate::sections::met;

/// `lua/spend.lua` as it was before the leaner script (main at 89695b5): the reference the
/// current script is measured against, in the same run.
const SPEND_BEFORE: &str = include_str!("spend_before.lua");

/// Commands the scripts run inside the server (not client round trips).
const INSIDE: [&str; 5] = ["time", "hmget", "hset", "hincrby", "pexpireat"];

/// What one script call cost the server in one block of sequential calls.
struct Block {
    usec_per_call: f64,
    inside_per_call: f64,
    round_trips_per_call: f64,
}

fn block(
    server: &RedisServer,
    script: &redis::Script,
    key: &str,
    args: &[String],
    calls: usize,
) -> Block {
    let mut conn = server.connection().unwrap();
    reset_stats(server);
    for _ in 0..calls {
        let _: redis::Value = script.key(key).arg(args).invoke(&mut conn).unwrap();
    }
    let (usec, evalsha) = usec_total(server, "evalsha");
    let counted = server.command_calls();
    let inside: u64 = INSIDE
        .iter()
        .map(|c| counted.get(*c).copied().unwrap_or(0))
        .sum();
    let trips = RedisServer::client_round_trips(&counted);
    Block {
        usec_per_call: usec / evalsha.max(1) as f64,
        inside_per_call: inside as f64 / calls as f64,
        round_trips_per_call: trips as f64 / calls as f64,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Section 2: server CPU per `spend.lua` call, the script before the leaner one against the
/// current one, in alternating blocks on one connection (sequential calls, so the figure is the
/// script's, not a queue's). Also the client round trips per decision and the commands run
/// inside: the policy in force is read by the same `HMGET` as the counters (issue 11).
pub(crate) fn script_cost(b: &Bench, summary: &mut Vec<String>) {
    let server = &b.server;
    let before = redis::Script::new(SPEND_BEFORE);
    let now = &*SPEND_SCRIPT;
    let mut args = vec![b.policy.window_ms().to_string()];
    args.extend(policy_args(&b.policy));
    let (key_before, key_now) = ("fbb:v1:{script-before}", "fbb:v1:{script-now}");
    let rounds = if b.args.smoke { 2 } else { 7 };
    let calls = b.args.latency_calls / 2;
    let (mut old, mut new) = (Vec::new(), Vec::new());
    let (mut last_old, mut last_new) = (None, None);
    for _ in 0..rounds {
        let o = block(server, &before, key_before, &args, calls);
        let n = block(server, now, key_now, &args, calls);
        old.push(o.usec_per_call);
        new.push(n.usec_per_call);
        (last_old, last_new) = (Some(o), Some(n));
    }
    let (o, n) = (last_old.unwrap(), last_new.unwrap());
    let (old_med, new_med) = (median(old.clone()), median(new.clone()));
    let (old_min, new_min) = (
        old.iter().copied().fold(f64::MAX, f64::min),
        new.iter().copied().fold(f64::MAX, f64::min),
    );
    println!(
        "\n## 2. server CPU per spend.lua call (INFO commandstats usec of EVALSHA / calls), {rounds} alternating blocks of {calls} sequential calls"
    );
    println!(
        "spend.lua before (main 89695b5)   median {old_med:>6.2} µs  min {old_min:>6.2} µs   commands inside/call {:.2}   client round trips/decision {:.2}",
        o.inside_per_call, o.round_trips_per_call
    );
    println!(
        "spend.lua now                     median {new_med:>6.2} µs  min {new_min:>6.2} µs   commands inside/call {:.2}   client round trips/decision {:.2}",
        n.inside_per_call, n.round_trips_per_call
    );
    println!(
        "per block, before: {:?}\nper block, now:    {:?}",
        old.iter().map(|v| format!("{v:.2}")).collect::<Vec<_>>(),
        new.iter().map(|v| format!("{v:.2}")).collect::<Vec<_>>()
    );
    let cut = 1.0 - new_med / old_med;
    summary.push(format!(
        "server CPU per spend.lua call: {new_med:.2} µs now vs {old_med:.2} µs before = {:.0}% less (target >= 30%: {})",
        cut * 100.0,
        met(cut >= 0.3)
    ));
    summary.push(format!(
        "policy in force: {:.2} client round trip per decision, {:.2} commands inside the script (TIME, HMGET of counters + policy + overrides, HSET) (target: no extra round trip: {})",
        n.round_trips_per_call,
        n.inside_per_call,
        met((n.round_trips_per_call - 1.0).abs() < 0.01)
    ));
}

/// One throughput figure: decisions/s and the server CPU (µs) per decision.
struct Rate {
    per_second: f64,
    cpu_per_decision: f64,
    per_call: f64,
    /// Budgets (dependencies) per script call.
    budgets_per_call: f64,
}

async fn measure(
    server: &RedisServer,
    store: &Arc<RedisStore>,
    dependencies: &[Dependency],
    b: &Bench,
) -> Rate {
    reset_stats(server);
    let before = store.group_commit_stats();
    let per_second =
        decisions_per_second(store.clone(), dependencies, b.policy, b.args.decisions).await;
    let after = store.group_commit_stats();
    let (usec, calls) = usec_total(server, "evalsha");
    let decisions = b.args.decisions / CONCURRENCY * CONCURRENCY;
    let (per_call, budgets_per_call) = if after.calls > before.calls {
        let sent = (after.calls - before.calls) as f64;
        (
            (after.decisions - before.decisions) as f64 / sent,
            (after.budgets - before.budgets) as f64 / sent,
        )
    } else {
        (decisions as f64 / calls.max(1) as f64, 1.0)
    };
    Rate {
        per_second,
        cpu_per_decision: usec / decisions as f64,
        per_call,
        budgets_per_call,
    }
}

/// The same store without group commit: one `spend.lua` call per decision.
fn one_call_per_decision(target: RedisTarget, prefix: &str) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::new(target, prefix, Duration::from_secs(2))
            .unwrap()
            .with_group_commit(None),
    )
}

/// Section 6: 32 tasks on one dependency, group commit against one call per decision and
/// against `redis-benchmark -c 32 -P 1` of the single-decision script; the server CPU per
/// decision of each.
pub(crate) async fn one_dependency(b: &Bench, summary: &mut Vec<String>) {
    let (server, grouped, bench) = (&b.server, &b.store, &b.dependency);
    let single = one_call_per_decision(RedisTarget::Single(server.url()), "fbb");
    let deps = std::slice::from_ref(bench);
    let (mut g, mut s) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        g.push(measure(server, grouped, deps, b).await);
        s.push(measure(server, &single, deps, b).await);
    }
    let mut command = vec![
        "EVALSHA".to_owned(),
        SPEND_SCRIPT.get_hash().to_owned(),
        "1".to_owned(),
        grouped.key(bench),
        b.policy.window_ms().to_string(),
    ];
    command.extend(policy_args(&b.policy));
    reset_stats(server);
    let (rb, rb_cmd) = redis_benchmark(server.port(), b.args.decisions, 1, &command);
    let (rb_usec, rb_calls) = usec_total(server, "evalsha");
    println!(
        "\n## 6. throughput, 32 tasks, one dependency, {} decisions per run, two runs each (alternating)",
        b.args.decisions
    );
    for (name, runs) in [
        ("group commit (default)", &g),
        ("one call per decision", &s),
    ] {
        for r in runs.iter() {
            println!(
                "{name:<24} {:>9.0} /s   server CPU {:>5.2} µs/decision   {:>5.1} decisions per script call",
                r.per_second, r.cpu_per_decision, r.per_call
            );
        }
    }
    println!(
        "redis-benchmark -c 32 -P 1 {rb:>9.0} /s   server CPU {:>5.2} µs/decision   `{rb_cmd}`",
        rb_usec / rb_calls.max(1) as f64
    );
    let best = |v: &[Rate]| v.iter().map(|r| r.per_second).fold(0.0, f64::max);
    let (gb, sb) = (best(&g), best(&s));
    let cpu = |v: &[Rate]| median(v.iter().map(|r| r.cpu_per_decision).collect());
    summary.push(format!(
        "32 tasks, 1 dependency: {gb:.0}/s with group commit (aim >= 150000: {})",
        met(gb >= 150_000.0)
    ));
    summary.push(format!(
        "  vs one call per decision {sb:.0}/s = {:.2}x (target >= 4: {})",
        gb / sb,
        met(gb >= 4.0 * sb)
    ));
    summary.push(format!(
        "  vs redis-benchmark -c 32 -P 1 {rb:.0}/s = {:.2}x (target >= 3: {})",
        gb / rb,
        met(gb >= 3.0 * rb)
    ));
    summary.push(format!(
        "server CPU per decision: {:.2} µs with group commit, {:.2} µs one call per decision (reported)",
        cpu(&g),
        cpu(&s)
    ));
}

/// Section 7: 32 tasks over 10 and over 1,000 dependencies: group commit across dependencies
/// (the default on one server) against group commit per dependency (as on Redis Cluster) and
/// against one call per decision.
pub(crate) async fn many_dependencies(b: &Bench, summary: &mut Vec<String>) {
    let server = &b.server;
    let single = one_call_per_decision(RedisTarget::Single(server.url()), "fbb");
    let per_dependency = Arc::new(
        RedisStore::new(
            RedisTarget::Single(server.url()),
            "fbb",
            Duration::from_secs(2),
        )
        .unwrap()
        .with_batches_across_dependencies(false),
    );
    println!(
        "\n## 7. throughput, 32 tasks over many dependencies, {} decisions per run, two runs each (alternating)",
        b.args.decisions
    );
    for n in [10usize, 1_000] {
        let deps: Vec<Dependency> = (0..n)
            .map(|i| Dependency::new(&format!("many-{i:04}")).unwrap())
            .collect();
        for d in &deps {
            b.store.withdraw(d, &b.policy).await.unwrap();
        }
        let (mut g, mut p, mut s) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..2 {
            g.push(measure(server, &b.store, &deps, b).await);
            p.push(measure(server, &per_dependency, &deps, b).await);
            s.push(measure(server, &single, &deps, b).await);
        }
        for (name, runs) in [
            ("group commit (default)", &g),
            ("group commit per dependency", &p),
            ("one call per decision", &s),
        ] {
            for r in runs.iter() {
                println!(
                    "{n:>5} dependencies, {name:<27} {:>9.0} /s   server CPU {:>5.2} µs/decision   {:>5.1} decisions, {:>5.1} dependencies per script call",
                    r.per_second, r.cpu_per_decision, r.per_call, r.budgets_per_call
                );
            }
        }
        let best = |v: &[Rate]| v.iter().map(|r| r.per_second).fold(0.0, f64::max);
        let ratio = best(&g) / best(&s);
        summary.push(if n == 10 {
            format!(
                "32 tasks over 10 dependencies: {:.0}/s vs {:.0}/s one call per decision = {ratio:.2}x (target >= 2: {}); per dependency {:.0}/s",
                best(&g),
                best(&s),
                met(ratio >= 2.0),
                best(&p)
            )
        } else {
            format!(
                "32 tasks over {n} dependencies: {:.0}/s vs {:.0}/s one call per decision = {ratio:.2}x (reported); per dependency {:.0}/s",
                best(&g),
                best(&s),
                best(&p)
            )
        });
    }
}

/// Section 8: a 3-master cluster, 32 tasks over 24 dependencies (spread over the masters'
/// slots), group commit and one call per decision, beside one node.
pub(crate) async fn cluster(b: &Bench, summary: &mut Vec<String>) {
    let cluster = RedisCluster::start(3);
    let deps: Vec<Dependency> = (0..24)
        .map(|i| Dependency::new(&format!("dep-{i:02}")).unwrap())
        .collect();
    let grouped = Arc::new(
        RedisStore::new(
            RedisTarget::Cluster(cluster.urls()),
            "fbc",
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    let single = one_call_per_decision(RedisTarget::Cluster(cluster.urls()), "fbc");
    let one_node = Arc::new(
        RedisStore::new(
            RedisTarget::Single(b.server.url()),
            "fb24",
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    for d in &deps {
        grouped.withdraw(d, &b.policy).await.unwrap();
        one_node.withdraw(d, &b.policy).await.unwrap();
    }
    let n = b.args.decisions;
    let mut rows = Vec::new();
    for _ in 0..2 {
        rows.push((
            decisions_per_second(grouped.clone(), &deps, b.policy, n).await,
            decisions_per_second(single.clone(), &deps, b.policy, n).await,
            decisions_per_second(one_node.clone(), &deps, b.policy, n).await,
        ));
    }
    println!("\n## 8. 3-master cluster, 32 tasks over 24 dependencies, {n} decisions per run");
    for (g, s, o) in &rows {
        println!(
            "cluster, group commit {g:>9.0} /s   cluster, one call per decision {s:>9.0} /s   one node, group commit {o:>9.0} /s"
        );
    }
    let best = |f: fn(&(f64, f64, f64)) -> f64| rows.iter().map(f).fold(0.0, f64::max);
    summary.push(format!(
        "3-master cluster, 24 dependencies: {:.0}/s group commit, {:.0}/s one call per decision, one node {:.0}/s (reported)",
        best(|r| r.0),
        best(|r| r.1),
        best(|r| r.2)
    ));
}
