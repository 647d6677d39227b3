// Over ~500 lines on purpose: one contract, two languages; docs/semantics.md cites these tests by
// name, and submodules would rename them.
//! The Python client (`clients/python`) and the Rust library decide alike: the same random
//! sequence of attempts, successes and failures is run by both against one private
//! redis-server, each under its own key prefix (a fresh pair per sequence, so each starts from
//! empty budgets), and every decision (retry or dead letter, the reason, the next attempt, the
//! source, the snapshot) and the final budget must be equal. The delays are random (centred
//! jitter, `[3n/4, 5n/4]` of the nominal): each must lie in the same bounds. Python's keys, read at
//! the end with Rust's policy, report no policy conflict: both sent the same policy.
//!
//! A second test feeds bad configurations to both: each refuses the same ones, naming the same
//! keys (or refusing the whole text: bad TOML, an unknown key). A third tries every code point in
//! a dependency name and a key prefix in both.
//!
//! A third (issue 13) holds one dependency's concurrency cap from both languages at once, and
//! opens, probes and reopens one circuit breaker from both.
//!
//! A Python worker restores a frozen dependency's and an exhausted budget's hashes evicted under
//! `allkeys-lru` as the Rust library does (issue 33, "Lost budgets" in `lua/README.md`).
//!
//! Needs the `.venv` scripts/test makes (Python 3.11, `redis`, `prometheus_client`, the client
//! installed editable); `FLEET_BUDGET_PYTHON` names another interpreter. Never skipped.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use fleet_budget::ceiling::Backoff;
use fleet_budget::store::{BudgetStore, RedisStore, RedisTarget};
use fleet_budget::testing::{RedisCluster, RedisServer};
use fleet_budget::{Config, Decision, Dependency, Failure, FleetBudget};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Reads one operation per line, prints one JSON answer per line.
const DRIVER: &str = r#"
import json, sys
from fleet_budget import Config, DeadLetter, Failure, FleetBudget
budget = FleetBudget(Config.from_toml(sys.argv[1]), seed=1)
def snap(s):
    if s is None:
        return None
    c, k = s.current, s.control
    return [s.allowance, s.window_index, c.successes, c.first_attempts, c.retries, c.denied,
            int(k.conflict), int(k.frozen), int(k.overridden)]
for line in sys.stdin:
    op = json.loads(line)
    if op[0] == "attempt":
        budget.on_attempt(op[1], op[2]); out = None
    elif op[0] == "success":
        budget.on_success(op[1]); out = None
    else:
        _, task, attempt, kind, after = op
        failure = {"retryable": Failure.retryable("x"), "non_retryable": Failure.non_retryable("x"),
                   "after": Failure.after(after, "x")}[kind]
        d = budget.on_failure(task, attempt, failure)
        if isinstance(d, DeadLetter):
            out = ["dead", d.reason, d.source, snap(d.snapshot)]
        else:
            out = ["retry", d.next_attempt, d.source, snap(d.snapshot), d.delay]
    print(json.dumps(out), flush=True)
budget.close()
"#;

fn python() -> PathBuf {
    std::env::var_os("FLEET_BUDGET_PYTHON").map_or_else(
        || common::repo_root().join(".venv/bin/python"),
        PathBuf::from,
    )
}

fn snap(s: Option<&fleet_budget::BudgetSnapshot>) -> String {
    s.map_or_else(
        || "null".to_owned(),
        |s| {
            let (c, k) = (&s.current, &s.control);
            format!(
                "[{}, {}, {}, {}, {}, {}, {}, {}, {}]",
                s.allowance,
                s.window_index,
                c.successes,
                c.first_attempts,
                c.retries,
                c.denied,
                u8::from(k.conflict),
                u8::from(k.frozen),
                u8::from(k.overridden)
            )
        },
    )
}

/// Six random sequences, both languages deciding alike at each step. The deny cache is off here
/// (it has tests of its own in each language): whether a denial is answered from it depends on
/// how long each language took since the last one, not on what it decides, and a stall of this
/// machine in one language only made the two differ (CI, session 17, on the cluster).
#[tokio::test]
async fn python_and_rust_decide_alike_on_random_sequences() {
    let server = RedisServer::start();
    for seed in 0..6u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let basis = if rng.random_bool(0.5) {
            "success"
        } else {
            "request"
        };
        let mode = if rng.random_bool(0.5) {
            "sliding"
        } else {
            "fixed"
        };
        let policy = format!(
            "[defaults]\nwindow_secs = 3600\nratio = {}\nmin_allowance = {}\ndeposit = \"{basis}\"\nmode = \"{mode}\"\n\
             [dependencies.search]\ntasks = [\"index\", \"reindex\"]\n[tasks.index]\nmax_attempts = 4\n\
             [tasks.reindex]\nclass = \"idempotent\"\nbackoff_base_ms = 100\n",
            [0.1, 1.0, 0.2, 2.0, 0.5, 0.25][usize::try_from(seed).unwrap()],
            rng.random_range(0..5),
        );
        let redis = |prefix: &str| {
            format!(
                "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\ndeposit_flush_ms = 0\ntimeout_ms = 2000\ndeny_cache_ms = 0\n{policy}",
                server.url()
            )
        };
        let rust = run_alike(
            &redis(&format!("rs{seed}")),
            &redis(&format!("py{seed}")),
            &mut rng,
            &format!("seed {seed}"),
        )
        .await;
        // The Python driver closed its budget, which flushed: the denials its deny cache answered
        // are in Redis. Rust's go with its flush.
        rust.flush().await.unwrap();

        // Both left the same budget in Redis, and Python's keys hold the policy Rust sends.
        let python_keys = RedisStore::new(
            RedisTarget::Single(server.url()),
            "py",
            Duration::from_secs(5),
        )
        .unwrap();
        for dependency in ["search", "lone"] {
            let d = Dependency::new(dependency).unwrap();
            let mine = rust.status(&d).await.0;
            let seen = python_keys.status(&d, &rust.policy(&d)).await.unwrap();
            assert!(
                !seen.control.conflict,
                "seed {seed}: {dependency}: {policy}"
            );
            let theirs: Vec<String> = server.cmd(&[
                "HMGET",
                &format!("py{seed}:v1:{{{dependency}}}"),
                "cs",
                "ca",
                "cr",
                "cd",
            ]);
            let c = &mine.current;
            assert_eq!(
                theirs,
                [c.successes, c.first_attempts, c.retries, c.denied].map(|n| n.to_string()),
                "seed {seed}: {dependency}"
            );
        }
        rust.shutdown().await.unwrap();
    }
}

