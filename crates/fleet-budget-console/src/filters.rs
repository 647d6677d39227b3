//! The dead-letter filters, read from a query or a form as the CLI reads its flags. Beside
//! the routes and the pages rather than in either: the routes read a filter from a request, the
//! pages draw its form, and neither imports the other for it.

use fleet_budget::DeadLetterReason;
use fleet_budget_amqp::ReplayFilter;
use serde::Deserialize;

use crate::dead_letters::Which;

/// The CLI's filters (`--dependency`, `--reason`, `--error-class`, `--task`, `--since`,
/// `--until`, `--error-contains`), as a query or a form.
#[derive(Debug, Default, Clone, Deserialize)]
pub(crate) struct FilterForm {
    #[serde(default)]
    pub(crate) queue: Option<String>,
    #[serde(default)]
    pub(crate) dependency: Option<String>,
    #[serde(default)]
    pub(crate) reason: Option<String>,
    #[serde(default)]
    pub(crate) task: Option<String>,
    #[serde(default)]
    pub(crate) since: Option<String>,
    #[serde(default)]
    pub(crate) until: Option<String>,
    #[serde(default)]
    pub(crate) error_contains: Option<String>,
    #[serde(default)]
    pub(crate) error_class: Option<String>,
    /// Any value: also the messages whose dead-letter headers cannot be read.
    #[serde(default)]
    pub(crate) malformed: Option<String>,
    /// A group of the index by its short key (`crate::dead_letters::group_key`): its
    /// dependency, reason and error class, read from the index by the route.
    #[serde(default)]
    pub(crate) g: Option<String>,
}

impl FilterForm {
    pub(crate) fn which(&self) -> Which {
        Which::parse(self.queue.as_deref())
    }

    /// The library's filter; a bad value is said (the routes answer 400 with it).
    pub(crate) fn filter(&self) -> Result<ReplayFilter, String> {
        let now = fleet_budget::clock::now_ms();
        let time = |v: Option<&String>, flag: &str| match some(v) {
            Some(t) => parse_time(t, now)
                .map(Some)
                .map_err(|e| format!("{flag}: {e}")),
            None => Ok(None),
        };
        let reason = match some(self.reason.as_ref()) {
            Some(r) => Some(DeadLetterReason::parse(r).ok_or_else(|| {
                "the reason is budget_exhausted, budget_frozen, attempts_exhausted or non_retryable (or another the library names)".to_owned()
            })?),
            None => None,
        };
        Ok(ReplayFilter {
            dependency: some(self.dependency.as_ref()).map(str::to_owned),
            reason,
            since_ms: time(self.since.as_ref(), "since")?,
            until_ms: time(self.until.as_ref(), "until")?,
            task: some(self.task.as_ref()).map(str::to_owned),
            message_id: None,
            error_contains: some(self.error_contains.as_ref()).map(str::to_owned),
            error_class: some(self.error_class.as_ref()).map(str::to_owned),
            malformed: some(self.malformed.as_ref()).is_some(),
        })
    }
}

/// A form's field as given, trimmed; `None` when empty.
pub(crate) fn some(v: Option<&String>) -> Option<&str> {
    v.map(|s| s.trim()).filter(|s| !s.is_empty())
}

/// Unix seconds, an RFC 3339 time, or an age (`30m`, `1h30m`, `1d`): Unix ms (as the CLI's
/// `--since`).
fn parse_time(text: &str, now_ms: u64) -> Result<u64, String> {
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(secs.saturating_mul(1000));
    }
    if let Ok(at) = humantime::parse_rfc3339_weak(text) {
        return at
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .map_err(|_| "a time before 1970".to_owned());
    }
    humantime::parse_duration(text)
        .map(|ago| now_ms.saturating_sub(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX)))
        .map_err(|_| {
            format!(
                "`{}` is neither Unix seconds, an RFC 3339 time nor an age like 30m",
                fleet_budget::printable::escape_text(text)
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_the_cli_reads_them() {
        let now = 10_000_000;
        assert_eq!(parse_time("90s", now), Ok(now - 90_000));
        assert_eq!(parse_time("1700000000", now), Ok(1_700_000_000_000));
        assert_eq!(
            parse_time("2026-11-30T04:00:00Z", now),
            Ok(1_796_011_200_000)
        );
        assert!(parse_time("yesterday", now).is_err());
    }
}
