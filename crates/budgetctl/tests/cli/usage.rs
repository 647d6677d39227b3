//! Usage errors: exit 2, naming the flag, the key or the file.

use crate::{assert_exit, budgetctl, run, run_with, stderr, stdout, temp_file};

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
    for (command, flag) in [
        (
            "simulate capacity --incoming 1000000 --ticks 10000",
            "--incoming",
        ),
        ("simulate brownout --failure-rate 1.5", "--failure-rate"),
        ("simulate brownout --failure-rate abc", "--failure-rate"),
        ("simulate brownout --failure-rate NaN", "--failure-rate"),
        ("simulate brownout", "--failure-rate"),
        (
            "simulate brownout --failure-rate 0.5 --budget-ratio -1",
            "--budget-ratio",
        ),
        (
            "simulate brownout --failure-rate 0.5 --deposit maybe",
            "--deposit",
        ),
        ("simulate capacity --ticks 0", "--ticks"),
        (
            "bench --dependency x --successes -3 --retries 1",
            "--successes",
        ),
        (
            "bench --dependency a{b} --successes 1 --retries 1",
            "--dependency",
        ),
        ("replay --dependency search --reason bored", "--reason"),
        ("demo --phase-secs 0", "--phase-secs"),
        ("--redis-url http://u:hunter2@h status", "--redis-url"),
        ("--amqp-url redis://h dlq stats", "--amqp-url"),
        ("--key-prefix a{b} status", "--key-prefix"),
    ] {
        let o = run_with(&[], command);
        assert_exit(&o, 2, flag);
        assert!(!stderr(&o).contains("hunter2"), "{}", stderr(&o));
    }
    assert_exit(&run(&["status", "--dependency", ""]), 2, "--dependency");
    let o = budgetctl()
        .env("FLEET_BUDGET_REDIS_URL", "http://u:pw@h")
        .arg("status")
        .output()
        .unwrap();
    assert_exit(&o, 2, "FLEET_BUDGET_REDIS_URL");
}

/// A negative number is a bad value of the flag it follows, named with the value, in every
/// command that takes a count: `parked replay --rate -5` was refused as an unknown argument
/// `-5` while `replay --rate -5` named `--rate`.
#[test]
fn negative_numbers_are_bad_values_naming_the_flag_and_the_value() {
    for (command, flag, value) in [
        ("replay --dependency search --rate -5", "--rate", "-5"),
        ("parked replay --rate -5", "--rate", "-5"),
        ("replay --dependency search --limit -1", "--limit", "-1"),
        ("parked replay --limit -1", "--limit", "-1"),
        ("parked purge --limit -1 --yes", "--limit", "-1"),
        ("parked list --limit -1", "--limit", "-1"),
        ("dlq peek --limit -1", "--limit", "-1"),
        ("audit --limit -1", "--limit", "-1"),
        ("budget set search --ratio -1 --for 30m", "--ratio", "-1"),
        (
            "budget set search --min-allowance -1 --for 30m",
            "--min-allowance",
            "-1",
        ),
        ("plan --max-attempts -3", "--max-attempts", "-3"),
        ("plan --max-attempts 5 --factor -2", "--factor", "-2"),
        (
            "simulate concurrency --timeline --ticks -5",
            "--ticks",
            "-5",
        ),
    ] {
        let o = run_with(&[], command);
        assert_exit(&o, 2, flag);
        assert!(
            stderr(&o).contains(&format!("'{value}'"))
                || stderr(&o).contains(&format!("`{value}`")),
            "{command}: the value is not named:\n{}",
            stderr(&o)
        );
        assert!(
            !stderr(&o).contains("unexpected argument"),
            "{command}: {}",
            stderr(&o)
        );
    }
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
        &run_with(
            &["--config", invalid.to_str().unwrap()],
            "bench --dependency s --successes 1 --retries 1",
        ),
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
