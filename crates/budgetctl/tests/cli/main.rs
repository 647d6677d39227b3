//! The CLI through the real binary: happy paths, JSON shapes, and bad input → exit 2 naming the
//! flag or key. Redis tests start a private `redis-server`; RabbitMQ tests use a topology of
//! their own on the shared broker; nothing here touches shared state.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod acl;
mod budget;
mod colour;
mod config_check;
mod dead_letters;
mod demo;
mod doctor;
mod hostile;
mod hostile_entries;
mod hostile_names;
mod plan;
mod rabbitmq;
mod redaction;
mod redis;
mod replay_loop;
mod schemas;
mod schemas_services;
mod simulate;
mod tls;
mod tune;
mod usage;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn budgetctl() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_budgetctl"));
    c.env_remove("FLEET_BUDGET_REDIS_URL")
        .env_remove("FLEET_BUDGET_AMQP_URL")
        .env_remove("FLEET_BUDGET_REDIS_CA_FILE")
        .env_remove("FLEET_BUDGET_AMQP_CA_FILE")
        .env_remove("RUST_LOG");
    c.stdin(Stdio::null());
    c
}

/// Runs `budgetctl` with `args`; what a `--json` run printed is held to its command's JSON
/// Schema ([`schemas::hold_to_schema`]).
fn run(args: &[&str]) -> Output {
    let o = budgetctl().args(args).output().expect("run budgetctl");
    schemas::hold_to_schema(args, &o);
    o
}

/// Runs `budgetctl` with the `global` flags, then `command` split at spaces.
fn run_with(global: &[&str], command: &str) -> Output {
    let mut args = global.to_vec();
    args.extend(command.split_whitespace());
    run(&args)
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
