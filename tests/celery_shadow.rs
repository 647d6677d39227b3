//! Shadow mode through Celery as users run it (issue 34): a real Celery worker process on its
//! default prefork pool (two children), against the shared RabbitMQ and a private redis-server,
//! the tasks of `tests/python/celery_fleet.py` failing while their dependency's budget is
//! exhausted (`ratio = 0`, floor 2: two retries granted, every other one refused).
//!
//! 1. `enforcement = "shadow"` in the TOML (`search`): 10 jobs failing twice each ask for 20
//!    retries; every one goes ahead (every job succeeds on its third attempt, nothing is
//!    dead-lettered), the 18 the budget refused are delivered with `fb-shadow-denied:
//!    budget_exhausted` and the 2 it granted without; `fleet_budget_retries_would_deny_total`,
//!    scraped from each child, sums to 18; `budgetctl status --json` shows `search` in shadow
//!    with `would_deny` ≥ 18. One more job, its first retry refused (marked), is given room by an
//!    operator (`budgetctl budget set`) before it fails again: its granted retry arrives unmarked.
//! 2. The operators' switch (`pages`, enforced by its configuration): `budgetctl budget shadow
//!    pages --for 1h` makes the same storm go through, marked and counted the same way; `budgetctl
//!    budget enforce pages` takes effect within the deny cache's staleness, and the next jobs the
//!    budget refuses are dead-lettered `budget_exhausted`, unmarked.
//!
//! Needs the `.venv` of scripts/test (Celery) and `budgetctl` built beside this test. Never
//! skipped.
#![allow(
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    clippy::unwrap_used,
    missing_docs
)]

mod common;
#[path = "mixed_fleet/processes.rs"]
#[allow(dead_code)]
mod processes;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use fleet_budget_amqp::testing::amqp_url;
use serde_json::Value;

use self::processes::{CeleryQueue, Fleet, budgetctl, depth, python, spawn_celery, wait_until};

/// Jobs per storm, the executions each fails, and the retries the floor grants.
const JOBS: usize = 10;
const FAILS: usize = 2;
const FLOOR: usize = 2;

/// Sends Celery jobs of `task` numbered `jobs`, each failing its first `fail` executions, its
/// retries held until the test says go when `hold`.
fn send(env: &[(&str, String)], task: &str, jobs: Range<usize>, fail: usize, hold: bool) {
    let script = "import sys, celery_fleet\n\
                  for i in range(int(sys.argv[2]), int(sys.argv[3])):\n    \
                  celery_fleet.app.send_task(sys.argv[1], [i], \
                  {'fail': int(sys.argv[4]), 'hold_retries': sys.argv[5] == '1'})\n\
                  celery_fleet.budget.close()\n";
    let (start, end, fail, hold) = (
        jobs.start.to_string(),
        jobs.end.to_string(),
        fail.to_string(),
        if hold { "1" } else { "0" },
    );
    let status = Command::new(python())
        .arg("-c")
        .arg(script)
        .args([task, &start, &end, &fail, hold])
        .current_dir(common::repo_root().join("tests/python"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .status()
        .expect("run Python (scripts/test makes .venv)");
    assert!(status.success(), "sending Celery tasks failed");
}

/// One execution as the task noted it: the task, the job, the attempt (1 first) and the
/// `fb-shadow-denied` header its message carried (`None`: none).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    task: String,
    job: usize,
    attempt: usize,
    shadow_denied: Option<String>,
}

fn seen(redis: &mut redis::Connection, queue: &str, task: &str) -> Vec<Seen> {
    let lines: Vec<String> = redis::cmd("LRANGE")
        .arg(format!("{queue}:seen"))
        .arg(0)
        .arg(-1)
        .query(redis)
        .unwrap();
    lines
        .iter()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(f.len(), 4, "{line:?}");
            Seen {
                task: f[0].to_owned(),
                job: f[1].parse().unwrap(),
                attempt: f[2].parse().unwrap(),
                shadow_denied: (f[3] != "-").then(|| f[3].to_owned()),
            }
        })
        .filter(|s| s.task == task)
        .collect()
}

