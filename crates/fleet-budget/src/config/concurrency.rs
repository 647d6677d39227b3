//! The `[dependencies.X.concurrency]` sections: a dependency's cap on calls in flight and the
//! share of it that retries may take (`fleet_budget::concurrency`).
//!
//! ```toml
//! [dependencies.paid-api.concurrency]
//! cap = 20                 # calls in flight the dependency accepts, fleet-wide
//! planned_primary = 16     # primary calls in flight at normal load
//! min_retry_slots = 3      # retry slots however quiet the dependency is
//! # max_retry_fraction = 0.25   # derived as (cap - planned_primary) / planned_primary unless set
//! # lease_secs = 30        # a dead worker's slot comes back after this
//! # primary_waits = false  # true: a primary call at the cap waits in a delay tier
//! # max_wait_secs = 600    # ... for at most this long in all, then it is dead-lettered
//! ```

use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;
use crate::concurrency::ConcurrencyPolicy;

/// The largest cap accepted (the scripts' bound).
const MAX_CAP: i64 = 1_000_000_000;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConcurrency {
    cap: Option<i64>,
    planned_primary: Option<i64>,
    min_retry_slots: Option<i64>,
    max_retry_fraction: Option<f64>,
    lease_secs: Option<i64>,
    primary_waits: Option<bool>,
    max_wait_secs: Option<i64>,
}

impl RawConcurrency {
    /// The policy of the section at `at` (`dependencies.X.concurrency`), or `None` with the
    /// problems recorded.
    pub(super) fn resolve(self, c: &mut Checker, at: &str) -> Option<ConcurrencyPolicy> {
        let before = c.problem_count();
        let Some(cap) = self.cap else {
            c.problem(
                &format!("{at}.cap"),
                "missing",
                "a concurrency section needs cap (calls in flight the dependency accepts)",
            );
            return None;
        };
        let cap = c.int_in(&format!("{at}.cap"), Some(cap), 1, MAX_CAP, 1);
        let planned = match self.planned_primary {
            Some(p) if (1..=cap).contains(&p) => p,
            Some(p) => {
                c.problem(
                    &format!("{at}.planned_primary"),
                    p,
                    format!("must be an integer from 1 to the cap ({cap})"),
                );
                cap
            }
            None if self.max_retry_fraction.is_some() => cap,
            None => {
                c.problem(
                    &format!("{at}.planned_primary"),
                    "missing",
                    "needed to derive max_retry_fraction = (cap - planned_primary) / planned_primary; give it or max_retry_fraction",
                );
                cap
            }
        };
        let min_slots = c.int_in(
            &format!("{at}.min_retry_slots"),
            self.min_retry_slots,
            0,
            MAX_CAP,
            3,
        );
        let lease = c.duration_in(
            &format!("{at}.lease_secs"),
            self.lease_secs,
            1,
            86_400,
            Duration::from_secs(30),
            Duration::from_secs,
        );
        let max_wait = c.duration_in(
            &format!("{at}.max_wait_secs"),
            self.max_wait_secs,
            0,
            86_400,
            Duration::from_secs(600),
            Duration::from_secs,
        );
        if let Some(f) = self.max_retry_fraction
            && !(f.is_finite() && (0.0..=1000.0).contains(&f))
        {
            c.problem(
                &format!("{at}.max_retry_fraction"),
                f,
                "must be a number from 0 to 1000",
            );
        }
        if c.problem_count() > before {
            return None;
        }
        // All three were checked to be from 0 (cap and planned from 1) to 10^9 above.
        let (cap, planned, min_slots) = (
            cap.unsigned_abs(),
            planned.unsigned_abs(),
            min_slots.unsigned_abs(),
        );
        #[allow(clippy::cast_precision_loss)] // both at most 10^9
        let max_retry_fraction = self
            .max_retry_fraction
            .unwrap_or((cap - planned) as f64 / planned as f64);
        // A share derived past what the scripts take (cap 5000, planned_primary 1) is a problem
        // of the section, named: never a section dropped without a word.
        let policy = ConcurrencyPolicy {
            cap,
            max_retry_fraction,
            min_retry_slots: min_slots,
            lease,
            primary_waits: self.primary_waits.unwrap_or(false),
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
    fn the_issue_example_derives_a_quarter() {
        let c = Config::from_toml(
            "[dependencies.paid-api]\ntasks = [\"charge\"]\n[dependencies.paid-api.concurrency]\ncap = 20\nplanned_primary = 16\n",
            "t",
        )
        .unwrap();
        let p = c.concurrency[&Dependency::new("paid-api").unwrap()];
        assert_eq!(p.cap, 20);
        assert!((p.max_retry_fraction - 0.25).abs() < 1e-12);
        assert_eq!(p.min_retry_slots, 3, "the default floor");
        assert_eq!(p.lease, std::time::Duration::from_secs(30));
        assert!(!p.primary_waits);
        assert_eq!(p.retry_slots(16), 4);
    }

    #[test]
    fn a_fraction_given_wins_and_every_field_is_checked() {
        let c = Config::from_toml(
            "[dependencies.a.concurrency]\ncap = 10\nmax_retry_fraction = 0.1\nmin_retry_slots = 0\nlease_secs = 5\nprimary_waits = true\n",
            "t",
        )
        .unwrap();
        let p = c.concurrency[&Dependency::new("a").unwrap()];
        assert!((p.max_retry_fraction - 0.1).abs() < 1e-12);
        assert_eq!(
            (p.min_retry_slots, p.lease.as_secs(), p.primary_waits),
            (0, 5, true)
        );

        let p = problems(
            "[dependencies.a.concurrency]\ncap = 0\nplanned_primary = 1\n[dependencies.b.concurrency]\ncap = 20\nplanned_primary = 21\nmin_retry_slots = -1\nlease_secs = 0\nmax_retry_fraction = -0.5\n[dependencies.c.concurrency]\nplanned_primary = 3\n[dependencies.d.concurrency]\ncap = 4\n",
        );
        let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "dependencies.a.concurrency.cap",
                "dependencies.b.concurrency.planned_primary",
                "dependencies.b.concurrency.min_retry_slots",
                "dependencies.b.concurrency.lease_secs",
                "dependencies.b.concurrency.max_retry_fraction",
                "dependencies.c.concurrency.cap",
                "dependencies.d.concurrency.planned_primary",
            ],
            "{p:?}"
        );
        assert!(p[1].allowed.contains("to the cap (20)"), "{}", p[1]);
        assert!(p[6].allowed.contains("max_retry_fraction"), "{}", p[6]);
    }

    #[test]
    fn a_derived_share_past_1000_is_named_not_dropped() {
        // cap 5000 with planned_primary 1 derives 4999: the section used to vanish silently,
        // leaving the dependency with no concurrency budget at all.
        let p = problems("[dependencies.a.concurrency]\ncap = 5000\nplanned_primary = 1\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].key, "dependencies.a.concurrency");
        assert!(p[0].allowed.contains("max_retry_fraction"), "{}", p[0]);
        // A fraction given is used as given, whatever planned_primary would derive.
        let c = Config::from_toml(
            "[dependencies.a.concurrency]\ncap = 5000\nplanned_primary = 1\nmax_retry_fraction = 0.5\n",
            "t",
        )
        .unwrap();
        let p = c.concurrency[&Dependency::new("a").unwrap()];
        assert!((p.max_retry_fraction - 0.5).abs() < 1e-12);
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = Config::from_toml("[dependencies.a.concurrency]\ncap = 3\ncpa = 2\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cpa") && e.contains("planned_primary"), "{e}");
    }
}
