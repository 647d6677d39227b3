//! Operators' overrides of a dependency's budget: a freeze (no retry at all, the floor included)
//! or a set (ratio and/or floor), each ending by itself. Written atomically by
//! `lua/override.lua` into the budget hash, where every script reads them (`lua/README.md`,
//! "Overrides"); every change is recorded in the [`super::AuditLog`]. An `unfreeze` or `clear`
//! first writes the dependency's lift record, which tells a [`super::keeper`] a lift from a loss.

use std::time::Duration;

use redis::Value;
use serde::Serialize;

use super::audit::{AuditEntry, AuditLog};
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::store::{RedisStore, field_text, field_u64};

/// The longest override `lua/override.lua` takes: 366 days.
pub const MAX_OVERRIDE_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);
/// The longest actor `lua/override.lua` takes, in bytes.
pub const MAX_ACTOR_BYTES: usize = 200;
/// The longest reason `lua/override.lua` takes, in bytes.
pub const MAX_REASON_BYTES: usize = 1000;

/// An override to apply.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OverrideAction {
    /// No retry is granted for the dependency, the floor included, for this long.
    Freeze {
        /// How long.
        duration: Duration,
    },
    /// Lifts a freeze.
    Unfreeze,
    /// Replaces the ratio and/or the floor for this long (at least one of them).
    Set {
        /// How long.
        duration: Duration,
        /// The ratio in force meanwhile.
        ratio: Option<f64>,
        /// The floor in force meanwhile.
        min_allowance: Option<u64>,
    },
    /// Removes every override.
    Clear,
}

impl OverrideAction {
    /// The audit name: `freeze`, `unfreeze`, `set`, `clear`.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Freeze { .. } => "freeze",
            Self::Unfreeze => "unfreeze",
            Self::Set { .. } => "set",
            Self::Clear => "clear",
        }
    }
}

/// A freeze in the budget hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Freeze {
    /// Server ms when it ends.
    pub until_ms: u64,
    /// Who set it.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// Server ms when it was set.
    pub since_ms: u64,
}

/// A set override in the budget hash.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetOverride {
    /// Server ms when it ends.
    pub until_ms: u64,
    /// The ratio in force meanwhile, if replaced.
    pub ratio: Option<f64>,
    /// The floor in force meanwhile, if replaced.
    pub min_allowance: Option<u64>,
    /// Who set it.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// Server ms when it was set.
    pub since_ms: u64,
}

/// The overrides of a dependency (those stored; see [`Overrides::active_at`] for the ones in
/// force).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Overrides {
    /// The freeze, if any.
    pub freeze: Option<Freeze>,
    /// The set override, if any.
    pub set: Option<SetOverride>,
}

/// The override fields, in the order `override.lua` replies with them.
pub(crate) const FIELDS: [&str; 10] = ["fu", "fa", "fy", "ft", "su", "sr", "sm", "sa", "sy", "st"];

impl Overrides {
    /// Those still in force at server time `now_ms` (expired ones stay in the hash, inert).
    #[must_use]
    pub fn active_at(mut self, now_ms: u64) -> Self {
        self.freeze = self.freeze.filter(|f| f.until_ms > now_ms);
        self.set = self.set.filter(|s| s.until_ms > now_ms);
        self
    }

    /// Whether there is none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.freeze.is_none() && self.set.is_none()
    }

    /// From the values of [`FIELDS`], in order (missing ones nil).
    pub(crate) fn from_values(values: &[Value]) -> Self {
        let text = |i: usize| field_text(values, i);
        let number = |i: usize| field_u64(values, i);
        let freeze = number(0).map(|until_ms| Freeze {
            until_ms,
            actor: text(1).unwrap_or_default(),
            reason: text(2).unwrap_or_default(),
            since_ms: number(3).unwrap_or_default(),
        });
        let set = number(4).map(|until_ms| SetOverride {
            until_ms,
            ratio: text(5)
                .and_then(|t| t.parse::<f64>().ok())
                .filter(|r| r.is_finite() && *r >= 0.0),
            min_allowance: number(6),
            actor: text(7).unwrap_or_default(),
            reason: text(8).unwrap_or_default(),
            since_ms: number(9).unwrap_or_default(),
        });
        Self { freeze, set }
    }
}

