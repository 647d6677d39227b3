//! Secrets never print, whatever the command and whatever the channel: a property test that
//! generates secrets, puts them in every URL form (flag, environment, configuration file, a
//! broken configuration file) and runs every `budgetctl` command that reads a URL, with
//! `RUST_LOG=trace`, against servers that do not answer; no 8-byte run of the secret (nor its
//! percent-encoded form) may appear on stdout (`--json` included) or stderr (logs included).
//! The long-running `exporter` is started, scraped once (the /metrics body is checked too) and
//! killed; `demo` runs the drill (it falls back to in-process) and a scenario (it fails fast).
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
    &["budget", "clear", "x", "--reason", "r"],
    &[
        "budget", "freeze", "x", "--for", "1m", "--reason", "r", "--json",
    ],
    &["budget", "unfreeze", "x", "--reason", "r"],
    &[
        "budget", "set", "x", "--ratio", "0.1", "--for", "1m", "--reason", "r",
    ],
    &["dlq", "stats", "--json"],
    &["dlq", "peek"],
    &["dlq", "peek", "--json"],
    &["parked", "list", "--json"],
    &["parked", "replay", "--dry-run", "--json"],
    &["parked", "purge", "--yes"],
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

/// What a `budgetctl exporter` run printed: stdout, stderr, and the body of one scrape of
/// /metrics (empty when it exited before serving, as it does on a URL it refuses).
pub(crate) struct ExporterRun {
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) scrape: String,
    /// Whether it served (and so was scraped and killed) rather than exiting.
    pub(crate) served: bool,
}

/// Starts `budgetctl exporter` on a free port with the `global` flags, its own `args` and `env`, scrapes
/// /metrics once after it says it serves, kills it, and returns everything it printed. The
/// waits are guards against a hang, never assertions on time.
pub(crate) fn exporter_once(global: &[&str], args: &[&str], env: &[(&str, &str)]) -> ExporterRun {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::Stdio;
    use std::sync::mpsc;
    use std::time::Duration;

    let port = fleet_budget::testing::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut c = budgetctl();
    c.envs(env.iter().copied())
        .args(global)
        .args(["exporter", "--listen", &listen, "--discover-secs", "1"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("start budgetctl exporter");
    let stderr = child.stderr.take().expect("stderr piped");
    let (lines, serving) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains("exporter: serving") {
                let _ = lines.send(line.clone());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let served = serving.recv_timeout(Duration::from_secs(60)).is_ok();
    let mut scrape = String::new();
    if served {
        let mut tcp = std::net::TcpStream::connect(&listen).expect("connect to the exporter");
        tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        tcp.write_all(b"GET /metrics HTTP/1.0\r\nHost: redaction\r\n\r\n")
            .unwrap();
        tcp.read_to_string(&mut scrape).expect("read the scrape");
        assert!(
            scrape.lines().next().is_some_and(|l| l.contains(" 200 ")),
            "{scrape}"
        );
    }
    let _ = child.kill();
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("stdout piped")
        .read_to_string(&mut stdout)
        .unwrap();
    let status = child.wait().unwrap();
    let stderr = reader.join().expect("stderr reader");
    if !served {
        assert!(
            !status.success(),
            "the exporter neither served nor failed:\n{stderr}"
        );
    }
    ExporterRun {
        stdout,
        stderr,
        scrape,
        served,
    }
}

/// `exporter` (served, scraped, killed) and `demo` (the drill falls back to in-process, a
/// scenario fails fast) with secret URLs to servers that refuse: nothing they print, nor the
/// scrape body, holds 8 bytes of the secret; what names a URL names it redacted.
#[test]
fn no_secret_prints_from_the_exporter_or_the_demo() {
    let mut runner = TestRunner::new(Cases {
        cases: 6,
        failure_persistence: None,
        ..Cases::default()
    });
    let strategy = (secret(), 0_usize..8, 0_usize..4, any::<bool>());
    runner
        .run(&strategy, |(s, r, a, by_flags)| {
            let redis = redis_urls(&s).swap_remove(r);
            let amqp = amqp_urls(&s).swap_remove(a);
            let flags = ["--redis-url", redis.as_str(), "--amqp-url", amqp.as_str()];
            let env = [
                ("RUST_LOG", "trace"),
                ("FLEET_BUDGET_REDIS_URL", redis.as_str()),
                ("FLEET_BUDGET_AMQP_URL", amqp.as_str()),
            ];
            let (global, env): (&[&str], &[(&str, &str)]) = if by_flags {
                (&flags, &env[..1])
            } else {
                (&[], &env)
            };
            let check = |what: &str, name: &str, printed: &str| {
                if let Some(found) = leak(printed, &s) {
                    return Err(TestCaseError::fail(format!(
                        "{what} ({redis} / {amqp}) printed {found:?} of the secret on {name}:\n{printed}"
                    )));
                }
                Ok(())
            };

            // A configured dependency, so that a scrape reads Redis (and fails).
            let deps = temp_file(
                &format!("redact-exporter-{r}-{a}.toml"),
                "[dependencies.search]\ntasks = [\"index\"]\n",
            );
            let deps = deps.to_str().unwrap_or_default().to_owned();
            let global: Vec<&str> = ["--config", deps.as_str()]
                .into_iter()
                .chain(global.iter().copied())
                .collect();
            let global = global.as_slice();
            let e = exporter_once(global, &[], env);
            check("exporter", "stdout", &e.stdout)?;
            check("exporter", "stderr", &e.stderr)?;
            check("exporter", "/metrics", &e.scrape)?;
            if r < 2 && a != 3 {
                // URLs it accepts and servers that refuse: it serves, says where it reads
                // (redacted), and the scrape says Redis is down.
                prop_assert!(e.served, "{}", e.stderr);
                prop_assert!(
                    e.scrape.contains("fleet_budget_exporter_up{source=\"redis\"} 0"),
                    "{}",
                    e.scrape
                );
                prop_assert!(e.stderr.contains("redis://"), "{}", e.stderr);
                prop_assert!(e.stderr.contains("127.0.0.1:1"), "{}", e.stderr);
            }

            for args in [
                &["demo", "--scenario", "slow", "--phase-secs", "1"][..],
                &["demo", "--phase-secs", "1", "--rate", "50"],
            ] {
                let mut c = budgetctl();
                c.envs(env.iter().copied()).args(global).args(args);
                let o = c.output().expect("run budgetctl demo");
                let (out, err) = (
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr),
                );
                check(&format!("{args:?}"), "stdout", &out)?;
                check(&format!("{args:?}"), "stderr", &err)?;
                if args.contains(&"--scenario") {
                    prop_assert!(!o.status.success(), "{args:?} ran without services: {err}");
                    prop_assert!(err.contains("127.0.0.1:1") || err.contains("nonexistent"), "{args:?} does not name the URL: {err}");
                }
            }
            Ok(())
        })
        .unwrap();
}
