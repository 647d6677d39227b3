//! `demo`: both runs account for every job, on the services or without them.

use fleet_budget::testing::RedisServer;
use fleet_budget_amqp::testing::amqp_url;
use serde_json::Value;

use crate::{has_fields, json, run, stderr, stdout, unique};

fn check_demo(v: &Value) {
    has_fields(v, &["mode", "runs", "workers"]);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        has_fields(
            run,
            &[
                "jobs_submitted",
                "executions",
                "amplification",
                "peak_executions_per_sec",
                "successes",
                "retries_granted",
                "retries_denied",
                "dead_lettered",
                "accounting",
            ],
        );
        for old in [
            "upstream_calls",
            "peak_upstream_calls_per_sec",
            "replay_upstream_calls",
        ] {
            assert!(run.get(old).is_none(), "{old}: one vocabulary, {run}");
        }
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
        with["peak_executions_per_sec"].as_u64().unwrap()
            < without["peak_executions_per_sec"].as_u64().unwrap(),
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
        &amqp_url(),
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
