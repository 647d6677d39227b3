//! The worker against the real RabbitMQ and a private Redis: end to end and budget exhaustion
//! across workers (`end_to_end`), no loss when a copy cannot be confirmed (`no_loss`),
//! redelivery after a killed process, graceful shutdown, reconnection and long delays
//! (`lifecycle`). The helpers here start and stop a worker.

use std::time::Duration;

use fleet_budget::{Failure, FleetBudget};
use fleet_budget_amqp::{Worker, WorkerHandle, WorkerOptions};
use tokio::task::JoinHandle;

use crate::common::Env;

mod bounds;
mod breaker;
mod concurrency;
mod end_to_end;
mod hostile;
mod lifecycle;
mod nested;
mod no_loss;
mod poison;
mod recovery_window;

const LONG: Duration = Duration::from_secs(60);

fn options(env: &Env) -> WorkerOptions {
    WorkerOptions::new(&env.config, &env.topology)
}

type Runner = (WorkerHandle, JoinHandle<fleet_budget_amqp::WorkerCounts>);

/// Starts a worker whose handler is `handler`.
fn start<H, F>(budget: FleetBudget, env: &Env, handler: H) -> Runner
where
    H: Fn(fleet_budget_amqp::Job) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Result<(), Failure>> + Send + 'static,
{
    let worker = Worker::new(budget, env.topology.clone(), options(env));
    let handle = worker.handle();
    let join = tokio::spawn(async move { worker.run(handler).await.unwrap() });
    (handle, join)
}

/// [`start`], for the other modules of the binary.
pub(crate) fn start_worker<H, F>(budget: FleetBudget, env: &Env, handler: H) -> Runner
where
    H: Fn(fleet_budget_amqp::Job) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Result<(), Failure>> + Send + 'static,
{
    start(budget, env, handler)
}

/// [`stop`], for the other modules of the binary.
pub(crate) async fn stop_worker(runner: Runner) -> fleet_budget_amqp::WorkerCounts {
    stop(runner).await
}

async fn stop((handle, join): Runner) -> fleet_budget_amqp::WorkerCounts {
    handle.shutdown();
    tokio::time::timeout(LONG, join)
        .await
        .expect("worker stops")
        .unwrap()
}
