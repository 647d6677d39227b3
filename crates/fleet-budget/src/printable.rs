//! Text that arrives from outside — a task, dependency or error text in a message's headers —
//! made safe to print on a terminal or in a log line.
//!
//! Why: configured names are checked ([`crate::dependency::validate_name`] refuses control,
//! bidirectional control and invisible characters: [`is_unsafe_char`]), but a message can carry
//! anything. Printed raw, an escape sequence drives the operator's terminal, a right-to-left
//! override (U+202E) makes `pay\u{202E}lanoitan` read as something it is not, and a zero-width
//! space hides inside `sea\u{200B}rch`. Each such character is shown as its code instead
//! (`\u{202e}`), so the text stays readable and unambiguous; everything else is kept.
//!
//! The characters themselves ([`is_unsafe_char`], [`is_bidi_control`]) and how an error names
//! one ([`CodePoint`]) live here too: the dependency names, the configuration's checks and the
//! printing of hostile text all refuse or escape the same set.

use std::borrow::Cow;
use std::fmt;

/// `text` with every character [`is_unsafe_char`] names (control, bidirectional control,
/// invisible) shown as `\u{…}`.
#[must_use]
pub fn escape_text(text: &str) -> Cow<'_, str> {
    let hostile = is_unsafe_char;
    if !text.chars().any(hostile) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hostile(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Whether `c` changes the direction of the text around it (U+061C, U+200E, U+200F,
/// U+202A to U+202E, U+2066 to U+2069): a name holding one prints as something it is not.
#[must_use]
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Whether `c` must not be part of a name (a dependency, a task in the configuration, the Redis
/// key prefix): printed, it drives the terminal, breaks the line, or hides or reorders the text
/// around it, so that `pay\u{202E}lanoitan` or `sea\u{200B}rch` reads as a name it is not. Such
/// characters are:
///
/// - the control characters (U+0000 to U+001F, U+007F to U+009F);
/// - the line and paragraph separators (U+2028, U+2029);
/// - Unicode's default-ignorable code points (`Default_Ignorable_Code_Point`, unchanged since Unicode 14),
///   which render as nothing: the bidirectional controls ([`is_bidi_control`]), the zero-width
///   space, joiners and no-break space (U+200B to U+200D, U+2060, U+FEFF), the soft hyphen
///   U+00AD, variation selectors, tags (U+E0000 to U+E0FFF), fillers and the code points
///   reserved as default-ignorable.
///
/// The list is written out, not read from the Unicode tables of the language, so that the Python
/// client (`fleet_budget.config._is_unsafe_char`) refuses exactly the same characters.
#[must_use]
pub fn is_unsafe_char(c: char) -> bool {
    matches!(c,
        '\u{0000}'..='\u{001F}'
        | '\u{007F}'..='\u{009F}'
        | '\u{00AD}'
        | '\u{034F}'
        | '\u{061C}'
        | '\u{115F}'..='\u{1160}'
        | '\u{17B4}'..='\u{17B5}'
        | '\u{180B}'..='\u{180F}'
        | '\u{200B}'..='\u{200F}'
        | '\u{2028}'
        | '\u{2029}'
        | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}'
        | '\u{3164}'
        | '\u{FE00}'..='\u{FE0F}'
        | '\u{FEFF}'
        | '\u{FFA0}'
        | '\u{FFF0}'..='\u{FFF8}'
        | '\u{1BCA0}'..='\u{1BCA3}'
        | '\u{1D173}'..='\u{1D17A}'
        | '\u{E0000}'..='\u{E0FFF}')
}

/// A character as an error message names it: its code point and, for one that does not show,
/// what it is (`U+202E (a bidirectional control)`), so that the message itself cannot be
/// garbled by the character it is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodePoint(pub char);

impl fmt::Display for CodePoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.0;
        write!(f, "U+{:04X}", u32::from(c))?;
        let what = if c.is_control() {
            "a control character"
        } else if is_bidi_control(c) {
            "a bidirectional control"
        } else if matches!(c, '\u{2028}' | '\u{2029}') {
            "a line or paragraph separator"
        } else if is_unsafe_char(c) {
            "an invisible character"
        } else if c.is_whitespace() {
            "a space"
        } else {
            return write!(f, " `{c}`");
        };
        write!(f, " ({what})")
    }
}