/// On a Redis Cluster of three masters, both decide alike (each language under its own key
/// prefix, dependencies spread over the masters by their hash tags), and then, with the master
/// of `search`'s slot stopped, both decide from the local fallback alike. The deny cache is off,
/// as in [`python_and_rust_decide_alike_on_random_sequences`].
///
/// The stopped master is left failed, not failing: the second sequence starts once the others
/// have marked it failed, and the cluster does not require full coverage, so the other masters go
/// on serving their slots. (With Redis's default, the cluster answered CLUSTERDOWN for every slot
/// from cluster-node-timeout on — 2 s after the stop, in the middle of the sequence on a loaded
/// machine — and the two languages met that moment at different steps.) The deadline stays at
/// 2 s with the master down: a call to the failed master fails at once in both, and a call to a
/// healthy one must not be cut by a stall of this machine in one language and not the other (at
/// 300 ms, 12 of 16 runs side by side on one core disagreed that way).
#[tokio::test]
async fn python_and_rust_decide_alike_on_a_cluster() {
    let mut cluster = RedisCluster::start_with(3, &["--cluster-require-full-coverage", "no"]);
    let seeds = cluster
        .urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let text = |prefix: &str| {
        format!(
            "[redis]\ncluster_urls = [{seeds}]\nkey_prefix = \"{prefix}\"\ndeposit_flush_ms = 0\ntimeout_ms = 2000\ndeny_cache_ms = 0\n\
             [defaults]\nwindow_secs = 86400\nratio = 0.5\nmin_allowance = 2\n\
             [dependencies.search]\ntasks = [\"index\", \"reindex\"]\n[tasks.index]\nmax_attempts = 4\n"
        )
    };
    let mut rng = SmallRng::seed_from_u64(20);
    let rust = run_alike(&text("rsc"), &text("pyc"), &mut rng, "cluster").await;
    rust.shutdown().await.unwrap();
    // Both sets of keys hold the same counters, each on the master of its slot.
    for dependency in ["search", "lone"] {
        let read = |prefix: &str| -> Vec<String> {
            let key = format!("{prefix}:v1:{{{dependency}}}");
            let slot: u16 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", &key]);
            let node = cluster.node_of_slot(slot).unwrap();
            cluster.nodes[node].cmd(&["HMGET", &key, "cs", "ca", "cr", "cd"])
        };
        assert_eq!(read("rsc"), read("pyc"), "{dependency}");
    }
    // The master of `search` stops: both go to the fallback for it, and agree there too.
    let slot: u16 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", "x:v1:{search}"]);
    let node = cluster.node_of_slot(slot).unwrap();
    cluster.nodes[node].stop();
    let healthy = (node + 1) % cluster.nodes.len();
    cluster.wait_marked_failed(healthy, Duration::from_secs(30));
    let mut rng = SmallRng::seed_from_u64(21);
    let rust = run_alike(
        &text("rsd"),
        &text("pyd"),
        &mut rng,
        "cluster, a master down",
    )
    .await;
    let _ = rust.shutdown().await;
}

/// Without Redis (nothing listens on the URL), both decide alike from their fallback: the
/// process's own budget (`local`), every retry refused (`deny`) or granted (`allow`), each
/// decision with the same source and, for `local`, the same local snapshot.
#[tokio::test]
async fn python_and_rust_decide_alike_without_redis() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for (seed, fallback) in [(10u64, "local"), (11, "deny"), (12, "allow")] {
        let mut rng = SmallRng::seed_from_u64(seed);
        let text = format!(
            "[redis]\nurl = \"redis://127.0.0.1:{port}\"\nfallback = \"{fallback}\"\ntimeout_ms = 200\n\
             [defaults]\nwindow_secs = 86400\nratio = 0.5\nmin_allowance = 2\n\
             [dependencies.search]\ntasks = [\"index\", \"reindex\"]\n[tasks.index]\nmax_attempts = 4\n"
        );
        let rust = run_alike(&text, &text, &mut rng, &format!("fallback {fallback}")).await;
        // The deposits still pending cannot be sent: Rust's shutdown returns the error, Python's
        // close() logs and returns their number (both drop them, the safe direction).
        let _ = rust.shutdown().await;
    }
}

/// Runs 200 random operations through the Rust library (configured by `rust_text`) and the
/// Python client (`python_text`), asserting after each that both decided alike; returns the
/// Rust budget.
async fn run_alike(
    rust_text: &str,
    python_text: &str,
    rng: &mut SmallRng,
    what: &str,
) -> FleetBudget {
    let rust_config = Config::from_toml(rust_text, "rust").unwrap();
    let rust = FleetBudget::from_config(&rust_config).await.unwrap();
    let mut child = Command::new(python())
        .args(["-c", DRIVER, python_text])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the Python driver (scripts/test makes .venv)");
    let mut to_py = child.stdin.take().unwrap();
    let mut from_py = BufReader::new(child.stdout.take().unwrap());
    for step in 0..200 {
        let task = match rng.random_range(0..3) {
            0 => "index",
            1 => "reindex",
            _ => "lone",
        };
        let (op, expected) = match rng.random_range(0..10) {
            0..=2 => {
                let attempt = rng.random_range(1..3);
                rust.on_attempt(task, attempt).await.unwrap();
                (
                    format!("[\"attempt\", \"{task}\", {attempt}]"),
                    "null".to_owned(),
                )
            }
            3..=4 => {
                rust.on_success(task).await.unwrap();
                (format!("[\"success\", \"{task}\"]"), "null".to_owned())
            }
            _ => {
                let attempt = rng.random_range(1..10u32);
                let (kind, after) = match rng.random_range(0..6) {
                    0 => ("non_retryable", 0),
                    1 => ("after", rng.random_range(0..5)),
                    _ => ("retryable", 0),
                };
                let failure = match kind {
                    "non_retryable" => Failure::non_retryable("x"),
                    "after" => Failure::retry_after(Duration::from_secs(after), "x"),
                    _ => Failure::retryable("x"),
                };
                let d = rust.on_failure(task, attempt, &failure).await.unwrap();
                let op = format!("[\"failure\", \"{task}\", {attempt}, \"{kind}\", {after}]");
                let expected = match &d {
                    Decision::DeadLetter {
                        reason,
                        source,
                        snapshot,
                        ..
                    } => format!(
                        "[\"dead\", \"{reason}\", \"{}\", {}]",
                        source.as_str(),
                        snap(snapshot.as_ref())
                    ),
                    Decision::Retry {
                        next_attempt,
                        source,
                        snapshot,
                        delay,
                        ..
                    } => {
                        let nominal = rust.ceiling(task).backoff.nominal(attempt);
                        let (low, high) = Backoff::jitter_bounds(nominal);
                        // Centred jitter in both; a Retry-After above the low bound may
                        // lift either delay past the other's.
                        let (lo, hi) = if kind == "after" && Duration::from_secs(after) > low {
                            (low.as_secs_f64(), f64::MAX)
                        } else {
                            (low.as_secs_f64(), high.as_secs_f64())
                        };
                        assert!(
                            *delay >= low && (*delay <= high || kind == "after"),
                            "{delay:?}"
                        );
                        format!(
                            "[\"retry\", {next_attempt}, \"{}\", {}, {lo}, {hi}]",
                            source.as_str(),
                            snap(Some(snapshot))
                        )
                    }
                };
                (op, expected)
            }
        };
        writeln!(to_py, "{op}").unwrap();
        let mut answer = String::new();
        from_py.read_line(&mut answer).unwrap();
        let answer = answer.trim();
        if let Some(bounds) = expected.strip_prefix("[\"retry\"") {
            // Compare all but the delay, then the delay against Rust's bounds.
            let (head, delay) = answer.rsplit_once(", ").unwrap();
            let (want_head, hi) = expected.rsplit_once(", ").unwrap();
            let (want_head, lo) = want_head.rsplit_once(", ").unwrap();
            assert_eq!(head, want_head, "{what} step {step}: {op} ({bounds})");
            let delay: f64 = delay.trim_end_matches(']').parse().unwrap();
            let (lo, hi): (f64, f64) = (
                lo.parse().unwrap(),
                hi.trim_end_matches(']').parse().unwrap(),
            );
            assert!(
                delay >= lo - 1e-9 && delay <= hi + 1e-9,
                "{what} step {step}: {op}: delay {delay} not in [{lo}, {hi}]"
            );
        } else {
            assert_eq!(answer, expected, "{what} step {step}: {op}");
        }
    }
    drop(to_py);
    assert!(child.wait().unwrap().success(), "the Python driver failed");
    rust
}

