//! Secrets never print, whatever the command and whatever the channel: a property test that
//! generates secrets, puts them in every URL form (flag, environment, configuration file, a
//! broken configuration file) and runs every `budgetctl` command that reads a URL, with
//! `RUST_LOG=trace`, against servers that do not answer; no 8-byte run of the secret (nor its
//! percent-encoded form) may appear on stdout (`--json` included) or stderr (logs included).
//! The headers a worker or the replayer writes to RabbitMQ are checked in
//! `crates/fleet-budget-amqp/tests/redaction.rs`.

use std::process::Output;

use proptest::prelude::*;
use proptest::test_runner::{Config as Cases, TestRunner};

use crate::{budgetctl, temp_file};

/// A secret with a character that needs care in a URL's user info.
fn secret() -> impl Strategy<Value = String> {
    "[A-Za-z0-9]{5,9}[!$*+=~_-][A-Za-z0-9]{5,9}"
}

/// `s` percent-encoded as a URL's user info holds it when encoded.
fn encoded(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_string()
            } else {
                format!("%{:02X}", u32::from(c))
            }
        })
        .collect()
}

fn redis_urls(s: &str) -> Vec<String> {
    let e = encoded(s);
    vec![
        format!("redis://fleet:{s}@127.0.0.1:1/0"),
        format!("redis://:{s}@127.0.0.1:1"),
        format!("rediss://fleet:{e}@127.0.0.1:1/0"),
        format!("redis://127.0.0.1:1/0?password={s}"),
        format!("unix:///nonexistent/fb.sock?pass={s}"),
        format!("redis+unix:///nonexistent/fb.sock?db=0&password={e}"),
        // Not a URL the store accepts: the error names it, redacted.
        format!("http://fleet:{s}@127.0.0.1:1"),
        format!("rediss://fleet:{s}@127.0.0.1:1/#insecure"),
    ]
}

fn amqp_urls(s: &str) -> Vec<String> {
    let e = encoded(s);
    vec![
        format!("amqp://fleet:{s}@127.0.0.1:1/%2f"),
        format!("amqps://fleet:{e}@127.0.0.1:1/%2f"),
        format!("amqp://fleet:{s}@127.0.0.1:1/%2f?heartbeat=10&connection_timeout=500"),
        format!("ftp://fleet:{s}@127.0.0.1:1/"),
    ]
}

/// How the URLs reach the command.
#[derive(Debug, Clone, Copy)]
enum Channel {
    Flags,
    Environment,
    File,
    BrokenFile,
}

/// Every command that reads a URL, as arguments after the global ones.
const COMMANDS: &[&[&str]] = &[
    &["status"],
    &["status", "--json"],
    &[
        "bench",
        "--dependency",
        "x",
        "--successes",
        "1",
        "--retries",
        "1",
        "--json",
    ],
    &["audit", "--json"],
    &["budget", "clear", "x"],
    &["dlq", "stats", "--json"],
    &["dlq", "peek"],
    &["parked", "list", "--json"],
    &["replay", "--dependency", "x", "--dry-run", "--json"],
    &["migrate", "--dry-run"],
    &["config", "check", "@FILE"],
    &["config", "check", "@FILE", "--json"],
];

/// The first printed run of 8 bytes of `s` (or its encoded form), if any.
fn leak(text: &str, s: &str) -> Option<String> {
    let e = encoded(s);
    let mut needles: Vec<&str> = vec![s, e.as_str()];
    let windows: Vec<&str> = (0..=s.len().saturating_sub(8))
        .filter_map(|i| s.get(i..i + 8))
        .collect();
    needles.extend(windows);
    needles
        .into_iter()
        .find(|n| text.contains(n))
        .map(ToOwned::to_owned)
}

fn run(channel: Channel, redis: &str, amqp: &str, file: &str, args: &[&str]) -> Output {
    let args: Vec<&str> = args
        .iter()
        .map(|a| if *a == "@FILE" { file } else { a })
        .collect();
    let mut c = budgetctl();
    c.env("RUST_LOG", "trace");
    match channel {
        Channel::Flags => {
            c.args(["--redis-url", redis, "--amqp-url", amqp]);
        }
        Channel::Environment => {
            c.env("FLEET_BUDGET_REDIS_URL", redis)
                .env("FLEET_BUDGET_AMQP_URL", amqp);
        }
        Channel::File | Channel::BrokenFile => {
            c.args(["--config", file]);
        }
    }
    c.args(args).output().expect("run budgetctl")
}

#[test]
fn no_secret_prints_from_any_command_or_channel() {
    let mut runner = TestRunner::new(Cases {
        cases: 32,
        failure_persistence: None,
        ..Cases::default()
    });
    let strategy = (secret(), 0_usize..8, 0_usize..4, 0_usize..4);
    runner
        .run(&strategy, |(s, r, a, channel)| {
            let redis = redis_urls(&s).swap_remove(r);
            let amqp = amqp_urls(&s).swap_remove(a);
            let channel = [
                Channel::Flags,
                Channel::Environment,
                Channel::File,
                Channel::BrokenFile,
            ][channel];
            let toml_str = |u: &str| u.replace('\\', "\\\\").replace('"', "\\\"");
            let text = match channel {
                // A parse error quotes the line it failed on: the URL's line.
                Channel::BrokenFile => format!(
                    "[redis]\nurl = \"{}\" oops\n[amqp]\nurl = \"{}\"\n",
                    toml_str(&redis),
                    toml_str(&amqp)
                ),
                _ => format!(
                    "[redis]\nurl = \"{}\"\nkey_prefix = \"fbredact\"\n[amqp]\nurl = \"{}\"\n",
                    toml_str(&redis),
                    toml_str(&amqp)
                ),
            };
            let file = temp_file(&format!("redact-{r}-{a}.toml"), &text);
            let file = file.to_str().unwrap_or_default().to_owned();
            for args in COMMANDS {
                let o = run(channel, &redis, &amqp, &file, args);
                for (name, bytes) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
                    let printed = String::from_utf8_lossy(bytes);
                    if let Some(found) = leak(&printed, &s) {
                        return Err(TestCaseError::fail(format!(
                            "{args:?} via {channel:?} ({redis} / {amqp}) printed {found:?} of the secret on {name}:\n{printed}"
                        )));
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}
