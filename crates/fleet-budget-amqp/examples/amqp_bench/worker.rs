//! Benchmark 3: a worker dead-lettering end to end (consume, handler fails non-retryably,
//! dead-letter copy confirmed, original acked).

use std::time::{Duration, Instant};

use fleet_budget::{Failure, FleetBudget};
use fleet_budget_amqp::{Topology, Worker, WorkerConfig, WorkerOptions};

use crate::rate;

/// A worker consuming the work queue (n jobs), failing each non-retryably: dead-letter copy
/// confirmed, original acked.
pub(crate) async fn worker_dead_lettering(
    url: &str,
    topology: &Topology,
    config: &WorkerConfig,
    n: usize,
) -> f64 {
    let budget = FleetBudget::local(&config.budget);
    let worker = Worker::new(
        budget,
        topology.clone(),
        WorkerOptions {
            url: url.to_owned(),
            ..WorkerOptions::new(config, topology)
        },
    );
    let handle = worker.handle();
    let start = Instant::now();
    let join = tokio::spawn(worker.run(|_job| async { Err(Failure::non_retryable("bench")) }));
    while handle.counts().dead_lettered < n as u64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = rate(n, start.elapsed());
    handle.shutdown();
    let counts = join.await.unwrap().unwrap();
    assert_eq!(
        (counts.dead_lettered, counts.requeued, counts.ack_failed),
        (n as u64, 0, 0),
        "{counts:?}"
    );
    r
}
