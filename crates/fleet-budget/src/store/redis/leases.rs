//! The concurrency budget's calls: `lease_acquire.lua` and `lease_release.lua` on a dependency's
//! two lease sets (`<budget key>:lp` and `:lr`, the budget's hash-tag slot). What to ask and
//! what the answer means is `crate::concurrency`'s; this file only calls.

use redis::Value;

use super::RedisStore;
use super::scripts::{LEASE_ACQUIRE_SCRIPT, LEASE_RELEASE_SCRIPT};
use crate::dependency::Dependency;
use crate::error::StoreError;

/// The arguments of `lua/lease_acquire.lua` (`lua/README.md`, "Leases").
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseArgs<'a> {
    /// `p` (primary) or `r` (retry, hedge).
    pub(crate) kind: &'static str,
    /// The lease id, unique in the fleet.
    pub(crate) id: &'a str,
    /// How long the lease lives (ms).
    pub(crate) lease_ms: u64,
    /// The most calls in flight.
    pub(crate) cap: u64,
    /// The retry share of the primaries in flight.
    pub(crate) max_retry_fraction: f64,
    /// The retry slots there always are.
    pub(crate) min_retry_slots: u64,
    /// Whether primaries are refused at the cap.
    pub(crate) primary_waits: bool,
}

impl RedisStore {
    /// The two lease sets of `dependency`: primary, retry.
    #[must_use]
    pub(crate) fn lease_keys(&self, dependency: &Dependency) -> [String; 2] {
        let base = self.key(dependency);
        [format!("{base}:lp"), format!("{base}:lr")]
    }

    /// One `lease_acquire.lua` call: its reply as sent.
    ///
    /// # Errors
    /// The store failed, passed its deadline, or refused a lease set of another type
    /// ([`StoreError::BadKey`] naming it).
    pub(crate) async fn lease_acquire(
        &self,
        dependency: &Dependency,
        args: &LeaseArgs<'_>,
    ) -> Result<Vec<Value>, StoreError> {
        let keys = self.lease_keys(dependency);
        let [lp, lr] = &keys;
        let mut invocation = LEASE_ACQUIRE_SCRIPT.key(lp);
        invocation
            .key(lr)
            .arg(args.kind)
            .arg(args.id)
            .arg(args.lease_ms)
            .arg(args.cap)
            .arg(args.max_retry_fraction.to_string())
            .arg(args.min_retry_slots)
            .arg(if args.primary_waits { "1" } else { "0" });
        self.invoke("lease_acquire", invocation)
            .await
            .map_err(|e| refused_key(e, &keys))
    }

    /// One `lease_release.lua` call for the lease `id`: its reply as sent.
    ///
    /// # Errors
    /// As [`RedisStore::lease_acquire`].
    pub(crate) async fn lease_release(
        &self,
        dependency: &Dependency,
        id: &str,
    ) -> Result<Vec<Value>, StoreError> {
        let keys = self.lease_keys(dependency);
        let [lp, lr] = &keys;
        let mut invocation = LEASE_RELEASE_SCRIPT.key(lp);
        invocation.key(lr).arg(id);
        self.invoke("lease_release", invocation)
            .await
            .map_err(|e| refused_key(e, &keys))
    }
}

/// The scripts' refusal of one of `keys` (`fleet-budget: key <key> is not a lease set: WRONGTYPE
/// ...`: anyone with access to Redis can overwrite it with another type) as a
/// [`StoreError::BadKey`] naming that key; any other error as it is.
fn refused_key(e: StoreError, keys: &[String; 2]) -> StoreError {
    let StoreError::Redis(redis_error) = &e else {
        return e;
    };
    if redis_error.code() != Some("fleet-budget:") {
        return e;
    }
    let Some(rest) = redis_error.detail().and_then(|d| d.strip_prefix("key ")) else {
        return e;
    };
    for key in keys {
        if let Some(detail) = rest
            .strip_prefix(key.as_str())
            .and_then(|d| d.strip_prefix(" is not a lease set"))
        {
            return StoreError::BadKey {
                key: key.clone(),
                detail: format!("is not a lease set{detail}"),
            };
        }
    }
    e
}

impl RedisStore {
    /// Calls in flight on `dependency` at server time `now_ms`: the leases of its two sets that
    /// have not expired (each lease is scored by its expiry), in one round trip (the two sets
    /// share the budget's slot). A read for tools: nothing is pruned.
    ///
    /// # Errors
    /// The store failed or passed its deadline; a lease set of another type (written by hand)
    /// is a [`StoreError::BadKey`] naming it.
    pub async fn leases_in_flight(
        &self,
        dependency: &Dependency,
        now_ms: u64,
    ) -> Result<u64, StoreError> {
        let keys = self.lease_keys(dependency);
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("ZCOUNT").arg(key).arg(now_ms).arg("+inf");
        }
        match self.query_pipeline::<(u64, u64)>(&pipe).await {
            Ok((primary, retry)) => Ok(primary.saturating_add(retry)),
            Err(StoreError::Redis(e)) if e.code() == Some("WRONGTYPE") => {
                // Which of the two: the one whose type is not a sorted set.
                for key in keys {
                    let kind: String = self.query(redis::cmd("TYPE").arg(&key)).await?;
                    if kind != "zset" && kind != "none" {
                        return Err(StoreError::BadKey {
                            key,
                            detail: format!("is not a lease set: it holds a {kind}"),
                        });
                    }
                }
                Err(StoreError::Redis(e))
            }
            Err(e) => Err(e),
        }
    }
}
