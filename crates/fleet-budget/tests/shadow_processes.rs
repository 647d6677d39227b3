//! Shadow beside enforcement in OS processes (issue 34's target: "Shadow in the 4-process storm
//! (32 tasks each, 200,000 decisions, floor 10): every retry granted; `would_deny` equal to what
//! enforcement denies in the same run beside it, within one deny-cache staleness per process").
//!
//! Eight processes of `examples/storm_worker.rs` (built here with `cargo build`), each its own
//! `FleetBudget` from a TOML file, run at the same time against a private `redis-server`: four
//! with 32 tasks each on a dependency in shadow, four with 32 tasks each on a dependency of the
//! same policy enforced. Each prints its accounting as a JSON line after flushing; the test sums
//! them and reads Redis's counters (`fleet_status`, what `budgetctl status` reads).
//!
//! Two storms: without successes (the budget at its floor the whole time: shadow's would-be
//! denials and enforcement's denials are equal exactly), and with a success before every tenth
//! failure of every task, so the allowance grows while both storms run and the deny caches are
//! what may tell them apart. The bound on that difference, from `docs/semantics.md` ("Exhausted
//! budgets answered in the process"), with `s = redis.deny_cache_ms`:
//!
//! - A process answers a denial without a call only until `s` after the call that brought it
//!   was *sent*. The storm's configuration has `deposit_flush_ms = 0`: each success is its own
//!   deposit call, awaited by `on_success`, so a deposit is in Redis when `on_success` returns.
//! - Take a deposit in Redis at `t`. A process that starts a decision at `t + s` or later holds
//!   either no denial from a call sent before `t` (it has expired), so it asks Redis, or a
//!   denial from a call sent after `t`, which Redis answered with the deposit counted, so the
//!   headroom it made was already spent. Either way the retries a deposit made possible are
//!   granted by the end of the storm if any decision of the storm starts `s` after it.
//! - So the headroom a storm leaves unspent (the allowance at its end less its grants) comes
//!   only from deposits that reached Redis less than `s` before the storm's last decision
//!   started, and (every task ends with a failure, so each process's deposits precede its own
//!   last decision) each of those reached Redis less than `s` before the last decision of the
//!   process that made it: the worker's `late_successes`, one staleness per process.
//! - `allowance = max(min_allowance, floor(ratio × deposits))`, so `L` late deposits leave at
//!   most `ceil(ratio × L)` retries unspent, and every other retry of the allowance is granted.
//! - Both storms deposit the same successes, so face the same allowance at their end: each
//!   grants it less its unspent headroom, and with the same decisions, `would_deny` less
//!   enforcement's denials is enforcement's grants less shadow's. Hence
//!   `|would_deny − enforcement's denials| ≤ max over the two storms of ceil(ratio × Σ late)`.
//!
//! Counts are asserted, never time. The non-ignored storms are small (12,800 decisions per
//! dependency); `storm_of_200000_decisions_in_os_processes` (ignored) is the full size recorded
//! in `docs/BENCHMARKS.md` ("Shadow beside enforcement in OS processes").
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    missing_docs
)]

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use fleet_budget::Dependency;
use fleet_budget::control::fleet_status;
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::{RedisServer, free_port, workspace_example};

const PROCESSES: u64 = 4;
const TASKS: u64 = 32;
const FLOOR: u64 = 10;
const RATIO: f64 = 0.1;
const STALENESS_MS: u64 = 100;

/// The configuration as users write it: a window of a day (nothing rolls under the test, so
/// both storms face the same budget), each deposit its own call (see the module's bound).
fn config_text(url: &str) -> String {
    format!(
        "[redis]\nurl = \"{url}\"\ntimeout_ms = 5000\nkey_prefix = \"fbp\"\n\
         deny_cache_ms = {STALENESS_MS}\ndeposit_flush_ms = 0\n\n\
         [defaults]\nwindow_secs = 86400\nratio = {RATIO}\nmin_allowance = {FLOOR}\n\n\
         [dependencies.shadowed]\ntasks = [\"shadowed\"]\nenforcement = \"shadow\"\n\n\
         [dependencies.enforced]\ntasks = [\"enforced\"]\n"
    )
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Worker {
    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert!(
            !line.is_empty(),
            "a storm worker ended early: {:?}",
            self.child.wait()
        );
        line
    }
}

