//! Server time of the console's overview with many dependencies and of its dead-letter page
//! with many dead letters, each beside the CLI command that answers the same question
//! (`budgetctl status --json`, `budgetctl dlq stats --json`), in the same run.
//!
//! `cargo run -p fleet-budget-console --example console_bench -- [DEPENDENCIES] [DEAD_LETTERS]`
//! (defaults 1000 and 100000) with `BUDGETCTL` naming the binary to compare with (default
//! `target/debug/budgetctl`). Uses a Redis of its own and a topology of its own on the shared
//! RabbitMQ (deleted at the end).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::process::Command;
use std::time::{Duration, Instant};

use fleet_budget::testing::RedisServer;
use fleet_budget::{DeadLetterReason, Failure, FleetBudget};
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use fleet_budget_console::{ConsoleSettings, Token, Viewers};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn get(addr: &str, path: &str) -> (u16, usize) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let head = String::from_utf8_lossy(&out[..out.len().min(20)]).into_owned();
    (
        head.split_whitespace()
            .nth(1)
            .unwrap_or("0")
            .parse()
            .unwrap_or(0),
        out.len(),
    )
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn cli(bin: &str, config: &str, args: &[&str]) -> Duration {
    let started = Instant::now();
    let out = Command::new(bin)
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{bin} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let deps: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let dead: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let bin = std::env::var("BUDGETCTL").unwrap_or_else(|_| "target/debug/budgetctl".to_owned());
    let redis = RedisServer::start();
    let broker = TestBroker::new("console-bench");
    broker.migrate().await;
    let mut toml = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\ntimeout_ms = 2000\n[amqp]\nurl = \"{}\"\nprefix = \"{}\"\n",
        redis.url(),
        unique_prefix("fbcb"),
        broker.url,
        broker.settings.prefix
    );
    for i in 0..deps {
        toml.push_str(&format!("[dependencies.d{i}]\ntasks = [\"t{i}\"]\n"));
    }
    let dir = std::env::temp_dir().join(unique_prefix("console-bench"));
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("fleet-budget.toml");
    std::fs::write(&config_path, &toml).unwrap();
    let config_path = config_path.to_string_lossy().into_owned();
    let config = WorkerConfig::from_toml(&toml, "bench").unwrap();

    // Every dependency with traffic, a tenth of them denying.
    let budget = FleetBudget::from_config(&config.budget).await.unwrap();
    let failure = Failure::retryable("503").with_class("http_503");
    for i in 0..deps {
        let task = format!("t{i}");
        budget.on_attempt(&task, 1).await.unwrap();
        for _ in 0..if i % 10 == 0 { 5 } else { 1 } {
            let _ = budget.on_failure(&task, 1, &failure).await.unwrap();
        }
    }
    budget.shutdown().await.unwrap();

    let started = Instant::now();
    let publisher = broker.publisher().await;
    let now = fleet_budget::clock::now_ms();
    for chunk in 0..10 {
        let dep = format!("d{chunk}");
        broker
            .seed_dead_letters(
                &publisher,
                dead / 10,
                &dep,
                DeadLetterReason::BudgetExhausted,
                0,
                now - 60_000,
            )
            .await;
    }
    publisher.close().await;
    eprintln!(
        "seeded {dead} dead letters in {:.1}s",
        started.elapsed().as_secs_f64()
    );

    let operators = Token::parse_list("bench:bench-token-0123456789", "operator", "bench").unwrap();
    let mut settings = ConsoleSettings::new(config.clone(), operators, Viewers::Open);
    settings.bind = "127.0.0.1:0".parse().unwrap();
    settings.dead_letter_refresh = Duration::from_secs(3600);
    settings.history_every = Duration::from_secs(3600);
    let console = fleet_budget_console::start(settings).await.unwrap();
    let addr = console.addr().to_string();

    println!(
        "overview, {deps} dependencies (median of 5; the console in-process, budgetctl a new process each run):"
    );
    let mut page = Vec::new();
    let mut json = Vec::new();
    let mut status = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let (code, bytes) = get(&addr, "/").await;
        assert_eq!(code, 200);
        page.push(t.elapsed());
        let t = Instant::now();
        let (code, jbytes) = get(&addr, "/api/overview").await;
        assert_eq!(code, 200);
        json.push(t.elapsed());
        status.push(cli(&bin, &config_path, &["status", "--json"]));
        let _ = (bytes, jbytes);
    }
    println!(
        "  console GET /               {:>8.1} ms",
        median(page).as_secs_f64() * 1000.0
    );
    println!(
        "  console GET /api/overview   {:>8.1} ms",
        median(json).as_secs_f64() * 1000.0
    );
    println!(
        "  budgetctl status --json     {:>8.1} ms",
        median(status).as_secs_f64() * 1000.0
    );

    // The first sample: wait until the page shows it.
    let t = Instant::now();
    loop {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(
            format!("GET /dead-letters HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        if out.contains("Sampled ") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sample_read = t.elapsed();
    let mut dl = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let (code, _) = get(&addr, "/dead-letters").await;
        assert_eq!(code, 200);
        dl.push(t.elapsed());
    }
    println!("dead letters, {dead} in the queue:");
    println!(
        "  console GET /dead-letters   {:>8.1} ms (median of 5, from the sample)",
        median(dl).as_secs_f64() * 1000.0
    );
    println!(
        "  console background sample   {:>8.1} ms (10,000 messages read and put back, once per refresh)",
        sample_read.as_secs_f64() * 1000.0
    );
    // Printed before the CLI's run, which reads every message and takes minutes.
    let stats = cli(&bin, &config_path, &["dlq", "stats", "--json"]);
    println!(
        "  budgetctl dlq stats --json  {:>8.1} ms (reads every message)",
        stats.as_secs_f64() * 1000.0
    );
    console.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
