//! The incident report's charts from a real Prometheus server (Debian's `prometheus`, started
//! here, scraping every 250 ms) that scraped two workers' `/metrics` (`FleetBudget`s on a private
//! `redis-server`, each serving its registry) while this test drove their jobs: healthy traffic,
//! then an outage where every attempt fails (the budget is exhausted and retries denied), then
//! healthy traffic again (the budget recovers). Then `budgetctl incident report --format html`
//! and the console's `/incident` page (`budgetctl console --prometheus-url`) over the same range
//! and step: both draw the per-minute charts, the incident shaded and the budget's turns
//! marked, and their SVG is the same, byte for byte (one code draws both); the page renders in
//! headless Chromium with its charts. About 40 s.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

#[path = "support/console.rs"]
mod console;
#[path = "support/prometheus.rs"]
mod prometheus;

use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use console::Console;
use fleet_budget::metrics::MetricsServer;
use fleet_budget::testing::RedisServer;
use fleet_budget::{Config, Decision, Failure, FleetBudget};
use prometheus::{PromServer, temp_dir};

const HEALTHY_SECS: u64 = 10;
const OUTAGE_SECS: u64 = 10;
const RETRY_DELAY: Duration = Duration::from_millis(200);

fn unix_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A job: its attempts fail while `failing`, retried while the budget grants.
async fn job(budget: FleetBudget, failing: Arc<AtomicBool>) {
    let mut attempt = 1;
    loop {
        budget.on_attempt("charge", attempt).await.unwrap();
        if !failing.load(Ordering::Relaxed) {
            budget.on_success("charge").await.unwrap();
            return;
        }
        match budget
            .on_failure("charge", attempt, &Failure::retryable("unavailable"))
            .await
            .unwrap()
        {
            Decision::Retry { next_attempt, .. } => {
                attempt = next_attempt;
                tokio::time::sleep(RETRY_DELAY).await;
            }
            Decision::DeadLetter { .. } => return,
        }
    }
}

fn budgetctl() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_budgetctl"));
    c.env_remove("FLEET_BUDGET_REDIS_URL")
        .env_remove("FLEET_BUDGET_AMQP_URL")
        .env_remove("FLEET_BUDGET_PROMETHEUS_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// `<figure id="chart-NAME">…</figure>` of a page.
fn figure<'a>(page: &'a str, name: &str) -> &'a str {
    let open = format!("<figure id=\"chart-{name}\">");
    let start = page
        .find(&open)
        .unwrap_or_else(|| panic!("no chart {name} in {page}"));
    let end = start + page[start..].find("</figure>").unwrap() + "</figure>".len();
    &page[start..end]
}

#[test]
fn the_report_and_the_console_page_draw_the_same_charts_from_what_prometheus_scraped() {
    let redis = RedisServer::start();
    let dir = temp_dir("fb-incident-prometheus");
    let config_path = dir.0.join("fleet.toml");
    std::fs::write(
        &config_path,
        format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"fb-incident-prom\"\n\n\
             [defaults]\nwindow_secs = 5\nratio = 0.2\nmin_allowance = 2\nmax_attempts = 4\n\n\
             [dependencies.payments]\ntasks = [\"charge\"]\n",
            redis.url()
        ),
    )
    .unwrap();
    let config = Config::from_path(&config_path).unwrap();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (prometheus, since, until) = runtime.block_on(async {
        let mut workers = Vec::new();
        let mut servers = Vec::new();
        for _ in 0..2 {
            let budget = FleetBudget::from_config(&config).await.unwrap();
            servers.push(
                MetricsServer::bind(
                    "127.0.0.1:0".parse().unwrap(),
                    budget.metrics().registry().clone(),
                )
                .await
                .unwrap(),
            );
            workers.push(budget);
        }
        let targets: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
        let prometheus = tokio::task::spawn_blocking(move || PromServer::start(&targets))
            .await
            .unwrap();
        let failing = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let since = unix_ms();
        let drivers: Vec<_> = workers
            .iter()
            .map(|budget| {
                let (budget, failing, stop) = (budget.clone(), failing.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_millis(20));
                    while !stop.load(Ordering::Relaxed) {
                        tick.tick().await;
                        tokio::spawn(job(budget.clone(), failing.clone()));
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(HEALTHY_SECS)).await;
        failing.store(true, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(OUTAGE_SECS)).await;
        failing.store(false, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(HEALTHY_SECS)).await;
        stop.store(true, Ordering::Relaxed);
        for d in drivers {
            d.await.unwrap();
        }
        // The last counts scraped, then nothing more in the range.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let until = unix_ms();
        tokio::time::sleep(Duration::from_secs(1)).await;
        for s in servers {
            s.shutdown().await;
        }
        for w in &workers {
            let _ = w.shutdown().await;
        }
        (prometheus, since, until)
    });
    let url = format!("http://127.0.0.1:{}", prometheus.port);
    // To the second: the same range for both.
    let (since, until) = (rfc3339(since - 2000), rfc3339(until + 1000));

    let html_path = dir.0.join("report.html");
    let cli = budgetctl()
        .arg("--config")
        .arg(&config_path)
        .args(["incident", "report", "--dependency", "payments"])
        .args(["--since", &since, "--until", &until, "--step", "2s"])
        .args(["--prometheus", &url, "--format", "html", "--output"])
        .arg(&html_path)
        .output()
        .unwrap();
    ok(&cli);
    let report = std::fs::read_to_string(&html_path).unwrap();
    assert!(report.contains("budget exhausted:"), "{report}");
    assert!(report.contains("budget recovered:"), "{report}");
    let denied = figure(&report, "denied");
    println!("{denied}");
    assert!(
        denied.matches("class=\"incident\"").count() >= 1,
        "the outage shaded: {denied}"
    );
    assert!(denied.contains(">exhausted</text>") && denied.contains(">recovered</text>"));

    let console = Console::start(&config_path, &["--prometheus-url", &url]);
    let path = format!("/incident?dependency=payments&since={since}&until={until}&step=2s");
    let page = console.get(&path);
    for name in ["denied", "amplification", "dead-letters"] {
        assert_eq!(
            figure(&page, name),
            figure(&report, name),
            "the page's {name} chart is the command's"
        );
    }
    assert!(!page.contains("charts-need-prometheus"), "{page}");

    // In the browser: the charts are drawn, their marks with them.
    let dom = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("http://127.0.0.1:{}{path}", console.port))
        .stdin(Stdio::null())
        .output()
        .expect("Debian's chromium on the PATH");
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.contains("Incident report: payments"), "{dom}");
    let drawn = figure(&dom, "denied");
    assert!(
        drawn.contains("<svg") && drawn.contains("class=\"event\""),
        "{drawn}"
    );
    drop(console);
    drop(prometheus);
    drop(redis);
}
