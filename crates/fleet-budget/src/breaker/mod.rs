//! The fleet-wide circuit breaker of a dependency.
//!
//! A retry budget caps amplification while a dependency partly works; when it does not work at
//! all, every call is wasted and every retry earned by the floor is too. A breaker stops calls
//! entirely and probes for recovery. Per-process breakers (Polly, resilience4j) open one process
//! at a time, each after its own share of failures, and probe from every process at once; to be
//! global a breaker needs shared state, exactly like the budget, so it lives in Redis beside it
//! (`<prefix>:v1:{<dependency>}:cb`, the budget's hash-tag slot) and every decision is one atomic
//! script call (`lua/breaker.lua`, contract in `lua/README.md`):
//!
//! - **closed**: calls run; their results are counted over a sliding window; a failure that
//!   makes failures ≥ `failure_ratio` of at least `min_volume` calls opens it;
//! - **open** for `open_secs`: no call runs; jobs wait in the delay tiers without spending an
//!   attempt ([`crate::Admission::Wait`] with [`crate::Hold::CircuitOpen`]), up to
//!   `max_wait_secs`, then are dead-lettered `circuit_open`;
//! - **half-open**: exactly `half_open_probes` calls are admitted fleet-wide as probes, each one
//!   retry of the rate budget's floor; `close_after` probe successes close it, one probe failure
//!   opens it again. Probes that never report (their worker died) are reissued after
//!   `probe_timeout_secs`.
//!
//! State changes are logged, counted (`fleet_budget_breaker_transitions_total`) and shown by
//! `budgetctl status`.

mod policy;
mod verdict;

pub use policy::{BreakerPolicy, BreakerPolicyError};
pub use verdict::{Breaker, BreakerState, BreakerStatus, Decided, Verdict, status_on};

// The breaker's script, loaded where every script is (`store/redis/scripts.rs`); kept here, where
// it was public before.
pub use crate::store::BREAKER_SCRIPT;
