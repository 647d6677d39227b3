// Over ~500 lines on purpose: one game day, a single scenario read top to bottom (storm, failover, accounting).
//! Issue 25, item 4: the Redis failover game day. A Redis Cluster of three masters, each with one
//! replica; a retry storm against it (a brownout: every execution fails, so retries are asked
//! for continually); during the storm the master serving some of the dependencies is SIGKILLed
//! and its replica promoted (automatic failover after `cluster-node-timeout`, 1 s). The failovers
//! alternate between a replica in sync (what loopback replication gives: it lacks nothing) and a
//! replica that fell behind (frozen while its master was sent 16 MB it could not take, then the
//! storm's writes of one more second: those wait in the master's output buffer and die with it).
//!
//! Per dependency it prints the decisions the fallback took, how long until the fleet budget
//! answered again, and the retries granted against the allowance, and it asserts the bound of
//! `docs/semantics.md` ("Failover to a replica"): retries granted ≤ the fleet allowance + the
//! increments the replica had not received + what the processes' fallback budgets may grant.
//! The increments lost are measured (the replica's counters are read the moment its master
//! dies, before it can be promoted) and also held to their bound in terms of the configuration
//! (at most one allowance per failover). No timing is asserted: the times are printed.
//!
//! CI runs two failovers, one of each kind (about 35 s). `FLEET_BUDGET_FAILOVER_ROUNDS=6` kills a
//! master six times in turn (each killed node rejoining as a replica of its successor, and the
//! storm going on until it is in sync) and `FLEET_BUDGET_FAILOVER_STORM_MS` sets how long the
//! storm runs before each kill and after the last (default 3000);
//! `FLEET_BUDGET_FAILOVER_FULL_COVERAGE=no` sets `cluster-require-full-coverage no` (with Redis's
//! default, `yes`, every master answers `CLUSTERDOWN` from the moment one is marked failed until
//! its replica is promoted, so every dependency goes to the fallback meanwhile).
//! `scripts/game-day-redis` runs the long version; every run leaves its report in
//! `target/tmp/game-day-redis.md`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

#[path = "redis_failover/cluster.rs"]
mod cluster;
#[path = "redis_failover/storm.rs"]
mod storm;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleet_budget::{BudgetSource, Config};

use cluster::{NODE_TIMEOUT, ReplicatedCluster};
use storm::{Event, Record, Storm};

/// Worker processes in the storm.
const PROCESSES: usize = 3;
/// Dependencies, spread over the three masters by their hash tags.
const DEPENDENCIES: usize = 6;
/// The policy of every dependency: retries earned by requests (a brownout fails every
/// execution, so `success` would leave only the floor), one day's window so that the whole run
/// is one window (the run checks that it is).
const WINDOW_SECS: u64 = 86_400;
const RATIO: f64 = 0.2;
const MIN_ALLOWANCE: u64 = 10;
/// The store deadline: longer than the default 50 ms so that a healthy master on this loaded
/// 2-core machine is not sent to the fallback by scheduling noise, which would blur what the
/// failover alone does.
const TIMEOUT_MS: u64 = 200;
/// The variant with a lagging replica: how much it is sent while frozen before the storm's own
/// writes (more than the kernel buffers of a loopback connection hold), and for how long the
/// storm goes on writing to the master meanwhile.
const PADDING_MB: usize = 16;
const LAG: Duration = Duration::from_millis(1000);
/// Guard against a hang while waiting for the fleet to answer again (not a measurement).
const PATIENCE: Duration = Duration::from_secs(60);

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

fn name(dependency: usize) -> String {
    format!("dep-{dependency}")
}

fn config(cluster: &ReplicatedCluster) -> Config {
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let mut text = format!(
        "[redis]\ncluster_urls = [{}]\ntimeout_ms = {TIMEOUT_MS}\nkey_prefix = \"fbf\"\n",
        urls.join(", ")
    );
    for d in 0..DEPENDENCIES {
        write!(
            text,
            "[dependencies.{}]\ntasks = [\"job-{d}\"]\nwindow_secs = {WINDOW_SECS}\n\
             ratio = {RATIO}\nmin_allowance = {MIN_ALLOWANCE}\ndeposit = \"request\"\n",
            name(d)
        )
        .unwrap();
    }
    Config::from_toml(&text, "redis_failover").unwrap()
}

