//! The smallest real worker: one configuration file, the broker topology migrated, every job
//! acknowledged unless its payload says `fail`. It prints `handled <message id>` per job and its
//! counts when SIGTERM or Ctrl-C stops it.

use fleet_budget::{Failure, FleetBudget};
use fleet_budget_amqp::{Migrations, Topology, Worker, WorkerConfig, WorkerOptions, migrate};
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: outside-worker CONFIG.toml")?;
    let text = std::fs::read_to_string(&path)?;
    let config = WorkerConfig::from_toml(&text, &path)?;
    let topology = Topology::new(&config.amqp);
    migrate(&config.amqp.url, &config.amqp, &Migrations::embedded()?, false).await?;
    let budget = FleetBudget::from_config(&config.budget).await?;
    let worker = Worker::new(budget, topology.clone(), WorkerOptions::new(&config, &topology));
    let handle = worker.handle();
    let mut term = signal(SignalKind::terminate())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        handle.shutdown();
    });
    let counts = worker
        .run(|job| async move {
            if job.payload == b"fail" {
                return Err(Failure::non_retryable("the job asked to fail"));
            }
            println!("handled {}", job.message_id.unwrap_or_default());
            Ok(())
        })
        .await?;
    println!("stopped: {counts:?}");
    Ok(())
}
