//! The fleet-wide concurrency budget of a dependency: calls in flight, primary and retry,
//! counted in Redis as leases that expire by the server's clock, so a worker that dies loses
//! its slots for no longer than one lease.
//!
//! A retry gets a slot only while the calls in flight are below the cap *and* the retries in
//! flight are below the retry share (`max(min_retry_slots, floor(max_retry_fraction ×
//! primaries in flight))`); it never waits for one: [`ConcurrencyBudget::acquire`] is one atomic
//! script call that grants or refuses. Primary calls are counted and never refused by the retry
//! share; with [`ConcurrencyPolicy::primary_waits`] they are refused at the cap, and the caller
//! decides whether to wait. The scripts are `lua/lease_acquire.lua` and `lua/lease_release.lua`
//! (contract in `lua/README.md`); the same rule in plain arithmetic is
//! `fleet_budget_sim::concurrency`.

mod lease;
mod policy;

pub use lease::{Acquired, ConcurrencyBudget, InFlight, Lease, LeaseKind, Refusal};
// The lease scripts, loaded where every script is (`store/redis/scripts.rs`); kept here, where
// they were public before.
pub use crate::store::{LEASE_ACQUIRE_SCRIPT, LEASE_RELEASE_SCRIPT};
pub use policy::{ConcurrencyPolicy, ConcurrencyPolicyError, MAX_LEASE};
