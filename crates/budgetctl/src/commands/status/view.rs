//! What `status` shows of a dependency, as the `--json` shape: the library's read model
//! ([`fleet_budget::view::DependencyView`], which computes every figure and alert) laid out
//! under the names `status` has always printed; the keys that cannot be used; the whole report.

use fleet_budget::control::Overrides;
use fleet_budget::view::{Alert, BreakerView, DependencyView, InFlight};
use serde::Serialize;

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
    /// Denied in the last window, those the workers answered from their deny cache included.
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
    pub(crate) breaker: Option<BreakerView>,
    /// Calls in flight against the cap, for a dependency with a concurrency budget (0.2.0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) concurrency: Option<InFlight>,
    /// What an operator should look at, worst first (0.2.0): the library's alerts, the same
    /// the console shows.
    pub(crate) alerts: Vec<Alert>,
    /// `enforce`, or `shadow`: refused retries are counted and retried anyway (the
    /// configuration's `enforcement`, unless an operator switched it) (0.2.0).
    pub(crate) enforcement: &'static str,
    /// In shadow, the retries enforcement would have denied in the window (its
    /// `retries_denied`); 0 while enforced (0.2.0).
    pub(crate) would_deny: u64,
    /// Deprecated: `retries_granted` under its name before 0.2.0, printed until 0.3.0.
    pub(crate) retries: u64,
    /// Deprecated: `retries_denied` under its name before 0.2.0, printed until 0.3.0.
    pub(crate) denied: u64,
}

impl DependencyStatus {
    pub(crate) fn new(v: &DependencyView) -> Self {
        Self {
            dependency: v.dependency.to_string(),
            window_secs: DependencyView::secs(v.window_ms),
            window_remaining_secs: DependencyView::secs(v.window_remaining_ms),
            successes: v.successes,
            first_attempts: v.first_attempts,
            executions: v.executions(),
            retries_granted: v.retries_granted,
            retries_denied: v.retries_denied,
            allowance: v.allowance,
            remaining: v.remaining,
            amplification: v.amplification,
            policy_in_force: v.policy_in_force(),
            conflicts: v.conflicts,
            conflicting_policy: v.conflicting_policy.clone(),
            conflict_age_secs: v.conflict_age_ms.map(DependencyView::secs),
            overrides: v.overrides.clone(),
            now_ms: v.now_ms,
            window_index: v.window_index,
            breaker: v.breaker.clone(),
            concurrency: v.in_flight,
            alerts: v.alerts.clone(),
            enforcement: v.enforcement.as_str(),
            would_deny: v.would_deny(),
            retries: v.retries_granted,
            denied: v.retries_denied,
        }
    }

    /// The worst alert's text, empty without one.
    pub(crate) fn alert(&self) -> &str {
        self.alerts.first().map_or("", |a| a.text.as_str())
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
