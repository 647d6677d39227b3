//! Hostile services (issue 9, items 4 and 7): a broker or a Redis that accepts TCP and never
//! answers ends every command in a named timeout and exit 1, never a hang; a budget key of the
//! wrong type or with a tampered field is reported beside the healthy dependencies, and `status`
//! exits 1 after printing everything.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_budget::testing::RedisServer;

use crate::{assert_exit, budgetctl, run_with, stderr, stdout, temp_file, unique};

/// A peer that accepts every connection and never sends a byte; it counts what it accepted.
struct Mute {
    port: u16,
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl Mute {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let h = Arc::clone(&held);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                h.lock().unwrap().push(stream);
            }
        });
        Self { port, held }
    }

    fn accepted(&self) -> usize {
        self.held.lock().unwrap().len()
    }
}

/// Waits for `child`; kills it and fails after `within` (a deadline for failing: the command
/// must end by itself, well before it).
fn finish(mut child: Child, within: Duration, what: &str) -> Output {
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "{what} hung: still running after {within:?}\nstderr: {}",
                stderr(&o)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn spawn(args: &[&str]) -> Child {
    budgetctl()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// `migrate`, `dlq stats` and `replay` against a broker that never answers: each ends in
/// "timed out" naming the step and the (redacted) URL, exit 1.
#[test]
fn a_broker_that_never_answers_ends_each_command_in_a_named_timeout() {
    let mute = Mute::start();
    let config = temp_file(
        &format!("{}.toml", unique("mute-amqp")),
        "[amqp]\nconnect_timeout_ms = 300\noperation_timeout_ms = 300\n",
    );
    let url = format!("amqp://guest:hunter2@127.0.0.1:{}/%2f", mute.port);
    for command in [
        "migrate",
        "migrate --dry-run",
        "dlq stats",
        "dlq stats --json",
        "replay --dependency search",
        "replay --dependency search --dry-run --json",
    ] {
        let mut args = vec![
            "--config",
            config.to_str().unwrap(),
            "--amqp-url",
            url.as_str(),
        ];
        args.extend(command.split_whitespace());
        let before = mute.accepted();
        let o = finish(spawn(&args), Duration::from_secs(60), command);
        assert_exit(&o, 1, "timed out");
        let err = stderr(&o);
        assert!(err.contains("RabbitMQ"), "{command}: {err}");
        assert!(
            err.contains(&mute.port.to_string()),
            "{command}: names the URL: {err}"
        );
        assert!(!err.contains("hunter2"), "{command}: password shown: {err}");
        assert!(mute.accepted() > before, "{command} never reached the peer");
    }
}

/// `status` and `bench` against a Redis that never answers: exit 1 naming the URL, no hang.
#[test]
fn a_redis_that_never_answers_ends_in_exit_1_naming_it() {
    let mute = Mute::start();
    let url = format!("redis://:hunter2@127.0.0.1:{}", mute.port);
    for command in [
        "status",
        "status --json",
        "bench --dependency s --successes 1 --retries 1",
    ] {
        let mut args = vec!["--redis-url", url.as_str()];
        args.extend(command.split_whitespace());
        let before = mute.accepted();
        let o = finish(spawn(&args), Duration::from_secs(60), command);
        assert_exit(&o, 1, "does not answer");
        let err = stderr(&o);
        assert!(err.contains(&mute.port.to_string()), "{command}: {err}");
        assert!(!err.contains("hunter2"), "{command}: {err}");
        assert!(mute.accepted() > before, "{command} never reached the peer");
    }
}

/// A key of another type and a hash with a tampered counter sit beside a healthy budget:
/// `status` prints the healthy one and marks both UNUSABLE naming the key, in text and JSON, and
/// exits 1 after printing everything.
#[test]
fn status_reports_unusable_keys_beside_healthy_ones_and_exits_1() {
    let redis = RedisServer::start();
    let url = redis.url();
    let prefix = unique("unusable");
    let on = ["--redis-url", url.as_str(), "--key-prefix", prefix.as_str()];
    let o = run_with(
        &on,
        "bench --dependency search --successes 50 --retries 5 --json",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let wrong_type = format!("{prefix}:v1:{{broken}}");
    let tampered = format!("{prefix}:v1:{{tampered}}");
    let _: () = redis.cmd(&["RPUSH", &wrong_type, "not a budget"]);
    let _: () = redis.cmd(&["HSET", &tampered, "cw", "1", "cr", "lots"]);
    let config = temp_file(
        &format!("{}.toml", unique("unusable")),
        "[dependencies.search]\n[dependencies.broken]\n[dependencies.tampered]\n",
    );
    let mut with_config = vec!["--config", config.to_str().unwrap()];
    with_config.extend(on);

    let o = run_with(&with_config, "status");
    assert_eq!(o.status.code(), Some(1), "stderr: {}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.lines().any(|l| l.starts_with("search")),
        "healthy row missing:\n{text}"
    );
    for key in [&wrong_type, &tampered] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("UNUSABLE") && l.contains(key.as_str())),
            "{key} not reported:\n{text}"
        );
    }
    assert!(
        stderr(&o).contains("2 budget keys cannot be used"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("does not answer"), "{}", stderr(&o));

    let o = run_with(&with_config, "status --json");
    assert_eq!(o.status.code(), Some(1), "stderr: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let healthy: Vec<&str> = v["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["dependency"].as_str().unwrap())
        .collect();
    assert_eq!(healthy, ["search"], "{v}");
    let unusable: Vec<(&str, &str)> = v["unusable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["dependency"].as_str().unwrap(),
                d["key"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        unusable,
        [
            ("broken", wrong_type.as_str()),
            ("tampered", tampered.as_str())
        ],
        "{v}"
    );
}
