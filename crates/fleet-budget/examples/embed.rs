//! Embedding fleet-budget in a worker: the example of docs/guides/worker-and-replay.md ("Embedding"),
//! compiled by `cargo test --all-targets`.
//!
//! Run it with `cargo run -p fleet-budget --example embed` (uses Redis on 127.0.0.1:6379, or the
//! local fallback if Redis is not there).

use std::time::Duration;

use fleet_budget::metrics::MetricsServer;
use fleet_budget::{Config, Decision, Failure, FleetBudget};

/// A job as the queue hands it over.
struct Job {
    task: &'static str,
    attempt: u32,
}

/// The call to the dependency (here: the first attempt fails, the retry succeeds).
async fn run(job: &Job) -> Result<(), Failure> {
    if job.attempt % 2 == 1 {
        Err(Failure::retryable("search cluster answered 503").with_class("http_503"))
    } else {
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::from_toml(
        r#"
        [defaults]
        window_secs = 60
        ratio = 0.2
        min_allowance = 10

        [dependencies.search]
        tasks = ["index_document", "reindex_tenant"]

        [tasks.index_document]
        class = "idempotent"
        "#,
        "inline example",
    )?;
    let budget = FleetBudget::from_config(&config).await?;
    // One line serves the metrics to Prometheus (a fixed port such as 9464 in production, or
    // `[metrics] listen = "127.0.0.1:9464"` in the configuration).
    let metrics =
        MetricsServer::bind("127.0.0.1:0".parse()?, budget.metrics().registry().clone()).await?;
    println!("metrics on http://{}/metrics", metrics.local_addr());

    let mut job = Job {
        task: "index_document",
        attempt: 1,
    };
    loop {
        budget.on_attempt(job.task, job.attempt).await?;
        match run(&job).await {
            Ok(()) => {
                budget.on_success(job.task).await?;
                println!("attempt {} succeeded", job.attempt);
                break;
            }
            Err(failure) => match budget.on_failure(job.task, job.attempt, &failure).await? {
                Decision::Retry {
                    delay,
                    next_attempt,
                    source,
                    ..
                } => {
                    println!(
                        "attempt {} failed; retry in {delay:?} (budget: {})",
                        job.attempt,
                        source.as_str()
                    );
                    // A real worker republishes to a delay queue; here we just wait a little.
                    tokio::time::sleep(delay.min(Duration::from_millis(10))).await;
                    job.attempt = next_attempt;
                }
                Decision::DeadLetter {
                    reason, snapshot, ..
                } => {
                    println!("dead-letter: {reason} (budget {snapshot:?})");
                    break;
                }
            },
        }
    }
    println!(
        "{}",
        budget
            .metrics()
            .render()
            .lines()
            .filter(|l| l.contains("search"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    budget.shutdown().await?;
    metrics.shutdown().await;
    Ok(())
}
