//! Usage errors: exit 2, naming the flag, the key or the file.

use crate::{assert_exit, budgetctl, run, stderr, stdout, temp_file};

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
