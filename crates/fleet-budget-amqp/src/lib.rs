//! # fleet-budget-amqp
//!
//! Where the fleet-wide retry budget meets RabbitMQ (via `lapin`):
//!
//! * [`topology`]: the exchanges and queues, declared by the versioned migration files (the
//!   repository's top-level `migrations/`, compiled in from the crate's generated copy) through
//!   [`migrate`] (idempotent, with a dry-run plan, and an error naming every differing
//!   argument when an existing queue was declared otherwise);
//! * [`worker`]: a [`Worker`] that consumes with a prefetch, runs an async handler per job,
//!   reports to the [`fleet_budget::FleetBudget`], publishes retries to delay tiers and
//!   dead-letters with the headers of `docs/semantics.md`, acking only after the broker
//!   confirmed the copy; what becomes of a failed job is the pure [`Outcome::of_decision`];
//! * [`dead_letters`]: what waits in the dead-letter and parked queues, counted in the fleet
//!   store as messages enter and leave, so that looking never reads a queue;
//! * [`headers`]: every header name and the message-identity rules, in one file;
//! * [`replay`]: a [`Replayer`] that moves dead-lettered jobs back, filtered, paced, bounded,
//!   pausing while the dependency's budget is exhausted, parking loops and garbage;
//! * [`publish`]: a [`Publisher`] with publisher confirms (also for producers);
//! * `testing` (feature `test-harness`): a `TestBroker` with a topology of its own per test.
//!
//! ```no_run
//! use fleet_budget::{Failure, FleetBudget};
//! use fleet_budget_amqp::{migrate, Migrations, Topology, Worker, WorkerConfig, WorkerOptions};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = WorkerConfig::from_toml("[dependencies.search]\ntasks = [\"index\"]\n", "inline")?;
//! let topology = Topology::new(&config.amqp);
//! migrate(&config.amqp.url, &config.amqp, &Migrations::embedded()?, false).await?;
//! let budget = FleetBudget::from_config(&config.budget).await?;
//! let worker = Worker::new(budget, topology.clone(), WorkerOptions::new(&config, &topology));
//! let handle = worker.handle(); // handle.shutdown() from a signal handler
//! worker
//!     .run(|job| async move {
//!         if job.payload.is_empty() {
//!             return Err(Failure::non_retryable("empty payload"));
//!         }
//!         Ok(())
//!     })
//!     .await?;
//! # Ok(()) }
//! ```

pub mod config;
pub mod connection;
pub mod dead_letters;
pub mod error;
pub mod frame_guard;
pub mod headers;
pub mod incident;
pub mod inspect;
pub mod metrics;
pub mod publish;
pub mod replay;
#[cfg(feature = "test-harness")]
pub mod testing;
pub mod topology;
pub mod worker;

pub use config::{AmqpSettings, WorkerConfig};
pub use connection::{ConnectionConfig, Timeouts, connect};
pub use error::{AmqpError, ArgumentDifference};
pub use headers::{DeadLetterRecord, HeaderError, JobHeaders, RetryRecord};
pub use metrics::{AmqpMetrics, QueueSource};
pub use publish::{PublishError, Publisher};
pub use replay::{
    DryRunReport, InspectOptions, Inspection, ReplayFilter, ReplayOptions, ReplayProgress,
    ReplayReport, Replayer, inspect_queue,
};
pub use topology::{
    Migration, MigrationReport, Migrations, Object, Operation, QueueDepths, RetryTier, StepState,
    Topology, delete_topology, migrate, queue_depth, queue_depths,
};
pub use worker::{Job, JobContext, Outcome, Worker, WorkerCounts, WorkerHandle, WorkerOptions};
