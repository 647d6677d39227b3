// Over ~500 lines on purpose: one drill, a single scenario read top to bottom (brownout, alerts, dashboard).
//! The alert rules and the dashboard against a real Prometheus (Debian's `prometheus`), scraping
//! a worker and the fleet exporter during a brownout drill.
//!
//! Two workers (the library's `Worker`, metrics served through `[metrics] listen`) share one
//! budget in a private redis-server and consume jobs from the shared RabbitMQ (a topology of the
//! test's own); each job calls a simulated dependency (`fleet_budget_sim::upstream`) that browns
//! out and recovers. A third budget with a stale configuration (another ratio) asks for a retry
//! now and then while the dependency is healthy: the policy in force serves it, and it counts
//! policy conflicts. `budgetctl exporter` serves the fleet's state. Prometheus scrapes them every
//! second and evaluates `deploy/prometheus/alerts.yml`, its `for:` durations cut to test size.
//! Then, through Prometheus' HTTP API:
//!
//! - `FleetBudgetExhausted` fires during the brownout and resolves after the recovery;
//! - every rule evaluates without error, every recorded signal returns data, every alert has a
//!   summary and a runbook link to a heading of the runbook (`docs/guides/operations.md`);
//! - every query of `deploy/grafana/fleet-budget.json` and every PromQL example of the metrics
//!   guide (`docs/guides/metrics-and-alerts.md`) returns data.
//!
//! It also draws the dashboard's panels from the drill's data into
//! `$CARGO_TARGET_TMPDIR/dashboard.svg` (`scripts/dashboard-screenshot` makes docs/dashboard.png
//! of it with headless Chromium).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod dashboard_svg;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::metrics::MetricsServer;
use fleet_budget::testing::{RedisServer, free_port};
use fleet_budget::{Config, Failure, FleetBudget};
use fleet_budget_amqp::testing::TestBroker;
use fleet_budget_amqp::{Worker, WorkerConfig, WorkerOptions};
use fleet_budget_sim::upstream::{Schedule, Upstream};
use serde_json::Value;

/// The drill: jobs per second, and the dependency's schedule (healthy, brownout, recovered).
const JOBS_PER_SEC: u64 = 80;
const HEALTHY: Duration = Duration::from_secs(6);
const BROWNOUT: Duration = Duration::from_secs(8);
const RECOVERED: Duration = Duration::from_secs(8);
/// Test-sized `for:` of every alert (10 minutes in production).
const TEST_FOR: &str = "2s";
/// Where every alert's `runbook_url` points: a heading of this file.
const RUNBOOK: &str = "docs/guides/operations.md";
/// The guide whose ```promql examples must return data during the drill.
const METRICS_GUIDE: &str = "docs/guides/metrics-and-alerts.md";
/// The exporter's scrape interval and timeout. Its reading uses the one RabbitMQ connection the
/// exporter keeps across scrapes (a new one once it fails or is closed) and, once dead letters
/// arrive, looks at the dead-letter queue on it: seconds on a loaded machine (3.4 s and 5 s seen,
/// test copies pinned to one core, when each reading still connected). It answers within 80 % of
/// the timeout Prometheus announces, cutting a source not read by then; 2 s leaves RabbitMQ room
/// and still samples each 2-second window of the budget. Its series are gauges; the dashboard's
/// rates are of the workers' counters (scraped every second).
const EXPORTER_SCRAPE: &str = "2s";
/// `$__rate_interval` of the dashboard's queries at a 1 s scrape interval.
const RATE_INTERVAL: &str = "10s";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

/// `GET path` on `addr` over HTTP/1.0 (the body ends when the server closes), bounded in time.
fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .map_err(|e| format!("read {addr}{path}: {e}"))?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP head from {addr}{path}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A directory of the test's own under the target directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "{name}-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed on drop; its stderr goes to a file printed when the test fails.
struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(name: &'static str, command: &mut Command, dir: &Path) -> Self {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name} ({command:?}): {e}"));
        Self { name, child, log }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- {} log (last lines) ---\n{}",
                self.name,
                self.log_tail()
            );
        }
    }
}

