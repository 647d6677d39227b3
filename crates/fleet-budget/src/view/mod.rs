//! The read model of the fleet: what every front end shows of a dependency, computed once.
//!
//! Why here: `budgetctl status`, the console and the exporter each used to compute a
//! dependency's amplification, breaker state and alert from the store's replies, and the copies
//! drifted (one threshold a constant, another a literal; a policy conflict alerted on by one
//! front end only). Now the library turns the replies into a [`DependencyView`] (figures, the
//! breaker as an operator reads it, the overrides, the calls in flight, and the [`Alert`]s with a
//! severity and a text) and the front ends only render it: a table, a page, JSON, gauges.
//!
//! How it fits:
//! - this file: [`DependencyView`] and its parts, built from the store's replies without I/O
//!   ([`DependencyView::new`]), so tests can build one from figures;
//! - [`alert`]: the alerts, judged from a view alone, and [`AMPLIFICATION_ALERT`];
//! - [`read`]: the reads from Redis (the dependencies configured and found, one store call per
//!   kind of fact), into a [`FleetView`].

pub mod alert;
pub mod read;

use serde::Serialize;

use crate::decision::Enforcement;

pub use self::alert::{AMPLIFICATION_ALERT, Alert, AlertKind};
pub use self::read::{read_dependency, read_fleet};
use crate::allowance::WindowCounters;
use crate::breaker::{BreakerState, BreakerStatus};
use crate::control::enforcement::EnforcementSwitch;
use crate::control::{FleetStatus, Overrides};
use crate::dependency::Dependency;
use crate::policy::BudgetPolicy;

/// One dependency as every front end shows it. Counts are the sliding estimates over the last
/// window (the current window and the part of the previous one still inside it), the numbers the
/// allowance is computed from. Texts (override actors and reasons, the conflicting policy) are as
/// Redis holds them: a front end escapes them for its medium.
#[derive(Debug, Clone, PartialEq)]
pub struct DependencyView {
    /// The dependency.
    pub dependency: Dependency,
    /// Server time of the read (ms); override expiries are server times too.
    pub now_ms: u64,
    /// The window's length (ms) under the policy in force.
    pub window_ms: u64,
    /// Until the current window rolls (ms).
    pub window_remaining_ms: u64,
    /// The current window's index (server time / window length).
    pub window_index: u64,
    /// Successes in the last window.
    pub successes: u64,
    /// First attempts in the last window.
    pub first_attempts: u64,
    /// Retries granted in the last window (the budget spent).
    pub retries_granted: u64,
    /// Retries denied in the last window, those the workers answered from their deny cache
    /// included (they send them to Redis with their next deposit).
    pub retries_denied: u64,
    /// Retries allowed in the last window (after overrides: 0 while frozen).
    pub allowance: u64,
    /// Retries still grantable now.
    pub remaining: u64,
    /// Executions per first attempt, `(first attempts + retries granted) / first attempts`;
    /// `None` without first attempts.
    pub amplification: Option<f64>,
    /// The policy in force in Redis (the reader's own while the key has none).
    pub policy: BudgetPolicy,
    /// Calls that sent another policy, since the key was created.
    pub conflicts: u64,
    /// The last such policy (`window_ms ratio min_allowance basis mode`), as Redis holds it.
    pub conflicting_policy: Option<String>,
    /// How long ago it was sent (ms).
    pub conflict_age_ms: Option<u64>,
    /// The operators' overrides in force.
    pub overrides: Overrides,
    /// The circuit breaker, for a dependency with one configured and readable.
    pub breaker: Option<BreakerView>,
    /// Calls in flight against the cap, for a dependency with a concurrency budget and readable
    /// lease sets.
    pub in_flight: Option<InFlight>,
    /// The two windows Redis holds, previous then current.
    pub windows: [WindowCounters; 2],
    /// Whether refused retries are dead-lettered or, in shadow, retried anyway (the
    /// configuration's, unless an operator switched it; [`DependencyView::with_enforcement`]).
    pub enforcement: Enforcement,
    /// The operator's switch in force, when there is one (who, why, until when); `None`: the
    /// configuration decides.
    pub enforcement_switch: Option<EnforcementSwitch>,
    /// What an operator should look at, worst first ([`alert`]).
    pub alerts: Vec<Alert>,
}

/// A circuit breaker as an operator reads it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BreakerView {
    /// Its state; an open breaker whose period ended is shown half-open (it half-opens at the
    /// next call), with `open_remaining_secs` 0. In JSON its wire name (`closed`, `open`,
    /// `half_open`).
    #[serde(serialize_with = "state_name")]
    pub state: BreakerState,
    /// Seconds until an open breaker half-opens (0 otherwise).
    pub open_remaining_secs: f64,
    /// Probes out in this half-open generation.
    pub probes_issued: u64,
    /// Probe successes in this half-open generation.
    pub probe_successes: u64,
    /// Seconds since the last change of state; `None` if it never changed while the key lived.
    pub changed_secs_ago: Option<f64>,
    /// Times opened while the key lived.
    pub times_opened: u64,
    /// Calls in the breaker's window (sliding estimate).
    pub calls: f64,
    /// Failures in the breaker's window (sliding estimate).
    pub failures: f64,
}

fn state_name<S: serde::Serializer>(state: &BreakerState, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(state.as_str())
}

