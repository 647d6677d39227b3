//! A dependency's budget as the fleet sees it: `status.lua`'s full reply (the policy in force,
//! which may differ from the reader's, and the conflicts workers reported) with the overrides.

use serde::Serialize;

use super::overrides::{self, Overrides};
use crate::allowance::BudgetSnapshot;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::policy::BudgetPolicy;
use crate::store::{RedisStore, int_at, text_at};

/// What `budgetctl status` shows for one dependency.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetStatus {
    /// The budget under the policy in force (allowance after overrides; 0 while frozen).
    pub snapshot: BudgetSnapshot,
    /// The policy in force (the reader's own when the key has none yet).
    #[serde(serialize_with = "policy_json")]
    pub policy: BudgetPolicy,
    /// The key's time to live in ms (`None` when there is no key, or while it has no expiry:
    /// an operator's override in force, `lua/README.md` "Lost budgets").
    pub ttl_ms: Option<u64>,
    /// Calls that sent another policy, since the key was created.
    pub conflicts: u64,
    /// The last such policy (`window_ms ratio min_allowance basis mode`).
    pub conflicting_policy: Option<String>,
    /// How long ago it was sent (ms).
    pub conflict_age_ms: Option<u64>,
    /// Server ms of the read.
    pub now_ms: u64,
    /// The overrides in force.
    pub overrides: Overrides,
}

fn policy_json<S: serde::Serializer>(p: &BudgetPolicy, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut st = s.serialize_struct("Policy", 5)?;
    st.serialize_field("window_ms", &p.window_ms())?;
    st.serialize_field("ratio", &p.ratio)?;
    st.serialize_field("min_allowance", &p.min_allowance)?;
    st.serialize_field("deposit", p.deposit.as_str())?;
    st.serialize_field("mode", p.mode.as_str())?;
    st.end()
}

/// Reads `dependency`'s budget; `policy` only matters while the key has no policy in force.
///
/// # Errors
/// Redis failed, passed the store's deadline, or sent a reply the script never sends.
pub async fn fleet_status(
    store: &RedisStore,
    dependency: &Dependency,
    policy: &BudgetPolicy,
) -> Result<FleetStatus, StoreError> {
    let (status, reply) = store.read_status(dependency, policy).await?;
    // The server time of the status read is the one that matters: no `TIME` call.
    let stored = overrides::read_stored(store, dependency).await?;
    from_reads(status, &reply, stored)
}

/// The fleet status from `status.lua`'s reply (parsed and whole) and the overrides stored.
///
/// # Errors
/// A reply the script never sends.
pub(crate) fn from_reads(
    status: crate::store::BudgetStatus,
    reply: &[redis::Value],
    stored: Overrides,
) -> Result<FleetStatus, StoreError> {
    let bad = |detail: String| StoreError::BadReply {
        script: "status",
        detail,
    };
    let ttl = int_at(reply, 21).map_err(bad)?;
    let conflicts = int_at(reply, 22).map_err(bad)?;
    let last = text_at(reply, 23).map_err(bad)?;
    let age = int_at(reply, 24).map_err(bad)?;
    let s = status.snapshot;
    let now_ms = s
        .window_index
        .saturating_mul(s.window_ms)
        .saturating_add(s.elapsed_ms);
    Ok(FleetStatus {
        snapshot: s,
        policy: status.policy,
        ttl_ms: u64::try_from(ttl).ok(),
        conflicts: u64::try_from(conflicts).unwrap_or_default(),
        conflicting_policy: Some(last).filter(|l| !l.is_empty()),
        conflict_age_ms: u64::try_from(age).ok(),
        now_ms,
        overrides: stored.active_at(now_ms),
    })
}
