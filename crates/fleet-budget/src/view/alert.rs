//! What an operator should look at: the alerts of a dependency, each with a severity and a
//! text, judged from its [`DependencyView`] alone (no I/O), so that every front end raises the
//! same alerts for the same figures.

use serde::Serialize;

use super::DependencyView;
use crate::breaker::BreakerState;
use crate::decision::Enforcement;

/// Amplification (executions per first attempt over the last window) above which a dependency
/// is alerted on: retries above half of the first attempts (docs/semantics.md,
/// "Observability").
pub const AMPLIFICATION_ALERT: f64 = 1.5;

/// What kind of trouble an [`Alert`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AlertKind {
    /// An operator froze retries: none is granted, the floor included.
    Frozen,
    /// The circuit breaker is open or half-open: jobs wait instead of calling.
    Breaker,
    /// The budget is spent and retries are being denied (dead-lettered).
    Exhausted,
    /// In shadow, the budget is spent: what it refuses is counted and retried anyway.
    Shadow,
    /// Retries are above [`AMPLIFICATION_ALERT`] of the first attempts.
    Amplified,
    /// Retries were denied in the last window (the budget has room again now).
    Denials,
    /// Calls sent another policy than the one in force in Redis.
    PolicyConflict,
}

impl AlertKind {
    /// The name in JSON: `frozen`, `breaker`, `exhausted`, `shadow`, `amplified`, `denials`,
    /// `policy_conflict`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Frozen => "frozen",
            Self::Breaker => "breaker",
            Self::Exhausted => "exhausted",
            Self::Shadow => "shadow",
            Self::Amplified => "amplified",
            Self::Denials => "denials",
            Self::PolicyConflict => "policy_conflict",
        }
    }

    /// How bad, from 1 (look when you can) to 5 (an operator's hand is on it): frozen 5,
    /// breaker 4, exhausted 3, shadow and amplified 2, denials and policy conflict 1. Front ends sort by
    /// it, worst first.
    #[must_use]
    pub fn severity(self) -> u8 {
        match self {
            Self::Frozen => 5,
            Self::Breaker => 4,
            Self::Exhausted => 3,
            Self::Shadow | Self::Amplified => 2,
            Self::Denials | Self::PolicyConflict => 1,
        }
    }
}

/// One alert on a dependency: its kind, its severity ([`AlertKind::severity`]) and the words
/// every front end shows. The text holds no text from Redis (only numbers), so it needs no
/// escaping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alert {
    /// What kind of trouble.
    pub kind: AlertKind,
    /// From 1 to 5 ([`AlertKind::severity`]).
    pub severity: u8,
    /// For people.
    pub text: String,
}

impl Alert {
    fn new(kind: AlertKind, text: impl Into<String>) -> Self {
        Self {
            kind,
            severity: kind.severity(),
            text: text.into(),
        }
    }
}

/// Every alert `view` deserves, worst first (an empty list: nothing to look at).
pub(super) fn judge(view: &DependencyView) -> Vec<Alert> {
    let mut alerts = Vec::new();
    if view.overrides.freeze.is_some() {
        alerts.push(Alert::new(
            AlertKind::Frozen,
            "FROZEN: an operator froze retries",
        ));
    }
    match view.breaker.as_ref().map(|b| b.state) {
        Some(BreakerState::Open) => alerts.push(Alert::new(
            AlertKind::Breaker,
            "BREAKER: circuit open, jobs wait instead of calling",
        )),
        Some(BreakerState::HalfOpen) => alerts.push(Alert::new(
            AlertKind::Breaker,
            "BREAKER: circuit half-open, probes decide whether calls resume",
        )),
        _ => {}
    }
    let exhausted = view.retries_denied > 0 && view.remaining == 0;
    if exhausted && view.enforcement == Enforcement::Shadow {
        alerts.push(Alert::new(
            AlertKind::Shadow,
            "SHADOW: budget exhausted, refused retries are retried anyway",
        ));
    } else if exhausted {
        alerts.push(Alert::new(
            AlertKind::Exhausted,
            "DENYING: budget exhausted, retries are dead-lettered",
        ));
    }
    if view.amplification.is_some_and(|a| a > AMPLIFICATION_ALERT) {
        alerts.push(Alert::new(
            AlertKind::Amplified,
            format!(
                "AMPLIFIED: retries above {:.0}% of traffic",
                (AMPLIFICATION_ALERT - 1.0) * 100.0
            ),
        ));
    }
    if view.retries_denied > 0 && !exhausted {
        alerts.push(Alert::new(AlertKind::Denials, "denials in the last window"));
    }
    if view.conflicting_policy.is_some() {
        alerts.push(Alert::new(
            AlertKind::PolicyConflict,
            format!(
                "policy conflict: {} calls sent another policy, served by the policy in force",
                view.conflicts
            ),
        ));
    }
    // Stable: of equal severity, the order above.
    alerts.sort_by_key(|a| std::cmp::Reverse(a.severity));
    alerts
}
