//! The fleet-wide store, and every call the core crate makes to Redis: the Lua scripts of
//! `lua/` on Redis or Redis Cluster, and the few plain commands tools need.
//!
//! One shared multiplexed connection per process (a
//! [`ConnectionManager`](redis::aio::ConnectionManager), which reconnects by itself, or a cluster
//! connection; `connect.rs` makes it), not a pool: a pool checkout costs a round trip per call
//! (`docs/BENCHMARKS.md`). One file per kind of call, each going through `call.rs` (the deadline):
//!
//! - `budget.rs`: the budget ([`BudgetStore`] for this store, `status.lua` for tools);
//! - `spend.rs`: the spend scripts; `batch.rs` and `group_commit.rs` beside it, group commit of
//!   the withdrawals they decide;
//! - `leases.rs`: the concurrency budget's leases (`crate::concurrency` decides what to ask);
//! - `breaker.rs`: the circuit breaker's script (`crate::breaker` reads its answers);
//! - `overrides.rs`: operators' overrides and the audit stream (`crate::control`);
//! - `discovery.rs`: which dependencies have a budget (`SCAN`);
//! - `workers.rs`: the worker registry (`heartbeat.lua`, and the reads of `crate::control`);
//! - `scripts.rs`: the one place scripts are loaded; `reply.rs`: decoding their replies.

use std::sync::Mutex;
use std::time::Duration;

use redis::TlsCertificates;
use redis::cluster::ClusterClient;
use tokio::sync::OnceCell;

mod batch;
mod breaker;
mod budget;
mod call;
mod connect;
mod dead_letters;
mod discovery;
mod enforcement;
mod group_commit;
mod leases;
mod memory;
mod overrides;
mod reply;
mod scripts;
mod spend;
mod workers;

pub(crate) use breaker::BreakerArgs;
pub use connect::RedisTarget;
use connect::{Connecting, Connection};
pub use discovery::DiscoveryError;
use group_commit::GroupCommit;
pub use group_commit::{DEFAULT_MAX_BATCH, GroupCommitStats, MAX_BATCH_LIMIT};
pub(crate) use leases::LeaseArgs;
pub use reply::{ScriptReply, parse_reply, parse_status};
pub(crate) use reply::{count_at, field_text, field_u64, int_at, text_at};
pub use scripts::{
    BREAKER_SCRIPT, DEAD_LETTERS_SCRIPT, DEPOSIT_SCRIPT, HEARTBEAT_SCRIPT, LEASE_ACQUIRE_SCRIPT,
    LEASE_RELEASE_SCRIPT, OVERRIDE_SCRIPT, SPEND_BATCH_SCRIPT, SPEND_MANY_SCRIPT, SPEND_SCRIPT,
    STATUS_SCRIPT, policy_args,
};
pub use spend::batch_answer;
pub(crate) use workers::Report;

use crate::config::RedisSettings;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::keys::budget_key;
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
    /// What this process last saw of each budget hash, sent with every budget call so that a
    /// hash lost mid-window is restored (`memory.rs`).
    memory: memory::Memory,
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
            memory: memory::Memory::default(),
        })
    }

    /// Sets group commit of withdrawals: `Some(max_batch)` (on by default, with
    /// [`DEFAULT_MAX_BATCH`]; clamped to 1..=10,000) or `None` for one
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

    /// Forgets what this store remembers of the budget hashes (`lua/README.md`, "Lost
    /// budgets"): its next calls restore nothing. For tests and tools that empty Redis on
    /// purpose.
    pub fn forget_budgets(&self) {
        self.memory.clear();
    }

    /// The budget key of `dependency`.
    #[must_use]
    pub fn key(&self, dependency: &Dependency) -> String {
        budget_key(&self.prefix, dependency)
    }
}
