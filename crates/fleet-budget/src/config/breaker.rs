//! The `[dependencies.X.breaker]` sections: a dependency's fleet-wide circuit breaker
//! (`fleet_budget::breaker`).
//!
//! ```toml
//! [dependencies.search.breaker]
//! failure_ratio = 0.5      # failures over calls in the window that open it (0 < r <= 1)
//! min_volume = 20          # ... counted only from this many calls in the window
//! window_secs = 60
//! open_secs = 30           # open this long, then half-open
//! half_open_probes = 3     # probes fleet-wide, spent from the rate budget's floor
//! close_after = 3          # probe successes that close it
//! probe_timeout_secs = 60  # probes unanswered this long are issued again
//! max_wait_secs = 900      # a job waits at most this long in all, then dead-lettered circuit_open
//! ```

use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;
use crate::breaker::BreakerPolicy;

/// The longest of its durations accepted: a day.
const DAY_SECS: i64 = 86_400;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBreaker {
    failure_ratio: Option<f64>,
    min_volume: Option<i64>,
    window_secs: Option<i64>,
    open_secs: Option<i64>,
    half_open_probes: Option<i64>,
    close_after: Option<i64>,
    probe_timeout_secs: Option<i64>,
    max_wait_secs: Option<i64>,
}

impl RawBreaker {
    /// The policy of the section at `at` (`dependencies.X.breaker`), whose rate budget grants
    /// `floor` retries however it fails; `None` with the problems recorded.
    pub(super) fn resolve(self, c: &mut Checker, at: &str, floor: u64) -> Option<BreakerPolicy> {
        let before = c.problem_count();
        let d = BreakerPolicy::default();
        let key = |name: &str| format!("{at}.{name}");
        let mut secs = |name: &str, v: Option<i64>, lo: i64, default: Duration| {
            c.duration_in(&key(name), v, lo, DAY_SECS, default, Duration::from_secs)
        };
        let window = secs("window_secs", self.window_secs, 1, d.window);
        let open = secs("open_secs", self.open_secs, 1, d.open);
        let probe_timeout = secs(
            "probe_timeout_secs",
            self.probe_timeout_secs,
            1,
            d.probe_timeout,
        );
        let max_wait = secs("max_wait_secs", self.max_wait_secs, 0, d.max_wait);
        let failure_ratio = self.failure_ratio.unwrap_or(d.failure_ratio);
        if !(failure_ratio > 0.0 && failure_ratio <= 1.0) {
            c.problem(
                &key("failure_ratio"),
                failure_ratio,
                "must be a number above 0 and at most 1",
            );
        }
        let min_volume = c
            .int_in(&key("min_volume"), self.min_volume, 1, 1_000_000_000, 20)
            .unsigned_abs();
        let probes = c
            .int_in(
                &key("half_open_probes"),
                self.half_open_probes,
                1,
                1_000_000,
                3,
            )
            .unsigned_abs();
        if probes > floor {
            c.problem(
                &key("half_open_probes"),
                probes,
                format!(
                    "probes are spent from the rate budget's floor: at most min_allowance ({floor})"
                ),
            );
        }
        let close_after = match self.close_after {
            None => probes,
            Some(n) if n >= 1 && n.unsigned_abs() <= probes => n.unsigned_abs(),
            Some(n) => {
                c.problem(
                    &key("close_after"),
                    n,
                    format!("must be an integer from 1 to half_open_probes ({probes})"),
                );
                probes
            }
        };
        if c.problem_count() > before {
            return None;
        }
        let policy = BreakerPolicy {
            window,
            failure_ratio,
            min_volume,
            open,
            half_open_probes: probes,
            close_after,
            probe_timeout,
            max_wait,
        };
        c.section(at, policy.checked())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::super::tests::problems;
    use crate::dependency::Dependency;

    #[test]
    fn defaults_and_overrides() {
        let c = Config::from_toml(
            "[dependencies.search.breaker]\n[dependencies.mail]\nmin_allowance = 1\n[dependencies.mail.breaker]\nhalf_open_probes = 1\nopen_secs = 5\nfailure_ratio = 1.0\n",
            "t",
        )
        .unwrap();
        let s = c.breakers[&Dependency::new("search").unwrap()];
        assert_eq!(
            (s.half_open_probes, s.close_after, s.min_volume),
            (3, 3, 20)
        );
        let m = c.breakers[&Dependency::new("mail").unwrap()];
        assert_eq!(
            (m.half_open_probes, m.close_after, m.open.as_secs()),
            (1, 1, 5)
        );
        assert!((m.failure_ratio - 1.0).abs() < f64::EPSILON);
    }

    #[test]
    fn each_bad_value_is_named() {
        let p = problems(
            "[dependencies.a.breaker]\nfailure_ratio = 0.0\nmin_volume = 0\nopen_secs = 0\nclose_after = 9\n[dependencies.b]\nmin_allowance = 2\n[dependencies.b.breaker]\nhalf_open_probes = 3\n",
        );
        let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "dependencies.a.breaker.open_secs",
                "dependencies.a.breaker.failure_ratio",
                "dependencies.a.breaker.min_volume",
                "dependencies.a.breaker.close_after",
                "dependencies.b.breaker.half_open_probes",
            ],
            "{p:?}"
        );
        assert!(p[4].allowed.contains("min_allowance (2)"), "{}", p[4]);
    }
}