/// Prometheus' HTTP API.
struct Api(SocketAddr);

impl Api {
    fn get(&self, path: &str) -> Value {
        let (status, body) = http_get(self.0, path).unwrap();
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{path}: HTTP {status}, not JSON ({e}): {body}"));
        assert_eq!(v["status"], "success", "{path}: {body}");
        v["data"].clone()
    }

    /// The series `query` returns now (an error in the query fails the test).
    fn query(&self, query: &str) -> Vec<Value> {
        let data = self.get(&format!("/api/v1/query?query={}", percent_encode(query)));
        data["result"].as_array().cloned().unwrap_or_default()
    }

    fn query_range(&self, query: &str, start: f64, end: f64) -> Vec<Value> {
        let data = self.get(&format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1",
            percent_encode(query)
        ));
        data["result"].as_array().cloned().unwrap_or_default()
    }

    fn firing(&self, alert: &str) -> bool {
        self.get("/api/v1/alerts")["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|a| a["labels"]["alertname"] == alert && a["state"] == "firing")
    }

    fn is_ready(&self) -> bool {
        matches!(http_get(self.0, "/-/ready"), Ok((200, _)))
    }
}

/// alerts.yml with every `for:` cut to [`TEST_FOR`].
fn test_sized_rules(rules: &str) -> String {
    rules
        .lines()
        .map(|line| {
            let indent = &line[..line.len() - line.trim_start().len()];
            if line.trim_start().starts_with("for:") {
                format!("{indent}for: {TEST_FOR}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The dashboard's queries, `(panel title, expr)`, with its variables set for the drill.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String, String)> {
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$dependency", "search")
                .replace("$__rate_interval", RATE_INTERVAL);
            queries.push((
                panel["title"].as_str().unwrap().to_owned(),
                target["legendFormat"].as_str().unwrap_or("").to_owned(),
                expr,
            ));
        }
    }
    queries
}

/// The PromQL examples of the metrics guide: each line of its ```promql blocks that is not a comment.
fn guide_promql(guide: &str) -> Vec<String> {
    let mut queries = Vec::new();
    let mut inside = false;
    for line in guide.lines() {
        let line = line.trim();
        if line.starts_with("```promql") {
            inside = true;
        } else if inside && line.starts_with("```") {
            inside = false;
        } else if inside && !line.is_empty() && !line.starts_with('#') {
            queries.push(line.to_owned());
        }
    }
    queries
}

/// GitHub's anchor of a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '_' => Some(c),
            ' ' => Some('-'),
            _ => None,
        })
        .collect()
}

