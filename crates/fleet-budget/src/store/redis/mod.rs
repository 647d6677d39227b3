//! The fleet-wide store: the Lua scripts of `lua/` on Redis or Redis Cluster.
//!
//! One shared multiplexed connection per process (a
//! [`ConnectionManager`](redis::aio::ConnectionManager), which reconnects by itself, or a cluster
//! connection; `connect.rs` makes it), not a pool: a pool checkout costs a round trip per call
//! (`docs/BENCHMARKS.md`). Scripts go through [`redis::Script`]: `EVALSHA`, and on `NOSCRIPT`
//! (after a restart or `SCRIPT FLUSH`) `SCRIPT LOAD` and again.

use std::sync::Mutex;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::{Script, ScriptInvocation, TlsCertificates};
use tokio::sync::OnceCell;

mod connect;

pub use connect::RedisTarget;
use connect::{Connecting, Connection};

use super::group_commit::{DEFAULT_MAX_BATCH, GroupCommit, GroupCommitStats, batch_answer};
use super::scripts::{
    DEPOSIT_SCRIPT, SPEND_MANY_SCRIPT, SPEND_SCRIPT, STATUS_SCRIPT, ScriptReply, parse_reply,
    parse_status, policy_args,
};
use super::{BudgetStatus, BudgetStore, Deposits, StoreFuture, Withdrawal};
use crate::allowance::BudgetSnapshot;
use crate::config::RedisSettings;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::keys::budget_key;
use crate::policy::BudgetPolicy;
use crate::tls::TlsFiles;