/// One storm's sums over its processes.
#[derive(Debug, Default)]
struct Storm {
    decisions: u64,
    granted: u64,
    shadow_denied: u64,
    budget_exhausted: u64,
    other_dead_letters: u64,
    not_from_redis: u64,
    successes: u64,
    late_successes: u64,
    would_deny: u64,
    denied: u64,
    slowest_secs: f64,
}

impl Storm {
    fn add(&mut self, line: &serde_json::Value) {
        let n = |key: &str| {
            line[key]
                .as_u64()
                .unwrap_or_else(|| panic!("{key}: {line}"))
        };
        self.decisions += n("decisions");
        self.granted += n("granted");
        self.shadow_denied += n("shadow_denied");
        for (reason, count) in line["dead_lettered"].as_object().unwrap() {
            let count = count.as_u64().unwrap();
            if reason == "budget_exhausted" {
                self.budget_exhausted += count;
            } else {
                self.other_dead_letters += count;
            }
        }
        for (source, count) in line["sources"].as_object().unwrap() {
            if source != "fleet" && source != "fleet_cache" {
                self.not_from_redis += count.as_u64().unwrap();
            }
        }
        self.successes += n("successes");
        self.late_successes += n("late_successes");
        self.would_deny += n("would_deny");
        self.denied += n("denied");
        self.slowest_secs = self.slowest_secs.max(line["secs"].as_f64().unwrap());
    }

    /// The most retries the deposits in the last staleness of each process can leave unspent.
    fn unspent_bound(&self) -> u64 {
        (RATIO * self.late_successes as f64).ceil() as u64
    }
}

