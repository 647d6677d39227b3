//! The budget calls of the Redis store: [`BudgetStore`] for [`RedisStore`] (deposit, withdraw,
//! status), and the calls only Redis has: several withdrawals in one call, and `status.lua`'s
//! whole reply for tools. A withdrawal goes to group commit (`batch.rs`) when it is on, else
//! straight to `spend.lua` (`spend.rs`).

use super::RedisStore;
use super::connect::RedisTarget;
use super::reply::{ScriptReply, parse_status};
use super::scripts::{DEPOSIT_SCRIPT, STATUS_SCRIPT, policy_args};
use super::spend::{Entry, batch_answer};
use crate::allowance::BudgetSnapshot;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::keys::enforcement_key;
use crate::policy::BudgetPolicy;
use crate::store::{BudgetStatus, BudgetStore, Deposits, StoreFuture, Withdrawal};

impl RedisStore {
    /// Decides `n` (1 to 10,000) withdrawals for `dependency` in one `spend_many.lua` call, as
    /// `n` calls of `spend.lua` at that instant would, in order.
    ///
    /// # Errors
    /// `n` out of range (an error reply), or the store failed or timed out.
    pub async fn withdraw_many(
        &self,
        dependency: &Dependency,
        policy: &BudgetPolicy,
        n: u64,
    ) -> Result<Vec<Withdrawal>, StoreError> {
        let (granted, snapshot, next_grant_ms) = self
            .spend_many_key(&self.key(dependency), policy, n)
            .await?;
        (0..n)
            .map(|k| batch_answer(&snapshot, next_grant_ms, n, granted, k))
            .collect()
    }

    /// Decides `n` (1 to 10,000) withdrawals of each budget in `requests` in one
    /// `spend_batch.lua` call, as `n` calls of `spend.lua` of each budget, in order, at that
    /// instant would: the answers per budget, or that budget's error (the others are decided).
    /// On Redis Cluster every key must be in one slot.
    ///
    /// # Errors
    /// No budget or more than 10,000, or the call failed or timed out (then none is answered).
    pub async fn withdraw_batch(
        &self,
        requests: &[(&Dependency, &BudgetPolicy, u64)],
    ) -> Result<Vec<Result<Vec<Withdrawal>, StoreError>>, StoreError> {
        let keys: Vec<String> = requests.iter().map(|(d, _, _)| self.key(d)).collect();
        let entries: Vec<Entry<'_>> = requests
            .iter()
            .zip(&keys)
            .map(|((_, policy, n), key)| Entry { key, policy, n: *n })
            .collect();
        let replies = self.spend_batch(&entries).await?;
        Ok(replies
            .into_iter()
            .zip(&entries)
            .map(|(reply, entry)| {
                let (granted, snapshot, next) = reply?;
                (0..entry.n)
                    .map(|k| batch_answer(&snapshot, next, entry.n, granted, k))
                    .collect()
            })
            .collect())
    }

    /// Reads `dependency`'s budget with `status.lua` (no writes): the budget, the policy in force
    /// and what the allowance uses, and the whole reply for the fields only tools read
    /// ([`crate::control::fleet_status`]). `policy` only matters while the key has none.
    ///
    /// # Errors
    /// Redis failed, passed the store's deadline, or sent a reply the script never sends.
    pub async fn read_status(
        &self,
        dependency: &Dependency,
        policy: &BudgetPolicy,
    ) -> Result<(BudgetStatus, Vec<redis::Value>), StoreError> {
        let mut invocation = STATUS_SCRIPT.key(self.key(dependency));
        invocation.arg(policy.window_ms());
        for arg in policy_args(policy) {
            invocation.arg(arg);
        }
        let reply = self.invoke("status", invocation).await?;
        let status = parse_status(&reply, policy)?;
        Ok((status, reply))
    }

