//! Operators' switch between shadow and enforcement (`budgetctl budget shadow|enforce`): which
//! [`Enforcement`] a dependency is held to instead of its configured one, by whom, why, and
//! until when. Kept in a key of its own beside the budget hash
//! ([`crate::keys::enforcement_key`]), which expires with the switch, so an ended switch leaves
//! nothing behind; workers read it when their budget refuses a retry, at most once per deny
//! cache staleness per dependency (`crate::budget`), so a switch reaches the fleet within that
//! staleness. Every switch is recorded in the [`super::AuditLog`].

use std::time::Duration;

use redis::Value;
use serde::Serialize;

use super::audit::{AuditEntry, AuditLog};
use super::overrides::{MAX_ACTOR_BYTES, MAX_OVERRIDE_DURATION, MAX_REASON_BYTES};
use crate::decision::Enforcement;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::store::{RedisStore, field_text, field_u64};

/// An operator's switch in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EnforcementSwitch {
    /// The enforcement in force meanwhile.
    pub enforcement: Enforcement,
    /// Server ms when it ends; `None`: until the next switch.
    pub until_ms: Option<u64>,
    /// Who switched.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// Server ms when it was switched.
    pub since_ms: u64,
}

/// The switch's fields, in the order [`EnforcementSwitch::from_values`] reads them.
pub(crate) const FIELDS: [&str; 5] = ["m", "u", "a", "y", "t"];

impl EnforcementSwitch {
    /// From the values of [`FIELDS`], in order; `None` when there is no switch or its mode is
    /// not one this build knows (written by hand: ignored, the configuration decides).
    pub(crate) fn from_values(values: &[Value]) -> Option<Self> {
        let text = |i: usize| field_text(values, i);
        let number = |i: usize| field_u64(values, i);
        Some(Self {
            enforcement: Enforcement::parse(&text(0)?)?,
            until_ms: number(1),
            actor: text(2).unwrap_or_default(),
            reason: text(3).unwrap_or_default(),
            since_ms: number(4).unwrap_or_default(),
        })
    }
}

/// `dependency`'s switch in force, if any.
///
/// # Errors
/// Redis failed or passed the store's deadline.
pub async fn read(
    store: &RedisStore,
    dependency: &Dependency,
) -> Result<Option<EnforcementSwitch>, StoreError> {
    let values = store.enforcement_fields(dependency, &FIELDS).await?;
    Ok(EnforcementSwitch::from_values(&values))
}

/// What a switch changed: the switch in force before (`None`: the configuration decided) and
/// after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Switched {
    /// Server ms of the switch.
    pub at_ms: u64,
    /// The switch in force before.
    pub before: Option<EnforcementSwitch>,
    /// The switch in force now.
    pub after: EnforcementSwitch,
}

/// Holds `dependency` to `enforcement` for `duration` (`None`: until the next switch) as
/// `actor` for `reason`, replacing any switch in force, and records it in `audit` (action
/// `shadow` or `enforce`).
///
/// # Errors
/// A duration outside 1 ms to 366 days, or an actor or reason too long (nothing written);
/// Redis failed; the audit record failed (the switch is then in place).
pub async fn switch(
    store: &RedisStore,
    audit: &AuditLog,
    dependency: &Dependency,
    enforcement: Enforcement,
    duration: Option<Duration>,
    actor: &str,
    reason: &str,
) -> Result<Switched, StoreError> {
    if let Some(d) = duration
        && (d.is_zero() || d > MAX_OVERRIDE_DURATION)
    {
        return Err(invalid("duration must be from 1 ms to 366 days"));
    }
    if actor.len() > MAX_ACTOR_BYTES || reason.len() > MAX_REASON_BYTES {
        return Err(invalid("actor (200 bytes) or reason (1000 bytes) too long"));
    }
    let before = read(store, dependency).await?;
    let at_ms = store.server_time_ms().await?;
    let expire_ms = duration.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let after = EnforcementSwitch {
        enforcement,
        until_ms: expire_ms.map(|ms| at_ms.saturating_add(ms)),
        actor: actor.to_owned(),
        reason: reason.to_owned(),
        since_ms: at_ms,
    };
    let mut fields = vec![
        ("m", enforcement.as_str().to_owned()),
        ("a", after.actor.clone()),
        ("y", after.reason.clone()),
        ("t", at_ms.to_string()),
    ];
    if let Some(until) = after.until_ms {
        fields.push(("u", until.to_string()));
    }
    store
        .replace_enforcement(dependency, &fields, expire_ms)
        .await?;
    audit
        .record(
            store,
            &AuditEntry::new(
                actor,
                enforcement.as_str(),
                Some(dependency.as_str()),
                reason,
            )
            .with_before_after(&before, &after),
        )
        .await?;
    Ok(Switched {
        at_ms,
        before,
        after,
    })
}

/// A value refused before anything is written, as Redis's refusals of `override.lua` are.
fn invalid(detail: &'static str) -> StoreError {
    StoreError::Redis(redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "fleet-budget: enforcement switch",
        detail.to_owned(),
    )))
}