fn budgetctl() -> PathBuf {
    // Built by `cargo test --workspace` (scripts/test) beside this test's binary.
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join(format!("budgetctl{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is not built: run `cargo build -p budgetctl` (scripts/test builds the workspace)",
        bin.display()
    );
    bin
}

fn wait_until(what: &str, within: Duration, ready: impl FnMut() -> bool) {
    wait_until_or(what, within, ready, String::new);
}

/// As [`wait_until`], with `explain()` in the failure message.
fn wait_until_or(
    what: &str,
    within: Duration,
    mut ready: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    let started = Instant::now();
    while !ready() {
        if started.elapsed() >= within {
            panic!("{what}: not within {within:?}\n{}", explain());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What Prometheus saw of the drill, second by second: whether each target answered, how long
/// its scrapes took, the signal the alert reads and the alert's own state. For a failure message.
fn drill_as_seen(api: &Api, since_unix: f64) -> String {
    let mut out = String::from("what Prometheus saw, one value per second since the drill began:");
    for query in [
        "up",
        "scrape_duration_seconds",
        "dependency:fleet_budget_window_retries_denied:max",
        "ALERTS{alertname=\"FleetBudgetExhausted\"}",
    ] {
        for series in api.query_range(query, since_unix, unix_now()) {
            let values: Vec<String> = series["values"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| {
                    let at = v[0].as_f64().unwrap_or(0.0) - since_unix;
                    let value = v[1].as_str().unwrap_or("?");
                    format!("{at:.0}s={value}")
                })
                .collect();
            out.push_str(&format!(
                "\n{query} {}: {}",
                series["metric"],
                values.join(" ")
            ));
        }
    }
    out
}

#[test]
fn alerts_and_dashboard_hold_against_a_real_prometheus_during_a_brownout() {
    let prometheus_bin = Path::new("/usr/bin/prometheus");
    assert!(
        prometheus_bin.exists(),
        "Debian's prometheus is needed (apt-get install prometheus; .ci/run installs it)"
    );
    let root = repo_root();
    let dir = TempDir::new("e2e-prometheus");
    let redis = RedisServer::start();
    let broker = TestBroker::new("e2e_prometheus");
    let (worker_port, exporter_port, prometheus_port) = (free_port(), free_port(), free_port());
    let stale_port = free_port();

    // One configuration for the workers and the exporter: a 2-second window so the drill is
    // short, retries waiting 1 s in the only tier.
    let config_text = format!(
        r#"
[redis]
url = "{redis}"
key_prefix = "fbe2e"
timeout_ms = 200
deposit_flush_ms = 50

[amqp]
url = "{amqp}"
prefix = "{prefix}"
retry_tiers_secs = [1]

[defaults]
window_secs = 2
ratio = 0.1
min_allowance = 2
max_attempts = 3
backoff_base_ms = 200
backoff_cap_ms = 1000

[dependencies.search]
tasks = ["index_document"]

[metrics]
listen = "127.0.0.1:{worker_port}"
"#,
        redis = redis.url(),
        amqp = broker.url,
        prefix = broker.settings.prefix,
    );
    let config_path = dir.0.join("fleet-budget.toml");
    std::fs::write(&config_path, &config_text).unwrap();
    let config = WorkerConfig::from_toml(&config_text, "e2e").unwrap();

    let exporter = Process::spawn(
        "budgetctl exporter",
        Command::new(budgetctl())
            .arg("--config")
            .arg(&config_path)
            .arg("exporter")
            .arg("--listen")
            .arg(format!("127.0.0.1:{exporter_port}")),
        &dir.0,
    );

    std::fs::write(
        dir.0.join("alerts.yml"),
        test_sized_rules(
            &std::fs::read_to_string(root.join("deploy/prometheus/alerts.yml")).unwrap(),
        ),
    )
    .unwrap();
    std::fs::write(
        dir.0.join("prometheus.yml"),
        format!(
            r#"
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: ["alerts.yml"]
scrape_configs:
  - job_name: fleet-budget-exporter
    scrape_interval: {EXPORTER_SCRAPE}
    scrape_timeout: {EXPORTER_SCRAPE}
    static_configs: [{{targets: ["127.0.0.1:{exporter_port}"]}}]
  - job_name: fleet-budget-workers
    static_configs: [{{targets: ["127.0.0.1:{worker_port}", "127.0.0.1:{stale_port}"]}}]
"#
        ),
    )
    .unwrap();
    let prometheus = Process::spawn(
        "prometheus",
        Command::new(prometheus_bin)
            .arg(format!(
                "--config.file={}",
                dir.0.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
            .arg("--log.level=warn"),
        &dir.0,
    );
    let api = Api(SocketAddr::from(([127, 0, 0, 1], prometheus_port)));
    // Only a guard against a hang: Prometheus took more than 20 s to be ready on a loaded core.
    wait_until("prometheus ready", Duration::from_secs(60), || {
        api.is_ready()
    });

    // The drill, on a runtime of its own; the main thread watches Prometheus meanwhile.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Quorum queues take seconds to declare: before the clock of the drill starts.
    runtime.block_on(broker.migrate());
    let drill_started_unix = unix_now();
    // The stale configuration: the same dependency and window, another ratio.
    let stale = Config::from_toml(
        &format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"fbe2e\"\ntimeout_ms = 200\n\
             [defaults]\nwindow_secs = 2\nratio = 0.3\nmin_allowance = 2\n\
             [dependencies.search]\ntasks = [\"index_document\"]\n",
            redis.url()
        ),
        "stale.toml",
    )
    .unwrap();
    let stale_addr = SocketAddr::from(([127, 0, 0, 1], stale_port));
    let drill = runtime.spawn(drill(config, broker, (stale, stale_addr)));
    let mut fired_at = None;
    wait_until_or(
        "FleetBudgetExhausted fires during the brownout",
        HEALTHY + BROWNOUT + Duration::from_secs(10),
        || {
            let firing = api.firing("FleetBudgetExhausted");
            if firing {
                fired_at = Some(unix_now() - drill_started_unix);
            }
            firing
        },
        || drill_as_seen(&api, drill_started_unix),
    );
    let fired_at = fired_at.unwrap();
    assert!(
        fired_at > HEALTHY.as_secs_f64(),
        "it fired at {fired_at:.1}s, before the brownout began at {HEALTHY:?}"
    );
    wait_until_or(
        "FleetBudgetExhausted resolves after the recovery",
        BROWNOUT + RECOVERED + Duration::from_secs(15),
        || !api.firing("FleetBudgetExhausted"),
        || drill_as_seen(&api, drill_started_unix),
    );
    let resolved_at = unix_now() - drill_started_unix;
    assert!(
        resolved_at > (HEALTHY + BROWNOUT).as_secs_f64(),
        "it resolved at {resolved_at:.1}s, before the recovery at {:?}",
        HEALTHY + BROWNOUT
    );
    let broker = runtime.block_on(drill).unwrap();
    eprintln!("FleetBudgetExhausted fired at {fired_at:.1}s and resolved at {resolved_at:.1}s");

    // Every rule evaluated without error; every signal returns data during the drill.
    let groups = api.get("/api/v1/rules")["groups"]
        .as_array()
        .cloned()
        .unwrap();
    let runbook_text = std::fs::read_to_string(root.join(RUNBOOK)).unwrap();
    let headings: BTreeSet<String> = runbook_text
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    let mut alerts = 0;
    let mut signals = 0;
    for rule in groups
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap())
    {
        let name = rule["name"].as_str().unwrap().to_owned();
        assert_eq!(rule["health"], "ok", "{name}: {}", rule["lastError"]);
        match rule["type"].as_str().unwrap() {
            "alerting" => {
                alerts += 1;
                assert!(
                    rule["annotations"]["summary"].is_string(),
                    "{name}: no summary"
                );
                let runbook = rule["annotations"]["runbook_url"].as_str().unwrap_or("");
                let (page, section) = runbook.split_once('#').unwrap_or((runbook, ""));
                assert!(
                    page.ends_with(&format!("/{RUNBOOK}")) && headings.contains(section),
                    "{name}: runbook_url {runbook:?} is not a heading of {RUNBOOK}"
                );
                // The expression is valid PromQL that Prometheus evaluates.
                api.query(rule["query"].as_str().unwrap());
            }
            _ => {
                signals += 1;
                // Over the drill, not at this instant: the workers have stopped, and once a
                // scrape of theirs fails Prometheus marks their series stale, so a rule over
                // them records nothing from then on.
                let data = api.query_range(&name, drill_started_unix, unix_now());
                assert!(
                    !data.is_empty(),
                    "recorded signal {name} has no data during the drill"
                );
            }
        }
    }
    assert!(
        alerts >= 6 && signals >= 6,
        "{alerts} alerts, {signals} signals"
    );

    // Every dashboard query and every PromQL example of the metrics guide returns data.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/fleet-budget.json")).unwrap(),
    )
    .unwrap();
    let queries = dashboard_queries(&dashboard);
    let end = unix_now();
    for (panel, _, expr) in &queries {
        let data = api.query_range(expr, drill_started_unix, end);
        assert!(!data.is_empty(), "panel {panel:?}: no data for {expr}");
    }
    let guide = std::fs::read_to_string(root.join(METRICS_GUIDE)).unwrap();
    let examples = guide_promql(&guide);
    assert!(
        examples.len() >= 4,
        "{METRICS_GUIDE} PromQL examples: {examples:?}"
    );
    for expr in &examples {
        let data = api.query_range(expr, drill_started_unix, end);
        assert!(
            !data.is_empty(),
            "{METRICS_GUIDE} example has no data: {expr}"
        );
    }

    // The picture of the drill's data.
    let panels: Vec<dashboard_svg::Panel> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| dashboard_svg::Panel {
            title: p["title"].as_str().unwrap().to_owned(),
            unit: p["fieldConfig"]["defaults"]["unit"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
            series: queries
                .iter()
                .filter(|(title, _, _)| title == p["title"].as_str().unwrap())
                .flat_map(|(_, legend, expr)| {
                    api.query_range(expr, drill_started_unix, end)
                        .into_iter()
                        .map(|s| dashboard_svg::Series::from_prometheus(&s, legend))
                        .collect::<Vec<_>>()
                })
                .collect(),
        })
        .collect();
    let svg = dashboard_svg::render(
        "fleet-budget — brownout drill, end-to-end test data",
        &panels,
        drill_started_unix,
        end,
        &[
            (drill_started_unix + HEALTHY.as_secs_f64(), "brownout"),
            (
                drill_started_unix + (HEALTHY + BROWNOUT).as_secs_f64(),
                "recovery",
            ),
        ],
    );
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.svg");
    std::fs::write(&out, svg).unwrap();
    eprintln!("dashboard drawn from the drill's data: {}", out.display());

    drop(broker);
    drop(prometheus);
    drop(exporter);
    drop(redis);
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Publishes jobs for the whole schedule while two workers run them against the dependency, and
/// the stale budget asks for retries while it is healthy; returns the broker (its topology is
/// deleted when it is dropped).
async fn drill(
    config: WorkerConfig,
    broker: TestBroker,
    (stale, stale_addr): (Config, SocketAddr),
) -> TestBroker {
    let topology = broker.topology.clone();
    let budget = FleetBudget::from_config(&config.budget).await.unwrap();
    let upstream = Arc::new(Upstream::new(Schedule {
        capacity: JOBS_PER_SEC * 2,
        degraded_capacity: JOBS_PER_SEC / 10,
        degraded_from: HEALTHY,
        degraded_until: HEALTHY + BROWNOUT,
    }));
    let started = Instant::now();
    let stale = tokio::spawn(stale_worker(stale, stale_addr, started));
    let mut handles = Vec::new();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let worker = Worker::new(
            budget.clone(),
            topology.clone(),
            WorkerOptions::new(&config, &topology),
        );
        handles.push(worker.handle());
        let upstream = Arc::clone(&upstream);
        runs.push(tokio::spawn(worker.run(move |_job| {
            let upstream = Arc::clone(&upstream);
            async move {
                upstream
                    .call(started.elapsed(), false)
                    .map_err(|_| Failure::retryable("search answered 503").with_class("http_503"))
            }
        })));
    }
    let publisher = broker.publisher().await;
    let total = HEALTHY + BROWNOUT + RECOVERED;
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / JOBS_PER_SEC));
    while started.elapsed() < total {
        tick.tick().await;
        publisher
            .publish_job(
                &topology.work_exchange,
                "index_document",
                "index_document",
                b"{}",
            )
            .await
            .unwrap();
    }
    // Let the last retries come back, then stop.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for h in &handles {
        h.shutdown();
    }
    for r in runs {
        r.await.unwrap().unwrap();
    }
    budget.shutdown().await.unwrap();
    stale.await.unwrap();
    broker
}

/// A worker whose configuration has another ratio: from the third second of the healthy phase to its
/// end, one retry asked each second (the workers' policy is in force by then, so it serves these
/// and they count as conflicts); its metrics are served until the drill ends.
async fn stale_worker(config: Config, addr: SocketAddr, started: Instant) {
    let budget = FleetBudget::from_config(&config).await.unwrap();
    let server = MetricsServer::bind(addr, budget.metrics().registry().clone())
        .await
        .unwrap();
    tokio::time::sleep_until((started + Duration::from_secs(3)).into()).await;
    while started.elapsed() < HEALTHY {
        budget
            .on_failure("index_document", 1, &Failure::retryable("stale"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        budget.metrics().counter("policy_conflicts", "search") > 0,
        "the stale worker's calls were served by the policy in force"
    );
    tokio::time::sleep_until((started + HEALTHY + BROWNOUT + RECOVERED).into()).await;
    server.shutdown().await;
    budget.shutdown().await.unwrap();
}