fn key(dependency: usize) -> String {
    format!("fbf:v1:{{{}}}", name(dependency))
}

/// `max(min_allowance, floor(ratio × deposits))`: the allowance of one window with `deposits`
/// requests in it and the one before (`allowance.rs`, whose arithmetic this repeats so that the
/// bound is computed independently of the code under test).
fn allowance(deposits: u64) -> u64 {
    // ratio 0.2 = 1/5, exactly.
    MIN_ALLOWANCE.max(deposits / 5)
}

fn window_index() -> u64 {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    u64::try_from(ms).unwrap() / (WINDOW_SECS * 1000)
}

/// One failover of the run.
struct Failover {
    /// Whether the replica had been frozen (falling behind) before its master died.
    lagging: bool,
    victim_port: u16,
    replica_port: u16,
    /// The dependencies whose slot the victim served.
    dependencies: Vec<usize>,
    /// Since the storm's start.
    killed: Duration,
    /// When the replica, its counters read, was let fail over: no grant answered before came
    /// from it.
    released: Duration,
    promoted: Duration,
    /// Per dependency of this failover: the retries (`cr + pr`) the replica held when its
    /// master died, which is what it held when it was promoted.
    replica_retries: BTreeMap<usize, u64>,
}

/// The accounting of one dependency over the run.
#[derive(Default)]
struct Account {
    deposits: u64,
    fleet_granted: u64,
    fleet_denied: u64,
    cached_denied: u64,
    fallback_granted: u64,
    fallback_denied: u64,
    /// Per process: fallback grants, and that process's deposits.
    fallback_by_process: Vec<(u64, u64)>,
    /// Increments lost, per failover of this dependency (measured).
    lost: Vec<u64>,
    /// Per failover: from the kill to the answer of the first decision asked after it that the
    /// fleet budget answered.
    fleet_again_after: Vec<Duration>,
    /// Per failover of this dependency: its number, and the fallback's grants and denials from
    /// the kill until the fleet answered again.
    outages: Vec<(usize, u64, u64)>,
}

