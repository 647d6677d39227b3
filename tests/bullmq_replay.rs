//! `budgetctl replay` puts Node's BullMQ dead letters back on their BullMQ queue (issue 35), and
//! nothing is lost or done twice when either side is killed half-way.
//!
//! A Node.js BullMQ worker (`clients/node/test/workers/bullmq_fleet.mjs`: `budgeted` and the
//! queue's `ReplayReceiver`) on a private redis-server and the shared RabbitMQ (names of the
//! test's own) fails 40 jobs against a dependency that is down (floor 0: every job dead-lettered
//! at once, to `<prefix>.dead`, each kept in BullMQ's failed set). The worker is stopped and the
//! dependency recovers. `budgetctl replay --rate 20` is killed (SIGKILL) after a second, then run
//! again to the end: every dead letter is in the replay queue `<prefix>.bullmq.<queue>` once (the
//! killed run's confirmed copies there, their originals parked by the second run as in doubt). The
//! worker starts again, without its receiver: `fleet-budget-bullmq receive` drains the replay
//! queue, is killed (SIGKILL) once it took a first message, and is started again.
//! Every one of the 40 jobs then succeeded exactly once, as replay 1 and attempt 1, BullMQ's failed
//! set is empty and so are the queues.
//!
//! Without `[amqp]` (`budgetctl_replay_puts_bullmq_kept_jobs_back_*`): the worker keeps the 40
//! jobs in BullMQ's failed set, each recorded in the fleet's kept list; `budgetctl replay
//! --bullmq-queue` moves them, paced, to the queue's replay list and `fleet-budget-bullmq receive`
//! puts them back, once without kills and once with the replay and the receiver each killed
//! (SIGKILL) half-way; every job succeeds exactly once, the failed set and the lists end empty,
//! and the audit trail holds each run's intent and the end entry.
//!
//! Needs `budgetctl` built beside this test and the Node.js package built (scripts/test does
//! both). Never skipped.
#![allow(
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    clippy::unwrap_used,
    missing_docs
)]

mod common;
// Shared with the mixed fleet's tests; this one sends no Celery task and publishes no Rust job.
#[allow(dead_code)]
#[path = "mixed_fleet/processes.rs"]
mod processes;
#[path = "mixed_fleet/upstream.rs"]
mod upstream;

use std::collections::{BTreeMap, HashMap};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use self::processes::{CeleryQueue, Fleet, Proc, budgetctl, depth, node_fleet_worker, wait_until};
use self::upstream::Upstream;

const JOBS: usize = 40;

