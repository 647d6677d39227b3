//! One worker on a private RabbitMQ node and a private Redis, every job failing: the setting of
//! the tests of copies the broker refuses (`tests/oversized_body.rs`, `tests/foreign_user_id.rs`),
//! which change the node (a user, a lower maximum) as the shared broker must never be changed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_budget::testing::RedisServer;
use fleet_budget::{Failure, FleetBudget};
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use fleet_budget_amqp::{
    Topology, Worker, WorkerConfig, WorkerCounts, WorkerHandle, WorkerOptions,
};

use super::rabbit_node::RabbitNode;

/// Runs `test` (`common::block_on`), or says it is skipped where RabbitMQ's server
/// scripts are not installed (no private node can start).
pub(crate) fn on_a_private_node<F: Future<Output = ()>>(test: impl FnOnce() -> F) {
    if RabbitNode::installed().is_err() {
        eprintln!("skipped: RabbitMQ's server scripts are not installed, no private node");
        return;
    }
    crate::common::block_on(test());
}

/// Waits until `cond` holds, checking every 100 ms; fails naming `what` after `within` (a
/// guard against a hang, not a measure).
pub(crate) async fn wait_until<F, Fut>(within: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !cond().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A private node and Redis, a configuration on both (names under a prefix of `name`), and
/// its topology declared.
pub(crate) struct Setting {
    pub(crate) node: RabbitNode,
    /// Held: the server lives as long as the setting.
    _redis: RedisServer,
    pub(crate) config: WorkerConfig,
    pub(crate) broker: TestBroker,
    pub(crate) topology: Topology,
}

impl Setting {
    /// `extra_toml` is appended to the configuration (sections of its own).
    pub(crate) async fn start(name: &str, extra_toml: &str) -> Self {
        let node = RabbitNode::start().await.expect("a private RabbitMQ node");
        let redis = RedisServer::start();
        let toml = format!(
            "[redis]\nurl = \"{}\"\ntimeout_ms = 2000\ndeposit_flush_ms = 0\n\
             [amqp]\nurl = \"{}\"\nprefix = \"{}\"\nprefetch = 4\nretry_tiers_secs = [0.2, 0.5]\n\
             {extra_toml}",
            redis.url(),
            node.url(),
            unique_prefix(name)
        );
        let config = WorkerConfig::from_toml(&toml, "test").unwrap();
        let broker = TestBroker::with_settings(config.amqp.clone());
        broker.migrate().await;
        let topology = broker.topology.clone();
        Self {
            node,
            _redis: redis,
            config,
            broker,
            topology,
        }
    }

    /// A worker whose handler fails every job with `failure()`, running in a task of its own.
    pub(crate) async fn failing_worker(&self, failure: fn() -> Failure) -> FailingWorker {
        let runs = Arc::new(AtomicU64::new(0));
        let budget = FleetBudget::from_config(&self.config.budget).await.unwrap();
        let worker = Worker::new(
            budget,
            self.topology.clone(),
            WorkerOptions::new(&self.config, &self.topology),
        );
        let handle = worker.handle();
        let join = {
            let runs = Arc::clone(&runs);
            tokio::spawn(async move {
                worker
                    .run(move |_job| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        async move { Err(failure()) }
                    })
                    .await
                    .unwrap()
            })
        };
        FailingWorker { runs, handle, join }
    }
}

/// A worker of [`Setting::failing_worker`].
pub(crate) struct FailingWorker {
    runs: Arc<AtomicU64>,
    handle: WorkerHandle,
    join: tokio::task::JoinHandle<WorkerCounts>,
}

impl FailingWorker {
    /// Shuts the worker down (it stops within 60 s) and returns how many times its handler ran
    /// and its counts.
    pub(crate) async fn stop(self) -> (u64, WorkerCounts) {
        self.handle.shutdown();
        let counts = tokio::time::timeout(Duration::from_secs(60), self.join)
            .await
            .expect("the worker stops")
            .unwrap();
        (self.runs.load(Ordering::SeqCst), counts)
    }
}
