//! `budgetctl tune` against a real Prometheus server (Debian's `prometheus`, started here on a
//! free port with its own configuration and data folder, scraping every 250 ms) that scraped two
//! workers' `/metrics` (in-process `FleetBudget`s on a private `redis-server`, each serving its
//! registry) while this test drove their jobs: healthy traffic failing 10% of attempts, and four
//! incidents of known lengths (12, 16, 20 and 26 s) where every attempt fails. Time is
//! compressed: 2 s steps, a 5 s budget window, retries 200 ms apart.
//!
//! The targets: the recommended ratio between 1.2 and 2 times the healthy retry
//! fraction (the p99, over the healthy steps tune read, of what the test itself counted: retries asked
//! per success), and the recommended window within 20% of the incidents' p95 duration (nearest
//! rank of the lengths the test drove). About 2.5 minutes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::cast_precision_loss,
    missing_docs
)]

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleet_budget::metrics::MetricsServer;
use fleet_budget::testing::{RedisServer, free_port};
use fleet_budget::{Config, DeadLetterReason, Decision, Failure, FleetBudget};

const HEALTHY_FAILURE_RATE: f64 = 0.1;
const INCIDENTS_SECS: [u64; 4] = [12, 16, 20, 26];
const LEAD_IN_SECS: u64 = 20;
const BETWEEN_SECS: u64 = 15;
/// Jobs started per worker every 10 ms.
const JOBS_PER_TICK: usize = 4;
const RETRY_DELAY: Duration = Duration::from_millis(200);

/// A Prometheus server of the test's own, stopped on drop.
struct PromServer {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl Drop for PromServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("{name}-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

impl PromServer {
    fn start(targets: &[String]) -> Self {
        let dir = temp_dir("fb-tune-prometheus");
        let port = free_port();
        let config = dir.0.join("prometheus.yml");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n  \
                 evaluation_interval: 1s\nscrape_configs:\n  - job_name: workers\n    \
                 static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.0.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("Debian's `prometheus` binary on the PATH (apt-get install prometheus)");
        let server = Self {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !server.ready() {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready in 60 s: {}",
                std::fs::read_to_string(server._dir.0.join("prometheus.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }

    /// `GET /-/ready` answers 200.
    fn ready(&self) -> bool {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /-/ready HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200")
    }
}

/// What the test counted itself: each success and each retry asked (granted or denied by the
/// budget), at the Unix ms it was decided.
#[derive(Default)]
struct Tally(Mutex<Vec<(u64, bool)>>);

impl Tally {
    fn add(&self, success: bool) {
        self.0.lock().unwrap().push((unix_ms(), success));
    }
}

fn unix_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// xorshift64*: the test's own draws, no dependency.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn config_text(redis_url: &str) -> String {
    format!(
        "[redis]\nurl = \"{redis_url}\"\nkey_prefix = \"fb-tune-test\"\n\n\
         [defaults]\nwindow_secs = 5\nratio = 0.5\nmin_allowance = 10\nmax_attempts = 4\n\n\
         [dependencies.payments]\ntasks = [\"charge\"]\n"
    )
}

async fn job(budget: FleetBudget, failing: Arc<AtomicBool>, tally: Arc<Tally>, seed: u64) {
    let mut rng = Rng(seed | 1);
    let mut attempt = 1;
    loop {
        budget.on_attempt("charge", attempt).await.unwrap();
        let fails = failing.load(Ordering::Relaxed) || rng.unit() < HEALTHY_FAILURE_RATE;
        if !fails {
            budget.on_success("charge").await.unwrap();
            tally.add(true);
            return;
        }
        let decision = budget
            .on_failure("charge", attempt, &Failure::retryable("unavailable"))
            .await
            .unwrap();
        match decision {
            Decision::Retry { next_attempt, .. } => {
                tally.add(false);
                attempt = next_attempt;
                tokio::time::sleep(RETRY_DELAY).await;
            }
            Decision::DeadLetter { reason, .. } => {
                if reason == DeadLetterReason::BudgetExhausted {
                    tally.add(false);
                }
                return;
            }
        }
    }
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
    let config = Config::from_path(&config_path).unwrap();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (tally, doc, incident_windows, traffic_from) = runtime.block_on(async {
        let mut workers = Vec::new();
        let mut servers = Vec::new();
        for _ in 0..2 {
            let budget = FleetBudget::from_config(&config).await.unwrap();
            let server = MetricsServer::bind(
                "127.0.0.1:0".parse().unwrap(),
                budget.metrics().registry().clone(),
            )
            .await
            .unwrap();
            servers.push(server);
            workers.push(budget);
        }
        let targets: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
        let prometheus = tokio::task::spawn_blocking(move || PromServer::start(&targets))
            .await
            .unwrap();

        let failing = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Tally::default());
        let started = Instant::now();
        let traffic_from = unix_ms();
        let stop = Arc::new(AtomicBool::new(false));
        let mut drivers = Vec::new();
        for (w, budget) in workers.iter().enumerate() {
            let (budget, failing, tally, stop) =
                (budget.clone(), failing.clone(), tally.clone(), stop.clone());
            drivers.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                let mut seed = 0x9E37_79B9_7F4A_7C15_u64.wrapping_mul(w as u64 + 1);
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    for _ in 0..JOBS_PER_TICK {
                        seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
                        tokio::spawn(job(budget.clone(), failing.clone(), tally.clone(), seed));
                    }
                }
            }));
        }
        // The schedule: healthy, then each incident followed by a healthy stretch.
        let mut incident_windows = Vec::new();
        tokio::time::sleep(Duration::from_secs(LEAD_IN_SECS)).await;
        for secs in INCIDENTS_SECS {
            let from = unix_ms();
            failing.store(true, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_secs(secs)).await;
            failing.store(false, Ordering::Relaxed);
            let to = unix_ms();
            println!("incident {secs}s driven for {} ms", to - from);
            incident_windows.push((from, to));
            tokio::time::sleep(Duration::from_secs(BETWEEN_SECS)).await;
        }
        stop.store(true, Ordering::Relaxed);
        for d in drivers {
            d.await.unwrap();
        }
        // Two more scrapes of the last counts.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let span = started.elapsed() + Duration::from_secs(1);

        let out = tokio::task::spawn_blocking({
            let config_path = config_path.clone();
            let url = format!("http://127.0.0.1:{}", prometheus.port);
            let chart_dir = config_dir.0.join("charts");
            move || {
                Command::new(env!("CARGO_BIN_EXE_budgetctl"))
                    .env_remove("FLEET_BUDGET_REDIS_URL")
                    .env_remove("FLEET_BUDGET_PROMETHEUS_URL")
                    .arg("--config")
                    .arg(&config_path)
                    .args(["tune", "--prometheus", &url, "--step", "2s", "--json"])
                    .args(["--since", &format!("{}ms", span.as_millis())])
                    .args(["--dependency", "payments", "--chart-dir"])
                    .arg(&chart_dir)
                    .output()
                    .unwrap()
            }
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "budgetctl tune: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        std::fs::write(config_dir.0.join("tune.json"), &out.stdout).unwrap();
        let tally = tally.0.lock().unwrap().clone();
        for s in servers {
            s.shutdown().await;
        }
        for w in &workers {
            let _ = w.shutdown().await;
        }
        drop(prometheus);
        (tally, doc, incident_windows, traffic_from)
    });

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
