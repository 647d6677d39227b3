//! Celery workers keep the dead-letter index as Rust workers do (issue 31): what a Celery worker
//! dead-letters is counted in Redis under the row the Rust tools read back from its headers, so
//! that a look at the queue (`Replayer::counts`, `budgetctl dlq stats`, a dry run) is exact after
//! an incident in a Celery fleet, and a Rust replay's counts out hit the rows Python wrote.
//!
//! 1. `python_rows_are_rusts_rows`: `fleet_budget.dead_letters.row` of header sets, hostile texts
//!    and malformed values included, is `Row::in_dead_letters(..).encode()` of the same headers.
//! 2. `celery_dead_letters_are_counted_where_rust_reads_them`: a real Celery worker (the prefork
//!    pool, two children) dead-letters 32 jobs of two dependencies, two reasons and hostile error
//!    classes; the index equals the queue (exact, the groups expected); a replay of one
//!    dependency moves its 10 back, the worker dead-letters them again as replay 1, and the index
//!    is still exact; the worker stops, and it stays exact.
//!
//! Needs the `.venv` of scripts/test (Celery). Never skipped.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

mod common;
#[path = "mixed_fleet/processes.rs"]
#[allow(dead_code)]
mod processes;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fleet_budget::FleetBudget;
use fleet_budget_amqp::dead_letters::{QueueCounts, Row};
use fleet_budget_amqp::testing::amqp_url;
use fleet_budget_amqp::{ReplayFilter, ReplayOptions, Replayer, WorkerConfig};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use serde_json::{Value, json};

use self::processes::{CeleryQueue, Fleet, depth, python, spawn_celery, wait_until};

/// `headers` as py-amqp sends the Python values of the same JSON (text as long strings, integers
/// as 64-bit integers, `true` as a boolean, `1.5` as a double, `null` as void).
fn table(headers: &serde_json::Map<String, Value>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in headers {
        let value = match v {
            Value::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
            Value::Number(n) if n.is_i64() => AMQPValue::LongLongInt(n.as_i64().unwrap()),
            Value::Number(n) => AMQPValue::Double(n.as_f64().unwrap()),
            Value::Bool(b) => AMQPValue::Boolean(*b),
            Value::Null => AMQPValue::Void,
            other => panic!("no such header value in these cases: {other}"),
        };
        t.insert(ShortString::from(k.as_str()), value);
    }
    t
}

/// A dead letter's headers as a Celery worker publishes them, changed by `change` (a `null`
/// value removes the header).
fn record(change: &Value) -> Value {
    let mut base = json!({
        "fb-task": "fail_as",
        "fb-dependency": "search",
        "fb-reason": "non_retryable",
        "fb-original-exchange": "",
        "fb-original-routing-key": "fleet.celery",
        "fb-original-queue": "fleet.celery",
        "fb-attempts": 1,
        "fb-first-failure-ms": 1_765_000_000_000_u64,
        "fb-dead-lettered-ms": 1_765_000_059_999_u64,
        "fb-error-class": "timeout",
        "fb-error": "it failed",
        "fb-replays": 0,
        "task": "fail_as",
        "id": "0b5d",
    });
    let fields = base.as_object_mut().unwrap();
    for (k, v) in change.as_object().unwrap() {
        if v.is_null() {
            fields.remove(k);
        } else {
            fields.insert(k.clone(), v.clone());
        }
    }
    base
}

