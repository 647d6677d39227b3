//! What `status` shows of a dependency, as figures: the budget's sliding estimates, the policy in
//! force, conflicts and overrides, and the alert an operator should look at; the keys that
//! cannot be used; the whole report (the `--json` shape).

use fleet_budget::breaker::BreakerState;
use fleet_budget::control::{FleetStatus, Overrides};
use fleet_budget::{BudgetSnapshot, Dependency, WindowCounters};
use serde::Serialize;

use super::breaker::BreakerLine;

/// Amplification above this, sustained, deserves an alert (docs/semantics: "Observability").
pub(super) const AMPLIFICATION_ALERT: f64 = 1.5;

/// One dependency's budget, as `status` shows it. Counts are the sliding estimates over the
/// last window (current window + the part of the previous one still inside it), the same
/// numbers the allowance is computed from.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DependencyStatus {
    pub(crate) dependency: String,
    pub(crate) window_secs: f64,
    pub(crate) window_remaining_secs: f64,
    pub(crate) successes: u64,
    pub(crate) first_attempts: u64,
    /// First attempts and retries granted.
    pub(crate) executions: u64,
    pub(crate) retries_granted: u64,
    pub(crate) retries_denied: u64,
    pub(crate) allowance: u64,
    pub(crate) remaining: u64,
    /// Executions per job, `executions / first_attempts`; null without traffic.
    pub(crate) amplification: Option<f64>,
    /// The policy in force in Redis (`window_ms ratio min_allowance basis mode`), not the CLI's.
    pub(crate) policy_in_force: String,
    /// Calls that sent another policy, the last of them, and how long ago (s).
    pub(crate) conflicts: u64,
    pub(crate) conflicting_policy: Option<String>,
    pub(crate) conflict_age_secs: Option<f64>,
    /// The operators' overrides in force, with who, why and when they expire.
    pub(crate) overrides: Overrides,
    /// Server ms of the read (override times are server ms too).
    pub(crate) now_ms: u64,
    /// The current window's index (server time / window length), for `--watch`'s trend.
    #[serde(skip)]
    pub(crate) window_index: u64,
    /// The circuit breaker, for a dependency with a `[dependencies.X.breaker]` section.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) breaker: Option<BreakerLine>,
    /// `enforce`, or `shadow`: refused retries are counted and retried anyway (the
    /// configuration's `enforcement`, unless an operator switched it).
    pub(crate) enforcement: &'static str,
    /// In shadow, the retries enforcement would have denied in the window (its
    /// `retries_denied`); 0 while enforced.
    pub(crate) would_deny: u64,
    /// Deprecated: `retries_granted` under its name before 0.2.0, printed until 0.3.0.
    pub(crate) retries: u64,
    /// Deprecated: `retries_denied` under its name before 0.2.0, printed until 0.3.0.
    pub(crate) denied: u64,
}

impl DependencyStatus {
    #[allow(clippy::cast_precision_loss)]
    pub(crate) fn new(dependency: &Dependency, fleet: &FleetStatus) -> Self {
        let s: &BudgetSnapshot = &fleet.snapshot;
        let p = &fleet.policy;
        let WindowCounters {
            successes,
            first_attempts,
            retries,
            denied,
        } = s.estimates();
        Self {
            dependency: dependency.to_string(),
            window_secs: s.window_ms as f64 / 1000.0,
            window_remaining_secs: s.ms_until_roll() as f64 / 1000.0,
            successes,
            first_attempts,
            executions: first_attempts + retries,
            retries_granted: retries,
            retries_denied: denied,
            allowance: s.allowance,
            remaining: s.remaining(),
            amplification: (first_attempts > 0)
                .then(|| (first_attempts + retries) as f64 / first_attempts as f64),
            policy_in_force: format!(
                "window {}ms, ratio {}, min_allowance {}, deposit {}, mode {}",
                p.window_ms(),
                p.ratio,
                p.min_allowance,
                p.deposit.as_str(),
                p.mode.as_str()
            ),
            conflicts: fleet.conflicts,
            conflicting_policy: fleet.conflicting_policy.clone(),
            conflict_age_secs: fleet.conflict_age_ms.map(|ms| ms as f64 / 1000.0),
            overrides: fleet.overrides.clone(),
            now_ms: fleet.now_ms,
            window_index: s.window_index,
            breaker: None,
            enforcement: fleet_budget::Enforcement::Enforce.as_str(),
            would_deny: 0,
            retries,
            denied,
        }
    }

    /// What an operator should look at, if anything.
    pub(crate) fn alert(&self) -> &'static str {
        if self.overrides.freeze.is_some() {
            "FROZEN: an operator froze retries"
        } else if self
            .breaker
            .as_ref()
            .is_some_and(|b| b.state != BreakerState::Closed.as_str())
        {
            "BREAKER: circuit open, jobs wait instead of calling"
        } else if self.would_deny > 0 && self.remaining == 0 {
            "SHADOW: budget exhausted, refused retries are retried anyway"
        } else if self.retries_denied > 0 && self.remaining == 0 {
            "DENYING: budget exhausted, retries are dead-lettered"
        } else if self.amplification.is_some_and(|a| a > AMPLIFICATION_ALERT) {
            "AMPLIFIED: retries above 50% of traffic"
        } else if self.retries_denied > 0 {
            "denials in the last window"
        } else {
            ""
        }
    }
}

/// A dependency whose key the scripts refuse (of another type, or tampered with): shown beside
/// the healthy ones, and `status` exits 1 after printing everything.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct KeyProblem {
    pub(crate) dependency: String,
    pub(crate) key: String,
    pub(crate) error: String,
}

/// What `status` read: the `--json` shape.
#[derive(Debug, Serialize)]
pub(super) struct StatusReport {
    pub(super) redis: String,
    pub(super) key_prefix: String,
    pub(super) dependencies: Vec<DependencyStatus>,
    pub(super) unusable: Vec<KeyProblem>,
}

impl StatusReport {
    /// The error to exit with after printing, when a key was unusable.
    pub(super) fn failure(&self) -> anyhow::Result<()> {
        match self.unusable.as_slice() {
            [] => Ok(()),
            [one] => Err(anyhow::anyhow!(
                "budget key {} of dependency {} cannot be used: {}",
                one.key,
                one.dependency,
                one.error
            )),
            many => Err(anyhow::anyhow!(
                "{} budget keys cannot be used (listed above)",
                many.len()
            )),
        }
    }
}
