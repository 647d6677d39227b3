//! A mixed fleet of three languages through a brownout and a replay (issue 35): two Rust worker
//! processes (`fleet-worker`), a Celery worker with the prefork pool (`tests/python/celery_fleet.py`,
//! `fleet_budget.celery`) and a Node.js BullMQ worker (`clients/node/test/workers/bullmq_fleet.mjs`,
//! `@fleet-budget/client/bullmq`, with its replay receiver) call one dependency, `search`, and draw
//! on its one budget in a private redis-server (BullMQ's queue lives there too), through RabbitMQ
//! on 127.0.0.1:5672 under names of the test's own. The dependency is a line server owned by this
//! test, so the three languages see one brownout schedule and every call is logged.
//!
//! 1. Warm-up: 10 jobs of each language succeed (30 successes: the allowance is
//!    `floor(0.5 × 30)` = 15 retries); the worker registry lists workers of the three languages.
//! 2. Brownout: every call fails; 20 new jobs of each language (five Celery jobs first, then five
//!    BullMQ jobs, so that every language draws on the budget). Retries granted fleet-wide,
//!    counted in Redis and seen by the dependency, are exactly the allowance; every job ends in
//!    `<prefix>.dead`, from each language, once.
//! 3. Recovery: 10 jobs of each language succeed.
//! 4. `budgetctl replay --dependency search` moves the 60 back: the Rust ones to the work
//!    exchange, the Celery ones to the Celery queue, the BullMQ ones to their BullMQ queue's replay
//!    queue, which the Node worker's receiver drains into BullMQ; each runs once more as replay 1
//!    and succeeds.
//!
//! Every job is accounted for (lost 0, none done twice), and every queue is empty, BullMQ's failed
//! set included. Needs the `.venv` of scripts/test (Celery), `budgetctl` built beside this test
//! and the Node.js package built (`npm ci && npm run build` in clients/node; scripts/test does
//! both). Never skipped.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

mod common;
#[path = "mixed_fleet/processes.rs"]
mod processes;
#[path = "mixed_fleet/upstream.rs"]
mod upstream;

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fleet_budget::control::fleet_workers;
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget_amqp::testing::amqp_url;

use self::processes::{
    CeleryQueue, Fleet, Proc, common_block_on, depth, node_fleet_worker, publish_rust, replay_json,
    send_celery, spawn_celery, spawn_rust_workers, wait_until,
};
use self::upstream::{Call, Upstream};

/// The three languages, by the ids their jobs carry.
fn language(id: &str) -> &'static str {
    if id.starts_with("py-") {
        "celery"
    } else if id.starts_with("node-") {
        "bullmq"
    } else {
        "rust"
    }
}

