//! The one place the scripts of `lua/` are loaded: all eleven, as [`redis::Script`]s (`EVALSHA`,
//! and on `NOSCRIPT` after a restart or `SCRIPT FLUSH`, `SCRIPT LOAD` and again), and the
//! policy arguments the budget scripts take. The texts are the crate's `lua/*.lua`, copies of
//! the repository's `lua/` (`lua/README.md` is the contract for other languages).

use std::sync::LazyLock;

use redis::Script;

use crate::policy::BudgetPolicy;

/// `lua/spend.lua`: try to spend one retry.
pub static SPEND_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/spend.lua")));
/// `lua/spend_many.lua`: decide n retry requests together (group commit).
pub static SPEND_MANY_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/spend_many.lua")));
/// `lua/spend_batch.lua`: decide the requests of several budgets together (group commit on one
/// server).
pub static SPEND_BATCH_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/spend_batch.lua")));
/// `lua/deposit.lua`: record deposits.
pub static DEPOSIT_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/deposit.lua")));
/// `lua/status.lua`: read a budget.
pub static STATUS_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/status.lua")));
/// `lua/override.lua`: an operator's freeze or set override, or its removal.
pub static OVERRIDE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/override.lua")));
/// `lua/lease_acquire.lua`: take a slot of a concurrency budget.
pub static LEASE_ACQUIRE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/lease_acquire.lua")));
/// `lua/lease_release.lua`: give a slot back.
pub static LEASE_RELEASE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/lease_release.lua")));
/// `lua/breaker.lua`: every decision of the circuit breaker.
pub static BREAKER_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/breaker.lua")));

/// `lua/heartbeat.lua`: a worker's entry in the worker registry, or its removal.
pub static HEARTBEAT_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/heartbeat.lua")));

/// `lua/dead_letters.lua`: changes to a queue's dead-letter index.
pub static DEAD_LETTERS_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/dead_letters.lua")));

/// The arguments every budget script takes after its own, as `lua/README.md` lists them: the
/// ratio, the floor, the deposit basis (`s` or `a`) and the window mode (`sliding` or `fixed`).
#[must_use]
pub fn policy_args(policy: &BudgetPolicy) -> [String; 4] {
    [
        policy.ratio.to_string(),
        policy.min_allowance.to_string(),
        policy.deposit.script_code().to_owned(),
        policy.mode.as_str().to_owned(),
    ]
}