/// `GET /metrics` of a child's registry (2 s at most), its text.
fn scrape(port: u16) -> String {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    conn.set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.0 200"), "{text:.200}");
    text
}

/// `counter{dependency="<dependency>"}` summed over every child's registry.
fn summed(redis: &mut redis::Connection, queue: &str, counter: &str, dependency: &str) -> f64 {
    let ports: Vec<u16> = redis::cmd("SMEMBERS")
        .arg(format!("{queue}:metrics"))
        .query(redis)
        .unwrap();
    let series = format!("{counter}{{dependency=\"{dependency}\"}} ");
    ports
        .into_iter()
        .map(|port| {
            scrape(port)
                .lines()
                .find_map(|l| l.strip_prefix(&series))
                .map_or(0.0, |v| v.trim().parse::<f64>().unwrap())
        })
        .sum()
}

fn budgetctl_json(config: &Path, args: &[&str]) -> Value {
    let out = Command::new(budgetctl())
        .args(["--config", &config.display().to_string()])
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success(), "budgetctl {args:?}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `dependency`'s entry of `budgetctl status --json`.
fn status(config: &Path, dependency: &str) -> Value {
    let all = budgetctl_json(config, &["status"]);
    all["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["dependency"] == dependency)
        .unwrap_or_else(|| panic!("{dependency} not in {all}"))
        .clone()
}

/// A storm of `JOBS` jobs of `task` failing `FAILS` times each on a dependency in shadow: every
/// retry goes ahead and each refused one is marked; returns the executions.
fn storm_in_shadow(
    env: &[(&str, String)],
    redis: &mut redis::Connection,
    queue: &str,
    task: &str,
) -> Vec<Seen> {
    send(env, task, 0..JOBS, FAILS, false);
    let executions = JOBS * (FAILS + 1);
    wait_until(
        &format!("{executions} executions of {task}"),
        Duration::from_secs(90),
        || seen(redis, queue, task).len() >= executions,
    );
    let runs = seen(redis, queue, task);
    assert_eq!(runs.len(), executions, "{runs:#?}");
    for job in 0..JOBS {
        let mut attempts: Vec<usize> = runs
            .iter()
            .filter(|s| s.job == job)
            .map(|s| s.attempt)
            .collect();
        attempts.sort_unstable();
        assert_eq!(
            attempts,
            (1..=FAILS + 1).collect::<Vec<_>>(),
            "job {job}: every retry went ahead"
        );
    }
    let first: Vec<&Seen> = runs.iter().filter(|s| s.attempt == 1).collect();
    assert!(
        first.iter().all(|s| s.shadow_denied.is_none()),
        "a first attempt is never marked: {first:?}"
    );
    let marked: Vec<&Seen> = runs.iter().filter(|s| s.shadow_denied.is_some()).collect();
    assert!(
        marked
            .iter()
            .all(|s| s.shadow_denied.as_deref() == Some("budget_exhausted")),
        "{marked:?}"
    );
    assert_eq!(
        marked.len(),
        JOBS * FAILS - FLOOR,
        "every retry but the floor's two was refused, retried anyway and marked"
    );
    runs
}

#[test]
#[allow(clippy::too_many_lines)]
fn a_prefork_celery_worker_retries_what_shadow_refuses_marks_and_counts_it() {
    // No ratio: the floor's two retries per day and no more, whatever succeeds.
    let fleet = Fleet::start(
        "csh",
        "",
        &[],
        &format!(
            "[defaults]\nwindow_secs = 86400\nratio = 0.0\nmin_allowance = {FLOOR}\n\
             [dependencies.search]\ntasks = [\"shadow_index\"]\nenforcement = \"shadow\"\n\
             [dependencies.pages]\ntasks = [\"switch_index\"]\n\
             [tasks.shadow_index]\nmax_attempts = 4\nbackoff_base_ms = 10\nbackoff_cap_ms = 50\n\
             [tasks.switch_index]\nmax_attempts = 4\nbackoff_base_ms = 10\nbackoff_cap_ms = 50\n"
        ),
    );
    let Fleet {
        redis: server,
        broker,
        prefix,
        dir,
        config,
        ..
    } = &fleet;
    let queue = format!("{prefix}.celery");
    let env = [
        ("FB_CONFIG", config.display().to_string()),
        ("FB_CELERY_QUEUE", queue.clone()),
        ("FB_BROKER", amqp_url()),
    ];
    let _celery_queue = CeleryQueue {
        name: queue.clone(),
    };
    // Celery's default pool (prefork, no -P), two children, each serving its own metrics.
    let mut worker_env = env.to_vec();
    worker_env.push(("FB_METRICS", "1".to_owned()));
    let mut celery = spawn_celery(None, 2, &queue, &worker_env, dir);
    let mut redis = redis::Client::open(server.url())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap();
    wait_until(
        "two children serving metrics",
        Duration::from_secs(60),
        || {
            redis::cmd("SCARD")
                .arg(format!("{queue}:metrics"))
                .query::<usize>(&mut redis)
                .unwrap()
                == 2
        },
    );
    let dead = broker.topology.dead_queue.clone();
    let refused = JOBS * FAILS - FLOOR;

    // 1. Shadow from the configuration.
    storm_in_shadow(&env, &mut redis, &queue, "shadow_index");
    let would_deny = summed(
        &mut redis,
        &queue,
        "fleet_budget_retries_would_deny_total",
        "search",
    );
    let granted = summed(
        &mut redis,
        &queue,
        "fleet_budget_retries_granted_total",
        "search",
    );
    println!(
        "shadow (configuration): {} retries, {granted} granted, {would_deny} would have been denied \
         (fleet_budget_retries_would_deny_total over both children), {refused} delivered marked",
        JOBS * FAILS
    );
    #[allow(clippy::cast_precision_loss)]
    {
        assert!((would_deny - refused as f64).abs() < 0.5, "{would_deny}");
        assert!((granted - FLOOR as f64).abs() < 0.5, "{granted}");
    }
    // The deny cache's denials reach Redis with the children's deposits (every 100 ms).
    wait_until(
        "status to count every refusal of search",
        Duration::from_secs(10),
        || status(config, "search")["would_deny"].as_u64().unwrap() >= refused as u64,
    );
    let search = status(config, "search");
    println!(
        "budgetctl status --json, search: enforcement {}, would_deny {}, retries_denied {}, retries_granted {}",
        search["enforcement"],
        search["would_deny"],
        search["retries_denied"],
        search["retries_granted"]
    );
    assert_eq!(search["enforcement"], "shadow");
    assert_eq!(depth(broker, &dead), 0, "nothing dead-lettered in shadow");

    // A later retry the budget grants drops the mark: one more job fails twice; its first retry
    // is refused (the floor is spent) and arrives marked; while it waits, an operator gives the
    // dependency room (`budgetctl budget set`), so its second retry is granted and arrives
    // unmarked.
    send(&env, "shadow_index", JOBS..JOBS + 1, FAILS, true);
    let attempt = |n: usize, redis: &mut redis::Connection| {
        seen(redis, &queue, "shadow_index")
            .into_iter()
            .find(|s| s.job == JOBS && s.attempt == n)
    };
    wait_until(
        "the held job's first retry",
        Duration::from_secs(60),
        || attempt(2, &mut redis).is_some(),
    );
    assert_eq!(
        attempt(2, &mut redis).unwrap().shadow_denied.as_deref(),
        Some("budget_exhausted")
    );
    budgetctl_json(
        config,
        &[
            "budget",
            "set",
            "search",
            "--min-allowance",
            "100",
            "--for",
            "1h",
            "--reason",
            "room for the held job",
        ],
    );
    std::thread::sleep(Duration::from_millis(500)); // past the deny cache's 100 ms
    redis::cmd("SET")
        .arg(format!("{queue}:go:{JOBS}"))
        .arg(1)
        .exec(&mut redis)
        .unwrap();
    wait_until(
        "the held job's second retry",
        Duration::from_secs(60),
        || attempt(3, &mut redis).is_some(),
    );
    assert_eq!(
        attempt(3, &mut redis).unwrap().shadow_denied,
        None,
        "a granted retry drops the mark"
    );

    // 2. The operators' switch: `pages` is enforced by its configuration.
    let switched = budgetctl_json(
        config,
        &[
            "budget",
            "shadow",
            "pages",
            "--for",
            "1h",
            "--reason",
            "watch before enforcing",
        ],
    );
    println!("budgetctl budget shadow pages --for 1h: {switched}");
    assert_eq!(status(config, "pages")["enforcement"], "shadow");
    storm_in_shadow(&env, &mut redis, &queue, "switch_index");
    let pages_would_deny = summed(
        &mut redis,
        &queue,
        "fleet_budget_retries_would_deny_total",
        "pages",
    );
    #[allow(clippy::cast_precision_loss)]
    {
        assert!(
            (pages_would_deny - refused as f64).abs() < 0.5,
            "{pages_would_deny}"
        );
    }
    wait_until(
        "status to count every refusal of pages",
        Duration::from_secs(10),
        || status(config, "pages")["would_deny"].as_u64().unwrap() >= refused as u64,
    );
    println!(
        "shadow (switch): {pages_would_deny} would have been denied; status would_deny {}",
        status(config, "pages")["would_deny"]
    );
    assert_eq!(depth(broker, &dead), 0, "nothing dead-lettered in shadow");

    // Enforced again: within the staleness (100 ms here) the refusals dead-letter the jobs.
    budgetctl_json(
        config,
        &[
            "budget",
            "enforce",
            "pages",
            "--reason",
            "the ratio is workable",
        ],
    );
    assert_eq!(status(config, "pages")["enforcement"], "enforce");
    std::thread::sleep(Duration::from_millis(500));
    let before = seen(&mut redis, &queue, "switch_index").len();
    send(&env, "switch_index", 0..5, 1, false);
    wait_until("5 dead letters", Duration::from_secs(60), || {
        depth(broker, &dead) >= 5
    });
    std::thread::sleep(Duration::from_millis(500));
    let after = seen(&mut redis, &queue, "switch_index");
    assert_eq!(
        after.len() - before,
        5,
        "each job ran once and its retry was refused: {:?}",
        &after[before..]
    );
    assert_eq!(depth(broker, &dead), 5);
    // What the dead letters say (`budgetctl dlq stats`, from the dead-letter index the worker
    // keeps): the budget's refusal, not a ceiling's.
    wait_until(
        "the dead-letter index to count the 5",
        Duration::from_secs(10),
        || budgetctl_json(config, &["dlq", "stats"])["dead_letter"]["indexed"] == 5,
    );
    let stats = budgetctl_json(config, &["dlq", "stats"]);
    assert_eq!(
        stats["dead_letter"]["by_dependency_reason"],
        serde_json::json!([{"dependency": "pages", "reason": "budget_exhausted", "count": 5}]),
        "{stats}"
    );
    #[allow(clippy::cast_precision_loss)]
    {
        let still = summed(
            &mut redis,
            &queue,
            "fleet_budget_retries_would_deny_total",
            "pages",
        );
        assert!(
            (still - refused as f64).abs() < 0.5,
            "enforced: none counted as would-deny: {still}"
        );
    }
    assert_eq!(status(config, "pages")["would_deny"], 0, "0 while enforced");
    celery.stop();
}
