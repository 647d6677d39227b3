//! Where budgets are kept: one small trait, one atomic call per decision.
//!
//! [`RedisStore`] shares a budget across the fleet; [`LocalStore`] keeps it in this process (for
//! single-process workers, the simulator, and the fallback while Redis is unreachable). Both
//! implement the same arithmetic ([`crate::allowance`]).
//!
//! Every call the core crate makes to Redis is in `redis/`: the budget's, and those the
//! concurrency budget, the breaker and the control plane ask it to make (one file per kind of
//! call, the scripts loaded in one place: `redis/scripts.rs`).

use std::future::Future;
use std::pin::Pin;

use crate::allowance::BudgetSnapshot;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::policy::BudgetPolicy;

mod local;
mod redis;

pub use local::{LocalBudget, LocalStore};
pub use redis::{
    BREAKER_SCRIPT, DEAD_LETTERS_SCRIPT, DEFAULT_MAX_BATCH, DEPOSIT_SCRIPT, DiscoveryError,
    GroupCommitStats, HEARTBEAT_SCRIPT, LEASE_ACQUIRE_SCRIPT, LEASE_RELEASE_SCRIPT,
    MAX_BATCH_LIMIT, OVERRIDE_SCRIPT, RedisStore, RedisTarget, SPEND_BATCH_SCRIPT,
    SPEND_MANY_SCRIPT, SPEND_SCRIPT, STATUS_SCRIPT, ScriptReply, batch_answer, parse_reply,
    parse_status, policy_args,
};
pub(crate) use redis::{
    BreakerArgs, LeaseArgs, Report, count_at, field_text, field_u64, int_at, text_at,
};

/// A boxed future returned by [`BudgetStore`] methods (keeps the trait usable as `dyn`).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Deposits to record in one call (a batch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deposits {
    /// Successful jobs.
    pub successes: u64,
    /// First attempts.
    pub first_attempts: u64,
}

impl Deposits {
    /// Whether there is nothing to record.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.successes == 0 && self.first_attempts == 0
    }

    /// Adds `other` to `self`, saturating.
    pub fn add(&mut self, other: Self) {
        self.successes = self.successes.saturating_add(other.successes);
        self.first_attempts = self.first_attempts.saturating_add(other.first_attempts);
    }

    /// The total count.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.successes.saturating_add(self.first_attempts)
    }
}

/// The answer to a request for one retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Withdrawal {
    /// Whether the retry was granted (and counted as a retry; otherwise counted as a denial).
    pub granted: bool,
    /// The budget after counting.
    pub snapshot: BudgetSnapshot,
    /// Milliseconds from the decision until one more retry could be granted if nothing changed
    /// meanwhile (no deposit, spend, override or policy change): `Some(0)` when one would be now
    /// (or the store did not say), `None` when none would without a change. Never later than the
    /// true instant: [`crate::allowance::next_grant_in_ms`], `lua/README.md` ("Reply").
    pub next_grant_ms: Option<u64>,
}

impl Withdrawal {
    /// The answer `granted` with the budget after counting, and when the next grant could come
    /// as the arithmetic says (a store without overrides: the local store).
    #[must_use]
    pub fn decided(granted: bool, snapshot: BudgetSnapshot) -> Self {
        Self {
            granted,
            snapshot,
            next_grant_ms: crate::allowance::next_grant_in_ms(&snapshot),
        }
    }
}

/// A budget as read by [`BudgetStore::status_in_force`]: what the store holds and the policy that
/// shapes it, which is the store's to say (`lua/README.md`, "The policy in force").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetStatus {
    /// The budget, under the policy in force.
    pub snapshot: BudgetSnapshot,
    /// The policy in force: the one the fleet's calls are decided by (the reader's own where the
    /// store holds none yet: no key).
    pub policy: BudgetPolicy,
    /// The ratio the allowance uses: the policy's, or an operator's set override's in its place.
    pub ratio: f64,
    /// The floor the allowance uses: the policy's, or an operator's set override's in its place.
    pub min_allowance: u64,
}

impl BudgetStatus {
    /// A budget read under `policy`, the reader's own (a store without a shared policy in force
    /// or overrides: [`LocalStore`]).
    #[must_use]
    pub fn under(snapshot: BudgetSnapshot, policy: BudgetPolicy) -> Self {
        Self {
            snapshot,
            policy,
            ratio: policy.ratio,
            min_allowance: policy.min_allowance,
        }
    }
}

/// A store of per-dependency budgets. Each method is one atomic operation.
pub trait BudgetStore: Send + Sync + std::fmt::Debug {
    /// Records deposits for `dependency`.
    fn deposit<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
        deposits: Deposits,
    ) -> StoreFuture<'a, BudgetSnapshot>;

    /// Records deposits for `dependency` and `denied`, the denials this process answered itself
    /// while a denial of this store still stood (the deny cache, `redis.deny_cache_ms`): they
    /// never reached the store, which counts them with its own denials, so that its count is
    /// the fleet's (`lua/README.md`, `deposit.lua`'s ARGV 8). By default only the deposits are
    /// recorded: a store without such a cache in front of it has decided every denial itself.
    fn deposit_with_denials<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
        deposits: Deposits,
        denied: u64,
    ) -> StoreFuture<'a, BudgetSnapshot> {
        let _ = denied;
        self.deposit(dependency, policy, deposits)
    }

    /// Asks for one retry: decides, and counts it as a retry or a denial.
    fn withdraw<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
    ) -> StoreFuture<'a, Withdrawal>;

    /// Reads the budget without changing it.
    fn status<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
    ) -> StoreFuture<'a, BudgetSnapshot>;

    /// Reads the budget without changing it, with the policy in force and the ratio and floor
    /// its allowance uses (what the fleet exporter shows). By default the reader's own policy,
    /// for a store that keeps no policy of its own.
    fn status_in_force<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
    ) -> StoreFuture<'a, BudgetStatus> {
        Box::pin(async move {
            let snapshot = self.status(dependency, policy).await?;
            Ok(BudgetStatus::under(snapshot, *policy))
        })
    }

    /// A short name for logs and metrics (`redis`, `redis-cluster`, `local`).
    fn kind(&self) -> &'static str;
}