/// Unix ms as an RFC 3339 UTC time to the second (`2026-03-01T12:00:00Z`), as the CLI, the
/// console and the reports show times. The ms come from Redis entries and message headers
/// anyone can write: a time past the year 9999, which RFC 3339 cannot show, is shown as the
/// number it is, never a panic.
#[must_use]
pub fn rfc3339_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil(i64::try_from(days).unwrap_or(i64::MAX / 2));
    if y > 9999 {
        return format!("{ms} ms after the epoch (past the year 9999)");
    }
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The civil date of `days` since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_up_to_the_year_9999_and_numbers_after() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_ms(1_796_604_919_999), "2026-12-07T00:55:19Z");
        assert_eq!(rfc3339_ms(253_402_300_799_000), "9999-12-31T23:59:59Z");
        assert_eq!(
            rfc3339_ms(253_402_300_800_000),
            "253402300800000 ms after the epoch (past the year 9999)"
        );
        assert_eq!(
            rfc3339_ms(u64::MAX),
            format!("{} ms after the epoch (past the year 9999)", u64::MAX)
        );
    }

    #[test]
    fn controls_and_bidi_overrides_are_shown_as_codes() {
        assert_eq!(escape_text("search"), "search");
        assert!(matches!(escape_text("plain"), Cow::Borrowed(_)));
        assert_eq!(escape_text("pay\u{202E}lanoitan"), "pay\\u{202e}lanoitan");
        assert_eq!(escape_text("a\x1b[2Jb\n"), "a\\u{1b}[2Jb\\u{a}");
        assert_eq!(
            escape_text("\u{2066}x\u{2069}\u{200F}"),
            "\\u{2066}x\\u{2069}\\u{200f}"
        );
        assert_eq!(escape_text("naïve 検索"), "naïve 検索");
        assert_eq!(
            escape_text("sea\u{200B}rch\u{FEFF}\u{E0041}"),
            "sea\\u{200b}rch\\u{feff}\\u{e0041}"
        );
    }

    /// What [`is_unsafe_char`] names, range by range, and that it covers the controls and the
    /// bidirectional controls it is documented to.
    #[test]
    fn unsafe_characters_are_controls_separators_and_default_ignorables() {
        let unsafe_ranges: Vec<(u32, u32)> = {
            let mut ranges: Vec<(u32, u32)> = Vec::new();
            for c in (0..=0x10_FFFF).filter_map(char::from_u32) {
                if !is_unsafe_char(c) {
                    continue;
                }
                let code = u32::from(c);
                match ranges.last_mut() {
                    Some((_, end)) if *end + 1 == code => *end = code,
                    _ => ranges.push((code, code)),
                }
            }
            ranges
        };
        assert_eq!(
            unsafe_ranges,
            [
                (0x0, 0x1F),
                (0x7F, 0x9F),
                (0xAD, 0xAD),
                (0x34F, 0x34F),
                (0x61C, 0x61C),
                (0x115F, 0x1160),
                (0x17B4, 0x17B5),
                (0x180B, 0x180F),
                (0x200B, 0x200F),
                (0x2028, 0x202E),
                (0x2060, 0x206F),
                (0x3164, 0x3164),
                (0xFE00, 0xFE0F),
                (0xFEFF, 0xFEFF),
                (0xFFA0, 0xFFA0),
                (0xFFF0, 0xFFF8),
                (0x1BCA0, 0x1BCA3),
                (0x1D173, 0x1D17A),
                (0xE0000, 0xE0FFF),
            ]
        );
        for c in (0..=0x10_FFFF).filter_map(char::from_u32) {
            if c.is_control() || is_bidi_control(c) {
                assert!(is_unsafe_char(c), "{:x}", u32::from(c));
            }
        }
    }
}
