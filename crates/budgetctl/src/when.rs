//! Durations and times on the command line: humantime durations (`90s`, `30m`, `1h30m`)
//! everywhere, and for `--since` / `--until` also RFC 3339 times (`2026-11-30T04:00:00Z`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Parses a humantime duration of at least a millisecond.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("`{s}` is not a duration like 90s, 30m or 1h30m: {e}"))?;
    if d < Duration::from_millis(1) {
        return Err(format!("`{s}` must be at least 1ms"));
    }
    Ok(d)
}

/// A point in time: an RFC 3339 time, or a duration meaning that long ago.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct When(pub(crate) SystemTime);

impl When {
    /// Milliseconds since the Unix epoch (0 before it).
    pub(crate) fn unix_ms(self) -> u64 {
        self.0
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// Parses `--since` / `--until`: `2026-11-30T04:00:00Z` or `1h30m` (ago).
pub(crate) fn when(s: &str) -> Result<When, String> {
    if let Ok(t) = humantime::parse_rfc3339_weak(s.trim()) {
        return Ok(When(t));
    }
    let ago = humantime::parse_duration(s.trim()).map_err(|_| {
        format!(
            "`{s}` is neither an RFC 3339 time (2026-11-30T04:00:00Z) nor a duration ago (1h30m)"
        )
    })?;
    SystemTime::now()
        .checked_sub(ago)
        .map(When)
        .ok_or_else(|| format!("`{s}` is before the epoch"))
}

pub(crate) use fleet_budget::printable::rfc3339_ms;

/// Who runs the command, for the audit trail: `$USER@<hostname>`.
pub(crate) fn default_actor() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{user}@{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_times() {
        assert_eq!(duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(duration("90s"), Ok(Duration::from_secs(90)));
        assert!(duration("0s").is_err());
        assert!(duration("soon").is_err());
        let t = when("2026-11-30T04:00:00Z").map(When::unix_ms);
        assert_eq!(t, Ok(1_796_011_200_000));
        assert_eq!(rfc3339_ms(1_796_011_200_000), "2026-11-30T04:00:00Z");
        assert_eq!(rfc3339_ms(253_402_300_799_000), "9999-12-31T23:59:59Z");
        let ago = when("1h30m").map(When::unix_ms).unwrap_or_default();
        assert!(ago > 0);
        assert!(when("yesterday-ish").is_err());
    }

    /// A time past the year 9999 (an audit entry written by hand with such an id, a dead letter
    /// whose header says so) used to panic inside `to_string` (humantime's formatter returns an
    /// error there): it is shown as its number.
    #[test]
    fn times_rfc_3339_cannot_show_are_shown_as_numbers() {
        for ms in [253_402_300_800_000, u64::MAX] {
            let shown = rfc3339_ms(ms);
            assert_eq!(
                shown,
                format!("{ms} ms after the epoch (past the year 9999)")
            );
        }
    }
}
