//! # fleet-budget
//!
//! One fleet-wide retry budget per *dependency*, kept in Redis.
//!
//! ## Why a budget and not just `max_attempts`?
//!
//! A per-job attempt ceiling limits what one message can cost. It does nothing when a shared
//! dependency goes down: every queued job enters its retry curve at once, and backoff only
//! spreads the same volume over time. At a 90% failure rate with 3 attempts per job the
//! dependency sees about 2.7 calls per job, exactly when it can least absorb them. A retry
//! budget caps retries as a fraction of recent traffic (`ratio × successes`, with a floor), and
//! because autoscaling would multiply per-process budgets, the counter is shared: one atomic Lua
//! script call per decision, on time-bucketed counters in Redis.
//!
//! ## Embedding
//!
//! ```no_run
//! use fleet_budget::{Config, Decision, Failure, FleetBudget};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config::from_toml(r#"
//!     [dependencies.search]
//!     tasks = ["index_document"]
//! "#, "inline")?;
//! let budget = FleetBudget::from_config(&config).await?;
//!
//! budget.on_attempt("index_document", 1).await?;
//! // ... the job failed on its first attempt:
//! let failure = Failure::retryable("search returned 503").with_class("http_503");
//! match budget.on_failure("index_document", 1, &failure).await? {
//!     Decision::Retry { delay, next_attempt, .. } => { /* reschedule after `delay` */ }
//!     Decision::DeadLetter { reason, snapshot, .. } => { /* dead-letter with `reason` */ }
//! }
//! // ... and a later job succeeded:
//! budget.on_success("index_document").await?;
//! budget.shutdown().await?; // flush coalesced deposits
//! # Ok(()) }
//! ```
//!
//! The decision order, the allowance formula and the Redis key layout are specified in
//! `docs/semantics.md`-derived docs: [`allowance`] (the math), `lua/README.md` (the scripts).

pub mod allowance;
pub mod breaker;
pub mod budget;
pub mod ceiling;
pub mod clock;
pub mod concurrency;
pub mod config;
pub mod control;
pub mod decision;
pub mod dependency;
pub mod error;
pub mod http;
pub mod keys;
pub mod metrics;
pub mod policy;
pub mod printable;
pub mod redact;
pub mod risks;
pub mod store;
#[cfg(feature = "test-harness")]
pub mod testing;
pub mod tls;
pub mod view;

pub use allowance::{BudgetSnapshot, Control, WindowCounters};
pub use budget::{
    Admission, Call, CallOutcome, FanOut, FleetBudget, FleetBudgetBuilder, Hold, Route,
};
pub use ceiling::{Backoff, JobClass, TaskCeiling};
pub use config::{Config, ConfigError, FallbackMode};
pub use decision::{BudgetSource, DeadLetterReason, Decision, Enforcement, Failure, FailureKind};
pub use dependency::{Dependency, DependencyMap, InvalidName, UnmappedTasks};
pub use error::{Error, StoreError};
pub use metrics::Metrics;
pub use policy::{BudgetPolicy, DepositBasis, WindowMode};
