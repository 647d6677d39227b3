//! The CLI through the real binary: happy paths, JSON shapes, and bad input → exit 2 naming the
//! flag or key. Redis tests start a private `redis-server`; nothing here touches shared state.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use fleet_budget::testing::{RedisCluster, RedisServer};
use serde_json::Value;

fn budgetctl() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_budgetctl"));
    c.env_remove("FLEET_BUDGET_REDIS_URL")
        .env_remove("FLEET_BUDGET_AMQP_URL")
        .env_remove("RUST_LOG");
    c.stdin(Stdio::null());
    c
}

fn run(args: &[&str]) -> Output {
    budgetctl().args(args).output().expect("run budgetctl")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exactly one JSON object on stdout.
fn json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        stdout(o),
        stderr(o)
    );
    let v: Value = serde_json::from_str(&stdout(o))
        .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}):\n{}", stdout(o)));
    assert!(v.is_object(), "{v}");
    v
}

fn assert_exit(o: &Output, code: i32, needle: &str) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        stdout(o),
        stderr(o)
    );
    assert!(
        stderr(o).contains(needle),
        "stderr does not name {needle:?}:\n{}",
        stderr(o)
    );
}

fn has_fields(v: &Value, fields: &[&str]) {
    for f in fields {
        assert!(v.get(f).is_some(), "missing field {f:?} in {v}");
    }
}