/// Prints, for each configuration text on stdin (JSON lines), the keys the Python client names
/// as invalid, or "parse" when it refuses the text as a whole (bad TOML, an unknown key).
const CONFIG_DRIVER: &str = r#"
import json, sys
from fleet_budget import Config, ConfigError
for line in sys.stdin:
    try:
        Config.from_toml(json.loads(line))
        out = "ok"
    except ConfigError as e:
        out = sorted(p.key for p in e.problems) if e.problems else "parse"
    print(json.dumps(out), flush=True)
"#;

#[test]
fn bad_configurations_are_refused_alike() {
    let texts = [
        "[defaults]\nratio = -1.0\nwindow_secs = 0\nmin_allowance = -3\n",
        "[defaults]\nratio = nan\n",
        "[defaults]\nratio = 11.0\n",
        "[defaults]\nwindow_secs = 86401\n",
        "[defaults]\nratoi = 0.2\n",
        "[redsi]\nurl = \"x\"\n",
        "[defaults\n",
        "[redis]\nurl = \"http://u:hunter2@h\"\n",
        "[redis]\ntimeout_ms = 0\nkey_prefix = \"a b\"\ndeposit_flush_ms = 10001\n",
        "[dependencies.\"a{b\"]\n",
        // Bidi controls, in a dependency name, a task section and a tasks list (TOML escapes).
        "[dependencies.\"pay\\u202Ex\"]\n",
        "[tasks.\"x\\u2066y\"]\nmax_attempts = 3\n",
        "[dependencies.search]\ntasks = [\"send\\u202Eliam\", \"ok\"]\n",
        "[dependencies.x]\ntasks = [\"t\", \"t\"]\n[dependencies.y]\ntasks = [\"t\"]\n",
        "[tasks.t]\nclass = \"paid\"\nmax_attempts = 2\n",
        "[tasks.t]\nbackoff_base_ms = 500\nbackoff_cap_ms = 100\n",
        "[tasks.t]\nrecovery_window_secs = 0\n",
        "[amqp]\nprefetch = 4\n[defaults]\nratio = 0.5\n",
        "[metrics]\nlisten = \"127.0.0.1:9464\"\n[audit]\nmax_entries = 5\nmax_age_days = 30\n",
        "[metrics]\nlisten = \"[::]:9464\"\n",
        "[metrics]\nlisten = \"localhost:9464\"\n[audit]\nmax_entries = 0\nmax_age_days = 3651\n",
        "[metrics]\nlisten = \"127.0.0.1\"\n",
        "[metrics]\nport = 1\n",
        "[audit]\nmax_entries = \"many\"\n",
        "[redis]\nurl = \"rediss://u:hunter2@h:6380\"\n",
        "[redis]\ncluster_urls = [\"redis://10.0.0.1:7000\", \"unix:///tmp/x\", \"rediss://h:7000\"]\n",
        "[redis]\ncluster_urls = [\"redis://10.0.0.1:7000\"]\ntimeout_ms = 100\n",
        "[redis]\ncluster_urls = \"redis://10.0.0.1:7000\"\n",
        "[defaults]\nratio = \"0.2\"\n",
        "[defaults]\nwindow_secs = true\n",
        "[redis]\nfallback = 1\n",
        "[dependencies.x]\ntasks = [1]\n",
        "[tasks.t]\nclass = \"paid\"\n[defaults]\nmax_attempts = 0\nmode = \"weekly\"\n",
        "[unmapped_tasks]\npolicy = \"share\"\n",
        "[unmapped_tasks]\npolicy = \"share\"\ndependency = \"serch\"\n[dependencies.search]\n",
        "[unmapped_tasks]\npolicy = \"share\"\ndependency = \"search\"\n[dependencies.search]\n",
        "[unmapped_tasks]\npolicy = \"share\"\ndependency = \"a{b\"\n[dependencies.\"a{b\"]\n",
        "[unmapped_tasks]\npolicy = \"reject\"\ndependency = \"search\"\nmax_own_budgets = 3\n",
        "[unmapped_tasks]\npolicy = \"share\"\nmax_own_budgets = 3\n",
        "[unmapped_tasks]\nmax_own_budgets = -1\n[defaults]\nmax_delay_secs = 0\n",
        "[unmapped_tasks]\nmax_own_budgets = 100001\n[tasks.t]\nmax_delay_secs = 604801\n",
        "[unmapped_tasks]\nmax_own_budgets = 0\n[defaults]\nmax_delay_secs = 604800\n",
        "[unmapped_tasks]\npolicy = \"own\"\n",
        "[unmapped_tasks]\nmax_own_budgets = \"many\"\n",
        "[unmapped_tasks]\ndependency = 3\n",
        "[unmapped_tasks]\ncap = 3\n",
        "[defaults]\nmax_delay_secs = 1.5\n",
        "[unmapped_tasks]\npolicy = \"reject\"\n[tasks.\"a{b}\"]\nmax_delay_secs = 1\n",
        "[tasks.\"a{b}\"]\nmax_delay_secs = 1\n",
        // Input review, session 5: a prefix of 58 characters but 74 bytes, Unicode spaces, an
        // empty fragment, empty certificate paths, IPv6 scopes, were taken by one language only.
        "[redis]\nkey_prefix = \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\\u3042\\u3042\\u3042\\u3042\\u3042\\u3042\\u3042\\u3042\"\n",
        "[redis]\nkey_prefix = \"a\\u00A0b\"\n",
        "[redis]\nkey_prefix = \"a\\u3000b\"\n",
        "[redis]\nurl = \"redis://h:1/#\"\n",
        "[redis]\ntls_ca_file = \"\"\n",
        "[redis]\ntls_cert_file = \"\"\ntls_key_file = \"k.pem\"\n",
        "[metrics]\nlisten = \"[fe80::1%2]:9464\"\n",
        "[metrics]\nlisten = \"[fe80::1%eth0]:9464\"\n",
        // URLs the Redis client cannot use, refused when the file is checked.
        "[redis]\nurl = \"redis://u:hunter2@h:99999\"\ncluster_urls = [\"redis://h ost:1\", \"redis://0.0.0.0:1\"]\n",
        "[redis]\nurl = \"redis://h:1/zero\"\n",
        "[redis]\nurl = \"redis://[::1:1\"\n",
        "[redis]\nurl = \"redis://h:1?protocol=resp9\"\n",
        "[redis]\nurl = \"unix:///tmp/x.sock?db=one\"\n",
        "[redis]\nurl = \"redis://u:p@[::1]:6379/+3?protocol=3\"\n",
        // Input review, session 6: bidirectional controls, zero-width and other invisible
        // characters in the key prefix (accepted by both before), and invisible characters in
        // dependency names, task lists and task sections (accepted by both before: only controls
        // and bidirectional controls were refused). The keys name them as `\u{…}` in both.
        "[redis]\nkey_prefix = \"fb\\u202Eevil\"\n",
        "[redis]\nkey_prefix = \"\\u2066fb\\u2069\"\n",
        "[redis]\nkey_prefix = \"fb\\u200E\"\n",
        "[redis]\nkey_prefix = \"fb\\u200F\"\n",
        "[redis]\nkey_prefix = \"fb\\u061C\"\n",
        "[redis]\nkey_prefix = \"f\\u200Bb\"\n",
        "[redis]\nkey_prefix = \"f\\u200Cb\"\n",
        "[redis]\nkey_prefix = \"f\\u200Db\"\n",
        "[redis]\nkey_prefix = \"f\\u2060b\"\n",
        "[redis]\nkey_prefix = \"\\uFEFFfb\"\n",
        "[redis]\nkey_prefix = \"f\\u00ADb\"\n",
        "[redis]\nkey_prefix = \"fb\\uFE0F\"\n",
        "[redis]\nkey_prefix = \"fb\\U000E0041\"\n",
        "[redis]\nkey_prefix = \"fb\\u3164\"\n",
        "[redis]\nkey_prefix = \"f\\u2028b\"\n",
        "[redis]\nkey_prefix = \"f\\u0085b\"\n",
        "[redis]\nkey_prefix = \"f\\u001Bb\"\n",
        "[redis]\nkey_prefix = \"tenant-7.\\u691C\\u7D22\"\n",
        "[dependencies.\"sea\\u200Brch\"]\n",
        "[dependencies.\"search\\uFEFF\"]\nratio = 11.0\n",
        "[dependencies.\"a\\u2028b\"]\n",
        "[dependencies.\"a\\u3164b\"]\n",
        "[dependencies.\"na\\u00EFve \\u691C\\u7D22\"]\nratio = 0.5\n",
        "[dependencies.search]\ntasks = [\"send\\u200Dmail\", \"ok\", \"x\\U000E0020\"]\n",
        "[tasks.\"sea\\u2060rch\"]\nmax_attempts = 3\n",
        "[unmapped_tasks]\npolicy = \"reject\"\n[tasks.\"sea\\u2060rch\"]\nmax_attempts = 3\n",
        "[unmapped_tasks]\npolicy = \"share\"\ndependency = \"sea\\u200Brch\"\n[dependencies.search]\n",
        // The concurrency budget and the circuit breaker (issue 13), read by both since the
        // Python client has them.
        "[dependencies.a.concurrency]\ncap = 0\nplanned_primary = 1\n[dependencies.b.concurrency]\ncap = 20\nplanned_primary = 21\nmin_retry_slots = -1\nlease_secs = 0\nmax_retry_fraction = -0.5\n[dependencies.c.concurrency]\nplanned_primary = 3\n[dependencies.d.concurrency]\ncap = 4\n",
        "[dependencies.a.concurrency]\ncap = 3\ncpa = 2\n",
        // A share derived past 1000 is named on the section (Rust used to drop the section
        // silently); a fraction given is used as given.
        "[dependencies.a.concurrency]\ncap = 5000\nplanned_primary = 1\n",
        "[dependencies.a]\ntasks = [\"t\"]\n[dependencies.a.concurrency]\ncap = 5000\nplanned_primary = 1\nmax_retry_fraction = 0.5\n",
        "[dependencies.a.concurrency]\ncap = \"3\"\n",
        "[dependencies.a.concurrency]\ncap = 3\nplanned_primary = 1\nprimary_waits = 1\n",
        "[dependencies.a]\ntasks = [\"t\"]\n[dependencies.a.concurrency]\ncap = 20\nplanned_primary = 16\nprimary_waits = true\nmax_wait_secs = 0\nmax_retry_fraction = 1\n[dependencies.a.breaker]\nfailure_ratio = 1\n",
        "[dependencies.a.breaker]\nfailure_ratio = 0.0\nmin_volume = 0\nopen_secs = 0\nclose_after = 9\n[dependencies.b]\nmin_allowance = 2\n[dependencies.b.breaker]\nhalf_open_probes = 3\n",
        "[dependencies.a.breaker]\nfailure_ratio = nan\nmax_wait_secs = 86401\nprobe_timeout_secs = 0\n",
        "[dependencies.a.breaker]\nopen = 3\n",
        "[dependencies.a.breaker]\nmin_volume = 2.5\n",
        "[defaults]\nmin_allowance = 1\n[dependencies.a.breaker]\n",
        "[dependencies.\"a{b\"]\n[dependencies.\"a{b\".concurrency]\ncap = 0\n[dependencies.\"a{b\".breaker]\nmin_volume = 0\n",
        "",
    ];
    let mut child = Command::new(python())
        .args(["-c", CONFIG_DRIVER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the Python driver (scripts/test makes .venv)");
    let mut to_py = child.stdin.take().unwrap();
    let mut from_py = BufReader::new(child.stdout.take().unwrap());
    for text in texts {
        let rust = match Config::from_toml_ignoring(text, "t", &["amqp"]) {
            Ok(_) => "\"ok\"".to_owned(),
            Err(fleet_budget::ConfigError::Invalid { problems, .. }) => {
                let mut keys: Vec<String> =
                    problems.iter().map(|p| format!("{:?}", p.key)).collect();
                keys.sort();
                format!("[{}]", keys.join(", "))
            }
            Err(_) => "\"parse\"".to_owned(),
        };
        let json = format!("{text:?}").replace("\\'", "'");
        writeln!(to_py, "{json}").unwrap();
        let mut answer = String::new();
        from_py.read_line(&mut answer).unwrap();
        assert_eq!(answer.trim(), rust, "{text}");
    }
    drop(to_py);
    assert!(child.wait().unwrap().success());
}

/// For each code point on stdin (one a line), whether the Python client refuses it in a
/// dependency name and in a key prefix (`"DK"`, `"D"`, `"K"` or `""`).
const CHAR_DRIVER: &str = r#"
import sys
from fleet_budget.config import dependency_name_problem, key_prefix_problem
out = []
for c in range(0x110000):
    if 0xD800 <= c <= 0xDFFF:
        continue
    ch = chr(c)
    d = dependency_name_problem("a" + ch + "b") is not None
    k = key_prefix_problem("a" + ch + "b") is not None
    if d or k:
        out.append(f"{c:x} {'D' if d else ''}{'K' if k else ''}")
print("\n".join(out))
"#;

/// Input review, session 6: every code point, in a dependency name and in a key prefix, is
/// refused or taken alike by both languages (a rule written against each language's own
/// Unicode tables, Python's `isspace` beside Rust's `is_whitespace`, could differ where the
/// shared cases do not look).
#[test]
fn every_code_point_is_refused_alike_in_names_and_key_prefixes() {
    let output = Command::new(python())
        .args(["-c", CHAR_DRIVER])
        .stderr(Stdio::inherit())
        .output()
        .expect("run the Python driver (scripts/test makes .venv)");
    assert!(output.status.success());
    let python = String::from_utf8(output.stdout).unwrap();
    let mut rust = String::new();
    for ch in (0..=0x10_FFFF_u32).filter_map(char::from_u32) {
        let text = format!("a{ch}b");
        let d = Dependency::new(&text).is_err();
        let k = fleet_budget::config::check_key_prefix("k", &text).is_err();
        if d || k {
            rust.push_str(&format!(
                "{:x} {}{}\n",
                u32::from(ch),
                if d { "D" } else { "" },
                if k { "K" } else { "" }
            ));
        }
    }
    let python: BTreeSet<&str> = python.lines().collect();
    let rust: BTreeSet<&str> = rust.lines().collect();
    let differ: Vec<_> = rust.symmetric_difference(&python).take(20).collect();
    assert!(
        differ.is_empty(),
        "refused by one language only: {differ:?}"
    );
    for refused in ["202e DK", "200b DK", "7b DK", "a0 K", "e0041 DK"] {
        assert!(rust.contains(refused), "{refused}");
    }
}

/// Prints the Python redactor's output for each text on stdin (JSON lines).
const REDACT_DRIVER: &str = r#"
import json, sys
from fleet_budget.redact import error_text, redact_text, redact_url
for line in sys.stdin:
    text = json.loads(line)
    print(json.dumps([redact_text(text), redact_url(text), error_text(text)]), flush=True)
"#;

/// The dead-letter headers Celery jobs carry (`fb-error`) are redacted as the Rust worker
/// redacts them: the same output on credential shapes, URLs, hostile and long texts.
#[test]
fn both_languages_redact_error_text_alike() {
    let long = format!("{} password=swordfish", "é".repeat(300));
    let texts = [
        "GET https://bob:hunter2@search.internal:9200/x?token=abc#frag failed",
        "redis://:s3cr3t@10.0.0.1:6379/0",
        "Authorization: Bearer abc.def.ghi\nnext line",
        "Authorization: Bearer Bearer 2hunter2xyz",
        "proxy-authorization: Basic dXNlcjpwYXNz and more",
        "basic check failed",
        "{\"password\": \"p\\\"w\", \"user\": \"u\"}",
        "db_pass=x bypass=y pwd: z auth=q author=w",
        "aws_secret_access_key = AKIAABCDEFGHIJKLMNOP ASIA1234567890ABCDEF",
        "Cookie: a=b; Set-Cookie: c=d",
        "x-api-key:k1 and api-key=k2, apikey: 'k3'",
        "://user:pw@host and ://nohost",
        "amqp://guest:guest@127.0.0.1:5672// and mailto:x",
        "key: \"password\": \"v\"",
        "\u{1c}token=\u{2003}x",
        "aauth//u:p:/sqps://#cookie:p@brhost#grag",
        "redis://us er:pw@h and ftp://a/b@c:d@e",
        &long,
        "",
    ];
    let mut child = Command::new(python())
        .args(["-c", REDACT_DRIVER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the Python driver (scripts/test makes .venv)");
    let mut to_py = child.stdin.take().unwrap();
    let mut from_py = BufReader::new(child.stdout.take().unwrap());
    for text in texts {
        writeln!(to_py, "{}", serde_json::to_string(text).unwrap()).unwrap();
        let mut answer = String::new();
        from_py.read_line(&mut answer).unwrap();
        let theirs: Vec<String> = serde_json::from_str(&answer).unwrap();
        let ours = [
            fleet_budget::redact::redact_text(text),
            fleet_budget::redact::redact_url(text),
            fleet_budget_amqp::headers::error_text(text),
        ];
        assert_eq!(theirs, ours, "{text:?}");
    }
    drop(to_py);
    assert!(child.wait().unwrap().success());
}

/// For each configuration text on stdin, the task `t`'s ceiling: max_attempts and the recovery
/// window, and whether attempt 3 is final 10 s and 100 s after the first failure.
const CEILING_DRIVER: &str = r#"
import json, sys
from fleet_budget import Config
for line in sys.stdin:
    c = Config.from_toml(json.loads(line)).ceiling("t")
    print(json.dumps([c.max_attempts, c.recovery_window, c.exhausted(3, 10.0), c.exhausted(3, 100.0)]), flush=True)
"#;

/// Ceilings by time are derived alike: the attempt count of the nominal schedule whose last
/// attempt runs when the window ends (60 s → 6, 900 s → 10, 4 h → 32), and the window itself
/// decides when the time since the first failure is known.
#[test]
fn ceilings_by_time_agree() {
    let mut child = Command::new(python())
        .args(["-c", CEILING_DRIVER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the Python driver (scripts/test makes .venv)");
    let mut to_py = child.stdin.take().unwrap();
    let mut from_py = BufReader::new(child.stdout.take().unwrap());
    for backoff in [
        "",
        "backoff_base_ms = 100\n",
        "backoff_base_ms = 1000\nbackoff_cap_ms = 5000\n",
    ] {
        for window in [1, 2, 15, 40, 60, 300, 900, 3600, 14_400, 604_800] {
            let text = format!("[tasks.t]\nrecovery_window_secs = {window}\n{backoff}");
            let c = Config::from_toml(&text, "t")
                .unwrap()
                .ceilings
                .for_task("t");
            let rust = serde_json::json!([
                c.max_attempts,
                c.recovery_window.map(|w| w.as_secs_f64()),
                c.exhausted(3, Some(Duration::from_secs(10))),
                c.exhausted(3, Some(Duration::from_secs(100))),
            ]);
            writeln!(to_py, "{}", serde_json::to_string(&text).unwrap()).unwrap();
            let mut answer = String::new();
            from_py.read_line(&mut answer).unwrap();
            let theirs: serde_json::Value = serde_json::from_str(&answer).unwrap();
            assert_eq!(theirs, rust, "{text}");
        }
    }
    drop(to_py);
    assert!(child.wait().unwrap().success());
}

/// Reads `[task, attempt, retry_after or null]` per line, prints the decision as JSON: a retry or
/// dead letter with the dependency that decided it, or the refusal of the task.
const UNMAPPED_DRIVER: &str = r#"
import json, sys
from fleet_budget import Config, DeadLetter, Failure, FleetBudget, InvalidTask, UnmappedTask
budget = FleetBudget(Config.from_toml(sys.argv[1]), seed=1)
def snap(s):
    if s is None:
        return None
    c, k = s.current, s.control
    return [s.allowance, s.window_index, c.successes, c.first_attempts, c.retries, c.denied,
            int(k.conflict), int(k.frozen), int(k.overridden)]
for line in sys.stdin:
    task, attempt, after = json.loads(line)
    failure = Failure.retryable("x") if after is None else Failure.after(after, "x")
    try:
        d = budget.on_failure(task, attempt, failure)
    except UnmappedTask:
        out = ["refused", "unmapped_task"]
    except InvalidTask:
        out = ["refused", "invalid_task"]
    else:
        if isinstance(d, DeadLetter):
            out = ["dead", d.dependency, d.reason, d.source, snap(d.snapshot)]
        else:
            out = ["retry", d.dependency, d.next_attempt, d.source, snap(d.snapshot)]
    print(json.dumps(out), flush=True)
budget.close()
"#;

/// `[unmapped_tasks]` and `max_delay_secs` are decided alike: under `own_budget` the first
/// `max_own_budgets` unmapped names spend their own budget and later ones the shared `unmapped`
/// one (an invalid name is refused and takes no place); under `share` every unmapped name spends
/// the named dependency's; under `reject` each is refused. A `Retry-After` past a task's
/// `max_delay` (set, inherited from `[defaults]`, or the default 1,200 s) is dead-lettered
/// `delay_exceeded` before the budget, one at it is retried.
#[tokio::test]
async fn unmapped_names_and_long_waits_are_decided_alike() {
    let server = RedisServer::start();
    let mut ops: Vec<(String, u32, Option<u64>)> = Vec::new();
    for round in 0..3u32 {
        for i in 0..8 {
            ops.push((format!("t{i}"), 1 + round, None));
        }
        ops.push(("a{b}".to_owned(), 1, None));
        for after in [4, 5, 6, 1199, 1200, 1201] {
            ops.push(("index".to_owned(), 1, Some(after)));
            ops.push((format!("t{round}"), 1, Some(after)));
        }
    }
    // (what `[defaults]` adds, the `[unmapped_tasks]` section)
    let cases = [
        ("", "[unmapped_tasks]\nmax_own_budgets = 3\n"),
        (
            "max_delay_secs = 1199\n",
            "[unmapped_tasks]\nmax_own_budgets = 0\n",
        ),
        (
            "",
            "[unmapped_tasks]\npolicy = \"share\"\ndependency = \"search\"\n",
        ),
        ("", "[unmapped_tasks]\npolicy = \"reject\"\n"),
        ("", ""),
    ];
    for (n, (extra, section)) in cases.into_iter().enumerate() {
        // No deny cache: each language's 100 ms of standing denials start when its own call
        // returned, so on a loaded machine one answered from its cache where the other, a
        // moment later past its 100 ms, asked Redis (a clean-clone run saw it). The deny cache
        // has tests of its own in each language (deny_cache.rs, test_deny_cache.py).
        let text = |prefix: &str| {
            format!(
                "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\ndeposit_flush_ms = 0\ntimeout_ms = 2000\ndeny_cache_ms = 0\n\
                 [defaults]\nwindow_secs = 3600\nratio = 0.5\nmin_allowance = 2\n{extra}\
                 [dependencies.search]\ntasks = [\"index\"]\n[tasks.index]\nmax_delay_secs = 5\n\
                 [tasks.t1]\nmax_attempts = 3\n{section}",
                server.url()
            )
        };
        let rust_config = Config::from_toml(&text(&format!("ru{n}")), "rust").unwrap();
        let rust = FleetBudget::from_config(&rust_config).await.unwrap();
        let mut child = Command::new(python())
            .args(["-c", UNMAPPED_DRIVER, &text(&format!("pu{n}"))])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run the Python driver (scripts/test makes .venv)");
        let mut to_py = child.stdin.take().unwrap();
        let mut from_py = BufReader::new(child.stdout.take().unwrap());
        let mut reasons = std::collections::BTreeSet::new();
        for (task, attempt, after) in &ops {
            let failure = after.map_or_else(
                || Failure::retryable("x"),
                |s| Failure::retry_after(Duration::from_secs(s), "x"),
            );
            let expected = match rust.on_failure(task, *attempt, &failure).await {
                Err(fleet_budget::Error::UnmappedTask { .. }) => {
                    "[\"refused\", \"unmapped_task\"]".to_owned()
                }
                Err(fleet_budget::Error::InvalidTask { .. }) => {
                    "[\"refused\", \"invalid_task\"]".to_owned()
                }
                Err(e) => panic!("{task}: {e}"),
                Ok(Decision::DeadLetter {
                    dependency,
                    reason,
                    snapshot,
                    source,
                }) => format!(
                    "[\"dead\", \"{dependency}\", \"{reason}\", \"{}\", {}]",
                    source.as_str(),
                    snap(snapshot.as_ref())
                ),
                Ok(Decision::Retry {
                    dependency,
                    next_attempt,
                    source,
                    snapshot,
                    ..
                }) => format!(
                    "[\"retry\", \"{dependency}\", {next_attempt}, \"{}\", {}]",
                    source.as_str(),
                    snap(Some(&snapshot))
                ),
            };
            let after_json = after.map_or_else(|| "null".to_owned(), |s| s.to_string());
            writeln!(to_py, "[{task:?}, {attempt}, {after_json}]").unwrap();
            let mut answer = String::new();
            from_py.read_line(&mut answer).unwrap();
            assert_eq!(
                answer.trim(),
                expected,
                "{section}{extra}: {task} {attempt} {after:?}"
            );
            reasons.insert(expected.split(", ").take(3).collect::<Vec<_>>().join(", "));
        }
        drop(to_py);
        assert!(child.wait().unwrap().success(), "the Python driver failed");
        rust.shutdown().await.unwrap();
        // The sequence reached what it is about (not only budget refusals).
        let seen = format!("{reasons:?}");
        match n {
            0 => assert!(
                seen.contains("\\\"unmapped\\\"")
                    && seen.contains("\\\"t2\\\"")
                    && seen.contains("delay_exceeded"),
                "{seen}"
            ),
            1 => assert!(
                seen.contains("\\\"unmapped\\\"") && !seen.contains("\\\"t0\\\""),
                "{seen}"
            ),
            2 => assert!(
                !seen.contains("\\\"t0\\\"") && !seen.contains("unmapped"),
                "{seen}"
            ),
            3 => assert!(seen.contains("unmapped_task"), "{seen}"),
            _ => assert!(
                seen.contains("\\\"t7\\\"") && seen.contains("invalid_task"),
                "{seen}"
            ),
        }
    }
}

/// Drives a Python `FleetBudget`'s admission (the concurrency budget and the breaker): one JSON
/// operation per line, one JSON answer per line. `storm` starts threads that take and give back
/// retry slots, each reading the leases held fleet-wide while it holds one; `join` waits for them.
const ADMISSION_DRIVER: &str = r#"
import json, sys, threading
import redis
from fleet_budget import Call, Config, FleetBudget, Hold, SUCCEEDED
config = Config.from_toml(sys.argv[1])
budget = FleetBudget(config, group_commit=False)
r = redis.Redis.from_url(config.redis.url)
held, storm = [], {}
def one(task, rounds, key, out, lock):
    for _ in range(rounds):
        c = budget.admit(task, 2)
        if isinstance(c, Call):
            n = r.zcard(key + ":lp") + r.zcard(key + ":lr")
            with lock:
                out["most"] = max(out["most"], n); out["granted"] += 1
            budget.finish(c, SUCCEEDED)
        else:
            with lock:
                out["refused"].add(c.reason)
for line in sys.stdin:
    op = json.loads(line)
    out = None
    if op[0] == "admit":
        a = budget.admit(op[1], op[2])
        if isinstance(a, Call):
            held.append(a); out = ["run", a.lease is not None, a.is_probe]
        elif isinstance(a, Hold):
            out = ["hold", a.reason]
        else:
            out = ["dead", a.reason]
    elif op[0] == "finish_all":
        for c in held:
            budget.finish(c, op[1])
        held.clear()
    elif op[0] == "breaker":
        out = budget.breaker_status(op[1]).state
    elif op[0] == "storm":
        storm = {"out": {"most": 0, "granted": 0, "refused": set()}, "lock": threading.Lock()}
        storm["threads"] = [threading.Thread(target=one, args=(op[1], op[3], op[4], storm["out"], storm["lock"]))
                            for _ in range(op[2])]
        for t in storm["threads"]:
            t.start()
    elif op[0] == "join":
        for t in storm["threads"]:
            t.join()
        s = storm["out"]; out = [s["most"], s["granted"], sorted(s["refused"])]
    print(json.dumps(out), flush=True)
budget.close()
"#;

/// Issue 13 across languages: Rust and Python holders of one dependency's concurrency budget
/// never hold more than its cap together (each refused `concurrency_cap` once the other holds the
/// rest), also while both take and give back slots at once; and a breaker opened by Rust's
/// failures is seen open by Python, which holds its job, while Python's probes and a probe's
/// failure are seen by Rust.
#[tokio::test]
async fn rust_and_python_share_one_cap_and_one_breaker() {
    use fleet_budget::{Admission, CallOutcome, DeadLetterReason, Hold};

    let server = RedisServer::start();
    let text = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"mix\"\ndeposit_flush_ms = 0\ntimeout_ms = 2000\n\
         [dependencies.paid-api]\ntasks = [\"charge\"]\n[dependencies.paid-api.concurrency]\n\
         cap = 6\nplanned_primary = 6\nmin_retry_slots = 6\nlease_secs = 600\n\
         [dependencies.search]\ntasks = [\"index\"]\n[dependencies.search.breaker]\n\
         min_volume = 4\nfailure_ratio = 0.5\nopen_secs = 3600\nhalf_open_probes = 2\n",
        server.url()
    );
    let rust = FleetBudget::from_config(&Config::from_toml(&text, "rust").unwrap())
        .await
        .unwrap();
    let mut child = Command::new(python())
        .args(["-c", ADMISSION_DRIVER, &text])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the Python driver (scripts/test makes .venv)");
    let mut to_py = child.stdin.take().unwrap();
    let mut from_py = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |op: &str| {
        writeln!(to_py, "{op}").unwrap();
        let mut answer = String::new();
        from_py.read_line(&mut answer).unwrap();
        answer.trim().to_owned()
    };
    let leases = || {
        let p: u64 = server.cmd(&["ZCARD", "mix:v1:{paid-api}:lp"]);
        let r: u64 = server.cmd(&["ZCARD", "mix:v1:{paid-api}:lr"]);
        p + r
    };

    // Rust holds three retry slots of six; Python gets the other three, then is refused.
    let mut rust_calls = Vec::new();
    for _ in 0..3 {
        match rust.admit("charge", 2, None).await.unwrap() {
            Admission::Run(call) => rust_calls.push(call),
            other => panic!("{other:?}"),
        }
    }
    for _ in 0..3 {
        assert_eq!(ask(r#"["admit", "charge", 2]"#), "[\"run\", true, false]");
    }
    assert_eq!(
        ask(r#"["admit", "charge", 2]"#),
        "[\"dead\", \"concurrency_cap\"]"
    );
    match rust.admit("charge", 3, None).await.unwrap() {
        Admission::DeadLetter(d) => {
            assert_eq!(
                d.dead_letter_reason(),
                Some(DeadLetterReason::ConcurrencyCap)
            );
        }
        other => panic!("Rust was given a seventh slot: {other:?}"),
    }
    assert_eq!(leases(), 6);
    // Python gives its slots back: Rust gets one.
    assert_eq!(ask(r#"["finish_all", "succeeded"]"#), "null");
    match rust.admit("charge", 2, None).await.unwrap() {
        Admission::Run(call) => rust_calls.push(call),
        other => panic!("{other:?}"),
    }
    for call in rust_calls.drain(..) {
        rust.finish(call, CallOutcome::Succeeded).await;
    }
    assert_eq!(leases(), 0);

    // Both at once: four Python threads and three Rust holders take and give back retry slots;
    // every reading of the leases held fleet-wide, by either, is within the cap.
    assert_eq!(
        ask(r#"["storm", "charge", 4, 60, "mix:v1:{paid-api}"]"#),
        "null"
    );
    let (mut most, mut granted, mut refused) = (0, 0, 0);
    for _ in 0..80 {
        for _ in 0..3 {
            match rust.admit("charge", 2, None).await.unwrap() {
                Admission::Run(call) => rust_calls.push(call),
                Admission::DeadLetter(d) => {
                    assert_eq!(
                        d.dead_letter_reason(),
                        Some(DeadLetterReason::ConcurrencyCap)
                    );
                    refused += 1;
                }
                Admission::Wait(hold) => panic!("a retry never waits: {hold:?}"),
            }
        }
        most = most.max(leases());
        granted += rust_calls.len();
        for call in rust_calls.drain(..) {
            rust.finish(call, CallOutcome::Succeeded).await;
        }
    }
    let python: serde_json::Value = serde_json::from_str(&ask(r#"["join"]"#)).unwrap();
    assert!(most <= 6, "Rust read {most} leases held, over the cap of 6");
    assert!(
        python[0].as_u64().unwrap() <= 6,
        "Python read over the cap: {python}"
    );
    assert!(
        granted > 0 && python[1].as_u64().unwrap() > 0,
        "{granted} {python} {refused}"
    );
    assert!(
        python[2]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r == "concurrency_cap"),
        "{python}"
    );
    assert_eq!(leases(), 0, "every slot given back");

    // The breaker: opened by Rust's failures, seen open by Python, whose job waits.
    for _ in 0..4 {
        match rust.admit("index", 1, None).await.unwrap() {
            Admission::Run(call) => rust.finish(call, CallOutcome::Failed).await,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(rust.metrics().breaker_transitions("search", "open"), 1);
    assert_eq!(ask(r#"["breaker", "search"]"#), "\"open\"");
    assert_eq!(
        ask(r#"["admit", "index", 1]"#),
        "[\"hold\", \"circuit_open\"]"
    );
    // Its open period over (moved to the past): Python takes both probes, so Rust waits; a
    // probe's failure in Python opens it again, for Rust too.
    let _: u64 = server.cmd(&["HSET", "mix:v1:{search}:cb", "ou", "1"]);
    for _ in 0..2 {
        assert_eq!(ask(r#"["admit", "index", 1]"#), "[\"run\", false, true]");
    }
    match rust.admit("index", 1, None).await.unwrap() {
        Admission::Wait(Hold::CircuitOpen { .. }) => {}
        other => panic!("a third probe: {other:?}"),
    }
    assert_eq!(ask(r#"["finish_all", "failed"]"#), "null");
    match rust.admit("index", 1, None).await.unwrap() {
        Admission::Wait(Hold::CircuitOpen { .. }) => {}
        other => panic!("{other:?}"),
    }
    let opened: Vec<String> = server.cmd(&["HMGET", "mix:v1:{search}:cb", "st", "no"]);
    assert_eq!(opened, ["1", "2"], "open, opened twice");
    drop(to_py);
    assert!(child.wait().unwrap().success(), "the Python driver failed");
    rust.shutdown().await.unwrap();
}

/// A Python worker: reports to the worker registry, decides `find` once (its Redis user may not
/// touch `search`'s budget: the fallback decides), prints its worker id and its package's
/// version, and closes (leaving the registry) when told to.
const REGISTRY_DRIVER: &str = r#"
import json, sys
from importlib import metadata
from fleet_budget import Config, Failure, FleetBudget
budget = FleetBudget(Config.from_toml(sys.argv[1]))
decision = budget.on_failure("find", 1, Failure.retryable("503"))
assert decision.source == "local_fallback", decision
print(json.dumps([budget.worker_id, metadata.version("fleet-budget")]), flush=True)
sys.stdin.readline()
budget.close()
"#;

/// The worker registry across languages: the Rust reader (`control::fleet_workers`, which the
/// console uses) reads a Python worker's report as a Rust worker's, and sees the dependency it
/// decides from its fallback; the Python worker's `close()` takes it out.
#[tokio::test]
async fn rust_reads_a_python_workers_report_and_its_fallback() {
    use fleet_budget::control::fleet_workers;
    use fleet_budget::testing::eventually;

    let server = RedisServer::start();
    let _: String = server.cmd(&[
        "ACL",
        "SETUSER",
        "w",
        "on",
        ">pw",
        "resetkeys",
        "~fb:v1:workers:*",
        "+@all",
    ]);
    let url = server.url().replacen("redis://", "redis://w:pw@", 1);
    let text = format!(
        "[redis]\nurl = \"{url}\"\nheartbeat_ms = 100\ntimeout_ms = 2000\ndeposit_flush_ms = 0\n\
         [dependencies.search]\ntasks = [\"find\"]\n[dependencies.mail]\ntasks = [\"send\"]\n"
    );
    let mut child = Command::new(python())
        .args(["-c", REGISTRY_DRIVER, &text])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the Python driver (scripts/test makes .venv)");
    let mut to_py = child.stdin.take().unwrap();
    let mut from_py = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    from_py.read_line(&mut line).unwrap();
    let (id, version): (String, String) = serde_json::from_str(&line).expect("the driver's id");
    let store = RedisStore::new(
        RedisTarget::Single(server.url()),
        "fb",
        Duration::from_secs(2),
    )
    .unwrap();
    let find = async |id: &str| {
        let read = fleet_workers(&store, 1000).await.unwrap();
        read.workers.into_iter().find(|w| w.id == id)
    };
    eventually(
        "the Python worker reports search in fallback",
        Duration::from_secs(10),
        async || find(&id).await.is_some_and(|w| w.in_fallback()),
    )
    .await;
    let w = find(&id).await.unwrap();
    assert!(w.is_fresh() && w.unreadable.is_none(), "{w:?}");
    assert_eq!(w.lang.as_deref(), Some("python"));
    assert_eq!(w.version.as_deref(), Some(version.as_str()));
    assert_eq!(w.pid, Some(u64::from(child.id())));
    assert_eq!(w.interval_ms, Some(100));
    assert!(w.started_ms.is_some() && w.host.is_some(), "{w:?}");
    assert_eq!(
        w.fallback
            .iter()
            .map(|f| f.dependency.as_str())
            .collect::<Vec<_>>(),
        ["search"],
        "mail was never asked: {w:?}"
    );
    assert_eq!(w.fallback_more, 0);
    let read = fleet_workers(&store, 1000).await.unwrap();
    assert_eq!((read.reporting(), read.in_fallback()), (1, 1));
    assert_eq!(read.in_fallback_by_dependency().get("search"), Some(&1));

    writeln!(to_py, "close").unwrap();
    assert!(child.wait().unwrap().success(), "the Python driver failed");
    assert_eq!(find(&id).await, None, "close() leaves the registry");
}

/// Asks retries of a task and reads the loss counter (issue 33): `["ask", task, n]` prints the
/// grants; `["lost", dependency]` prints `fleet_budget_budget_lost_total` for it.
const EVICTION_DRIVER: &str = r#"
import json, sys
from fleet_budget import Config, Failure, FleetBudget, Retry
budget = FleetBudget(Config.from_toml(sys.argv[1]), seed=1)
for line in sys.stdin:
    op = json.loads(line)
    if op[0] == "ask":
        out = sum(isinstance(budget.on_failure(op[1], 1, Failure.retryable("503")), Retry) for _ in range(op[2]))
    else:
        out = budget.metrics.value("fleet_budget_budget_lost_total", dependency=op[1])
    print(json.dumps(out), flush=True)
budget.close()
"#;

/// A cache filling an 8 MB Redis under `allkeys-lru` (keys with a TTL, until at least 30,000
/// are evicted and the budget hashes are gone) evicts a frozen dependency's hash and an
/// exhausted one's. The Python worker, which saw the freeze and every grant, restores both with
/// its next calls (its memory of the hashes, the same optional arguments as Rust's): no retry is
/// granted on the frozen dependency, none past the floor on the exhausted one, from Python or
/// from the Rust worker after it (which saw half the grants: its memory raises nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_restores_a_freeze_under_allkeys_lru_as_rust_does() {
    use fleet_budget::control::{AuditLog, OverrideAction, overrides};

    let server = RedisServer::start_with(
        &["--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru"],
        &[],
    );
    let text = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"mix\"\ndeposit_flush_ms = 0\ndeny_cache_ms = 0\n\
         heartbeat_ms = 0\ntimeout_ms = 5000\n\
         [dependencies.mail]\ntasks = [\"send\"]\nwindow_secs = 600\nmin_allowance = 10\n\
         [dependencies.search]\ntasks = [\"index\"]\nwindow_secs = 600\nmin_allowance = 10\n",
        server.url()
    );
    let rust = FleetBudget::from_config(&Config::from_toml(&text, "rust").unwrap())
        .await
        .unwrap();
    let operator = RedisStore::new(
        RedisTarget::Single(server.url()),
        "mix",
        Duration::from_secs(5),
    )
    .unwrap();
    overrides::apply(
        &operator,
        &AuditLog::default(),
        &Dependency::new("mail").unwrap(),
        OverrideAction::Freeze {
            duration: Duration::from_secs(3600),
        },
        "ops",
        "incident",
    )
    .await
    .unwrap();
    let freeze_until: String = server.cmd(&["HGET", "mix:v1:{mail}", "fu"]);
    let mut child = Command::new(python())
        .args(["-c", EVICTION_DRIVER, &text])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the Python driver (scripts/test makes .venv)");
    let mut to_py = child.stdin.take().unwrap();
    let mut from_py = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |op: &str| {
        writeln!(to_py, "{op}").unwrap();
        let mut answer = String::new();
        from_py.read_line(&mut answer).unwrap();
        // Python prints counts as floats ("10.0"): whole, small, never negative.
        let n = answer.trim().parse::<f64>().unwrap();
        assert!(n >= 0.0 && n.fract() == 0.0 && n < 1e15, "{n}");
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = n as u64;
        n
    };
    let rust_granted = async |task: &str, n: u64| {
        let mut granted = 0;
        for _ in 0..n {
            let d = rust
                .on_failure(task, 1, &Failure::retryable("503"))
                .await
                .unwrap();
            granted += u64::from(d.is_retry());
        }
        granted
    };
    assert_eq!(ask(r#"["ask", "send", 1]"#), 0, "Python sees the freeze");
    assert_eq!(rust_granted("index", 5).await, 5);
    assert_eq!(ask(r#"["ask", "index", 6]"#), 5, "the floor is spent");

    // The cache.
    let mut connection = server.connection().unwrap();
    let value = "x".repeat(1024);
    let (mut written, mut evicted) = (0u64, 0u64);
    let gone = |k: &str| server.cmd::<i64>(&["EXISTS", k]) == 0;
    while written < 2_000_000
        && (evicted < 30_000 || !gone("mix:v1:{mail}") || !gone("mix:v1:{search}"))
    {
        let mut pipe = redis::pipe();
        for _ in 0..1000 {
            pipe.cmd("SET")
                .arg(format!("cache:{written}"))
                .arg(&value)
                .arg("EX")
                .arg(3600)
                .ignore();
            written += 1;
        }
        let _: () = pipe.query(&mut connection).unwrap();
        let info: String = server.cmd(&["INFO", "stats"]);
        evicted = info
            .lines()
            .find_map(|l| l.strip_prefix("evicted_keys:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
    }
    assert!(
        gone("mix:v1:{mail}") && gone("mix:v1:{search}"),
        "both evicted"
    );

    let py_frozen = ask(r#"["ask", "send", 20]"#);
    let py_search = ask(r#"["ask", "index", 20]"#);
    let rust_frozen = rust_granted("send", 20).await;
    let rust_search = rust_granted("index", 20).await;
    let py_lost = ask(r#"["lost", "mail"]"#) + ask(r#"["lost", "search"]"#);
    let restored_until: String = server.cmd(&["HGET", "mix:v1:{mail}", "fu"]);
    println!(
        "allkeys-lru, maxmemory 8mb: cache keys written {written}, evicted {evicted}; after: \
         frozen dependency asked 20 + 20, granted {py_frozen} (Python) + {rust_frozen} (Rust); \
         exhausted budget asked 20 + 20, granted {py_search} + {rust_search} (bound 0: Python, \
         first to call, had seen every grant); losses counted by Python {py_lost}"
    );
    assert_eq!((py_frozen, rust_frozen), (0, 0), "the freeze holds");
    assert_eq!((py_search, rust_search), (0, 0), "within the bound");
    assert_eq!(py_lost, 2, "one loss per hash, found by Python");
    assert_eq!(
        restored_until, freeze_until,
        "the same freeze, to the same end"
    );
    drop(to_py);
    assert!(child.wait().unwrap().success());
}
