//! The Redis store against the physical limit, side by side in one run (issues 3, 11 and 14).
//!
//! ```text
//! cargo run --release -p fleet-budget --features test-harness --example redis_bench -- [--decisions N] [--latency-calls N] [--smoke] [--only 1,6,7]
//! ```
//!
//! Starts its own `redis-server` processes through the test harness (a single node and a
//! 3-master cluster, on free ports; never the shared 6379) and prints, each beside its
//! reference measured in the same run:
//!
//! 1. 1 task: retry-decision latency p50/p99 against `PING` on the same connection;
//! 2. server CPU per `spend.lua` call, the script before the leaner one (kept as
//!    `spend_before.lua`) against the current one, and the round trips and commands per
//!    decision (the policy in force is read in the same call);
//! 3. the naive client-side GET / INCR / EXPIRE budget: p50 and round trips per decision;
//! 4. Redis round trips per successful job with coalesced deposits at ≥ 1,000 jobs/s;
//! 5. Redis memory per active dependency (`MEMORY USAGE`), and the keys left after two idle windows;
//! 6. 32 tasks on one dependency: group commit against one call per decision against
//!    `redis-benchmark -c 32 -P 1` of `spend.lua`, with the server CPU per decision;
//! 7. 32 tasks over 10 and over 1,000 dependencies, group commit against one call per decision;
//! 8. a 3-master cluster, 32 tasks over 24 dependencies;
//! 9. a retry storm, 4 budgets (as processes) x 32 tasks against an exhausted budget: script
//!    calls per decision with exhausted budgets answered in the process, and without;
//! 10. one budget, 32 tasks: denials/s of an exhausted budget with and without that cache, one
//!     denial's latency in the process, and the healthy path with and without it.
//!
//! Round trips are counted by the server (`INFO commandstats` after `CONFIG RESETSTAT`), leaving
//! out the commands a script runs inside the server. `--smoke` runs everything with tiny counts
//! (a few seconds; the idle-window check still waits its two 1 s windows). `--only` runs the
//! sections listed (section 3 needs 1's figures, so it runs 1 too).
//!
//! `measure.rs` holds what the sections measure with; `sections.rs` sections 1, 3, 4 and 5;
//! `throughput.rs` sections 2, 6, 7 and 8; `storm.rs` sections 9 and 10.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::cast_precision_loss
)]

mod measure;
mod sections;
mod storm;
mod throughput;

use std::sync::Arc;
use std::time::Duration;

use fleet_budget::store::{BudgetStore, RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{BudgetPolicy, Dependency};

pub(crate) struct Args {
    pub(crate) decisions: usize,
    pub(crate) latency_calls: usize,
    pub(crate) jobs_seconds: f64,
    pub(crate) smoke: bool,
    /// The sections to run (all when empty).
    pub(crate) only: Vec<u32>,
}

impl Args {
    fn runs(&self, section: u32) -> bool {
        self.only.is_empty() || self.only.contains(&section)
    }
}

fn args() -> Args {
    let mut a = Args {
        decisions: 200_000,
        latency_calls: 20_000,
        jobs_seconds: 3.0,
        smoke: false,
        only: Vec::new(),
    };
    let usage = "usage: redis_bench [--decisions N] [--latency-calls N] [--smoke] [--only 1,6,7]";
    let refuse = |what: String| -> ! {
        eprintln!("redis_bench: {what}\n{usage}");
        std::process::exit(2)
    };
    let count = |flag: &str, value: Option<String>| -> usize {
        match value.as_deref().map(str::parse::<usize>) {
            Some(Ok(n)) if n > 0 => n,
            Some(_) => refuse(format!(
                "{flag} takes a whole number above 0, got {:?}",
                value.unwrap_or_default()
            )),
            None => refuse(format!("{flag} needs a number")),
        }
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--decisions" => a.decisions = count("--decisions", it.next()),
            "--latency-calls" => a.latency_calls = count("--latency-calls", it.next()),
            "--smoke" => {
                a = Args {
                    decisions: 2_000,
                    latency_calls: 300,
                    jobs_seconds: 0.5,
                    smoke: true,
                    only: a.only,
                };
            }
            "--only" => {
                let list = it.next().unwrap_or_default();
                a.only = list
                    .split(',')
                    .map(|n| match n.trim().parse::<u32>() {
                        Ok(n @ 1..=10) => n,
                        _ => refuse(format!(
                            "--only takes section numbers from 1 to 10, comma-separated, got {list:?}"
                        )),
                    })
                    .collect();
            }
            other => refuse(format!("unknown argument {other:?}")),
        }
    }
    a
}

/// What one section needs: the private server, a store on it, and the always-granting policy
/// on one dependency.
pub(crate) struct Bench {
    pub(crate) args: Args,
    pub(crate) server: RedisServer,
    pub(crate) store: Arc<RedisStore>,
    pub(crate) dependency: Dependency,
    pub(crate) policy: BudgetPolicy,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let server = RedisServer::start();
    let version: String = server.cmd(&["INFO", "server"]);
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    println!(
        "redis_bench: redis-server {version} on 127.0.0.1:{} (private), {} cores, load average {}, decisions={} latency_calls={}{}{}",
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
        if args.smoke { " (smoke)" } else { "" },
        if args.only.is_empty() {
            String::new()
        } else {
            format!(" sections {:?}", args.only)
        }
    );
    let store = Arc::new(
        RedisStore::new(
            RedisTarget::Single(server.url()),
            "fbb",
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    let dependency = Dependency::new("bench").unwrap();
    // Always grants: the same path for every call (a denial costs the same script time). The
    // floor is the largest the scripts accept.
    let policy = BudgetPolicy {
        min_allowance: 1_000_000_000,
        ..BudgetPolicy::default()
    };
    for _ in 0..500 {
        store.withdraw(&dependency, &policy).await.unwrap();
        store.ping().await.unwrap();
    }
    let bench = Bench {
        args,
        server,
        store,
        dependency,
        policy,
    };

    let mut summary: Vec<String> = Vec::new();
    let a = &bench.args;
    if a.runs(1) || a.runs(3) {
        let decision = sections::latency(&bench, &mut summary).await;
        if a.runs(3) {
            sections::naive(&bench, &decision, &mut summary).await;
        }
    }
    if a.runs(2) {
        throughput::script_cost(&bench, &mut summary);
    }
    if a.runs(6) {
        throughput::one_dependency(&bench, &mut summary).await;
    }
    if a.runs(7) {
        throughput::many_dependencies(&bench, &mut summary).await;
    }
    if a.runs(8) {
        throughput::cluster(&bench, &mut summary).await;
    }
    if a.runs(9) {
        storm::storm_section(&bench, &mut summary).await;
    }
    if a.runs(10) {
        storm::one_process(&bench, &mut summary).await;
    }
    if a.runs(4) {
        sections::coalescing(&bench, &mut summary).await;
    }
    if a.runs(5) {
        sections::memory(&bench, &mut summary).await;
    }

    println!(
        "\n## summary (load average at the end {})",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    for line in summary {
        println!("- {line}");
    }
}
