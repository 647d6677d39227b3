//! The incident control plane: what an on-call engineer (or any tool) reads and changes in Redis
//! while workers run.
//!
//! Why here and not in `budgetctl`: the CLI is one client among others (a chat bot, a runbook
//! automation); each must see the same policy in force, write overrides the scripts understand,
//! and leave the same audit trail. How the parts fit:
//! - [`status`]: a dependency's budget as the fleet sees it: the policy in force (which may
//!   differ from the caller's), conflicts, overrides;
//! - [`overrides`]: freeze / set / unfreeze / clear, written by `lua/override.lua` into the
//!   budget hash, where every script reads them, each with its own expiry;
//! - [`keeper`]: a copy of the overrides in a long-running operator process (the exporter, the
//!   console), that puts back an override Redis lost before its end (an eviction, `FLUSHALL`)
//!   and counts an audit trail lost;
//! - [`enforcement`]: the operators' switch between shadow and enforcement, in a key of its own
//!   that expires with it, read by workers when their budget refuses a retry;
//! - [`workers`]: the worker registry: which workers report, which decide from their
//!   fallback, which went silent;
//! - [`bullmq`]: the BullMQ jobs a Node.js worker without `[amqp]` kept in BullMQ's failed set,
//!   as the fleet records them, for the replay and the console;
//! - [`dead_letters`]: how many messages wait in a dead-letter or parked queue, row by row,
//!   counted as they enter and leave, so that looking never reads the queue;
//! - [`moves`]: each dead letter a replay is moving, claimed before its copy is sent, so that
//!   a replay cut off half-way never makes a job run twice;
//! - [`runs`]: the last progress of each running replay or purge, so that one cut off says
//!   where it stopped;
//! - [`audit`]: a bounded Redis stream of every override, replay, purge and migration, with
//!   who, why, and before/after.

pub mod audit;
pub mod bullmq;
pub mod dead_letters;
pub mod enforcement;
pub mod keeper;
pub mod moves;
pub mod overrides;
pub mod runs;
pub mod status;
pub mod workers;

pub use audit::{AuditEntry, AuditLog};
pub use dead_letters::{DeadLetterIndex, IndexRows};
pub use enforcement::{EnforcementSwitch, Switched};
pub use keeper::{Keeper, keep_overrides};
pub use moves::{Claim, ReplayMoves};
pub use overrides::{Change, Freeze, OverrideAction, Overrides, SetOverride};
pub use runs::RunJournal;
pub use status::{FleetStatus, fleet_status};
pub use workers::{FallbackEntry, FleetWorkers, WorkerEntry, fleet_workers};
