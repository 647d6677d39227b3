//! The overview's sparklines from a real Prometheus (Debian's `prometheus`, started here on a
//! free port with a configuration and a data folder of its own, scraping a worker's `/metrics`
//! every 250 ms): with `prometheus` set the overview draws each dependency's last hour from
//! Prometheus's range queries over the counters the workers export, and says so; once
//! Prometheus is gone it falls back to the console's own readings and says why.
//!
//! No timed assertion: each wait is a hang check.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

#[allow(dead_code)]
#[path = "browser/webdriver.rs"]
mod webdriver;

use std::io::{Read as _, Write as _};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fleet_budget::metrics::MetricsServer;
use fleet_budget::testing::{RedisServer, free_port};
use fleet_budget::{Failure, FleetBudget};
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use fleet_budget_console::{ConsoleSettings, Prometheus, Token, Viewers};

use webdriver::http;

/// A Prometheus server of the test's own, stopped (and its folder removed) on drop.
struct PromServer {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Drop for PromServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PromServer {
    fn start(target: &str) -> Self {
        let dir = std::env::temp_dir().join(unique_prefix("fbc-prometheus"));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n  \
                 evaluation_interval: 1s\nscrape_configs:\n  - job_name: workers\n    \
                 static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("Debian's `prometheus` binary on the PATH (apt-get install prometheus)");
        let server = Self { child, port, dir };
        let started = Instant::now();
        while !server.ready() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "prometheus not ready in 60 s: {}",
                std::fs::read_to_string(server.dir.join("prometheus.log")).unwrap_or_default()
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

/// `GET /` of an open console until `ok` holds for the page (a hang check).
async fn page_until(addr: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let started = Instant::now();
    loop {
        let (status, _, body) = http(addr, "GET", "/", &[], None).await;
        let page = String::from_utf8_lossy(&body).into_owned();
        if status == 200 && ok(&page) {
            return page;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the overview never showed {what}: {status}\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The `aria-label` of `dependency`'s sparkline on the page.
fn spark_label(page: &str, dependency: &str) -> Option<String> {
    let row = page
        .split("<tr data-severity=")
        .find(|r| r.contains(&format!("href=\"/dependency/{dependency}\"")))?;
    let at = row.find("aria-label=\"")? + "aria-label=\"".len();
    Some(row[at..at + row[at..].find('"')?].to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparklines_come_from_prometheus_when_configured_and_from_the_console_when_it_fails() {
    let redis = RedisServer::start();
    let broker = TestBroker::new("console-prometheus");
    let toml = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\ntimeout_ms = 10000\n\
         [dependencies.search]\ntasks = [\"index\"]\nratio = 0.1\nmin_allowance = 2\n\
         [amqp]\nurl = \"{}\"\nprefix = \"{}\"\n",
        redis.url(),
        unique_prefix("fbcm"),
        broker.url,
        broker.settings.prefix
    );
    let config = WorkerConfig::from_toml(&toml, "prometheus test").unwrap();
    let worker = FleetBudget::from_config(&config.budget).await.unwrap();
    let metrics = MetricsServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        worker.metrics().registry().clone(),
    )
    .await
    .unwrap();
    let target = metrics.local_addr().to_string();
    let prometheus = tokio::task::spawn_blocking(move || PromServer::start(&target))
        .await
        .unwrap();

    let operators = Token::parse_list("ann:operator-token-0123456789", "operator", "t").unwrap();
    let mut settings = ConsoleSettings::new(config.clone(), operators, Viewers::Open);
    settings.bind = "127.0.0.1:0".parse().unwrap();
    settings.history_every = Duration::from_secs(1);
    settings.prometheus = Some(
        Prometheus::parse(
            &format!("http://127.0.0.1:{}", prometheus.port),
            Duration::from_secs(5),
        )
        .unwrap(),
    );
    settings.prometheus_step = Duration::from_secs(2);
    let console = fleet_budget_console::start(settings).await.unwrap();
    let addr = console.addr().to_string();

    // search browns out for a while: its retries denied, step after step.
    let failure = Failure::retryable("search returned 503").with_class("http_503");
    let drive = async {
        for _ in 0..40 {
            for _ in 0..5 {
                worker.on_attempt("index", 1).await.unwrap();
                let _ = worker.on_failure("index", 1, &failure).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    drive.await;

    let page = page_until(&addr, "sparklines from Prometheus", |p| {
        p.contains("id=\"spark-source\" data-source=\"prometheus\"")
            && spark_label(p, "search").is_some_and(|l| {
                l.contains("denied in a step (Prometheus)") && !l.contains("up to 0 denied")
            })
    })
    .await;
    let label = spark_label(&page, "search").unwrap();
    println!("from Prometheus: {label}");
    assert!(label.contains("amplification up to"), "{label}");
    assert!(
        page.contains(&format!(
            "from Prometheus at <code>http://127.0.0.1:{}",
            prometheus.port
        )),
        "the page says where they come from"
    );

    // Prometheus gone: the console's own readings, saying why.
    drop(prometheus);
    let page = page_until(&addr, "the fallback to its own readings", |p| {
        p.contains("id=\"spark-source\" data-source=\"own\"")
    })
    .await;
    let at = page.find("id=\"spark-source\"").unwrap();
    let note = &page[at..at + page[at..].find("</p>").unwrap()];
    println!("without Prometheus: {note}");
    assert!(
        note.contains("because Prometheus at") && note.contains("failed"),
        "{note}"
    );
    let label = spark_label(&page, "search").unwrap_or_default();
    assert!(!label.contains("(Prometheus)"), "{label}");

    console.stop().await;
    worker.shutdown().await.unwrap();
    drop(metrics);
}