impl BreakerView {
    /// The breaker as `status` read it.
    #[must_use]
    #[allow(clippy::cast_precision_loss)] // ms differences, far below 2^53
    pub fn new(s: &BreakerStatus) -> Self {
        let due = s.state == BreakerState::Open && s.now_ms >= s.open_until_ms;
        Self {
            state: if due { BreakerState::HalfOpen } else { s.state },
            open_remaining_secs: if s.state == BreakerState::Open {
                s.open_until_ms.saturating_sub(s.now_ms) as f64 / 1000.0
            } else {
                0.0
            },
            probes_issued: s.probes_issued,
            probe_successes: s.probe_successes,
            changed_secs_ago: (s.changed_ms > 0)
                .then(|| s.now_ms.saturating_sub(s.changed_ms) as f64 / 1000.0),
            times_opened: s.times_opened,
            calls: s.volume,
            failures: s.failures,
        }
    }
}

/// Calls in flight against the concurrency cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct InFlight {
    /// Leases held and not expired (primary and retry together).
    pub in_flight: u64,
    /// The cap configured.
    pub cap: u64,
}

impl DependencyView {
    /// The view of `dependency` from its fleet status, breaker and calls in flight; the alerts
    /// judged.
    #[must_use]
    #[allow(clippy::cast_precision_loss)] // counts of a window, far below 2^53
    pub fn new(
        dependency: &Dependency,
        fleet: &FleetStatus,
        breaker: Option<BreakerView>,
        in_flight: Option<InFlight>,
    ) -> Self {
        let s = &fleet.snapshot;
        let WindowCounters {
            successes,
            first_attempts,
            retries,
            denied,
        } = s.estimates();
        let mut view = Self {
            dependency: dependency.clone(),
            now_ms: fleet.now_ms,
            window_ms: s.window_ms,
            window_remaining_ms: s.ms_until_roll(),
            window_index: s.window_index,
            successes,
            first_attempts,
            retries_granted: retries,
            retries_denied: denied,
            allowance: s.allowance,
            remaining: s.remaining(),
            amplification: (first_attempts > 0)
                .then(|| first_attempts.saturating_add(retries) as f64 / first_attempts as f64),
            policy: fleet.policy,
            conflicts: fleet.conflicts,
            conflicting_policy: fleet.conflicting_policy.clone(),
            conflict_age_ms: fleet.conflict_age_ms,
            overrides: fleet.overrides.clone(),
            breaker,
            in_flight,
            windows: [s.previous, s.current],
            enforcement: Enforcement::Enforce,
            enforcement_switch: None,
            alerts: Vec::new(),
        };
        view.alerts = alert::judge(&view);
        view
    }

    /// The same view under `enforcement`, its alerts judged again (in shadow an exhausted
    /// budget dead-letters nothing: [`AlertKind::Shadow`]).
    #[must_use]
    pub fn with_enforcement(mut self, enforcement: Enforcement) -> Self {
        self.enforcement = enforcement;
        self.alerts = alert::judge(&self);
        self
    }

    /// In shadow, the retries enforcement would have denied in the last window (its
    /// `retries_denied`); 0 while enforced.
    #[must_use]
    pub fn would_deny(&self) -> u64 {
        match self.enforcement {
            Enforcement::Shadow => self.retries_denied,
            Enforcement::Enforce => 0,
        }
    }

    /// First attempts and retries granted in the last window.
    #[must_use]
    pub fn executions(&self) -> u64 {
        self.first_attempts.saturating_add(self.retries_granted)
    }

    /// The worst alert, if any.
    #[must_use]
    pub fn alert(&self) -> Option<&Alert> {
        self.alerts.first()
    }

    /// The worst alert's severity, 0 without one.
    #[must_use]
    pub fn severity(&self) -> u8 {
        self.alert().map_or(0, |a| a.severity)
    }

    /// Seconds in `ms`.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn secs(ms: u64) -> f64 {
        ms as f64 / 1000.0
    }

    /// Retries denied per second over the last window.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn denials_per_sec(&self) -> f64 {
        if self.window_ms == 0 {
            0.0
        } else {
            self.retries_denied as f64 * 1000.0 / self.window_ms as f64
        }
    }

    /// Seconds until server time `until_ms` (an override's expiry), 0 when past.
    #[must_use]
    pub fn secs_until(&self, until_ms: u64) -> f64 {
        Self::secs(until_ms.saturating_sub(self.now_ms))
    }

    /// The policy in force in words: `window 60000ms, ratio 0.1, min_allowance 10, deposit
    /// success, mode sliding`.
    #[must_use]
    pub fn policy_in_force(&self) -> String {
        let p = &self.policy;
        format!(
            "window {}ms, ratio {}, min_allowance {}, deposit {}, mode {}",
            p.window_ms(),
            p.ratio,
            p.min_allowance,
            p.deposit.as_str(),
            p.mode.as_str()
        )
    }
}

/// A dependency one of whose keys the scripts refuse (of another type, or tampered with): shown
/// beside the others; what could be read of it is in the [`FleetView`] too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unusable {
    /// The dependency.
    pub dependency: Dependency,
    /// The key refused.
    pub key: String,
    /// Why, redacted (`crate::redact::redact_text`).
    pub detail: String,
}

/// Every dependency read, in the order of their names, and the keys that could not be used.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetView {
    /// The dependencies whose budget was read.
    pub dependencies: Vec<DependencyView>,
    /// The keys refused.
    pub unusable: Vec<Unusable>,
}

impl FleetView {
    /// The dependencies worst first: by severity, then by denials per second, then by name.
    #[must_use]
    pub fn worst_first(&self) -> Vec<&DependencyView> {
        let mut rows: Vec<&DependencyView> = self.dependencies.iter().collect();
        rows.sort_by(|a, b| {
            b.severity()
                .cmp(&a.severity())
                .then(b.denials_per_sec().total_cmp(&a.denials_per_sec()))
                .then(a.dependency.cmp(&b.dependency))
        });
        rows
    }
}

#[cfg(test)]
mod tests;
