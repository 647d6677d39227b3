//! Text that arrives from outside — a task, dependency or error text in a message's headers —
//! made safe to print on a terminal or in a log line.
//!
//! Why: configured names are checked ([`crate::dependency::validate_name`] refuses control,
//! bidirectional control and invisible characters: [`is_unsafe_char`]), but a message can carry
//! anything. Printed raw, an escape sequence drives the operator's terminal, a right-to-left
//! override (U+202E) makes `pay\u{202E}lanoitan` read as something it is not, and a zero-width
//! space hides inside `sea\u{200B}rch`. Each such character is shown as its code instead
//! (`\u{202e}`), so the text stays readable and unambiguous; everything else is kept.

use std::borrow::Cow;

use crate::dependency::is_unsafe_char;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