/// Both storms at once, `total` decisions each, a success before every `success_every`-th
/// failure of a task (0: none); checks what both promise and returns the difference.
fn storms_side_by_side(total: u64, success_every: u64) -> i128 {
    assert_eq!(total % PROCESSES, 0);
    let per_process = total / PROCESSES;
    let server = RedisServer::start();
    let worker = workspace_example("fleet-budget", "storm_worker");
    let dir = std::env::temp_dir().join(format!("fb-storm-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("fleet.toml");
    std::fs::write(&config, config_text(&server.url())).unwrap();
    let parsed = fleet_budget::Config::from_path(&config).unwrap();

    let mut workers: Vec<(&str, Worker)> = Vec::new();
    for task in ["shadowed", "enforced"] {
        for _ in 0..PROCESSES {
            let mut child = Command::new(&worker)
                .arg("--config")
                .arg(&config)
                .args(["--task", task])
                .args(["--tasks", &TASKS.to_string()])
                .args(["--decisions", &per_process.to_string()])
                .args(["--success-every", &success_every.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap();
            let stdin = child.stdin.take().unwrap();
            let stdout = BufReader::new(child.stdout.take().unwrap());
            workers.push((
                task,
                Worker {
                    child,
                    stdin,
                    stdout,
                },
            ));
        }
    }
    // Every process connected before any storm starts; then all at once.
    for (_, w) in &mut workers {
        assert_eq!(w.line().trim(), "ready");
    }
    let started = Instant::now();
    for (_, w) in &mut workers {
        w.stdin.write_all(b"go\n").unwrap();
        w.stdin.flush().unwrap();
    }
    let (mut shadow, mut enforced) = (Storm::default(), Storm::default());
    for (task, w) in &mut workers {
        let line: serde_json::Value = serde_json::from_str(&w.line()).unwrap();
        if *task == "shadowed" {
            shadow.add(&line);
        } else {
            enforced.add(&line);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    for (_, w) in &mut workers {
        assert!(w.child.wait().unwrap().success());
    }
    let _ = std::fs::remove_dir_all(&dir);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let store = RedisStore::new(
        RedisTarget::Single(server.url()),
        "fbp",
        Duration::from_secs(5),
    )
    .unwrap();
    let in_redis = |name: &str| {
        let dependency = Dependency::new(name).unwrap();
        let policy = parsed.policy(&dependency);
        runtime
            .block_on(fleet_status(&store, &dependency, &policy))
            .unwrap()
            .snapshot
    };
    let (shadow_redis, enforced_redis) = (in_redis("shadowed"), in_redis("enforced"));
    let difference = i128::from(shadow.would_deny) - i128::from(enforced.denied);
    println!(
        "storm of {total} decisions per dependency in OS processes, {PROCESSES} x {TASKS} tasks \
         each side, floor {FLOOR}, ratio {RATIO}, a success every {success_every} failures, \
         {secs:.2} s for both (slowest process: shadow {:.2} s, enforcement {:.2} s)\n\
         shadow:      {} retried as granted, {} retried in shadow (would_deny {}, Redis denied {}), \
         {} dead-lettered; {} successes, allowance {} at the end, {} late\n\
         enforcement: {} retried, {} dead-lettered budget_exhausted (denied {}, Redis denied {}); \
         {} successes, allowance {} at the end, {} late\n\
         would_deny - enforcement's denials = {difference} (bound {})",
        shadow.slowest_secs,
        enforced.slowest_secs,
        shadow.granted,
        shadow.shadow_denied,
        shadow.would_deny,
        shadow_redis.current.denied,
        shadow.budget_exhausted + shadow.other_dead_letters,
        shadow.successes,
        shadow_redis.allowance,
        shadow.late_successes,
        enforced.granted,
        enforced.budget_exhausted,
        enforced.denied,
        enforced_redis.current.denied,
        enforced.successes,
        enforced_redis.allowance,
        enforced.late_successes,
        shadow.unspent_bound().max(enforced.unspent_bound()),
    );

    for storm in [&shadow, &enforced] {
        assert_eq!(storm.decisions, total);
        assert_eq!(storm.not_from_redis, 0, "Redis answered every decision");
        assert_eq!(storm.other_dead_letters, 0, "{storm:?}");
    }
    // In shadow every retry went ahead; the budget's refusals are counted, in the processes
    // and in Redis, as enforcement's are.
    assert_eq!(shadow.granted + shadow.shadow_denied, total, "all retried");
    assert_eq!(shadow.budget_exhausted, 0);
    assert_eq!(shadow.would_deny, shadow.shadow_denied);
    assert_eq!(shadow_redis.current.denied, shadow.would_deny);
    assert_eq!(shadow_redis.current.retries, shadow.granted);
    assert_eq!(enforced.granted + enforced.budget_exhausted, total);
    assert_eq!(enforced.denied, enforced.budget_exhausted);
    assert_eq!(enforced_redis.current.denied, enforced.denied);
    assert_eq!(enforced_redis.current.retries, enforced.granted);
    // The same successes, so the same allowance at the end; each storm granted all of it but
    // what its last staleness per process can hold back.
    assert_eq!(shadow.successes, enforced.successes);
    assert_eq!(shadow_redis.allowance, enforced_redis.allowance);
    let allowance = shadow_redis.allowance;
    for (storm, name) in [(&shadow, "shadow"), (&enforced, "enforcement")] {
        assert!(storm.granted <= allowance, "{name}: never past the budget");
        assert!(
            allowance - storm.granted <= storm.unspent_bound(),
            "{name}: {} of {allowance} granted, {} late successes",
            storm.granted,
            storm.late_successes
        );
    }
    assert!(
        difference.unsigned_abs()
            <= u128::from(shadow.unspent_bound().max(enforced.unspent_bound())),
        "would_deny {} against enforcement's {} denials",
        shadow.would_deny,
        enforced.denied
    );
    if success_every == 0 {
        assert_eq!(allowance, FLOOR);
        assert_eq!(shadow.granted, FLOOR, "exactly the floor");
        assert_eq!(enforced.granted, FLOOR, "exactly the floor");
        assert_eq!(difference, 0);
    } else {
        assert!(allowance > FLOOR, "the allowance grew during the storm");
    }
    difference
}

#[test]
fn a_storm_in_shadow_processes_retries_everything_enforcement_denies_beside_it() {
    storms_side_by_side(12_800, 0);
}

#[test]
fn with_successes_during_the_storm_shadow_and_enforcement_differ_by_at_most_one_staleness_per_process()
 {
    storms_side_by_side(12_800, 10);
}

/// The full storm of `docs/BENCHMARKS.md` ("Shadow beside enforcement in OS processes"):
/// `cargo test --release -p fleet-budget --test shadow_processes -- --ignored --nocapture`.
#[test]
#[ignore = "the full-size storms (200,000 decisions per dependency), a benchmark"]
fn storm_of_200000_decisions_in_os_processes() {
    storms_side_by_side(200_000, 0);
    storms_side_by_side(200_000, 10);
}