#[test]
#[allow(clippy::too_many_lines)]
fn rust_celery_and_bullmq_workers_share_one_budget_through_a_brownout_and_a_replay() {
    let node_worker = node_fleet_worker();
    let fleet = Fleet::brownout("lang3");
    let Fleet {
        redis,
        broker,
        prefix,
        key_prefix,
        dir,
        config,
    } = &fleet;
    let celery_queue = format!("{prefix}.celery");
    let bullmq_queue = format!("{prefix}-bullmq");
    let upstream = Upstream::start();
    let env = [
        ("FB_CONFIG", config.display().to_string()),
        ("FB_CELERY_QUEUE", celery_queue.clone()),
        ("FB_BULLMQ_QUEUE", bullmq_queue.clone()),
        ("FB_UPSTREAM", upstream.addr.clone()),
        ("FB_BROKER", amqp_url()),
    ];
    // Queues the topology does not hold, deleted on drop after the workers (declared before
    // them): Celery's, and the BullMQ queue's replay queue (declared by the Node worker).
    let replay_queue = format!("{prefix}.bullmq.{bullmq_queue}");
    let _celery_queue = CeleryQueue {
        name: celery_queue.clone(),
    };
    let _replay_queue = CeleryQueue {
        name: replay_queue.clone(),
    };
    let mut procs = spawn_rust_workers(2, config, &upstream.addr, dir);
    procs.push(spawn_celery(Some("prefork"), 2, &celery_queue, &env, dir));
    let node = |args: &[&str]| {
        let mut c = Command::new("node");
        c.arg(&node_worker)
            .args(args)
            .env_remove("FLEET_BUDGET_REDIS_URL")
            .env_remove("FLEET_BUDGET_AMQP_URL")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        c
    };
    procs.push(Proc::spawn("bullmq", &mut node(&["worker"]), dir));
    let ids = |lang: &str, phase: &str, n: usize| -> Vec<String> {
        (0..n)
            .map(|i| format!("{lang}-{phase}-{i}-{key_prefix}"))
            .collect()
    };
    let send_bullmq = |ids: &[String]| {
        let mut args = vec!["add"];
        args.extend(ids.iter().map(String::as_str));
        let status = node(&args).status().expect("run node");
        assert!(status.success(), "adding BullMQ jobs failed");
    };

    // 1. Warm-up: 30 successes.
    let mut warm = publish_rust(broker, 10);
    let warm_py = ids("py", "warm", 10);
    send_celery(&env, &warm_py);
    let warm_node = ids("node", "warm", 10);
    send_bullmq(&warm_node);
    warm.extend(warm_py);
    warm.extend(warm_node);
    wait_until(
        "the warm-up jobs to succeed",
        Duration::from_secs(90),
        || upstream.succeeded(&warm) == warm.len(),
    );
    // The worker registry, as the console reads it (`control::fleet_workers`): each language's
    // workers report there (the Celery pool's children, one each; the Node worker as `node`).
    let langs = common_block_on(async {
        let registry = RedisStore::new(
            RedisTarget::Single(redis.url()),
            key_prefix,
            Duration::from_secs(2),
        )
        .unwrap();
        let started = Instant::now();
        loop {
            let read = fleet_workers(&registry, 1000).await.unwrap();
            let mut langs: BTreeMap<String, usize> = BTreeMap::new();
            for w in read.workers.iter().filter(|w| !w.silent) {
                *langs.entry(w.lang.clone().unwrap_or_default()).or_default() += 1;
            }
            if ["rust", "python", "node"]
                .iter()
                .all(|l| langs.contains_key(*l))
            {
                return langs;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "a worker of each language in the registry: {langs:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    eprintln!("worker registry: {langs:?}");

    // 2. Brownout: every call fails; every job ends in the dead-letter queue.
    upstream.failing.store(true, Ordering::SeqCst);
    let calls_before = upstream.calls().len();
    let budget_key = format!("{key_prefix}:v1:{{search}}");
    let granted_now = || -> u64 {
        redis
            .cmd::<Option<String>>(&["HGET", &budget_key, "cr"])
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    // Five Celery jobs fail first, then five BullMQ jobs, then the Rust jobs take what is left;
    // then the other Celery and BullMQ jobs, all denied. Each Celery job retries once at most
    // (`max_attempts = 2` for its task): a second round of Celery retries once took the grants
    // meant for BullMQ's (CI, session 17: Celery 11, BullMQ 4).
    let brown_py = ids("py", "brown", 20);
    let brown_node = ids("node", "brown", 20);
    send_celery(&env, &brown_py[..5]);
    wait_until(
        "5 retries granted to Celery",
        Duration::from_secs(60),
        || granted_now() >= 5,
    );
    send_bullmq(&brown_node[..5]);
    wait_until(
        "5 retries granted to BullMQ",
        Duration::from_secs(60),
        || granted_now() >= 10,
    );
    let mut brown = publish_rust(broker, 20);
    wait_until("the allowance to be spent", Duration::from_secs(60), || {
        granted_now() >= 15
    });
    send_celery(&env, &brown_py[5..]);
    send_bullmq(&brown_node[5..]);
    brown.extend(brown_py);
    brown.extend(brown_node);
    let dead = broker.topology.dead_queue.clone();
    wait_until(
        "the 60 brownout jobs to be dead-lettered",
        Duration::from_secs(90),
        || depth(broker, &dead) >= 60,
    );
    let during: Vec<Call> = upstream.calls()[calls_before..].to_vec();
    let mut retries_by: BTreeMap<&str, usize> = BTreeMap::new();
    for c in during.iter().filter(|c| c.attempt > 1) {
        *retries_by.entry(language(&c.id)).or_default() += 1;
    }
    let retries_seen: usize = retries_by.values().sum();
    let counters: Vec<u64> = redis
        .cmd::<Vec<Option<String>>>(&["HMGET", &budget_key, "cs", "cr", "cd"])
        .into_iter()
        .map(|v| v.and_then(|v| v.parse().ok()).unwrap_or(0))
        .collect();
    let (successes, granted, denied) = (counters[0], counters[1], counters[2]);
    eprintln!(
        "brownout: {} calls, {retries_seen} retries {retries_by:?}; Redis: {successes} successes, {granted} granted, {denied} denied",
        during.len(),
    );
    assert_eq!(
        successes, 30,
        "the warm-up's successes, from the three languages"
    );
    // The allowance is floor(0.5 × 30) = 15: granted fleet-wide, never more, and each granted
    // retry ran once against the dependency.
    assert_eq!(granted, 15, "retries granted fleet-wide = the allowance");
    assert_eq!(
        u64::try_from(retries_seen).unwrap(),
        granted,
        "every granted retry ran, and no other"
    );
    for lang in ["celery", "bullmq"] {
        assert!(
            retries_by.get(lang).copied().unwrap_or(0) >= 5,
            "{lang}'s five retries ran: {retries_by:?}"
        );
    }
    assert!(denied >= 1, "the rest were denied: {denied}");

    // 3. Recovery: 30 more successes, headroom for the replay.
    upstream.failing.store(false, Ordering::SeqCst);
    let mut recovery = publish_rust(broker, 10);
    let recovery_py = ids("py", "recovery", 10);
    send_celery(&env, &recovery_py);
    let recovery_node = ids("node", "recovery", 10);
    send_bullmq(&recovery_node);
    recovery.extend(recovery_py);
    recovery.extend(recovery_node);
    wait_until(
        "the recovery jobs to succeed",
        Duration::from_secs(60),
        || upstream.succeeded(&recovery) == recovery.len(),
    );
    assert_eq!(depth(broker, &dead), 60, "dead letters before the replay");
    let bullmq_failed =
        || -> u64 { redis.cmd::<u64>(&["ZCARD", &format!("bull:{bullmq_queue}:failed")]) };
    assert_eq!(
        bullmq_failed(),
        20,
        "BullMQ keeps each dead-lettered job in its failed set"
    );

    // 4. The replay: each dead letter back where it came from, the BullMQ ones through the
    // receiver of the Node worker.
    let report = replay_json(config, "search");
    assert_eq!(report["moved"], 60, "{report}");
    assert_eq!(report["parked"], 0, "{report}");
    assert_eq!(report["failed"], 0, "{report}");
    wait_until(
        "the replayed jobs to succeed",
        Duration::from_secs(90),
        || upstream.succeeded(&brown) == brown.len(),
    );

    // Every job accounted for: each succeeded exactly once (the brownout's on replay 1, attempt
    // 1), and every queue is empty.
    for p in &mut procs {
        p.stop();
    }
    let calls = upstream.calls();
    let mut oks: HashMap<&str, Vec<&Call>> = HashMap::new();
    for c in calls.iter().filter(|c| c.ok) {
        oks.entry(c.id.as_str()).or_default().push(c);
    }
    let all: Vec<&String> = warm.iter().chain(&recovery).chain(&brown).collect();
    let mut wrong = BTreeMap::new();
    for id in &all {
        let n = oks.get(id.as_str()).map_or(0, Vec::len);
        if n != 1 {
            wrong.insert((*id).clone(), n);
        }
    }
    let twice = wrong.values().filter(|n| **n > 1).count();
    let lost = wrong.values().filter(|n| **n == 0).count();
    let mut replayed_by: BTreeMap<&str, usize> = BTreeMap::new();
    for id in &brown {
        *replayed_by.entry(language(id)).or_default() += 1;
    }
    let bullmq_log = std::fs::read_to_string(dir.join("bullmq.log")).unwrap_or_default();
    eprintln!(
        "accounting: submitted {} (30 warm-up, 60 brownout, 30 recovery), succeeded once {}, \
         dead-lettered 60 then replayed {} {replayed_by:?}, lost {lost}, twice {twice}; \
         BullMQ receiver {}",
        all.len(),
        all.len() - wrong.len(),
        report["moved"],
        bullmq_log.lines().last().unwrap_or("")
    );
    assert!(
        wrong.is_empty(),
        "jobs not succeeded exactly once: {wrong:?}"
    );
    for id in &brown {
        let ok = oks[id.as_str()][0];
        assert_eq!(
            (ok.replays, ok.attempt),
            (1, 1),
            "{id}: replayed once, attempt 1 again"
        );
    }
    assert_eq!(
        bullmq_failed(),
        0,
        "the replayed originals left BullMQ's failed set"
    );
    for queue in [
        &dead,
        &broker.topology.parked_queue,
        &broker.topology.work_queue,
        &celery_queue,
        &replay_queue,
    ] {
        assert_eq!(depth(broker, queue), 0, "{queue}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
