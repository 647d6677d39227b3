//! `status` and `bench` against private Redis servers (and a private cluster).

use std::process::Stdio;

use fleet_budget::testing::{RedisCluster, RedisServer};

use crate::{
    assert_exit, budgetctl, has_fields, json, run, run_with, stderr, stdout, temp_file, unique,
};

#[test]
fn bench_and_status_against_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let prefix = unique("bench");
    let on = ["--redis-url", url.as_str(), "--key-prefix", prefix.as_str()];
    let o = run_with(
        &on,
        "bench --dependency search --successes 500 --retries 300 --concurrency 4 --json",
    );
    let v = json(&o);
    has_fields(
        &v,
        &[
            "successes",
            "retries_requested",
            "retries_granted",
            "retries_denied",
            "decisions_per_sec",
            "p50_us",
            "p99_us",
            "ping_p50_us",
            "ping_p99_us",
        ],
    );
    // Default policy: ratio 0.2 of 500 successes = 100.
    assert_eq!(v["retries_granted"], 100, "{v}");
    assert_eq!(v["retries_denied"], 200, "{v}");
    // The names before 0.2.0, kept beside the new ones until 0.3.0 (CHANGELOG.md, Deprecated).
    for (old, new) in [
        ("granted", "retries_granted"),
        ("denied", "retries_denied"),
        ("successes_recorded", "successes"),
    ] {
        assert_eq!(v[old], v[new], "{old} is deprecated for {new}: {v}");
    }

    let v = json(&run_with(&on, "status --json"));
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
            "executions",
            "retries_granted",
            "retries_denied",
            "allowance",
            "remaining",
            "amplification",
        ],
    );
    assert_eq!(s["dependency"], "search");
    assert_eq!(s["successes"], 500);
    assert_eq!(s["retries_granted"], 100);
    assert_eq!(s["retries_denied"], 200);
    assert_eq!(s["allowance"], 100);
    assert_eq!(s["remaining"], 0);
    assert_eq!(
        s["retries"], 100,
        "deprecated for retries_granted until 0.3.0: {s}"
    );
    assert_eq!(
        s["denied"], 200,
        "deprecated for retries_denied until 0.3.0: {s}"
    );

    let text = stdout(&run_with(&on, "status"));
    assert!(
        text.contains("search") && text.contains("DENYING"),
        "{text}"
    );
    // A configured dependency with no traffic is listed too.
    let config = temp_file(
        &format!("{prefix}.toml"),
        "[dependencies.mail]\ntasks = [\"send\"]\n",
    );
    let v = json(&run_with(
        &[&["--config", config.to_str().unwrap()][..], &on].concat(),
        "status --json",
    ));
    let names: Vec<&str> = v["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["dependency"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mail", "search"]);
    let v = json(&run_with(&on, "status --dependency mail --json"));
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
    let on = [
        "--config",
        config.to_str().unwrap(),
        "--redis-url",
        url.as_str(),
        "--key-prefix",
        prefix.as_str(),
    ];
    let children: Vec<_> = (0..3)
        .map(|_| {
            budgetctl()
                .args(on)
                .args(
                    "bench --dependency search --successes 100 --retries 200 --concurrency 8 --json"
                        .split_whitespace(),
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut granted = 0;
    for child in children {
        let v = json(&child.wait_with_output().unwrap());
        granted += v["retries_granted"].as_u64().unwrap();
        assert_eq!(
            v["retries_granted"].as_u64().unwrap() + v["retries_denied"].as_u64().unwrap(),
            200
        );
    }
    // All deposits in: allowance = 0.2 × 300 = 60. Every process saw at most that.
    assert!(granted <= 60, "granted {granted} > allowance 60");
    assert!(granted >= 10, "the floor alone grants 10: {granted}");
    let v = json(&run_with(&on, "status --json"));
    assert_eq!(
        v["dependencies"][0]["retries_granted"].as_u64().unwrap(),
        granted
    );
    assert_eq!(
        v["dependencies"][0]["retries_denied"].as_u64().unwrap(),
        600 - granted
    );
}

#[test]
fn redis_unreachable_is_a_runtime_failure_naming_the_redacted_url() {
    let port = fleet_budget::testing::free_port();
    let url = format!("redis://admin:hunter2@127.0.0.1:{port}");
    for command in ["status", "bench --dependency s --successes 1 --retries 1"] {
        let o = run_with(&["--redis-url", url.as_str()], command);
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
        json(&run_with(
            &["--config", config],
            &format!("bench --dependency {d} --successes 10 --retries 1 --concurrency 1 --json"),
        ));
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

#[test]
fn status_shows_a_dependency_s_breaker_and_refuses_a_tampered_one() {
    let redis = RedisServer::start();
    let url = redis.url();
    let prefix = unique("brk");
    let config = temp_file(
        &format!("{prefix}.toml"),
        "[dependencies.search]\ntasks = [\"t\"]\n[dependencies.search.breaker]\nopen_secs = 60\n",
    );
    let on = [
        "--config",
        config.to_str().unwrap(),
        "--redis-url",
        url.as_str(),
        "--key-prefix",
        prefix.as_str(),
    ];
    let v = json(&run_with(&on, "status --json"));
    let b = &v["dependencies"][0]["breaker"];
    has_fields(
        b,
        &[
            "state",
            "open_remaining_secs",
            "probes_issued",
            "probe_successes",
            "changed_secs_ago",
            "times_opened",
            "calls",
            "failures",
        ],
    );
    assert_eq!(
        (b["state"].as_str(), b["times_opened"].as_u64()),
        (Some("closed"), Some(0))
    );
    // Opened by a worker a moment ago (the fields lua/README.md documents), for a minute.
    let time: Vec<String> = redis.cmd(&["TIME"]);
    let now = time[0].parse::<u64>().unwrap() * 1000 + time[1].parse::<u64>().unwrap() / 1000;
    let key = format!("{prefix}:v1:{{search}}:cb");
    let (until, at) = ((now + 60_000).to_string(), now.to_string());
    let _: () = redis.cmd(&[
        "HSET", &key, "st", "1", "g", "1", "ou", &until, "ch", &at, "no", "1",
    ]);
    let v = json(&run_with(&on, "status --json"));
    let b = &v["dependencies"][0]["breaker"];
    assert_eq!(b["state"], "open", "{v}");
    assert!(b["open_remaining_secs"].as_f64().unwrap() > 50.0, "{v}");
    assert_eq!(b["times_opened"], 1);
    let text = stdout(&run_with(&on, "status"));
    assert!(
        text.contains("BREAKER OPEN") && text.contains("BREAKER: circuit open"),
        "{text}"
    );
    // A field the script cannot read: listed as unusable, exit 1, everything else printed.
    let _: () = redis.cmd(&["HSET", &key, "st", "7"]);
    let o = run_with(&on, "status");
    assert_exit(&o, 1, "");
    assert!(stdout(&o).contains(&key), "{}", stdout(&o));
}