fn account(record: &Record, failovers: &[Failover], dependency: usize) -> Account {
    let events: Vec<&Event> = record
        .events
        .iter()
        .filter(|e| e.dependency == dependency)
        .collect();
    let mut a = Account {
        deposits: record.first_attempts.iter().map(|p| p[dependency]).sum(),
        cached_denied: record.cached_denials[dependency],
        fallback_by_process: record
            .first_attempts
            .iter()
            .map(|p| (0, p[dependency]))
            .collect(),
        ..Account::default()
    };
    for e in &events {
        match (e.source, e.granted) {
            (BudgetSource::Fleet, true) => a.fleet_granted += 1,
            (BudgetSource::Fleet, false) => a.fleet_denied += 1,
            (BudgetSource::LocalFallback, true) => {
                a.fallback_granted += 1;
                a.fallback_by_process[e.process].0 += 1;
            }
            (BudgetSource::LocalFallback, false) => a.fallback_denied += 1,
            (other, _) => panic!("{}: a decision from {other:?}", name(dependency)),
        }
    }
    // The master a failover kills holds what the replica promoted before it held (nothing for
    // the first) plus the grants it made since; its replica may fail over only once its
    // counters have been read, so a grant answered by then was answered by the old master.
    let mut held_before = 0u64;
    let mut since = Duration::ZERO;
    for (number, f) in failovers
        .iter()
        .enumerate()
        .filter(|(_, f)| f.dependencies.contains(&dependency))
    {
        let cut = f.released;
        let granted_by_victim = events
            .iter()
            .filter(|e| e.source == BudgetSource::Fleet && e.granted)
            .filter(|e| e.answered > since && e.answered <= cut)
            .count() as u64;
        let replica = f.replica_retries[&dependency];
        a.lost
            .push((held_before + granted_by_victim).saturating_sub(replica));
        let again = events
            .iter()
            .filter(|e| e.source == BudgetSource::Fleet && e.asked > f.killed)
            .map(|e| e.answered)
            .min()
            .expect("the fleet answered again after the failover");
        a.fleet_again_after.push(again - f.killed);
        let in_outage = |granted: bool| {
            events
                .iter()
                .filter(|e| e.source == BudgetSource::LocalFallback && e.granted == granted)
                .filter(|e| e.asked >= f.killed && e.asked <= again)
                .count() as u64
        };
        a.outages
            .push((number + 1, in_outage(true), in_outage(false)));
        held_before = replica;
        since = cut;
    }
    a
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

/// Checks the bound for every dependency and renders the report as Markdown.
fn check_and_report(record: &Record, failovers: &[Failover], windows: u64) -> String {
    let mut out = String::new();
    writeln!(
        out,
        "### Failovers\n\n| # | replica | master killed | replica promoted | dependencies on it | promoted after (ms) |\n|---:|---|---:|---:|---|---:|"
    )
    .unwrap();
    for (i, f) in failovers.iter().enumerate() {
        let deps: Vec<String> = f.dependencies.iter().map(|d| name(*d)).collect();
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            i + 1,
            if f.lagging {
                format!("frozen, {PADDING_MB} MB + {} ms behind", LAG.as_millis())
            } else {
                "in sync".to_owned()
            },
            f.victim_port,
            f.replica_port,
            deps.join(", "),
            ms(f.promoted - f.killed)
        )
        .unwrap();
    }
    writeln!(
        out,
        "\n### Per failover, per dependency on the master killed\n\n\
         | # | dependency | fallback decisions until the fleet answered again (granted / denied) | fleet again after (ms) | increments lost `L` |\n\
         |---:|---|---|---:|---:|"
    )
    .unwrap();
    let accounts: Vec<Account> = (0..DEPENDENCIES)
        .map(|d| account(record, failovers, d))
        .collect();
    let mut rows = Vec::new();
    for (d, a) in accounts.iter().enumerate() {
        for (i, (number, granted, denied)) in a.outages.iter().enumerate() {
            rows.push((
                *number,
                format!(
                    "| {number} | {} | {} ({granted} / {denied}) | {} | {} |",
                    name(d),
                    granted + denied,
                    ms(a.fleet_again_after[i]),
                    a.lost[i]
                ),
            ));
        }
    }
    rows.sort_by_key(|(number, _)| *number);
    for (_, row) in rows {
        writeln!(out, "{row}").unwrap();
    }
    writeln!(
        out,
        "\n### Per dependency\n\n\
         `A` = max(min_allowance, ratio × requests), the fleet allowance of the run's window; \
         `L` = increments lost (measured, per failover); `F` = Σ over processes of each one's own \
         allowance, what the fallback budgets may grant.\n\n\
         | dependency | failovers | requests | fallback decisions (granted / denied) | fleet again after (ms) | fleet: granted / denied by Redis / denied in the process | granted in all | `A` | beyond `A` | `L` | `F` | bound `A + L + F` | bound in configuration terms `A × (1 + failovers) + F` |\n\
         |---|---:|---:|---|---|---|---:|---:|---:|---|---:|---:|---:|"
    )
    .unwrap();
    for (d, a) in accounts.iter().enumerate() {
        let failed_over = a.lost.len() as u64;
        // Every window the run touched may grant its allowance (one window unless the run
        // straddled midnight UTC, where the one-day windows turn).
        let fleet_allowance = windows * allowance(a.deposits);
        let lost: u64 = a.lost.iter().sum();
        let fallback_allowance: u64 = a
            .fallback_by_process
            .iter()
            .map(|(_, deposits)| windows * allowance(*deposits))
            .sum();
        let granted = a.fleet_granted + a.fallback_granted;
        let bound = fleet_allowance + lost + fallback_allowance;
        let config_bound = fleet_allowance * (1 + failed_over) + fallback_allowance;
        let again: Vec<String> = a.fleet_again_after.iter().map(|d| ms(*d)).collect();
        let lost_text: Vec<String> = a.lost.iter().map(u64::to_string).collect();
        writeln!(
            out,
            "| {} | {failed_over} | {} | {} ({} / {}) | {} | {} / {} / {} | {granted} | {fleet_allowance} | {} | {} | {fallback_allowance} | {bound} | {config_bound} |",
            name(d),
            a.deposits,
            a.fallback_granted + a.fallback_denied,
            a.fallback_granted,
            a.fallback_denied,
            if again.is_empty() { "–".to_owned() } else { again.join(", ") },
            a.fleet_granted,
            a.fleet_denied,
            a.cached_denied,
            granted.saturating_sub(fleet_allowance),
            if lost_text.is_empty() { "–".to_owned() } else { lost_text.join(" + ") },
        )
        .unwrap();
        // The fleet alone: its allowance plus what the replicas lacked.
        assert!(
            a.fleet_granted <= fleet_allowance + lost,
            "{}: the fleet granted {} > A {fleet_allowance} + L {lost}",
            name(d),
            a.fleet_granted
        );
        // Each process's fallback: its own allowance.
        for (p, (granted, deposits)) in a.fallback_by_process.iter().enumerate() {
            assert!(
                *granted <= windows * allowance(*deposits),
                "{}: process {p}'s fallback granted {granted} of {deposits} requests",
                name(d)
            );
        }
        assert!(granted <= bound, "{}: {granted} > {bound}", name(d));
        // What a replica can lack is at most what its master had counted: one allowance.
        for l in &a.lost {
            assert!(
                *l <= fleet_allowance,
                "{}: {l} increments lost > A {fleet_allowance}",
                name(d)
            );
        }
        assert!(
            granted <= config_bound,
            "{}: {granted} > {config_bound}",
            name(d)
        );
        if failed_over > 0 {
            // Its master was dead for longer than the store's deadline: the fallback answered.
            assert!(
                a.fallback_granted + a.fallback_denied > 0,
                "{}: no decision from the fallback while its master was dead",
                name(d)
            );
        }
    }
    let fleet: u64 = record
        .events
        .iter()
        .filter(|e| e.source == BudgetSource::Fleet)
        .count() as u64;
    let cached: u64 = record.cached_denials.iter().sum();
    let fallback = record
        .events
        .iter()
        .filter(|e| e.source == BudgetSource::LocalFallback)
        .count();
    let errors: Vec<String> = record
        .store_errors
        .iter()
        .map(|(kind, n)| format!("{n} {kind}"))
        .collect();
    writeln!(out, "\nStore calls that failed: {}.", errors.join(", ")).unwrap();
    writeln!(
        out,
        "\nDecisions: {fleet} answered by Redis, {cached} denials answered in the process \
         (`fleet_cache`), {fallback} by the fallback; {PROCESSES} processes, {DEPENDENCIES} \
         dependencies, window {WINDOW_SECS} s, ratio {RATIO}, min_allowance {MIN_ALLOWANCE}, \
         deposit `request`, redis.timeout_ms {TIMEOUT_MS}, cluster-node-timeout {} ms.",
        NODE_TIMEOUT.as_millis()
    )
    .unwrap();
    out
}

