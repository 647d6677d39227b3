//! How long a scrape of the fleet exporter takes at 100, 1,000 and 10,000 dependencies (issue 12:
//! "a scrape of 10,000 dependencies stays under a second").
//!
//! ```text
//! cargo run --release -p fleet-budget --features test-harness --example exporter_bench
//! ```
//!
//! Starts its own `redis-server` (test harness, free port), gives N dependencies a budget key
//! each, and serves `FleetExporter` with `MetricsServer` exactly as `budgetctl exporter` does.
//! For each N it prints the median of 5 scrapes over HTTP (GET /metrics, whole body read), one
//! reading of the N budgets and one writing of their text on their own, and beside them the
//! reference measured in the same run: the same N status reads one after another on the same
//! store (what a scrape without concurrency would cost); and the body size.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::indexing_slicing
)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::metrics::{FleetExporter, MetricsServer};
use fleet_budget::store::{BudgetStore, Deposits, RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{BudgetPolicy, Config, Dependency};

fn scrape(addr: SocketAddr) -> (Duration, usize) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
        .unwrap();
    let mut body = Vec::new();
    stream.read_to_end(&mut body).unwrap();
    let took = started.elapsed();
    assert!(body.starts_with(b"HTTP/1.0 200") || body.starts_with(b"HTTP/1.1 200"));
    (took, body.len())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = RedisServer::start();
    let store: Arc<dyn BudgetStore> = Arc::new(
        RedisStore::new(
            RedisTarget::Single(server.url()),
            "fb",
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    let policy = BudgetPolicy::default();
    println!(
        "| dependencies | scrape (median of 5, HTTP) | reading Redis | writing the text | the same reads one after another | scrape / one after another | body |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut dependencies = Vec::new();
    for n in [100_usize, 1_000, 10_000] {
        while dependencies.len() < n {
            let d = Dependency::new(&format!("dep-{:05}", dependencies.len())).unwrap();
            let deposits = Deposits {
                successes: 100,
                first_attempts: 120,
            };
            store.deposit(&d, &policy, deposits).await.unwrap();
            store.withdraw(&d, &policy).await.unwrap();
            dependencies.push(d);
        }
        let exporter = Arc::new(
            FleetExporter::new(Arc::clone(&store), &Config::default())
                .unwrap()
                .max_dependencies(n),
        );
        exporter.set_found_dependencies(dependencies.clone());
        let http = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), Arc::clone(&exporter))
            .await
            .unwrap();
        let addr = http.local_addr();
        let _warm = tokio::task::spawn_blocking(move || scrape(addr))
            .await
            .unwrap();
        let mut times = Vec::new();
        let mut size = 0;
        for _ in 0..5 {
            let (t, s) = tokio::task::spawn_blocking(move || scrape(addr))
                .await
                .unwrap();
            times.push(t);
            size = s;
        }
        let scrape_time = median(times);
        let list: Vec<_> = dependencies.iter().map(|d| (d.clone(), policy)).collect();
        let t = Instant::now();
        let (budgets, _) = fleet_budget::metrics::read_budgets(&store, list).await;
        let read = t.elapsed();
        let t = Instant::now();
        let mut text = String::new();
        fleet_budget::metrics::write_budgets(&mut text, &budgets);
        let write = t.elapsed();
        assert!(text.len() > n * 100);
        let started = Instant::now();
        for d in &dependencies {
            store.status(d, &policy).await.unwrap();
        }
        let sequential = started.elapsed();
        println!(
            "| {n} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.2} | {:.0} KiB |",
            scrape_time.as_secs_f64() * 1e3,
            read.as_secs_f64() * 1e3,
            write.as_secs_f64() * 1e3,
            sequential.as_secs_f64() * 1e3,
            scrape_time.as_secs_f64() / sequential.as_secs_f64(),
            size as f64 / 1024.0
        );
        http.shutdown().await;
    }
}