/// What an override call changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// Server ms of the change.
    pub at_ms: u64,
    /// The overrides in force before.
    pub before: Overrides,
    /// The overrides in force after.
    pub after: Overrides,
}

/// Reads `dependency`'s overrides and the server's time (ms).
///
/// # Errors
/// Redis failed or passed the store's deadline.
pub async fn read(
    store: &RedisStore,
    dependency: &Dependency,
) -> Result<(u64, Overrides), StoreError> {
    let values = store.budget_fields(dependency, &FIELDS).await?;
    let now_ms = store.server_time_ms().await?;
    Ok((now_ms, Overrides::from_values(&values)))
}

/// The overrides stored for `dependency` (in force or expired: [`Overrides::active_at`] tells),
/// in one round trip.
///
/// # Errors
/// Redis failed or passed the store's deadline.
pub(crate) async fn read_stored(
    store: &RedisStore,
    dependency: &Dependency,
) -> Result<Overrides, StoreError> {
    let values = store.budget_fields(dependency, &FIELDS).await?;
    Ok(Overrides::from_values(&values))
}

/// Applies `action` to `dependency` as `actor` for `reason`, and records it in `audit`.
///
/// # Errors
/// Redis refused it (a bad value names itself) or failed; the audit record failed (the override
/// is then in place: the error says so).
pub async fn apply(
    store: &RedisStore,
    audit: &AuditLog,
    dependency: &Dependency,
    action: OverrideAction,
    actor: &str,
    reason: &str,
) -> Result<Change, StoreError> {
    if matches!(action, OverrideAction::Unfreeze | OverrideAction::Clear) {
        record_lift(store, dependency).await?;
    }
    let mut args = vec![action.as_str().to_owned()];
    match action {
        OverrideAction::Freeze { duration } => {
            args.extend([
                millis(duration).to_string(),
                actor.to_owned(),
                reason.to_owned(),
            ]);
        }
        OverrideAction::Set {
            duration,
            ratio,
            min_allowance,
        } => {
            args.extend([
                millis(duration).to_string(),
                actor.to_owned(),
                reason.to_owned(),
                ratio.map(|r| r.to_string()).unwrap_or_default(),
                min_allowance.map(|m| m.to_string()).unwrap_or_default(),
            ]);
        }
        OverrideAction::Unfreeze | OverrideAction::Clear => {}
    }
    let reply = store.run_override(dependency, &args).await?;
    let at_ms = match reply.first() {
        Some(Value::Int(ms)) => u64::try_from(*ms).unwrap_or_default(),
        other => {
            return Err(StoreError::BadReply {
                script: "override",
                detail: format!("the time is {other:?}"),
            });
        }
    };
    let before = Overrides::from_values(reply.get(1..).unwrap_or_default()).active_at(at_ms);
    let (_, after) = read(store, dependency).await?;
    let change = Change {
        at_ms,
        before,
        after: after.active_at(at_ms),
    };
    audit
        .record(
            store,
            &AuditEntry::new(actor, action.as_str(), Some(dependency.as_str()), reason)
                .with_before_after(&change.before, &change.after),
        )
        .await?;
    Ok(change)
}

/// Writes `dependency`'s lift record ([`super::keeper::lift_key`]) before an `unfreeze` or a
/// `clear`: the server ms of the lift, lasting [`super::keeper::LIFT_RECORD_TTL`]. A keeper that
/// finds an override it kept gone from a hash that is not the one it was in reads it to tell a
/// lift (an override set before the record) from a loss. Written first, so that no keeper can
/// see the override gone without the record.
async fn record_lift(store: &RedisStore, dependency: &Dependency) -> Result<(), StoreError> {
    let now_ms = store.server_time_ms().await?;
    let key = super::keeper::lift_key(store.prefix(), dependency);
    let mut hset = redis::cmd("HSET");
    hset.arg(&key).arg("at").arg(now_ms);
    let _: i64 = store.query(&hset).await?;
    let mut pexpire = redis::cmd("PEXPIRE");
    pexpire
        .arg(&key)
        .arg(millis(super::keeper::LIFT_RECORD_TTL));
    let _: i64 = store.query(&pexpire).await?;
    Ok(())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
