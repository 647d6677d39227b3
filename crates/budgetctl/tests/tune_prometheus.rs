//! `budgetctl tune` against a real Prometheus server (Debian's `prometheus`, started here on a
//! free port with its own configuration and data folder, scraping every 250 ms) that scraped two
//! worker processes' `/metrics` (`crates/fleet-budget/examples/storm_worker.rs` in its traffic
//! mode, each its own `FleetBudget` from the TOML file on a private `redis-server`) while this
//! test drove their jobs through their standard input: healthy traffic failing 10% of attempts,
//! and four incidents of known lengths (12, 16, 20 and 26 s) where every attempt fails. Time is
//! compressed: 2 s steps, a 5 s budget window, retries 200 ms apart.
//!
//! The targets: the recommended ratio between 1.2 and 2 times the healthy retry
//! fraction (the p99, over the healthy steps tune read, of what the test itself counted: retries asked
//! per success), and the recommended window within 20% of the incidents' p95 duration (nearest
//! rank of the lengths the test drove; the workers' own counts, returned when they exit). About
//! 2.5 minutes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::cast_precision_loss,
    missing_docs
)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[path = "support/prometheus.rs"]
mod prometheus;
#[path = "support/storm_worker.rs"]
mod storm_worker;

use fleet_budget::Config;
use fleet_budget::testing::RedisServer;
use prometheus::{PromServer, temp_dir};
use storm_worker::Worker;

const HEALTHY_FAILURE_PERCENT: u64 = 10;
const INCIDENTS_SECS: [u64; 4] = [12, 16, 20, 26];
const LEAD_IN_SECS: u64 = 20;
const BETWEEN_SECS: u64 = 15;
/// Jobs started per worker every 10 ms.
const JOBS_PER_TICK: u64 = 4;
const RETRY_DELAY_MS: u64 = 200;

fn unix_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

fn config_text(redis_url: &str) -> String {
    format!(
        "[redis]\nurl = \"{redis_url}\"\nkey_prefix = \"fb-tune-test\"\n\n\
         [defaults]\nwindow_secs = 5\nratio = 0.5\nmin_allowance = 10\nmax_attempts = 4\n\n\
         [dependencies.payments]\ntasks = [\"charge\"]\n"
    )
}

/// The nearest-rank percentile.
fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = usize::try_from(fleet_budget_sim::history::whole(p * values.len() as f64)).unwrap();
    values[rank.clamp(1, values.len()) - 1]
}