/// Runs `f` on the cluster off the runtime, so that the storm's tasks keep deciding meanwhile.
async fn with_cluster<T: Send + 'static>(
    cluster: ReplicatedCluster,
    f: impl FnOnce(&mut ReplicatedCluster) -> T + Send + 'static,
) -> (ReplicatedCluster, T) {
    tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        let out = f(&mut cluster);
        (cluster, out)
    })
    .await
    .unwrap()
}

/// The shard (a master and its replica, named by the first slot they serve) each dependency is
/// on, and the shards in the order the run kills them: the one with the most dependencies first.
fn shards(cluster: &ReplicatedCluster) -> (Vec<u16>, Vec<u16>) {
    let observer = cluster.nodes[0].port();
    let view = cluster.view_of(observer);
    let of_dependency: Vec<u16> = (0..DEPENDENCIES)
        .map(|d| {
            let slot = cluster.slot_of(&key(d));
            view.iter()
                .filter(|n| n.is_master())
                .flat_map(|n| n.slots.iter())
                .filter(|(lo, hi)| (*lo..=*hi).contains(&slot))
                .map(|(lo, _)| *lo)
                .next()
                .expect("every slot is served")
        })
        .collect();
    let mut order: Vec<u16> = view
        .iter()
        .filter(|n| n.is_master())
        .filter_map(|n| n.slots.iter().map(|(lo, _)| *lo).min())
        .collect();
    order.sort_by_key(|first| {
        (
            std::cmp::Reverse(of_dependency.iter().filter(|s| *s == first).count()),
            *first,
        )
    });
    (of_dependency, order)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_dies_in_a_retry_storm_and_the_grants_stay_within_the_bound() {
    let rounds = env_u64("FLEET_BUDGET_FAILOVER_ROUNDS", 2);
    let storm_ms = env_u64("FLEET_BUDGET_FAILOVER_STORM_MS", 3000);
    let full_coverage = match std::env::var("FLEET_BUDGET_FAILOVER_FULL_COVERAGE").as_deref() {
        Err(_) | Ok("yes") => "yes",
        Ok("no") => "no",
        Ok(other) => panic!("FLEET_BUDGET_FAILOVER_FULL_COVERAGE={other:?}: yes or no"),
    };
    let mut cluster = tokio::task::spawn_blocking(move || ReplicatedCluster::start(full_coverage))
        .await
        .unwrap();
    let (shard_of, order) = shards(&cluster);
    let config = config(&cluster);
    let first_window = window_index();
    let storm = Storm::start(&config, PROCESSES, DEPENDENCIES).await;
    let mut failovers = Vec::new();
    for round in 0..rounds {
        tokio::time::sleep(Duration::from_millis(storm_ms)).await;
        let shard = order[usize::try_from(round).unwrap() % order.len()];
        let dependencies: Vec<usize> = (0..DEPENDENCIES)
            .filter(|d| shard_of[*d] == shard)
            .collect();
        let probe = dependencies.first().copied().unwrap_or(0);
        let epoch = storm.epoch;
        let deps = dependencies.clone();
        let lagging = round % 2 == 1;
        let (c, (victim_port, replica_port, killed, released, replica_retries)) =
            with_cluster(cluster, move |c| {
                let observer = c.nodes[0].port();
                let (victim, replica) = c.master_and_replica_of(observer, c.slot_of(&key(probe)));
                c.allow_failover(replica, false);
                if lagging {
                    // The replica stops reading; the padding fills the socket between them, and
                    // the storm's writes of the next LAG wait in the master's output buffer.
                    c.freeze(replica);
                    c.pad(victim, &name(probe), PADDING_MB);
                    std::thread::sleep(LAG);
                }
                let killed = epoch.elapsed();
                c.kill(victim);
                if lagging {
                    c.thaw(replica);
                    c.wait_link_down(replica);
                }
                // The replica's counters now, before it may be promoted: what the new master
                // will start from.
                let retries: BTreeMap<usize, u64> = deps
                    .iter()
                    .map(|d| (*d, c.retries_on(replica, &key(*d)).unwrap_or(0)))
                    .collect();
                assert_eq!(
                    c.role(replica),
                    "slave",
                    "the replica was read before its promotion"
                );
                c.allow_failover(replica, true);
                (victim, replica, killed, epoch.elapsed(), retries)
            })
            .await;
        cluster = c;
        let (c, ()) = with_cluster(cluster, move |c| c.wait_promoted(replica_port)).await;
        cluster = c;
        let promoted = storm.epoch.elapsed();
        let started = std::time::Instant::now();
        while !dependencies
            .iter()
            .all(|d| storm.fleet_answered_since(*d, promoted))
        {
            assert!(
                started.elapsed() < PATIENCE,
                "the fleet budget did not answer again within {PATIENCE:?} of the promotion"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!(
            "failover {}: killed master {victim_port} ({dependencies:?}), replica {replica_port} promoted after {} ms",
            round + 1,
            ms(promoted - killed)
        );
        failovers.push(Failover {
            lagging,
            victim_port,
            replica_port,
            dependencies,
            killed,
            released,
            promoted,
            replica_retries,
        });
        // The killed node comes back as a replica of the one that replaced it, and the storm
        // goes on until it is in sync.
        let (c, ()) = with_cluster(cluster, move |c| {
            c.rejoin(victim_port);
            c.wait_healthy();
        })
        .await;
        cluster = c;
    }
    tokio::time::sleep(Duration::from_millis(storm_ms)).await;
    let record = storm.stop().await;
    let windows = window_index() - first_window + 1;
    let mut report = check_and_report(&record, &failovers, windows);
    writeln!(report, "cluster-require-full-coverage {full_coverage}.").unwrap();
    println!("{report}");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("game-day-redis.md");
    std::fs::write(&out, &report).unwrap();
    assert!(
        failovers.iter().all(|f| !f.dependencies.is_empty()),
        "every failover hit a dependency"
    );
    drop(cluster);
}