/// Budgets in Redis, shared by every process that uses the same server and key prefix.
pub struct RedisStore {
    target: RedisTarget,
    prefix: String,
    timeout: Duration,
    cluster_client: Option<ClusterClient>,
    connection: OnceCell<Connection>,
    /// The cluster connection being made, when it is (see `RedisStore::connection`).
    connecting: Mutex<Option<Connecting>>,
    /// Group commit of withdrawals (`None`: one `spend.lua` call per decision).
    group: Option<GroupCommit>,
    /// Whether a group commit batch may hold several dependencies (one server only).
    across_dependencies: bool,
    /// Host and port of a `rediss://` server, to tell a handshake nobody answers from a
    /// server that is down (see [`RedisStore::ping`]).
    tls_address: Option<(String, u16)>,
    /// The certificates of `rediss://` connections, when files were given (for the other
    /// connections this store opens: discovery's `SCAN` of each node).
    certificates: Option<TlsCertificates>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.target.display())
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("max_batch", &self.max_batch())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on `target`, keys under `prefix`, every call bounded by `timeout`.
    ///
    /// Does not wait for Redis: the connection is made on first use and remade after failures,
    /// so a worker can start while Redis is down (and use its fallback meanwhile).
    ///
    /// # Errors
    /// A URL that cannot be parsed.
    pub fn new(target: RedisTarget, prefix: &str, timeout: Duration) -> Result<Self, StoreError> {
        Self::new_with_tls(target, prefix, timeout, &TlsFiles::default())
    }

    /// [`RedisStore::new`] with the certificate files of `rediss://` URLs: a CA file (instead
    /// of the system's root certificates) and a client certificate and key. Certificates and
    /// host names are always verified.
    ///
    /// # Errors
    /// A URL that cannot be parsed, certificate files that cannot be read, or files given for
    /// a URL that is not `rediss://` (the connection would not be encrypted).
    pub fn new_with_tls(
        target: RedisTarget,
        prefix: &str,
        timeout: Duration,
        tls: &TlsFiles,
    ) -> Result<Self, StoreError> {
        let certificates = connect::tls_certificates(&target, tls)?;
        let connect::Opened {
            connection,
            cluster_client,
            tls_address,
        } = connect::open(&target, timeout, certificates.as_ref())?;
        // One server takes a batch over many keys; on a cluster a script's keys share a slot.
        let across_keys = matches!(target, RedisTarget::Single(_));
        Ok(Self {
            target,
            prefix: prefix.to_owned(),
            timeout,
            cluster_client,
            connection,
            connecting: Mutex::new(None),
            group: Some(GroupCommit::new(DEFAULT_MAX_BATCH, across_keys)),
            across_dependencies: across_keys,
            tls_address,
            certificates,
        })
    }

    /// Sets group commit of withdrawals: `Some(max_batch)` (on by default, with
    /// [`DEFAULT_MAX_BATCH`](super::DEFAULT_MAX_BATCH); clamped to 1..=10,000) or `None` for one
    /// `spend.lua` call per decision. While a call is in flight on one server, the decisions
    /// that arrive, for any dependency, wait and then go together as one call (up to `max_batch`
    /// decisions: `spend_many.lua` for one dependency, `spend_batch.lua` for several); on Redis
    /// Cluster, per dependency. A lone decision never waits.
    #[must_use]
    pub fn with_group_commit(mut self, max_batch: Option<usize>) -> Self {
        let across_keys = self.across_dependencies;
        self.group = max_batch.map(|n| GroupCommit::new(n, across_keys));
        self
    }

    /// With `false`, group commit batches per dependency only, as it always does on Redis
    /// Cluster: for a single URL that is a proxy spreading keys over several servers, where a
    /// script's keys must live on one. (On by default for a single server.)
    #[must_use]
    pub fn with_batches_across_dependencies(mut self, across: bool) -> Self {
        self.across_dependencies = across && matches!(self.target, RedisTarget::Single(_));
        let across_keys = self.across_dependencies;
        self.group = self
            .group
            .map(|group| GroupCommit::new(group.max_batch(), across_keys));
        self
    }

    /// The largest batch of a group commit, `None` when it is off.
    #[must_use]
    pub fn max_batch(&self) -> Option<usize> {
        self.group.as_ref().map(GroupCommit::max_batch)
    }

    /// How many withdrawal calls this store sent and the decisions they carried (zero when group
    /// commit is off).
    #[must_use]
    pub fn group_commit_stats(&self) -> GroupCommitStats {
        self.group
            .as_ref()
            .map(GroupCommit::stats)
            .unwrap_or_default()
    }

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
        let ScriptReply {
            granted,
            snapshot,
            next_grant_ms,
            ..
        } = self.run_many(&self.key(dependency), policy, n).await?;
        let granted = u64::try_from(granted).map_err(|_| StoreError::BadReply {
            script: "spend_many",
            detail: format!("granted is {granted}"),
        })?;
        (0..n)
            .map(|k| batch_answer(&snapshot, next_grant_ms, n, granted, k))
            .collect()
    }

    /// One `spend_many.lua` call of `n` on `key`.
    pub(super) async fn run_many(
        &self,
        key: &str,
        policy: &BudgetPolicy,
        n: u64,
    ) -> Result<ScriptReply, StoreError> {
        self.run_key(&SPEND_MANY_SCRIPT, "spend_many", key, policy, &[n])
            .await
    }

    /// One `spend.lua` call on `key`.
    pub(super) async fn spend_one(
        &self,
        key: &str,
        policy: &BudgetPolicy,
    ) -> Result<Withdrawal, StoreError> {
        let ScriptReply {
            granted,
            snapshot,
            next_grant_ms,
            ..
        } = self
            .run_key(&SPEND_SCRIPT, "spend", key, policy, &[])
            .await?;
        match granted {
            0 | 1 => Ok(Withdrawal {
                granted: granted == 1,
                snapshot,
                next_grant_ms,
            }),
            other => Err(StoreError::BadReply {
                script: "spend",
                detail: format!("granted is {other}, expected 0 or 1"),
            }),
        }
    }

    /// A store as `settings` describe it: target, key prefix, deadline and TLS files.
    ///
    /// # Errors
    /// A URL that cannot be parsed, or TLS files that cannot be used.
    pub fn from_settings(settings: &RedisSettings) -> Result<Self, StoreError> {
        Ok(Self::new_with_tls(
            RedisTarget::from_settings(settings),
            &settings.key_prefix,
            settings.timeout,
            &settings.tls,
        )?
        .with_batches_across_dependencies(settings.batch_across_dependencies))
    }

    /// Where the store points, passwords redacted.
    #[must_use]
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    /// The key prefix.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The deadline of every call.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The budget key of `dependency`.
    #[must_use]
    pub fn key(&self, dependency: &Dependency) -> String {
        budget_key(&self.prefix, dependency)
    }

    /// Runs `script` (called `name` in errors) on `dependency`'s key with the arguments of
    /// `lua/README.md`: the window, the script's `own`, then the policy's; decodes the reply.
    async fn run(
        &self,
        script: &Script,
        name: &'static str,
        dependency: &Dependency,
        policy: &BudgetPolicy,
        own: &[u64],
    ) -> Result<ScriptReply, StoreError> {
        self.run_key(script, name, &self.key(dependency), policy, own)
            .await
    }

    /// [`Self::run`] on `key`.
    async fn run_key(
        &self,
        script: &Script,
        name: &'static str,
        key: &str,
        policy: &BudgetPolicy,
        own: &[u64],
    ) -> Result<ScriptReply, StoreError> {
        let mut invocation = script.key(key);
        invocation.arg(policy.window_ms());
        for arg in own {
            invocation.arg(*arg);
        }
        for arg in policy_args(policy) {
            invocation.arg(arg);
        }
        let reply = self.invoke(name, invocation).await?;
        parse_reply(name, &reply, policy)
    }

    /// Runs one command within the store's deadline (for tools: overrides, the audit stream).
    ///
    /// # Errors
    /// The call failed or passed its deadline.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        let call = async {
            let reply: T = match self.connection().await? {
                Connection::Single(mut c) => cmd.query_async(&mut c).await?,
                Connection::Cluster(mut c) => cmd.query_async(&mut c).await?,
            };
            Ok::<_, StoreError>(reply)
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
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

    /// Runs `invocation` (its keys and arguments set) within the store's deadline.
    ///
    /// # Errors
    /// The call failed or passed its deadline.
    pub async fn invoke(
        &self,
        script: &'static str,
        invocation: ScriptInvocation<'_>,
    ) -> Result<Vec<redis::Value>, StoreError> {
        let call = async {
            let reply: Vec<redis::Value> = match self.connection().await? {
                Connection::Single(mut c) => invocation.invoke_async(&mut c).await?,
                Connection::Cluster(mut c) => invocation.invoke_async(&mut c).await?,
            };
            Ok::<_, StoreError>(reply)
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(reply) => reply.map_err(|e| match e {
                StoreError::BadReply { detail, .. } => StoreError::BadReply { script, detail },
                StoreError::Redis(e) => bad_key(&e).unwrap_or(StoreError::Redis(e)),
                other => other,
            }),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

/// The scripts' refusal of a key (`fleet-budget: key <key> ...`, lua/README.md) as a
/// [`StoreError::BadKey`].
fn bad_key(e: &redis::RedisError) -> Option<StoreError> {
    if e.code() != Some("fleet-budget:") {
        return None;
    }
    key_refusal(e.detail()?)
}

/// The text after `fleet-budget: ` of a script's refusal of a key, as a [`StoreError::BadKey`].
pub(super) fn key_refusal(text: &str) -> Option<StoreError> {
    let rest = text.strip_prefix("key ")?;
    let at = [" is not a budget hash", " is not a breaker hash", " field "]
        .iter()
        .filter_map(|marker| rest.find(marker))
        .min()?;
    let (key, detail) = rest.split_at(at);
    Some(StoreError::BadKey {
        key: key.to_owned(),
        detail: detail.trim_start().to_owned(),
    })
}

impl BudgetStore for RedisStore {
    fn deposit<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
        deposits: Deposits,
    ) -> StoreFuture<'a, BudgetSnapshot> {
        Box::pin(async move {
            let own = [deposits.successes, deposits.first_attempts];
            let reply = self
                .run(&DEPOSIT_SCRIPT, "deposit", dependency, policy, &own)
                .await?;
            Ok(reply.snapshot)
        })
    }

    fn withdraw<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
    ) -> StoreFuture<'a, Withdrawal> {
        Box::pin(async move {
            match &self.group {
                Some(group) => self.withdraw_grouped(group, dependency, policy).await,
                None => self.spend_one(&self.key(dependency), policy).await,
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
