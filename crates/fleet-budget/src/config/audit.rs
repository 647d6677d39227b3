//! The `[audit]` section: how much of the audit trail Redis keeps (the last `max_entries`
//! entries, and none older than `max_age_days`, whichever is less).

use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;
use crate::control::AuditLog;

/// Default of `audit.max_entries`.
pub const DEFAULT_AUDIT_MAX_ENTRIES: u64 = 10_000;
/// Default of `audit.max_age_days`.
pub const DEFAULT_AUDIT_MAX_AGE_DAYS: u64 = 90;

/// Audit trail settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditSettings {
    /// Keep about this many entries at most (1 to 10,000,000).
    pub max_entries: u64,
    /// Trim entries older than this many days (1 to 3,650).
    pub max_age_days: u64,
}

impl Default for AuditSettings {
    fn default() -> Self {
        Self {
            max_entries: DEFAULT_AUDIT_MAX_ENTRIES,
            max_age_days: DEFAULT_AUDIT_MAX_AGE_DAYS,
        }
    }
}

impl AuditSettings {
    /// The trail these settings bound.
    #[must_use]
    pub fn log(&self) -> AuditLog {
        AuditLog {
            max_entries: self.max_entries,
            max_age: Duration::from_secs(self.max_age_days.saturating_mul(24 * 3600)),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAudit {
    max_entries: Option<i64>,
    max_age_days: Option<i64>,
}

impl RawAudit {
    /// The settings, out-of-range values recorded in `c` (and the defaults used).
    pub(super) fn resolve(self, c: &mut Checker) -> AuditSettings {
        let d = AuditSettings::default();
        let entries = c.int_in(
            "audit.max_entries",
            self.max_entries,
            1,
            10_000_000,
            i64::try_from(d.max_entries).unwrap_or(i64::MAX),
        );
        let days = c.int_in(
            "audit.max_age_days",
            self.max_age_days,
            1,
            3650,
            i64::try_from(d.max_age_days).unwrap_or(i64::MAX),
        );
        AuditSettings {
            max_entries: u64::try_from(entries).unwrap_or(d.max_entries),
            max_age_days: u64::try_from(days).unwrap_or(d.max_age_days),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::problems;
    use super::*;
    use crate::Config;

    #[test]
    fn bounds_default_parse_and_refuse_out_of_range() {
        let c = Config::from_toml("", "x").unwrap();
        assert_eq!(c.audit, AuditSettings::default());
        assert_eq!(c.audit.log(), AuditLog::default());
        let c = Config::from_toml("[audit]\nmax_entries = 50\nmax_age_days = 7\n", "x").unwrap();
        assert_eq!(c.audit.log().max_entries, 50);
        assert_eq!(c.audit.log().max_age, Duration::from_secs(7 * 86_400));
        let p = problems("[audit]\nmax_entries = 0\nmax_age_days = 99999\n");
        let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["audit.max_entries", "audit.max_age_days"], "{p:?}");
    }
}