fn temp_file(name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("budgetctl-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("t{}-{name}-{nanos}", std::process::id())
}

// --- usage errors -----------------------------------------------------------------------------

#[test]
fn help_and_version_exit_zero() {
    let o = run(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    for command in [
        "demo", "simulate", "status", "bench", "replay", "dlq", "migrate", "config",
    ] {
        assert!(stdout(&o).contains(command), "{command} missing from help");
    }
    assert_eq!(run(&["--version"]).status.code(), Some(0));
}

#[test]
fn unknown_flags_and_commands_exit_2_naming_them() {
    assert_exit(&run(&["--frobnicate", "status"]), 2, "--frobnicate");
    assert_exit(
        &run(&["simulate", "brownout", "--failure-rate", "0.5", "--nope"]),
        2,
        "--nope",
    );
    assert_exit(&run(&["teleport"]), 2, "teleport");
    assert_exit(&run(&[]), 2, "Usage");
}

#[test]
fn bad_values_exit_2_naming_the_flag() {
    assert_exit(
        &run(&[
            "simulate",
            "capacity",
            "--incoming",
            "1000000",
            "--ticks",
            "10000",
        ]),
        2,
        "--incoming",
    );
    let o = budgetctl()
        .env("FLEET_BUDGET_REDIS_URL", "http://u:pw@h")
        .arg("status")
        .output()
        .unwrap();
    assert_exit(&o, 2, "FLEET_BUDGET_REDIS_URL");
    assert_exit(
        &run(&["simulate", "brownout", "--failure-rate", "1.5"]),
        2,
        "--failure-rate",
    );
    assert_exit(
        &run(&["simulate", "brownout", "--failure-rate", "abc"]),
        2,
        "--failure-rate",
    );
    assert_exit(
        &run(&[
            "simulate",
            "brownout",
            "--failure-rate",
            "0.5",
            "--budget-ratio",
            "-1",
        ]),
        2,
        "--budget-ratio",
    );
    assert_exit(
        &run(&[
            "simulate",
            "brownout",
            "--failure-rate",
            "0.5",
            "--deposit",
            "maybe",
        ]),
        2,
        "--deposit",
    );
    assert_exit(
        &run(&["simulate", "brownout", "--failure-rate", "NaN"]),
        2,
        "--failure-rate",
    );
    assert_exit(&run(&["simulate", "brownout"]), 2, "--failure-rate");
    assert_exit(
        &run(&["simulate", "capacity", "--ticks", "0"]),
        2,
        "--ticks",
    );
    assert_exit(
        &run(&[
            "bench",
            "--dependency",
            "x",
            "--successes",
            "-3",
            "--retries",
            "1",
        ]),
        2,
        "--successes",
    );
    assert_exit(
        &run(&[
            "bench",
            "--dependency",
            "a{b}",
            "--successes",
            "1",
            "--retries",
            "1",
        ]),
        2,
        "--dependency",
    );
    assert_exit(&run(&["status", "--dependency", ""]), 2, "--dependency");
    assert_exit(
        &run(&["replay", "--dependency", "search", "--reason", "bored"]),
        2,
        "--reason",
    );
    assert_exit(&run(&["demo", "--phase-secs", "0"]), 2, "--phase-secs");
    assert_exit(
        &run(&["--redis-url", "http://u:hunter2@h", "status"]),
        2,
        "--redis-url",
    );
    assert!(!stderr(&run(&["--redis-url", "http://u:hunter2@h", "status"])).contains("hunter2"));
    assert_exit(
        &run(&["--amqp-url", "redis://h", "dlq", "stats"]),
        2,
        "--amqp-url",
    );
    assert_exit(&run(&["--key-prefix", "a{b}", "status"]), 2, "--key-prefix");
}

#[test]
fn missing_or_malformed_config_exits_2_naming_it() {
    let o = run(&["--config", "/nonexistent/fleet.toml", "status"]);
    assert_exit(&o, 2, "--config");
    assert!(stderr(&o).contains("/nonexistent/fleet.toml"));
    let malformed = temp_file("malformed.toml", "[defaults\nratio = 0.2\n");
    assert_exit(
        &run(&["--config", malformed.to_str().unwrap(), "status"]),
        2,
        "malformed.toml",
    );
    let invalid = temp_file("invalid.toml", "[dependencies.search]\nratio = -1.0\n");
    assert_exit(
        &run(&[
            "--config",
            invalid.to_str().unwrap(),
            "bench",
            "--dependency",
            "s",
            "--successes",
            "1",
            "--retries",
            "1",
        ]),
        2,
        "dependencies.search.ratio",
    );
    let unknown = temp_file("unknown.toml", "[defaults]\nratoi = 0.2\n");
    assert_exit(
        &run(&["--config", unknown.to_str().unwrap(), "demo"]),
        2,
        "ratoi",
    );
}

// --- config check -----------------------------------------------------------------------------

#[test]
fn config_check_prints_the_resolved_map_and_policies() {
    let path = temp_file(
        "good.toml",
        "[redis]\nurl = \"redis://admin:s3cret@127.0.0.1:6379\"\n[dependencies.search]\ntasks = [\"index_document\", \"reindex\"]\nratio = 0.1\n[tasks.index_document]\nclass = \"idempotent\"\n[tasks.thumbnail]\nmax_attempts = 2\n",
    );
    let o = run(&["config", "check", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("valid"), "{text}");
    assert!(
        text.contains("index_document")
            && text.contains("search")
            && text.contains("thumbnail (own)"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "password printed: {text}");
    let v = json(&run(&["config", "check", path.to_str().unwrap(), "--json"]));
    assert_eq!(v["valid"], true);
    has_fields(
        &v,
        &["file", "redis_url", "defaults", "dependencies", "tasks"],
    );
    assert!(!v.to_string().contains("s3cret"));
    let search = &v["dependencies"][0];
    assert_eq!(search["dependency"], "search");
    assert_eq!(search["ratio"], 0.1);
    assert_eq!(
        search["tasks"],
        serde_json::json!(["index_document", "reindex"])
    );
    let tasks = v["tasks"].as_array().unwrap();
    let index = tasks
        .iter()
        .find(|t| t["task"] == "index_document")
        .unwrap();
    assert_eq!(index["max_attempts"], 8);
}

#[test]
fn config_check_lists_every_error_and_exits_2() {
    let path = temp_file("bad.toml", "[defaults]\nratio = -1.0\nwindow_secs = 0\n");
    let o = run(&["config", "check", path.to_str().unwrap()]);
    assert_exit(&o, 2, "defaults.ratio");
    assert!(stderr(&o).contains("defaults.window_secs"));
    let o = run(&["config", "check", path.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(2));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["valid"], false);
    assert_eq!(v["errors"].as_array().unwrap().len(), 2);
    assert_exit(
        &run(&["config", "check", "/nonexistent/x.toml"]),
        2,
        "/nonexistent/x.toml",
    );
    let garbage = temp_file("garbage.toml", "\u{0}\u{1}[[[");
    assert_exit(
        &run(&["config", "check", garbage.to_str().unwrap()]),
        2,
        "garbage.toml",
    );
}

// --- simulate ---------------------------------------------------------------------------------

#[test]
fn simulate_brownout_json_shape_and_reference_numbers() {
    let base = [
        "simulate",
        "brownout",
        "--requests",
        "2000",
        "--attempts",
        "3",
        "--runs",
        "10",
        "--json",
    ];
    let amp = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        json(&run(&args))
    };
    let healthy = amp(&["--failure-rate", "0.05"]);
    has_fields(
        &healthy,
        &[
            "client_requests",
            "upstream_calls",
            "amplification",
            "successes",
            "retries_granted",
            "retries_denied",
        ],
    );
    assert!(
        (healthy["amplification"].as_f64().unwrap() - 1.05).abs() < 0.01,
        "{healthy}"
    );
    let storm = amp(&["--failure-rate", "0.9"]);
    assert!(
        (storm["amplification"].as_f64().unwrap() - 2.71).abs() < 0.03,
        "{storm}"
    );
    let budget = amp(&[
        "--failure-rate",
        "0.9",
        "--budget-ratio",
        "0.1",
        "--deposit",
        "request",
    ]);
    assert!(
        (budget["amplification"].as_f64().unwrap() - 1.10).abs() < 0.015,
        "{budget}"
    );
    assert!(
        (budget["successes"].as_f64().unwrap() - 220.0).abs() < 25.0,
        "{budget}"
    );
    // One run: integers.
    let one = json(&run(&[
        "simulate",
        "brownout",
        "--failure-rate",
        "0.5",
        "--json",
        "--seed",
        "3",
    ]));
    assert!(one["upstream_calls"].is_u64(), "{one}");
    let text = run(&["simulate", "brownout", "--failure-rate", "0.9"]);
    assert!(stdout(&text).contains("amplification"), "{}", stdout(&text));
}

#[test]
fn simulate_capacity_json_shape_reference_and_svg() {
    let svg = std::env::temp_dir().join(format!("{}.svg", unique("capacity")));
    let o = run(&[
        "simulate",
        "capacity",
        "--incoming",
        "900",
        "--capacity",
        "1000",
        "--degraded-capacity",
        "200",
        "--degraded-ticks",
        "3",
        "--attempts",
        "3",
        "--budget-ratio",
        "0.1",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let v = json(&o);
    has_fields(
        &v,
        &[
            "ticks",
            "peak_offered",
            "served_total",
            "dead_lettered_total",
            "without_budget",
        ],
    );
    has_fields(
        &v["ticks"][0],
        &[
            "tick",
            "offered",
            "served",
            "failed",
            "retries_granted",
            "dead_lettered",
        ],
    );
    let without = v["without_budget"]["peak_offered"].as_u64().unwrap();
    let with = v["peak_offered"].as_u64().unwrap();
    assert!((2300..=2450).contains(&without), "{without}");
    #[allow(clippy::cast_precision_loss)]
    let cut = 1.0 - with as f64 / without as f64;
    assert!((0.4..=0.6).contains(&cut), "{with} vs {without}");
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(
        chart.starts_with("<svg") && chart.contains("polyline") && chart.contains("without budget"),
        "{chart}"
    );
    let _ = std::fs::remove_file(&svg);
    let o = run(&["simulate", "capacity", "--svg", "/nonexistent-dir/x.svg"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = stdout(&run(&[
        "simulate",
        "capacity",
        "--budget-ratio",
        "0.1",
        "--ticks",
        "10",
    ]));
    assert!(text.contains("peak offered"), "{text}");
}

// --- Redis: status and bench --------------------------------------------------------------------

#[test]
fn bench_and_status_against_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let prefix = unique("bench");
    let o = run(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "bench",
        "--dependency",
        "search",
        "--successes",
        "500",
        "--retries",
        "300",
        "--concurrency",
        "4",
        "--json",
    ]);
    let v = json(&o);
    has_fields(
        &v,
        &[
            "successes_recorded",
            "retries_requested",
            "granted",
            "denied",
            "decisions_per_sec",
            "p50_us",
            "p99_us",
            "ping_p50_us",
            "ping_p99_us",
        ],
    );
    // Default policy: ratio 0.2 of 500 successes = 100.
    assert_eq!(v["granted"], 100, "{v}");
    assert_eq!(v["denied"], 200, "{v}");

    let o = run(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "status",
        "--json",
    ]);
    let v = json(&o);
    let deps = v["dependencies"].as_array().unwrap();
    assert_eq!(deps.len(), 1, "{v}");
    let s = &deps[0];
    has_fields(
        s,
        &[
            "dependency",
            "window_secs",
            "window_remaining_secs",
            "successes",
            "first_attempts",
            "retries",
            "denied",
            "allowance",
            "remaining",
            "amplification",
        ],
    );
    assert_eq!(s["dependency"], "search");
    assert_eq!(s["successes"], 500);
    assert_eq!(s["retries"], 100);
    assert_eq!(s["denied"], 200);
    assert_eq!(s["allowance"], 100);
    assert_eq!(s["remaining"], 0);

    let text = stdout(&run(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "status",
    ]));
    assert!(
        text.contains("search") && text.contains("DENYING"),
        "{text}"
    );
    // A configured dependency with no traffic is listed too.
    let config = temp_file(
        &format!("{prefix}.toml"),
        "[dependencies.mail]\ntasks = [\"send\"]\n",
    );
    let v = json(&run(&[
        "--config",
        config.to_str().unwrap(),
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "status",
        "--json",
    ]));
    let names: Vec<&str> = v["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["dependency"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mail", "search"]);
    let v = json(&run(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "status",
        "--dependency",
        "mail",
        "--json",
    ]));
    assert_eq!(v["dependencies"][0]["allowance"], 10);
}

#[test]
fn status_watch_redraws_until_interrupted() {
    let redis = RedisServer::start();
    let mut child = budgetctl()
        .args([
            "--redis-url",
            &redis.url(),
            "--key-prefix",
            &unique("watch"),
            "status",
            "--watch",
            "--dependency",
            "search",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.matches("budgets in").count() >= 2, "{text}");
}

#[test]
fn several_bench_processes_together_never_exceed_the_allowance() {
    let redis = RedisServer::start();
    let url = redis.url();
    let prefix = unique("race");
    // A long window, so the test never straddles a boundary.
    let config = temp_file(
        &format!("{prefix}.toml"),
        "[defaults]\nwindow_secs = 86400\nratio = 0.2\nmin_allowance = 10\n",
    );
    let children: Vec<_> = (0..3)
        .map(|_| {
            budgetctl()
                .args([
                    "--config",
                    config.to_str().unwrap(),
                    "--redis-url",
                    &url,
                    "--key-prefix",
                    &prefix,
                ])
                .args([
                    "bench",
                    "--dependency",
                    "search",
                    "--successes",
                    "100",
                    "--retries",
                    "200",
                    "--concurrency",
                    "8",
                    "--json",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut granted = 0;
    for child in children {
        let v = json(&child.wait_with_output().unwrap());
        granted += v["granted"].as_u64().unwrap();
        assert_eq!(
            v["granted"].as_u64().unwrap() + v["denied"].as_u64().unwrap(),
            200
        );
    }
    // All deposits in: allowance = 0.2 × 300 = 60. Every process saw at most that.
    assert!(granted <= 60, "granted {granted} > allowance 60");
    assert!(granted >= 10, "the floor alone grants 10: {granted}");
    let v = json(&run(&[
        "--config",
        config.to_str().unwrap(),
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "status",
        "--json",
    ]));
    assert_eq!(v["dependencies"][0]["retries"].as_u64().unwrap(), granted);
    assert_eq!(
        v["dependencies"][0]["denied"].as_u64().unwrap(),
        600 - granted
    );
}

#[test]
fn redis_unreachable_is_a_runtime_failure_naming_the_redacted_url() {
    let port = fleet_budget::testing::free_port();
    let url = format!("redis://admin:hunter2@127.0.0.1:{port}");
    for args in [
        vec!["status"],
        vec![
            "bench",
            "--dependency",
            "s",
            "--successes",
            "1",
            "--retries",
            "1",
        ],
    ] {
        let mut full = vec!["--redis-url", url.as_str()];
        full.extend(args);
        let o = run(&full);
        assert_exit(&o, 1, &format!("redis://admin:***@127.0.0.1:{port}"));
        assert!(!stderr(&o).contains("hunter2"), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("docker compose up -d"),
            "{}",
            stderr(&o)
        );
    }
    // The environment variable works the same way.
    let o = budgetctl()
        .env("FLEET_BUDGET_REDIS_URL", &url)
        .arg("status")
        .output()
        .unwrap();
    assert_exit(&o, 1, "admin:***@");
}

// --- demo ---------------------------------------------------------------------------------------

fn check_demo(v: &Value) {
    has_fields(v, &["mode", "runs", "workers"]);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        has_fields(
            run,
            &[
                "jobs_submitted",
                "upstream_calls",
                "amplification",
                "peak_upstream_calls_per_sec",
                "successes",
                "dead_lettered",
                "accounting",
            ],
        );
        let acc = &run["accounting"];
        assert_eq!(acc["lost"], 0, "{run}");
        let sum = acc["succeeded"].as_u64().unwrap()
            + acc["dead_lettered_then_replayed"].as_u64().unwrap()
            + acc["parked"].as_u64().unwrap();
        assert_eq!(sum, acc["submitted"].as_u64().unwrap(), "{run}");
    }
    let (without, with) = (&runs[0], &runs[1]);
    assert_eq!(without["budget"], false);
    assert_eq!(with["budget"], true);
    assert!(
        with["dead_lettered"]["budget_exhausted"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{with}"
    );
    assert!(
        with["peak_upstream_calls_per_sec"].as_u64().unwrap()
            < without["peak_upstream_calls_per_sec"].as_u64().unwrap(),
        "{v}"
    );
    assert!(
        with["amplification"].as_f64().unwrap() < without["amplification"].as_f64().unwrap(),
        "{v}"
    );
}

#[test]
fn demo_against_redis_json() {
    let redis = RedisServer::start();
    let o = run(&[
        "--redis-url",
        &redis.url(),
        "--amqp-url",
        &broker::url(),
        "--key-prefix",
        &unique("demo"),
        "demo",
        "--phase-secs",
        "1.5",
        "--rate",
        "120",
        "--json",
    ]);
    let v = json(&o);
    check_demo(&v);
    assert_eq!(v["mode"]["budget_store"], "redis");
    // RabbitMQ on 127.0.0.1:5672 when it runs (CI starts it), else the labelled in-memory queue.
    eprintln!("demo queue: {}", v["mode"]["queue"]);
    assert!(
        stderr(&o).contains("[with budget]"),
        "no progress on stderr: {}",
        stderr(&o)
    );
}

#[test]
fn demo_falls_back_to_the_in_process_mode_when_services_do_not_answer() {
    let port = fleet_budget::testing::free_port();
    let o = run(&[
        "--redis-url",
        &format!("redis://u:hunter2@127.0.0.1:{port}"),
        "--amqp-url",
        &format!("amqp://u:hunter2@127.0.0.1:{port}/%2f"),
        "demo",
        "--phase-secs",
        "1",
        "--rate",
        "100",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(
        err.contains(&format!("redis://u:***@127.0.0.1:{port}")),
        "{err}"
    );
    assert!(err.contains("docker compose up -d"), "{err}");
    assert!(
        out.contains("IN-PROCESS") && out.contains("IN-MEMORY"),
        "{out}"
    );
    assert!(out.contains("lost 0"), "{out}");
    assert!(!out.contains("hunter2") && !err.contains("hunter2"));
}

// --- RabbitMQ: migrate, dlq stats, replay ---------------------------------------------------------

mod broker {
    use fleet_budget::DeadLetterReason;
    use fleet_budget_amqp::AmqpSettings;
    use fleet_budget_amqp::Topology;
    use fleet_budget_amqp::headers::{self, DeadLetterRecord};
    use lapin::options::{
        BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions,
        QueueDeleteOptions,
    };
    use lapin::types::{FieldTable, ShortString};

    /// The shared broker: `FLEET_BUDGET_AMQP_URL`, or guest on 127.0.0.1:5672.
    pub(crate) fn url() -> String {
        std::env::var("FLEET_BUDGET_AMQP_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
    }

    /// A topology of the test's own on the shared broker, deleted on drop.
    pub(crate) struct TestBroker {
        pub(crate) topology: Topology,
        rt: tokio::runtime::Runtime,
    }

    impl TestBroker {
        pub(crate) fn new(prefix: &str) -> Self {
            let settings = AmqpSettings {
                prefix: prefix.to_owned(),
                ..AmqpSettings::default()
            };
            let topology = Topology::new(&settings);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            Self { topology, rt }
        }

        async fn channel() -> (lapin::Connection, lapin::Channel) {
            let conn = fleet_budget_amqp::connect(&url(), "budgetctl cli test")
                .await
                .expect("RabbitMQ on 127.0.0.1:5672 (.ci/run starts it)");
            let ch = conn.create_channel().await.unwrap();
            (conn, ch)
        }

        /// Publishes a dead-letter of `dependency` / `reason` into the dead-letter exchange.
        pub(crate) fn dead_letter(&self, dependency: &str, reason: DeadLetterReason) {
            let exchange = self.topology.dead_exchange.clone();
            let work = self.topology.work_exchange.clone();
            let queue = self.topology.work_queue.clone();
            self.rt.block_on(async move {
                let (conn, ch) = Self::channel().await;
                ch.confirm_select(ConfirmSelectOptions::default())
                    .await
                    .unwrap();
                let now = headers::now_ms();
                let record = DeadLetterRecord {
                    task: "index_document".to_owned(),
                    dependency: dependency.to_owned(),
                    reason,
                    original_exchange: work,
                    original_routing_key: "index_document".to_owned(),
                    original_queue: queue,
                    attempts: 3,
                    first_failure_ms: now - 5000,
                    dead_lettered_ms: now - 1000,
                    error_class: "http_503".to_owned(),
                    error: "over capacity".to_owned(),
                    budget: None,
                    budget_source: None,
                    replays: 0,
                };
                let mut table = FieldTable::default();
                headers::set_str(&mut table, headers::TASK, "index_document");
                record.write(&mut table);
                let props = headers::with_message_id(lapin::BasicProperties::default())
                    .with_headers(table)
                    .with_delivery_mode(2);
                ch.basic_publish(
                    ShortString::from(exchange.as_str()),
                    ShortString::from(""),
                    BasicPublishOptions::default(),
                    b"{}",
                    props,
                )
                .await
                .unwrap()
                .await
                .unwrap();
                let _ = conn.close(200, ShortString::from("done")).await;
            });
        }

        /// Messages ready in `queue`.
        pub(crate) fn depth(&self, queue: &str) -> u32 {
            let queue = queue.to_owned();
            self.rt.block_on(async move {
                let (conn, ch) = Self::channel().await;
                let q = ch
                    .queue_declare(
                        ShortString::from(queue.as_str()),
                        QueueDeclareOptions {
                            passive: true,
                            ..QueueDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .unwrap();
                let _ = conn.close(200, ShortString::from("done")).await;
                q.message_count()
            })
        }
    }

    impl Drop for TestBroker {
        fn drop(&mut self) {
            let topology = self.topology.clone();
            self.rt.block_on(async move {
                let Ok(conn) =
                    fleet_budget_amqp::connect(&url(), "budgetctl cli test cleanup").await
                else {
                    return;
                };
                let Ok(ch) = conn.create_channel().await else {
                    return;
                };
                for q in topology.queues() {
                    let _ = ch
                        .queue_delete(ShortString::from(q.as_str()), QueueDeleteOptions::default())
                        .await;
                }
                for e in topology.exchanges() {
                    let _ = ch
                        .exchange_delete(
                            ShortString::from(e.as_str()),
                            ExchangeDeleteOptions::default(),
                        )
                        .await;
                }
                let _ = conn.close(200, ShortString::from("done")).await;
            });
        }
    }
}

#[test]
fn migrate_dlq_stats_and_replay_against_rabbitmq() {
    let prefix = unique("amqp");
    let broker = broker::TestBroker::new(&prefix);
    let config = temp_file(
        &format!("{prefix}.toml"),
        &format!(
            "[amqp]\nprefix = \"{prefix}\"\nurl = \"{}\"\n",
            broker::url()
        ),
    );
    let cfg = config.to_str().unwrap();
    let redis_prefix = unique("replay");
    let base = ["--config", cfg, "--key-prefix", redis_prefix.as_str()];
    let with = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        run(&args)
    };

    let plan = json(&with(&["migrate", "--dry-run", "--json"]));
    assert_eq!(plan["dry_run"], true);
    assert!(plan["created"].as_u64().unwrap() >= 6, "{plan}");
    has_fields(&plan["steps"][0], &["version", "object", "state"]);
    let applied = json(&with(&["migrate", "--json"]));
    assert_eq!(applied["created"], plan["created"]);
    assert_eq!(
        json(&with(&["migrate", "--json"]))["created"],
        0,
        "migrate is idempotent"
    );
    let text = stdout(&with(&["migrate"]));
    assert!(
        text.contains("unchanged") && !text.contains("guest:guest"),
        "{text}"
    );

    broker.dead_letter("search", fleet_budget::DeadLetterReason::BudgetExhausted);
    broker.dead_letter("search", fleet_budget::DeadLetterReason::BudgetExhausted);
    broker.dead_letter("mail", fleet_budget::DeadLetterReason::AttemptsExhausted);

    let stats = json(&with(&["dlq", "stats", "--json"]));
    assert_eq!(stats["dead_letter"]["depth"], 3, "{stats}");
    assert_eq!(stats["parked"]["depth"], 0, "{stats}");
    let by = stats["dead_letter"]["by_dependency_reason"]
        .as_array()
        .unwrap();
    assert!(
        by.iter().any(|d| d["dependency"] == "search"
            && d["reason"] == "budget_exhausted"
            && d["count"] == 2),
        "{stats}"
    );
    assert!(
        by.iter().any(|d| d["dependency"] == "mail"
            && d["reason"] == "attempts_exhausted"
            && d["count"] == 1),
        "{stats}"
    );
    assert!(
        stats["dead_letter"]["oldest_age_secs"].as_f64().unwrap() >= 0.9,
        "{stats}"
    );
    assert!(stdout(&with(&["dlq", "stats"])).contains("budget_exhausted"));
    // Reading for stats puts the messages back.
    assert_eq!(broker.depth(&broker.topology.dead_queue), 3);

    let dry = json(&with(&[
        "replay",
        "--dependency",
        "search",
        "--dry-run",
        "--json",
    ]));
    for f in ["matched", "moved", "parked", "skipped", "failed", "dry_run"] {
        assert!(dry.get(f).is_some(), "{f} missing: {dry}");
    }
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["matched"], 2, "{dry}");
    assert_eq!(dry["skipped"], 1, "{dry}");
    assert_eq!(
        broker.depth(&broker.topology.dead_queue),
        3,
        "a dry run moves nothing"
    );

    let none = json(&with(&[
        "replay",
        "--dependency",
        "search",
        "--reason",
        "non_retryable",
        "--dry-run",
        "--json",
    ]));
    assert_eq!(none["matched"], 0, "{none}");

    let limited = json(&with(&[
        "replay",
        "--dependency",
        "search",
        "--limit",
        "1",
        "--dry-run",
        "--json",
    ]));
    assert_eq!(limited["moved"], 1, "{limited}");
    assert_eq!(limited["skipped"], 2, "{limited}");
    let one = json(&with(&[
        "replay",
        "--dependency",
        "search",
        "--limit",
        "1",
        "--json",
    ]));
    assert_eq!(one["moved"], 1, "{one}");
    assert_eq!(one["skipped"], 2, "{one}");
    assert_eq!(broker.depth(&broker.topology.work_queue), 1);
    assert_eq!(broker.depth(&broker.topology.dead_queue), 2);

    let done = json(&with(&[
        "replay",
        "--dependency",
        "search",
        "--rate",
        "100",
        "--since",
        "1h",
        "--json",
    ]));
    assert_eq!(done["dry_run"], false);
    assert_eq!(done["moved"], 1, "{done}");
    assert_eq!(done["skipped"], 1, "{done}");
    assert_eq!(done["failed"], 0, "{done}");
    assert_eq!(broker.depth(&broker.topology.work_queue), 2);
    assert_eq!(broker.depth(&broker.topology.dead_queue), 1);
    assert_exit(
        &with(&["replay", "--dependency", "search", "--limit", "0"]),
        2,
        "--limit",
    );

    assert_exit(
        &with(&["replay", "--dependency", "search", "--since", "yesterday"]),
        2,
        "--since",
    );
}

#[test]
fn rabbitmq_unreachable_is_a_runtime_failure_naming_the_redacted_url() {
    let port = fleet_budget::testing::free_port();
    let url = format!("amqp://admin:hunter2@127.0.0.1:{port}/%2f");
    for args in [
        vec!["migrate"],
        vec!["dlq", "stats"],
        vec!["replay", "--dependency", "search"],
        vec!["replay", "--dependency", "search", "--dry-run"],
    ] {
        let mut full = vec!["--amqp-url", url.as_str()];
        full.extend(args);
        let o = run(&full);
        assert_exit(&o, 1, &format!("amqp://admin:***@127.0.0.1:{port}"));
        assert!(!stderr(&o).contains("hunter2"), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("docker compose up -d"),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn status_on_a_cluster_lists_budgets_found_on_every_master() {
    let cluster = RedisCluster::start(3);
    let prefix = unique("cluster");
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let config = temp_file(
        &format!("{prefix}.toml"),
        &format!(
            "[redis]\ncluster_urls = [{}]\nkey_prefix = \"{prefix}\"\n",
            urls.join(", ")
        ),
    );
    let config = config.to_str().unwrap();
    // Budgets that no configuration names (unmapped tasks are their own dependencies), spread
    // over the masters by their hash tags.
    let deps: Vec<String> = (0..12).map(|i| format!("unmapped-{i}")).collect();
    for d in &deps {
        let o = run(&[
            "--config",
            config,
            "bench",
            "--dependency",
            d,
            "--successes",
            "10",
            "--retries",
            "1",
            "--concurrency",
            "1",
            "--json",
        ]);
        json(&o);
    }
    let v = json(&run(&["--config", config, "status", "--json"]));
    let listed: Vec<&str> = v["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["dependency"].as_str().unwrap())
        .collect();
    for d in &deps {
        assert!(listed.contains(&d.as_str()), "{d} missing from {v}");
    }
}
