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
        // The names before 0.2.0, kept beside the new ones until 0.3.0 (CHANGELOG.md).
        for (old, new) in [
            ("upstream_calls", "executions"),
            ("peak_upstream_calls_per_sec", "peak_executions_per_sec"),
            ("replay_upstream_calls", "replay_executions"),
            ("upstream_calls_per_second", "executions_per_second"),
        ] {
            assert_eq!(run[old], run[new], "{old} is deprecated for {new}: {run}");
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
    // The budget cut what the dependency received, in counts: fewer retries granted, fewer
    // calls per job. Not the busiest second against the other run's: that is a rate in real time,
    // and on a loaded machine a stall then a burst of queued jobs can make one second of the
    // budgeted run busier than any of the other, though it made far fewer calls.
    assert!(
        with["retries_granted"].as_u64().unwrap() < without["retries_granted"].as_u64().unwrap(),
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

/// Runs `demo --scenario NAME --json` on a private Redis and the broker, with short phases.
fn scenario_json(name: &str, phase_secs: &str) -> Value {
    let redis = RedisServer::start();
    let o = run(&[
        "--redis-url",
        &redis.url(),
        "--amqp-url",
        &amqp_url(),
        "--key-prefix",
        &unique("scenario"),
        "demo",
        "--scenario",
        name,
        "--phase-secs",
        phase_secs,
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["scenario"], name);
    assert_eq!(v["mode"]["budget_store"], "redis", "{v}");
    assert_eq!(v["mode"]["queue"], "rabbitmq", "{v}");
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{v}");
    assert_eq!(runs[0]["protected"], false);
    assert_eq!(runs[1]["protected"], true);
    for run in runs {
        has_fields(
            run,
            &[
                "first_attempts",
                "executions",
                "successes",
                "retries_granted",
                "retries_denied",
                "amplification",
                "peak_in_flight",
                "in_flight_per_second",
                "timeouts",
                "held",
                "breaker_transitions",
                "attempts_burned",
                "dead_lettered",
                "accounting",
            ],
        );
        let n = |k: &str| run[k].as_u64().unwrap();
        let acc = &run["accounting"];
        assert_eq!(acc["lost"], 0, "{run}");
        assert_eq!(acc["still_dead_lettered"], 0, "{run}");
        let sum = acc["succeeded"].as_u64().unwrap()
            + acc["dead_lettered_then_replayed"].as_u64().unwrap()
            + acc["parked"].as_u64().unwrap();
        assert_eq!(sum, n("jobs_submitted"), "{run}");
        // Every dead letter was replayed; only the bad-input jobs (one in 200) came back.
        let dead: u64 = run["dead_lettered"]
            .as_object()
            .unwrap()
            .values()
            .map(|c| c.as_u64().unwrap())
            .sum();
        assert_eq!(n("replayed"), dead, "{run}");
        assert_eq!(n("parked"), n("jobs_submitted") / 200, "{run}");
        assert!(n("executions") >= n("first_attempts"), "{run}");
        assert_eq!(
            n("attempts_burned"),
            n("executions") - n("successes"),
            "{run}"
        );
    }
    v
}

#[test]
fn scenario_slow_counts_in_flight_and_refuses_retries_only_with_the_concurrency_budget() {
    let v = scenario_json("slow", "2");
    let (without, with) = (&v["runs"][0], &v["runs"][1]);
    assert_eq!(v["dependency"]["cap"], 20, "{v}");
    for run in [without, with] {
        // Primary calls are counted, never refused: every job ran at least once.
        assert_eq!(run["first_attempts"], run["jobs_submitted"], "{run}");
        assert!(run["peak_in_flight"].as_u64().unwrap() > 0, "{run}");
        assert_eq!(run["held"], 0, "{run}");
    }
    for reason in ["concurrency_cap", "concurrency_retry_share"] {
        assert!(without["dead_lettered"].get(reason).is_none(), "{without}");
    }
    // 4 calls in 10 fail during the trouble: the failures were retried or refused a slot.
    assert!(with["failed"].as_u64().unwrap() > 0, "{with}");
    let refused = ["concurrency_cap", "concurrency_retry_share"]
        .iter()
        .map(|r| with["dead_lettered"][r].as_u64().unwrap_or(0))
        .sum::<u64>();
    assert!(
        refused + with["retries_granted"].as_u64().unwrap() > 0,
        "{with}"
    );
}

#[test]
fn scenario_down_holds_jobs_while_the_breaker_is_open_and_drains_after_recovery() {
    let v = scenario_json("down", "2");
    let (without, with) = (&v["runs"][0], &v["runs"][1]);
    assert_eq!(without["held"], 0, "{without}");
    assert_eq!(without["breaker_transitions"]["open"], 0, "{without}");
    assert!(without["refused"].as_u64().unwrap() > 0, "{without}");
    // Every call refused for two seconds at 60 jobs/s: well over the breaker's volume.
    let t = &with["breaker_transitions"];
    assert!(t["open"].as_u64().unwrap() >= 1, "{with}");
    assert!(t["half_open"].as_u64().unwrap() >= 1, "{with}");
    assert!(t["closed"].as_u64().unwrap() >= 1, "{with}");
    assert!(with["held"].as_u64().unwrap() > 0, "{with}");
    // Held jobs waited without spending attempts: none was dead-lettered `circuit_open`.
    assert!(
        with["dead_lettered"].get("circuit_open").is_none(),
        "{with}"
    );
}

#[test]
fn a_scenario_needs_the_services_and_says_which_one_failed() {
    let port = fleet_budget::testing::free_port();
    let o = run(&[
        "--redis-url",
        &format!("redis://u:hunter2@127.0.0.1:{port}"),
        "--amqp-url",
        &format!("amqp://u:hunter2@127.0.0.1:{port}/%2f"),
        "demo",
        "--scenario",
        "down",
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("Redis and RabbitMQ"), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(
        !err.contains("hunter2") && !stdout(&o).contains("hunter2"),
        "{err}"
    );

    let o = run(&["demo", "--scenario", "down", "--in-process"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--in-process"), "{}", stderr(&o));

    let o = run(&["demo", "--scenario", "fast"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("slow"), "{}", stderr(&o));
}