#[test]
fn tune_recommends_the_ratio_and_window_the_traffic_it_scraped_needs() {
    let redis = RedisServer::start();
    let config_dir = temp_dir("fb-tune-config");
    let config_path = config_dir.0.join("fleet.toml");
    std::fs::write(&config_path, config_text(&redis.url())).unwrap();

    // The configuration is read as the workers read it: a mistake in it fails here first.
    Config::from_path(&config_path).unwrap();

    let worker = storm_worker::build();
    let mut workers: Vec<Worker> = (0..2_u64)
        .map(|w| {
            Worker::start(
                &worker,
                &[
                    "--config".to_owned(),
                    config_path.display().to_string(),
                    "--task".to_owned(),
                    "charge".to_owned(),
                    "--jobs-per-tick".to_owned(),
                    JOBS_PER_TICK.to_string(),
                    "--healthy-failure-percent".to_owned(),
                    HEALTHY_FAILURE_PERCENT.to_string(),
                    "--retry-delay-ms".to_owned(),
                    RETRY_DELAY_MS.to_string(),
                    "--seed".to_owned(),
                    (w + 1).to_string(),
                ],
            )
        })
        .collect();
    let targets: Vec<String> = workers.iter().map(|w| w.metrics.clone()).collect();
    let prometheus = PromServer::start(&targets);
    let order = |workers: &mut Vec<Worker>, order: &str| {
        for w in workers.iter_mut() {
            w.order(order);
        }
    };

    let started = Instant::now();
    let traffic_from = unix_ms();
    order(&mut workers, "start");
    // The schedule: healthy, then each incident followed by a healthy stretch.
    let mut incident_windows = Vec::new();
    std::thread::sleep(Duration::from_secs(LEAD_IN_SECS));
    for secs in INCIDENTS_SECS {
        let from = unix_ms();
        order(&mut workers, "fail");
        std::thread::sleep(Duration::from_secs(secs));
        order(&mut workers, "heal");
        let to = unix_ms();
        println!("incident {secs}s driven for {} ms", to - from);
        incident_windows.push((from, to));
        std::thread::sleep(Duration::from_secs(BETWEEN_SECS));
    }
    order(&mut workers, "stop");
    // Two more scrapes of the last counts.
    std::thread::sleep(Duration::from_secs(2));
    let span = started.elapsed() + Duration::from_secs(1);

    let out = Command::new(env!("CARGO_BIN_EXE_budgetctl"))
        .env_remove("FLEET_BUDGET_REDIS_URL")
        .env_remove("FLEET_BUDGET_PROMETHEUS_URL")
        .arg("--config")
        .arg(&config_path)
        .args([
            "tune",
            "--prometheus",
            &format!("http://127.0.0.1:{}", prometheus.port),
            "--step",
            "2s",
            "--json",
        ])
        .args(["--since", &format!("{}ms", span.as_millis())])
        .args(["--dependency", "payments", "--chart-dir"])
        .arg(config_dir.0.join("charts"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "budgetctl tune: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    std::fs::write(config_dir.0.join("tune.json"), &out.stdout).unwrap();
    let tally: Vec<(u64, bool)> = workers.into_iter().flat_map(Worker::exit).collect();
    drop(prometheus);

    // The healthy steps, by the test's own count over the steps `tune` read (each the step
    // ending at its point): those overlapping no incident nor the second after it (jobs whose
    // retries were still waiting), with successes.
    let (since, until, step) = (
        doc["since_ms"].as_u64().unwrap(),
        doc["until_ms"].as_u64().unwrap(),
        doc["step_ms"].as_u64().unwrap(),
    );
    let mut steps: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for (at, success) in &tally {
        if *at <= since || *at > until {
            continue;
        }
        // The step ending at the first point at or after `at`.
        let end = since + (at - since).div_ceil(step) * step;
        let e = steps.entry(end).or_default();
        if *success {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
    }
    // The first two steps of traffic are left out too: a counter's first scrape is where its
    // series starts, so Prometheus cannot count what came before it.
    let healthy = |end: u64| {
        end - step >= traffic_from + 2 * step
            && incident_windows
                .iter()
                .all(|(from, to)| end <= *from || end - step >= to + 1000)
    };
    let mut fractions: Vec<f64> = steps
        .iter()
        .filter(|(end, (successes, _))| healthy(**end) && *successes > 0)
        .map(|(_, (successes, retries))| *retries as f64 / *successes as f64)
        .collect();
    let (successes, retries) = steps
        .iter()
        .filter(|(end, _)| healthy(**end))
        .fold((0, 0), |(a, b), (_, (s, r))| (a + s, b + r));
    let healthy_p99 = percentile(&mut fractions, 0.99);
    let mut top: Vec<(f64, u64, u64, u64)> = steps
        .iter()
        .filter(|(end, (successes, _))| healthy(**end) && *successes > 0)
        .map(|(end, (s, r))| (*r as f64 / *s as f64, *end - traffic_from, *s, *r))
        .collect();
    top.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!(
        "the test's highest healthy steps (fraction, ms after the traffic started, successes, \
         retries): {:?}; incidents at {:?}",
        top.get(..5),
        incident_windows
            .iter()
            .map(|(a, b)| (a - traffic_from, b - traffic_from))
            .collect::<Vec<_>>()
    );
    let rec = &doc["dependencies"][0]["recommendation"];
    let ratio = rec["ratio"].as_f64().expect("a ratio");
    let window = rec["window"]["recovery_window_secs"]
        .as_f64()
        .expect("a window");
    let mut lengths: Vec<f64> = INCIDENTS_SECS.iter().map(|s| *s as f64).collect();
    let p95 = percentile(&mut lengths, 0.95);
    let found: Vec<String> = rec["incidents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| format!("{}ms", i["duration_ms"]))
        .collect();
    println!(
        "healthy steps: {}, retry fraction by the test's count: mean {:.4}, p99 {healthy_p99:.4}",
        fractions.len(),
        retries as f64 / successes as f64
    );
    println!(
        "tune: healthy p99 {} (mean {}) over {} steps, ratio {ratio} = {:.2} x the test's p99; \
         incidents {found:?}; window {window}s vs the driven p95 {p95}s ({:+.1}%); \
         min_allowance {}",
        rec["healthy_fraction"],
        rec["healthy_mean_fraction"],
        rec["healthy_steps"],
        ratio / healthy_p99,
        (window / p95 - 1.0) * 100.0,
        rec["min_allowance"]
    );
    assert!(
        (1.2..=2.0).contains(&(ratio / healthy_p99)),
        "ratio {ratio} is {:.2} x the healthy p99 {healthy_p99:.4}",
        ratio / healthy_p99
    );
    assert!(
        (window - p95).abs() <= 0.2 * p95,
        "window {window}s, incidents' p95 {p95}s"
    );
    assert_eq!(
        found.len(),
        INCIDENTS_SECS.len(),
        "incidents found: {found:?}"
    );
    hold_to_schema(&doc);
    let chart = doc["dependencies"][0]["chart"].as_str().expect("a chart");
    let svg = std::fs::read_to_string(chart).unwrap();
    assert_eq!(
        svg.matches("class=\"incident\"").count(),
        INCIDENTS_SECS.len()
    );
    drop(redis);
}

/// What `tune --json` printed, held to `docs/schemas/tune.schema.json` by the suite's validator
/// (`crates/budgetctl/tests/cli/validate_json.py`, Python `jsonschema`: `FLEET_BUDGET_PYTHON`, else `python3`).
fn hold_to_schema(doc: &serde_json::Value) {
    let schemas = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/schemas");
    let request = serde_json::json!({
        "schemas": schemas,
        "documents": [["tune", doc]],
        "check_schemas": ["tune"],
    });
    let python = std::env::var("FLEET_BUDGET_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let mut child = Command::new(&python)
        .args(["-c", include_str!("cli/validate_json.py")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{python} with jsonschema: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let verdict: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(verdict["documents"], serde_json::json!([[]]), "{verdict}");
    assert!(
        verdict["schemas"]["tune"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{verdict}"
    );
}