    /// [`Self::read_status`] and the values of `budget_fields` of the budget hash and of
    /// `enforcement_fields` of the enforcement switch (`HMGET`s), in one round trip: one
    /// pipeline, the three keys in the dependency's slot. Why: a reader of the whole fleet
    /// (the console, every few seconds) made three round trips per dependency.
    ///
    /// `None` when Redis refused the pipeline (the script not loaded yet on this server, a key
    /// of another type): the caller then reads them one by one, which loads the script and
    /// names the refused key.
    ///
    /// # Errors
    /// Redis could not be reached, passed the store's deadline, or sent a reply the script
    /// never sends.
    pub(crate) async fn read_status_with_fields(
        &self,
        dependency: &Dependency,
        policy: &BudgetPolicy,
        budget_fields: &[&str],
        enforcement_fields: &[&str],
    ) -> Result<Option<StatusWithFields>, StoreError> {
        let key = self.key(dependency);
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(STATUS_SCRIPT.get_hash())
            .arg(1)
            .arg(&key)
            .arg(policy.window_ms());
        for arg in policy_args(policy) {
            evalsha.arg(arg);
        }
        let mut pipe = redis::pipe();
        pipe.add_command(evalsha);
        pipe.cmd("HMGET").arg(&key).arg(budget_fields);
        pipe.cmd("HMGET")
            .arg(enforcement_key(self.prefix(), dependency))
            .arg(enforcement_fields);
        type Replies = (Vec<redis::Value>, Vec<redis::Value>, Vec<redis::Value>);
        match self.query_pipeline::<Replies>(&pipe).await {
            Ok((reply, budget, enforcement)) => {
                let status = parse_status(&reply, policy)?;
                Ok(Some(StatusWithFields {
                    status,
                    reply,
                    budget,
                    enforcement,
                }))
            }
            // A refusal of one command (NOSCRIPT, WRONGTYPE, a script's error): read one by
            // one. A connection that failed fails this read, as any other would.
            Err(StoreError::Redis(e))
                if !(e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped()) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// What [`RedisStore::read_status_with_fields`] read in one round trip.
#[derive(Debug, Clone)]
pub(crate) struct StatusWithFields {
    /// `status.lua`'s reply, parsed.
    pub(crate) status: BudgetStatus,
    /// `status.lua`'s whole reply.
    pub(crate) reply: Vec<redis::Value>,
    /// The budget hash's fields asked, in order (missing ones nil).
    pub(crate) budget: Vec<redis::Value>,
    /// The enforcement switch's fields asked, in order (missing ones nil).
    pub(crate) enforcement: Vec<redis::Value>,
}

impl BudgetStore for RedisStore {
    fn deposit<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
        deposits: Deposits,
    ) -> StoreFuture<'a, BudgetSnapshot> {
        self.deposit_with_denials(dependency, policy, deposits, 0)
    }

    fn deposit_with_denials<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
        deposits: Deposits,
        denied: u64,
    ) -> StoreFuture<'a, BudgetSnapshot> {
        Box::pin(async move {
            // ARGV: window, successes, first attempts, the policy, then (0.2.0) the denials
            // answered in this process (the script takes at most 15 digits; more is not a
            // count a process makes) and this store's memory of the hash (ARGV 9 and 10).
            let key = self.key(dependency);
            let mut invocation = DEPOSIT_SCRIPT.key(&key);
            invocation
                .arg(policy.window_ms())
                .arg(deposits.successes)
                .arg(deposits.first_attempts);
            for arg in policy_args(policy) {
                invocation.arg(arg);
            }
            invocation.arg(denied.min(999_999_999_999_999));
            for arg in self.memory.args(&key) {
                invocation.arg(arg);
            }
            let reply = self.invoke("deposit", invocation).await?;
            let ScriptReply { snapshot, .. } = self.remembered("deposit", &key, &reply, policy)?;
            Ok(snapshot)
        })
    }

    fn withdraw<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
    ) -> StoreFuture<'a, Withdrawal> {
        Box::pin(async move {
            let key = self.key(dependency);
            match &self.group {
                Some(group) => self.withdraw_grouped(group, key, policy).await,
                None => self.spend_one(&key, policy).await,
            }
        })
    }

    fn status<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
    ) -> StoreFuture<'a, BudgetSnapshot> {
        Box::pin(async move {
            let (status, _) = self.read_status(dependency, policy).await?;
            Ok(status.snapshot)
        })
    }

    fn status_in_force<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
    ) -> StoreFuture<'a, BudgetStatus> {
        Box::pin(async move {
            let (status, _) = self.read_status(dependency, policy).await?;
            Ok(status)
        })
    }

    fn kind(&self) -> &'static str {
        match self.target {
            RedisTarget::Single(_) => "redis",
            RedisTarget::Cluster(_) => "redis-cluster",
        }
    }
}
