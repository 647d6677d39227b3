//! The `[defaults]` section, and the checks of the policy and backoff fields that
//! `[dependencies.*]` and `[tasks.*]` override.

use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;
use crate::ceiling::{Backoff, TaskCeiling};
use crate::policy::{BudgetPolicy, DepositBasis, WindowMode};

/// Longest window accepted: one day.
pub const MAX_WINDOW_SECS: i64 = 86_400;
/// Largest ratio accepted: more than 10 retries per deposit is no budget at all.
pub const MAX_RATIO: f64 = 10.0;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDefaults {
    window_secs: Option<i64>,
    ratio: Option<f64>,
    min_allowance: Option<i64>,
    deposit: Option<DepositBasis>,
    mode: Option<WindowMode>,
    max_attempts: Option<i64>,
    backoff_base_ms: Option<i64>,
    backoff_cap_ms: Option<i64>,
    max_delay_secs: Option<i64>,
    /// `"enforce"` (the default) or `"shadow"` ([`crate::Enforcement`]).
    pub(super) enforcement: Option<crate::decision::Enforcement>,
}

/// Longest `max_delay_secs` accepted: a week.
pub const MAX_DELAY_SECS: i64 = 7 * 86_400;

/// The `max_delay_secs` of the section at `at`, when given and in range.
pub(super) fn max_delay(c: &mut Checker, at: &str, secs: Option<i64>) -> Option<Duration> {
    let key = format!("{at}.max_delay_secs");
    let secs = c.int_in(&key, secs, 1, MAX_DELAY_SECS, 0);
    (secs > 0).then(|| Duration::from_secs(secs.unsigned_abs()))
}

impl RawDefaults {
    /// The default policy and the default ceiling.
    pub(super) fn resolve(self, c: &mut Checker) -> (BudgetPolicy, TaskCeiling) {
        let policy = PolicyFields {
            window_secs: self.window_secs,
            ratio: self.ratio,
            min_allowance: self.min_allowance,
            deposit: self.deposit,
            mode: self.mode,
        }
        .resolve(c, "defaults", &BudgetPolicy::default());
        let max_attempts = c.int_in("defaults.max_attempts", self.max_attempts, 1, 1000, 5);
        let ceiling = TaskCeiling {
            max_attempts: u32::try_from(max_attempts).unwrap_or(5),
            backoff: backoff(
                c,
                "defaults",
                self.backoff_base_ms,
                self.backoff_cap_ms,
                Backoff::default(),
            ),
            recovery_window: None,
            max_delay: max_delay(c, "defaults", self.max_delay_secs),
        };
        (policy, ceiling)
    }
}

/// The policy fields of a section, as written.
pub(super) struct PolicyFields {
    pub(super) window_secs: Option<i64>,
    pub(super) ratio: Option<f64>,
    pub(super) min_allowance: Option<i64>,
    pub(super) deposit: Option<DepositBasis>,
    pub(super) mode: Option<WindowMode>,
}

impl PolicyFields {
    /// The policy of the section at `at`: each field given, or else taken from `base`.
    pub(super) fn resolve(self, c: &mut Checker, at: &str, base: &BudgetPolicy) -> BudgetPolicy {
        let base_window = i64::try_from(base.window.as_secs()).unwrap_or(60);
        let window = c.int_in(
            &format!("{at}.window_secs"),
            self.window_secs,
            1,
            MAX_WINDOW_SECS,
            base_window,
        );
        let base_min = i64::try_from(base.min_allowance).unwrap_or(10);
        let min = c.int_in(
            &format!("{at}.min_allowance"),
            self.min_allowance,
            0,
            1_000_000_000,
            base_min,
        );
        BudgetPolicy {
            window: Duration::from_secs(u64::try_from(window).unwrap_or(60)),
            ratio: ratio(c, &format!("{at}.ratio"), self.ratio, base.ratio),
            min_allowance: u64::try_from(min).unwrap_or(10),
            deposit: self.deposit.unwrap_or(base.deposit),
            mode: self.mode.unwrap_or(base.mode),
        }
    }
}

fn ratio(c: &mut Checker, key: &str, value: Option<f64>, default: f64) -> f64 {
    match value {
        None => default,
        Some(v) if v.is_finite() && (0.0..=MAX_RATIO).contains(&v) => v,
        Some(v) => {
            c.problem(
                key,
                v,
                format!("must be a finite number from 0 to {MAX_RATIO} (retries per deposit)"),
            );
            default
        }
    }
}

/// The backoff of the section at `at`: each bound given, or else taken from `default`.
pub(super) fn backoff(
    c: &mut Checker,
    at: &str,
    base_ms: Option<i64>,
    cap_ms: Option<i64>,
    default: Backoff,
) -> Backoff {
    let day = 86_400_000;
    let default_base = i64::try_from(default.base.as_millis()).unwrap_or(2000);
    let default_cap = i64::try_from(default.cap.as_millis()).unwrap_or(600_000);
    let base = c.int_in(
        &format!("{at}.backoff_base_ms"),
        base_ms,
        1,
        day,
        default_base,
    );
    let cap = c.int_in(&format!("{at}.backoff_cap_ms"), cap_ms, 1, day, default_cap);
    if cap < base {
        c.problem(
            &format!("{at}.backoff_cap_ms"),
            cap,
            format!("must be at least backoff_base_ms ({base})"),
        );
    }
    Backoff {
        base: Duration::from_millis(u64::try_from(base).unwrap_or(2000)),
        factor: default.factor,
        cap: Duration::from_millis(u64::try_from(cap).unwrap_or(600_000)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::problems;

    #[test]
    fn invalid_ratio_nan_negative_absurd() {
        for value in ["nan", "-0.1", "11.0", "inf"] {
            let p = problems(&format!("[defaults]\nratio = {value}\n"));
            assert_eq!(p.len(), 1, "{value}");
            assert_eq!(p[0].key, "defaults.ratio");
            assert!(p[0].allowed.contains("from 0 to 10"), "{}", p[0]);
        }
        let p = problems("[dependencies.mail]\nratio = -1.0\n");
        assert_eq!(p[0].key, "dependencies.mail.ratio");
        assert_eq!(p[0].value, "-1");
    }

    #[test]
    fn invalid_window_zero_or_over_a_day() {
        for value in ["0", "86401", "-5"] {
            let p = problems(&format!("[defaults]\nwindow_secs = {value}\n"));
            assert_eq!(p[0].key, "defaults.window_secs");
            assert_eq!(p[0].value, value);
            assert!(p[0].allowed.contains("1 to 86400"));
        }
    }

    #[test]
    fn invalid_negative_floor() {
        let p = problems("[dependencies.search]\nmin_allowance = -1\n");
        assert_eq!(p[0].key, "dependencies.search.min_allowance");
        assert_eq!(p[0].value, "-1");
    }

    #[test]
    fn max_delay_from_a_second_to_a_week() {
        for value in ["0", "-1", "604801"] {
            let p = problems(&format!("[defaults]\nmax_delay_secs = {value}\n"));
            assert_eq!(p[0].key, "defaults.max_delay_secs");
            assert!(p[0].allowed.contains("1 to 604800"), "{}", p[0]);
        }
        let p = problems("[tasks.t]\nmax_delay_secs = 0\n");
        assert_eq!(p[0].key, "tasks.t.max_delay_secs");
    }

    #[test]
    fn all_problems_are_reported_together() {
        let p = problems("[defaults]\nratio = -1.0\nwindow_secs = 0\nmin_allowance = -3\n");
        assert_eq!(p.len(), 3);
    }
}