#[test]
fn python_rows_are_rusts_rows() {
    let long_e = format!("x{}", "é".repeat(200));
    let long_crab = format!("ab{}", "🦀".repeat(100));
    let cases: Vec<Value> = [
        json!({}),
        // Hostile texts: quotes, backslashes, every kind of control character, non-ASCII,
        // line and paragraph separators, bidi overrides, texts cut inside a character.
        json!({"fb-error-class": "quote\" back\\slash / solidus"}),
        json!({"fb-error-class": "\u{0}\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1b}\u{1f} \u{7f}\u{80}\u{9f}"}),
        json!({"fb-error-class": "ünïcødé 日本語 🦀 \u{2028}\u{2029} \u{202e}evil\u{feff}"}),
        json!({"fb-error-class": long_e, "fb-task": long_crab}),
        json!({"fb-dependency": long_crab, "fb-original-exchange": long_e}),
        json!({"fb-dependency": "a".repeat(256), "fb-task": "b".repeat(257)}),
        json!({"fb-original-exchange": "ex\"\\\u{1}ché"}),
        // Absent optional headers, and every other reason.
        json!({"fb-error-class": null, "fb-replays": null, "fb-attempts": null}),
        json!({"fb-reason": "budget_exhausted", "fb-budget-allowance": 10,
               "fb-budget-retries": 10, "fb-budget-window-ms": 60000,
               "fb-budget-window-index": 29_416_666, "fb-budget-source": "fleet"}),
        json!({"fb-reason": "attempts_exhausted"}),
        json!({"fb-reason": "budget_frozen"}),
        json!({"fb-reason": "concurrency_cap"}),
        json!({"fb-reason": "concurrency_retry_share"}),
        json!({"fb-reason": "circuit_open"}),
        json!({"fb-reason": "fanout_exhausted"}),
        json!({"fb-reason": "delay_exceeded"}),
        // Integers as text, with the whitespace Rust trims, and the minute's edges.
        json!({"fb-replays": "3", "fb-dead-lettered-ms": " 1765000060000\n"}),
        json!({"fb-replays": "+4", "fb-dead-lettered-ms": "\u{a0}\u{3000}59999"}),
        json!({"fb-replays": 4_294_967_295_u64, "fb-dead-lettered-ms": 0}),
        json!({"fb-dead-lettered-ms": i64::MAX}),
        // Not counted: what Rust's DeadLetterRecord::parse refuses.
        json!({"fb-reason": "budget_exhausted ", "fb-error-class": "x"}),
        json!({"fb-reason": "Non_Retryable"}),
        json!({"fb-reason": null}),
        json!({"fb-dependency": ""}),
        json!({"fb-dependency": null}),
        json!({"fb-task": null}),
        json!({"fb-original-exchange": null}),
        json!({"fb-original-routing-key": null}),
        json!({"fb-dead-lettered-ms": null}),
        json!({"fb-dead-lettered-ms": -1}),
        json!({"fb-dead-lettered-ms": "1e3"}),
        json!({"fb-dead-lettered-ms": "\u{1c}5"}),
        json!({"fb-dead-lettered-ms": "٣"}),
        json!({"fb-dead-lettered-ms": "1_000"}),
        json!({"fb-dead-lettered-ms": 1.5}),
        json!({"fb-dead-lettered-ms": true}),
        json!({"fb-replays": 4_294_967_296_u64}),
        json!({"fb-replays": "x"}),
        json!({"fb-attempts": 4_294_967_296_u64}),
        json!({"fb-first-failure-ms": "soon"}),
        json!({"fb-error-class": 5}),
        json!({"fb-error": true}),
        json!({"fb-original-queue": 1}),
        json!({"fb-budget-source": 2}),
        json!({"fb-budget-allowance": 3, "fb-budget-retries": "many"}),
        json!({"fb-budget-allowance": "lots"}),
        // Read only with an allowance: counted without one, whatever they hold.
        json!({"fb-budget-retries": "many", "fb-budget-window-ms": -1}),
        // Booleans where Rust reads text.
        json!({"fb-task": false}),
    ]
    .iter()
    .map(record)
    .collect();
    let rust: Vec<Option<String>> = cases
        .iter()
        .map(|c| Row::in_dead_letters(&table(c.as_object().unwrap())).map(|r| r.encode()))
        .collect();
    let counted = rust.iter().filter(|r| r.is_some()).count();
    assert_eq!(counted, 22, "the cases Rust counts: {rust:#?}");

    let mut child = Command::new(python())
        .args([
            "-c",
            "import json, sys\n\
             from fleet_budget.dead_letters import row\n\
             print(json.dumps([row(c) for c in json.load(sys.stdin)]))\n",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run Python (scripts/test makes .venv)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(Value::Array(cases.clone()).to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python failed");
    let python: Vec<Option<String>> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(python.len(), rust.len());
    for ((case, r), p) in cases.iter().zip(&rust).zip(&python) {
        assert_eq!(p, r, "the row of {case}");
    }
}

/// The index's groups, `(dependency, reason, error class) → messages`.
fn groups(counts: &QueueCounts) -> BTreeMap<(String, String, String), u64> {
    counts
        .groups()
        .into_iter()
        .map(|g| ((g.dependency, g.reason, g.error_class), g.messages))
        .collect()
}

/// Waits until the counts are exact and `also` holds (the counts are sent within 250 ms of the
/// confirm); fails with the last counts.
fn wait_exact(counts: &dyn Fn() -> QueueCounts, what: &str, also: impl Fn(&QueueCounts) -> bool) {
    let started = Instant::now();
    loop {
        let c = counts();
        if c.exact() && also(&c) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what}: not exact: {:?}\n{c:#?}",
            c.why_estimate()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends Celery tasks from Python: `(task, error class, retryable)` each.
fn send(env: &[(&str, String)], jobs: &[(&str, String, bool)]) {
    let jobs: Vec<Value> = jobs
        .iter()
        .map(|(task, class, retryable)| json!([task, class, retryable]))
        .collect();
    let script = "import json, sys, celery_fleet\n\
                  for i, (task, cls, retryable) in enumerate(json.loads(sys.argv[1])):\n    \
                  celery_fleet.app.send_task(task, [i, cls, retryable])\n\
                  celery_fleet.budget.close()\n";
    let status = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(Value::Array(jobs).to_string())
        .current_dir(common::repo_root().join("tests/python"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .status()
        .expect("run Python (scripts/test makes .venv)");
    assert!(status.success(), "sending Celery tasks failed");
}

#[test]
#[allow(clippy::too_many_lines)]
fn celery_dead_letters_are_counted_where_rust_reads_them() {
    // `search` has no allowance (its retryable failures are denied: budget_exhausted); `mail`
    // has headroom, so that its replay is not paused.
    let fleet = Fleet::start(
        "cdl",
        "",
        &[],
        "[defaults]\nwindow_secs = 86400\nratio = 0.0\nmin_allowance = 0\n\
         [dependencies.search]\ntasks = [\"fail_as\"]\n\
         [dependencies.mail]\ntasks = [\"mail_as\"]\nmin_allowance = 100\n",
    );
    let Fleet {
        broker,
        prefix,
        dir,
        config,
        ..
    } = &fleet;
    let celery_queue = format!("{prefix}.celery");
    let env = [
        ("FB_CONFIG", config.display().to_string()),
        ("FB_CELERY_QUEUE", celery_queue.clone()),
        ("FB_BROKER", amqp_url()),
    ];
    let _celery_queue = CeleryQueue {
        name: celery_queue.clone(),
    };
    let mut celery = spawn_celery(Some("prefork"), 2, &celery_queue, &env, dir);

    // 32 jobs that fail for good, under hostile error classes too.
    let long = format!("x{}", "é".repeat(200));
    let hostile = [
        "quote\" back\\slash",
        "tab\tline\nbell\u{7}\u{1f}",
        "ünïcødé 🦀 \u{2028}\u{202e}",
        long.as_str(),
    ];
    let mut jobs: Vec<(&str, String, bool)> = Vec::new();
    jobs.extend((0..8).map(|_| ("fail_as", "timeout".to_owned(), false)));
    jobs.extend((0..6).map(|_| ("fail_as", "http_503".to_owned(), true)));
    for class in hostile {
        jobs.extend((0..2).map(|_| ("fail_as", class.to_owned(), false)));
    }
    // The replayed dependency's rows hold what serde_json writes as it is (non-ASCII, U+2028)
    // and a text cut inside a character: its counts out find them only if the texts are Rust's.
    jobs.extend((0..5).map(|_| ("mail_as", "bounce".to_owned(), false)));
    jobs.extend((0..3).map(|_| ("mail_as", hostile[2].to_owned(), false)));
    jobs.extend((0..2).map(|_| ("mail_as", long.clone(), false)));
    send(&env, &jobs);

    let dead = broker.topology.dead_queue.clone();
    wait_until("32 dead letters", Duration::from_secs(60), || {
        depth(broker, &dead) >= 32
    });
    let worker_config = WorkerConfig::from_path(config).unwrap();
    // One runtime for the budget's Redis connection, which lives on the runtime it was made on.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let budget = rt
        .block_on(FleetBudget::from_config(&worker_config.budget))
        .unwrap();
    let replayer = Replayer::new(amqp_url(), broker.topology.clone(), Some(budget));
    let counts = || rt.block_on(replayer.counts()).unwrap();
    // Sent by each child's thread within 250 ms of the confirm.
    wait_exact(&counts, "the 32 dead letters", |c| c.depth == 32);
    let before = counts();
    assert_eq!((before.depth, before.indexed()), (32, 32), "{before:?}");
    let cut: String = long.chars().take(128).collect(); // 1 + 127 × 2 bytes: 255 ≤ 256
    let key = |d: &str, r: &str, c: &str| (d.to_owned(), r.to_owned(), c.to_owned());
    let expected: BTreeMap<_, _> = [
        (key("search", "non_retryable", "timeout"), 8),
        (key("search", "budget_exhausted", "http_503"), 6),
        (key("search", "non_retryable", hostile[0]), 2),
        (key("search", "non_retryable", hostile[1]), 2),
        (key("search", "non_retryable", hostile[2]), 2),
        (key("search", "non_retryable", &cut), 2),
        (key("mail", "non_retryable", "bounce"), 5),
        (key("mail", "non_retryable", hostile[2]), 3),
        (key("mail", "non_retryable", &cut), 2),
    ]
    .into_iter()
    .collect();
    assert_eq!(groups(&before), expected);
    assert!(
        before
            .rows
            .iter()
            .all(|(r, _)| r.replays == 0 && r.minute > 0 && r.task.ends_with("_as")),
        "{:?}",
        before.rows
    );

    // A Rust replay of `mail` counts its 10 out of the rows Python wrote; the Celery worker fails
    // them again and counts them in as replay 1.
    let mut options = ReplayOptions::new(&worker_config);
    options.filter = ReplayFilter {
        dependency: Some("mail".to_owned()),
        ..ReplayFilter::default()
    };
    let dry = rt.block_on(replayer.dry_run(&options)).unwrap();
    assert!(dry.exact, "{dry:?}");
    assert_eq!((dry.would_move, dry.skipped), (10, 22), "{dry:?}");
    let run = rt.block_on(replayer.run(&options, |_| {})).unwrap();
    assert_eq!((run.moved, run.parked, run.failed), (10, 0, 0), "{run:?}");
    wait_exact(&counts, "the replayed jobs dead-lettered again", |c| {
        c.depth == 32 && c.matching(|r| r.replays == 1) == 10
    });
    let after = counts();
    assert_eq!(groups(&after), expected, "{after:?}");
    assert_eq!(
        after.matching(|r| r.dependency == "mail" && r.replays == 1),
        10,
        "{after:?}"
    );
    assert_eq!(after.matching(|r| r.replays == 0), 22, "{after:?}");

    // The worker stops (each child flushes before it exits): nothing counted twice or lost.
    celery.stop();
    let stopped = counts();
    assert!(stopped.exact(), "{:?}", stopped.why_estimate());
    assert_eq!(groups(&stopped), expected);
    let _ = std::fs::remove_dir_all(dir);
}
