//! Times as an operator reads them: "3 min ago" on the page, the exact UTC time in the
//! element's `title` (shown on hover) and its `datetime`.
//!
//! Why one file: raw seconds and RFC 3339 stamps made every page's reader do arithmetic during
//! an incident (issue 32); every page that shows a time calls [`ago`] (or [`relative`] for the
//! words alone), so the wording is the same everywhere.

use std::time::Duration;

use fleet_budget::printable::rfc3339_ms;
use maud::{Markup, html};

/// A point in time (Unix ms) as `<time>`: "3 min ago" (or "in 3 min"), its exact UTC time in
/// the `title`; `-` when there is none. Now is the console's clock.
pub(crate) fn ago(ms: Option<u64>) -> Markup {
    ago_at(ms, fleet_budget::clock::now_ms())
}

/// [`ago`] with `now_ms` given.
pub(crate) fn ago_at(ms: Option<u64>, now_ms: u64) -> Markup {
    match ms {
        Some(ms) => html! {
            time datetime=(rfc3339_ms(ms)) title=(utc(ms)) { (relative(ms, now_ms)) }
        },
        None => html! { "-" },
    }
}

/// `ms` from `now_ms`, in words: "just now", "42 s ago", "3 min ago", "2 h 05 min ago",
/// "3 days ago", or "in ..." for a time to come.
pub(crate) fn relative(ms: u64, now_ms: u64) -> String {
    if ms <= now_ms {
        let past = Duration::from_millis(now_ms - ms);
        if past < Duration::from_secs(1) {
            return "just now".to_owned();
        }
        format!("{} ago", span(past))
    } else {
        format!("in {}", span(Duration::from_millis(ms - now_ms)))
    }
}

/// A length of time in words: "42 s", "3 min", "2 h 05 min", "3 days".
pub(crate) fn span(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min", secs / 60),
        3600..172_800 => format!("{} h {:02} min", secs / 3600, secs % 3600 / 60),
        _ => format!("{} days", secs / 86_400),
    }
}

/// The exact time: `2026-12-07 00:25:19 UTC`.
pub(crate) fn utc(ms: u64) -> String {
    rfc3339_ms(ms).replacen('T', " ", 1).replace('Z', " UTC")
}

#[cfg(test)]
mod tests {
    use super::{ago_at, relative, utc};

    const NOW: u64 = 1_796_604_919_000; // 2026-12-07T00:55:19Z

    #[test]
    fn times_read_as_words_with_the_exact_time_on_hover() {
        assert_eq!(relative(NOW, NOW), "just now");
        assert_eq!(relative(NOW - 42_000, NOW), "42 s ago");
        assert_eq!(relative(NOW - 3 * 60_000 - 5_000, NOW), "3 min ago");
        assert_eq!(
            relative(NOW - 2 * 3_600_000 - 5 * 60_000, NOW),
            "2 h 05 min ago"
        );
        assert_eq!(relative(NOW - 3 * 86_400_000, NOW), "3 days ago");
        assert_eq!(relative(NOW + 90_000, NOW), "in 1 min");
        assert_eq!(utc(NOW), "2026-12-07 00:55:19 UTC");
        let shown = ago_at(Some(NOW - 180_000), NOW).into_string();
        assert_eq!(
            shown,
            "<time datetime=\"2026-12-07T00:52:19Z\" title=\"2026-12-07 00:52:19 UTC\">3 min ago</time>"
        );
        assert_eq!(ago_at(None, NOW).into_string(), "-");
        // A registry's or a header's time is anyone's to write: past the year 9999 it is shown
        // as its number (humantime's formatter refused it, and `to_string` panicked).
        assert!(
            ago_at(Some(u64::MAX), NOW)
                .into_string()
                .contains("ms after the epoch (past the year 9999)")
        );
    }
}