#[test]
#[allow(clippy::too_many_lines)]
fn budgetctl_replay_puts_bullmq_dead_letters_back_once_through_kills_on_both_sides() {
    let root = common::repo_root();
    let node_worker = node_fleet_worker();
    let fleet = Fleet::start(
        "bullr",
        "deposit_flush_ms = 0\n",
        &[],
        "[defaults]\nratio = 0.0\nmin_allowance = 0\n\
         [dependencies.search]\ntasks = [\"index\"]\n",
    );
    let Fleet {
        redis,
        broker,
        prefix,
        key_prefix,
        dir,
        config,
    } = &fleet;
    let bullmq_queue = format!("{prefix}-bullmq");
    let replay_queue = format!("{prefix}.bullmq.{bullmq_queue}");
    let upstream = Upstream::start();
    let env = [
        ("FB_CONFIG", config.display().to_string()),
        ("FB_BULLMQ_QUEUE", bullmq_queue.clone()),
        ("FB_UPSTREAM", upstream.addr.clone()),
    ];
    let _replay_queue = CeleryQueue {
        name: replay_queue.clone(),
    };
    let node = |args: &[&str]| {
        let mut c = Command::new("node");
        c.arg(&node_worker)
            .args(args)
            .env_remove("FLEET_BUDGET_REDIS_URL")
            .env_remove("FLEET_BUDGET_AMQP_URL")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        c
    };
    let replay = |rate: &str| {
        let mut c = Command::new(budgetctl());
        c.args(["--config", &config.display().to_string()])
            .args(["replay", "--dependency", "search", "--rate", rate])
            .args(["--fixed-rate", "--json"])
            .env_remove("FLEET_BUDGET_REDIS_URL")
            .env_remove("FLEET_BUDGET_AMQP_URL");
        c
    };
    let bullmq_failed =
        || -> u64 { redis.cmd::<u64>(&["ZCARD", &format!("bull:{bullmq_queue}:failed")]) };

    // The dependency is down: every job is dead-lettered on its first failure (floor 0).
    upstream.failing.store(true, Ordering::SeqCst);
    let mut worker = Proc::spawn("bullmq-1", &mut node(&["worker"]), dir);
    let ids: Vec<String> = (0..JOBS)
        .map(|i| format!("node-{i}-{key_prefix}"))
        .collect();
    let mut add = vec!["add"];
    add.extend(ids.iter().map(String::as_str));
    assert!(node(&add).status().unwrap().success(), "adding BullMQ jobs");
    let dead = broker.topology.dead_queue.clone();
    wait_until("the 40 jobs dead-lettered", Duration::from_secs(60), || {
        depth(broker, &dead) >= 40
    });
    worker.stop();
    assert_eq!(bullmq_failed(), 40, "each kept in BullMQ's failed set");
    assert_eq!(
        depth(broker, &replay_queue),
        0,
        "the replay queue was declared with the first dead letter"
    );
    upstream.failing.store(false, Ordering::SeqCst);

    // The replay, killed once it has moved a few (20 a second), then run to the end.
    let mut first = replay("20")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(
        "the first replay to move a few",
        Duration::from_secs(30),
        || depth(broker, &replay_queue) >= 3,
    );
    first.kill().unwrap();
    first.wait().unwrap();
    let moved_first = depth(broker, &replay_queue);
    eprintln!(
        "replay killed after 1 s: {moved_first} in the replay queue, {} in the dead-letter queue",
        depth(broker, &dead)
    );
    assert!(moved_first < 40, "killed half-way: {moved_first}");
    let out = replay("1000").output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "replay: {report} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(report.trim()).unwrap();
    eprintln!("second replay: {report}");
    // The killed run's copies that the broker confirmed before the kill are in the replay queue;
    // of those whose originals it had not acked, the second run finds the claims and parks the
    // originals (in doubt) instead of copying them twice. It moves the rest: with what the first
    // run moved and acked, every job once (the replay queue's 40 below).
    let (moved, in_doubt) = (
        report["moved"].as_u64().unwrap(),
        report["in_doubt"].as_u64().unwrap(),
    );
    assert_eq!(Some(moved + in_doubt), report["total"].as_u64(), "{report}");
    assert_eq!(report["not_ready"], 0, "{report}");
    assert_eq!(report["parked"], in_doubt, "{report}");
    assert_eq!(report["failed"], 0, "{report}");
    assert_eq!(depth(broker, &dead), 0);
    let parked = u64::from(depth(broker, &broker.topology.parked_queue));
    assert_eq!(parked, in_doubt, "the in-doubt originals, parked");
    assert_eq!(
        depth(broker, &replay_queue),
        40,
        "every dead letter in the replay queue once"
    );

    // A BullMQ worker, and the receiver as a process of its own (`fleet-budget-bullmq
    // receive`), killed (SIGKILL) a moment after it started, then started again.
    let mut worker = Proc::spawn(
        "bullmq-2",
        node(&["worker"]).env("FB_NO_RECEIVER", "1"),
        dir,
    );
    let receive = || {
        let mut c = Command::new("node");
        c.arg(root.join("clients/node/dist/cli.js"))
            .args(["receive", "--config", &config.display().to_string()])
            .args(["--queue", &bullmq_queue])
            .env_remove("FLEET_BUDGET_REDIS_URL")
            .env_remove("FLEET_BUDGET_AMQP_URL");
        c
    };
    let mut receiver = Proc::spawn("receiver-1", &mut receive(), dir);
    wait_until(
        "the receiver to take a first job",
        Duration::from_secs(30),
        || depth(broker, &replay_queue) < 40,
    );
    let _ = receiver.child.kill();
    let _ = receiver.child.wait();
    let left_at_kill = depth(broker, &replay_queue);
    let mut receiver = Proc::spawn("receiver-2", &mut receive(), dir);
    wait_until(
        "every replayed job to succeed",
        Duration::from_secs(90),
        || upstream.succeeded(&ids) == JOBS,
    );
    // Time for a doubled job to show.
    std::thread::sleep(Duration::from_secs(1));
    receiver.stop();
    worker.stop();
    let counts = std::fs::read_to_string(&receiver.log).unwrap_or_default();
    eprintln!(
        "receiver killed with {left_at_kill} of 40 left in the replay queue; the second one: {}",
        counts.lines().last().unwrap_or("")
    );

    let calls = upstream.calls();
    let mut oks: HashMap<&str, Vec<(u32, u32)>> = HashMap::new();
    for c in calls.iter().filter(|c| c.ok) {
        oks.entry(c.id.as_str())
            .or_default()
            .push((c.replays, c.attempt));
    }
    let mut wrong = BTreeMap::new();
    for id in &ids {
        let runs = oks.get(id.as_str()).cloned().unwrap_or_default();
        if runs != [(1, 1)] {
            wrong.insert(id.clone(), runs);
        }
    }
    let twice = wrong.values().filter(|r| r.len() > 1).count();
    let lost = wrong.values().filter(|r| r.is_empty()).count();
    eprintln!(
        "accounting: {JOBS} BullMQ jobs dead-lettered, replayed by budgetctl (killed once after \
         {moved_first} copies; the second run moved {moved} and parked {in_doubt} in-doubt \
         originals), the receiver killed with {left_at_kill} left; succeeded once {}, \
         lost {lost}, twice {twice}",
        JOBS - wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "jobs not succeeded exactly once as replay 1, attempt 1: {wrong:?}"
    );
    assert_eq!(bullmq_failed(), 0, "the originals left BullMQ's failed set");
    for queue in [&dead, &replay_queue] {
        assert_eq!(depth(broker, queue), 0, "{queue}");
    }
    assert_eq!(
        u64::from(depth(broker, &broker.topology.parked_queue)),
        in_doubt,
        "only the in-doubt originals parked, their jobs run once through their copies"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// What one replay of the kept jobs came to, for the accounting line.
struct KeptRun {
    moved_by_first: u64,
    report: serde_json::Value,
    /// Requests in the replay list, and in the receiver's hand, when it was killed.
    left_at_kill: Option<(u64, u64)>,
}

/// Issue 35, item 3 without `[amqp]`: 40 BullMQ jobs the budget refused (floor 0, the dependency
/// down) are kept in BullMQ's failed set, each recorded in the fleet's kept list
/// (`<key_prefix>:v1:bullmq-kept:{<queue>}`). The dependency recovers; `budgetctl replay
/// --bullmq-queue` moves them, paced, to the queue's replay list, and `fleet-budget-bullmq
/// receive` puts each back on BullMQ (`<id>~r1`), where a Node worker runs it. With `kills`, the
/// replay is killed (SIGKILL) once it moved a few, the receiver once it put a few back, and each
/// started again. Every job then succeeded exactly once, as replay 1 and attempt 1; the failed
/// set and every list are empty.
fn budgetctl_replay_puts_kept_bullmq_jobs_back(kills: bool) -> KeptRun {
    let root = common::repo_root();
    let node_worker = node_fleet_worker();
    let redis = fleet_budget::testing::RedisServer::start();
    let key_prefix = format!(
        "fbkept{}",
        &fleet_budget_amqp::headers::new_message_id()[..8]
    );
    let dir = std::env::temp_dir().join(&key_prefix);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("fleet-budget.toml");
    // No [amqp]: the Node worker keeps the jobs it cannot retry in BullMQ's failed set.
    std::fs::write(
        &config,
        format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"{key_prefix}\"\ntimeout_ms = 2000\n\
             deposit_flush_ms = 0\n\
             [defaults]\nratio = 0.0\nmin_allowance = 0\n\
             [dependencies.search]\ntasks = [\"index\"]\n",
            redis.url()
        ),
    )
    .unwrap();
    let bullmq_queue = format!("{key_prefix}-bullmq");
    let kept = format!("{key_prefix}:v1:bullmq-kept:{{{bullmq_queue}}}");
    let requests = format!("{key_prefix}:v1:bullmq-replay:{{{bullmq_queue}}}");
    let parked = format!("{key_prefix}:v1:bullmq-parked:{{{bullmq_queue}}}");
    let upstream = Upstream::start();
    let env = [
        ("FB_CONFIG", config.display().to_string()),
        ("FB_BULLMQ_QUEUE", bullmq_queue.clone()),
        ("FB_UPSTREAM", upstream.addr.clone()),
    ];
    let node = |args: &[&str]| {
        let mut c = Command::new("node");
        c.arg(&node_worker)
            .args(args)
            .env_remove("FLEET_BUDGET_REDIS_URL")
            .env_remove("FLEET_BUDGET_AMQP_URL")
            .env("FB_NO_RECEIVER", "1")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        c
    };
    let replay = |rate: &str| {
        let mut c = Command::new(budgetctl());
        c.args(["--config", &config.display().to_string()])
            .args(["replay", "--bullmq-queue", &bullmq_queue, "--rate", rate])
            .args(["--fixed-rate", "--json", "--note", "bullmq kept"])
            .env_remove("FLEET_BUDGET_REDIS_URL")
            .env_remove("FLEET_BUDGET_AMQP_URL");
        c
    };
    let receive = || {
        let mut c = Command::new("node");
        c.arg(root.join("clients/node/dist/cli.js"))
            .args(["receive", "--config", &config.display().to_string()])
            .args(["--queue", &bullmq_queue])
            .env_remove("FLEET_BUDGET_REDIS_URL")
            .env_remove("FLEET_BUDGET_AMQP_URL");
        c
    };
    let len = |key: &str| -> u64 { redis.cmd::<u64>(&["LLEN", key]) };
    let bullmq_failed =
        || -> u64 { redis.cmd::<u64>(&["ZCARD", &format!("bull:{bullmq_queue}:failed")]) };

    // The dependency is down: every job is refused on its first failure (floor 0) and kept.
    upstream.failing.store(true, Ordering::SeqCst);
    let mut worker = Proc::spawn("bullmq-1", &mut node(&["worker"]), &dir);
    let ids: Vec<String> = (0..JOBS)
        .map(|i| format!("kept-{i}-{key_prefix}"))
        .collect();
    let mut add = vec!["add"];
    add.extend(ids.iter().map(String::as_str));
    assert!(node(&add).status().unwrap().success(), "adding BullMQ jobs");
    wait_until("the 40 jobs kept", Duration::from_secs(60), || {
        bullmq_failed() >= 40 && len(&kept) >= 40
    });
    worker.stop();
    assert_eq!(bullmq_failed(), 40, "each kept in BullMQ's failed set");
    assert_eq!(len(&kept), 40, "each recorded in the kept list");
    upstream.failing.store(false, Ordering::SeqCst);

    // Without kills, hostile entries beside the 40: not JSON, no dependency (both unreadable:
    // left in place by a run of one dependency, parked with --include-malformed), and a job
    // replayed max_replays (3) times already (parked).
    let hostile = if kills {
        0
    } else {
        redis.cmd::<u64>(&[
            "LPUSH",
            &kept,
            "not json",
            r#"{"id":"x"}"#,
            r#"{"id":"zz~r3","dependency":"search"}"#,
        ]);
        3
    };
    // A dry run reads only.
    let out = replay("20").arg("--dry-run").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dry: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(dry["moved"], 40, "{dry}");
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert_eq!(len(&kept), 40 + hostile, "the dry run moved nothing");

    let mut worker = Proc::spawn("bullmq-2", &mut node(&["worker"]), &dir);
    let mut receiver = Proc::spawn("receiver-1", &mut receive(), &dir);
    let mut moved_by_first = 0;
    let mut left_at_kill = None;
    if kills {
        // The replay, killed (SIGKILL) once it moved a few (10 a second), then the receiver
        // once it put a few back.
        let mut first = replay("10")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_until(
            "the first replay to move a few",
            Duration::from_secs(30),
            || len(&kept) <= 35,
        );
        first.kill().unwrap();
        first.wait().unwrap();
        moved_by_first = 40 - len(&kept);
        eprintln!(
            "replay killed: {moved_by_first} moved, {} kept left",
            len(&kept)
        );
        assert!(moved_by_first < 40, "killed half-way: {moved_by_first}");
    }
    let mut second = replay("20");
    if !kills {
        second.args(["--dependency", "search"]);
    }
    let second = second
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if kills {
        // The receiver, killed (SIGKILL) half-way through the second run's moves.
        wait_until(
            "the receiver to put some back",
            Duration::from_secs(60),
            || upstream.succeeded(&ids) >= 15,
        );
        let _ = receiver.child.kill();
        let _ = receiver.child.wait();
        // What it had in hand: its own list's request (finished by the next receiver).
        let in_hand: u64 = redis
            .cmd::<Vec<String>>(&["KEYS", &format!("{key_prefix}:v1:bullmq-replaying:*")])
            .iter()
            .map(|k| len(k))
            .sum();
        left_at_kill = Some((len(&requests), in_hand));
        receiver = Proc::spawn("receiver-2", &mut receive(), &dir);
    }
    let out = second.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "replay: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    eprintln!("replay: {report}");
    assert_eq!(report["bullmq_queue"], bullmq_queue.as_str(), "{report}");
    assert_eq!(
        report["total"].as_u64(),
        Some(40 - moved_by_first + hostile),
        "{report}"
    );
    assert_eq!(
        report["moved"].as_u64(),
        Some(40 - moved_by_first),
        "{report}"
    );
    assert_eq!(
        report["parked"],
        u64::from(!kills),
        "{report}: the looping one"
    );
    assert_eq!(report["skipped"], 2 * u64::from(!kills), "{report}");
    assert_eq!(report["malformed"], 2 * u64::from(!kills), "{report}");
    assert_eq!(report["failed"], 0, "{report}");
    // Paced: no move faster than the rate asked.
    let highest = report["highest_rate"].as_f64().unwrap();
    assert!(highest <= 20.0 + 1e-9, "{report}");
    if !kills {
        assert_eq!(len(&kept), 2, "the unreadable entries left in place");
        let out = replay("20")
            .args(["--dependency", "search", "--include-malformed"])
            .output()
            .unwrap();
        let parking: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(out.status.success(), "{parking}");
        assert_eq!(
            (parking["parked"].as_u64(), parking["malformed"].as_u64()),
            (Some(2), Some(2)),
            "{parking}"
        );
        assert_eq!(len(&parked), 3);
        redis.cmd::<u64>(&["DEL", &parked]);
    }
    assert_eq!(len(&kept), 0);
    wait_until(
        "every replayed job to succeed",
        Duration::from_secs(90),
        || upstream.succeeded(&ids) == JOBS,
    );
    // Time for a doubled job to show.
    std::thread::sleep(Duration::from_secs(1));
    receiver.stop();
    worker.stop();
    eprintln!(
        "receiver: {}",
        std::fs::read_to_string(&receiver.log)
            .unwrap_or_default()
            .lines()
            .last()
            .unwrap_or("")
    );

    let mut oks: HashMap<String, Vec<(u32, u32)>> = HashMap::new();
    for c in upstream.calls().into_iter().filter(|c| c.ok) {
        oks.entry(c.id).or_default().push((c.replays, c.attempt));
    }
    let mut wrong = BTreeMap::new();
    for id in &ids {
        let runs = oks.get(id).cloned().unwrap_or_default();
        if runs != [(1, 1)] {
            wrong.insert(id.clone(), runs);
        }
    }
    let twice = wrong.values().filter(|r| r.len() > 1).count();
    let lost = wrong.values().filter(|r| r.is_empty()).count();
    eprintln!(
        "accounting ({}): {JOBS} BullMQ jobs kept in the failed set, replayed by budgetctl \
         --bullmq-queue ({}), the receiver {}; succeeded once {}, lost {lost}, twice {twice}",
        if kills { "kills" } else { "clean" },
        if kills {
            format!(
                "killed after {moved_by_first} moves, the second run moved {}",
                report["moved"]
            )
        } else {
            format!("moved {}", report["moved"])
        },
        left_at_kill.map_or("not killed".to_owned(), |(n, h)| format!(
            "killed with {n} requests left and {h} in hand"
        )),
        JOBS - wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "jobs not succeeded exactly once as replay 1, attempt 1: {wrong:?}"
    );
    assert_eq!(bullmq_failed(), 0, "the originals left BullMQ's failed set");
    for key in [&kept, &requests, &parked] {
        assert_eq!(len(key), 0, "{key}");
    }

    // Audited like any replay: an intent before, the end entry after.
    let out = Command::new(budgetctl())
        .args(["--config", &config.display().to_string()])
        .args(["audit", "--json"])
        .env_remove("FLEET_BUDGET_REDIS_URL")
        .output()
        .unwrap();
    let trail: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let actions: Vec<&str> = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    let started = actions
        .iter()
        .filter(|a| **a == "bullmq_replay_started")
        .count();
    let ended = actions.iter().filter(|a| **a == "bullmq_replay").count();
    // Each run's intent; the end of each run but the killed one.
    assert_eq!(
        (started, ended),
        (2, if kills { 1 } else { 2 }),
        "{actions:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    KeptRun {
        moved_by_first,
        report,
        left_at_kill,
    }
}

#[test]
fn budgetctl_replay_puts_bullmq_kept_jobs_back_once() {
    let run = budgetctl_replay_puts_kept_bullmq_jobs_back(false);
    assert_eq!(run.report["moved"], 40);
}

#[test]
fn budgetctl_replay_puts_bullmq_kept_jobs_back_once_through_kills_on_both_sides() {
    let run = budgetctl_replay_puts_kept_bullmq_jobs_back(true);
    assert!(run.moved_by_first > 0 && run.left_at_kill.is_some());
}
