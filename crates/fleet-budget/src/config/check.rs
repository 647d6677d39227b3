//! The checks every section's values go through. Each check records a [`Problem`] and carries on
//! with the default, so that all problems of a file are reported together.
//!
//! Public so that crates owning other sections of the same file (`fleet-budget-amqp`'s
//! `[amqp]`) and the CLI's overrides check values the same way and word problems alike.

use std::fmt::{self, Write as _};
use std::path::PathBuf;
use std::time::Duration;

use super::Problem;
use crate::dependency::Dependency;
use crate::printable::{CodePoint, is_unsafe_char};
use crate::redact::redact_url;
use crate::tls::TlsFiles;

/// Longest key prefix accepted.
pub const MAX_KEY_PREFIX_LEN: usize = 64;

/// Checks that `url` is `<scheme>://<something>` for one of `schemes`; `key` names the setting.
/// The problem shows the URL with its password redacted.
///
/// # Errors
/// The problem, when the URL has none of the schemes or nothing after `://`.
pub fn check_url(key: &str, url: &str, schemes: &[&str]) -> Result<(), Problem> {
    if let Some(problem) = tls_not_built(key, url, schemes) {
        return Err(problem);
    }
    if url
        .split_once('#')
        .is_some_and(|(_, fragment)| !fragment.is_empty())
    {
        // `rediss://host/#insecure` would ask the Redis client to skip certificate checks.
        return Err(Problem::new(
            key,
            redact_url(url),
            "must not have a #fragment (certificate and host name checks cannot be turned off)",
        ));
    }
    let ok = schemes.iter().any(|s| {
        url.strip_prefix(s)
            .and_then(|r| r.strip_prefix("://"))
            .is_some_and(|r| !r.is_empty())
    });
    if ok {
        return Ok(());
    }
    let allowed: Vec<String> = schemes.iter().map(|s| format!("{s}://...")).collect();
    Err(Problem::new(
        key,
        redact_url(url),
        format!("must be a URL of the form {}", allowed.join(" or ")),
    ))
}

/// The TLS variant of an allowed scheme that this build cannot honour (a scheme plus `s` that is
/// not itself allowed, e.g. `unixs` where only `unix` is): refused as a configuration error
/// rather than connected **without encryption**.
fn tls_not_built(key: &str, url: &str, schemes: &[&str]) -> Option<Problem> {
    let (scheme, _) = url.split_once("://")?;
    let plain = scheme.strip_suffix('s')?;
    if schemes.contains(&scheme) || !schemes.contains(&plain) {
        return None;
    }
    Some(Problem::new(
        key,
        redact_url(url),
        format!(
            "TLS ({scheme}://) is not available in this build, and the connection would not be \
             encrypted; use {plain}:// on a trusted network or through a TLS tunnel"
        ),
    ))
}

/// Checks a Redis key prefix: 1 to [`MAX_KEY_PREFIX_LEN`] bytes without `{`, `}` (they would
/// change the Cluster hash tag), spaces, or a character [`is_unsafe_char`] names (control,
/// bidirectional control, invisible): the prefix is in every key name, and keys are printed by
/// `budgetctl status`, the audit trail and `redis-cli`, where such a character would make one
/// tenant's keys read as another's. The same rule as a dependency name's, plus no spaces. `key`
/// names the setting; the problem names the first offending character by its code point.
///
/// # Errors
/// The problem, when the prefix is not allowed.
pub fn check_key_prefix(key: &str, prefix: &str) -> Result<(), Problem> {
    const RULE: &str = "must be 1 to 64 bytes without `{`, `}`, spaces, control, bidirectional \
                        control or invisible characters";
    let forbidden = |ch: char| ch == '{' || ch == '}' || ch.is_whitespace() || is_unsafe_char(ch);
    let why = if let Some(ch) = prefix.chars().find(|ch| forbidden(*ch)) {
        format!("contains {}; {RULE}", CodePoint(ch))
    } else if prefix.is_empty() || prefix.len() > MAX_KEY_PREFIX_LEN {
        format!("is {} bytes long; {RULE}", prefix.len())
    } else {
        return Ok(());
    };
    Err(Problem::new(key, quoted(prefix), why))
}

/// Collects the problems of a configuration while its sections are resolved.
#[derive(Debug, Default)]
pub struct Checker {
    problems: Vec<Problem>,
}

impl Checker {
    /// No problems yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The problems found, in the order they were found.
    #[must_use]
    pub fn into_problems(self) -> Vec<Problem> {
        self.problems
    }

    /// How many problems were found so far (a section can tell whether its own checks passed).
    #[must_use]
    pub fn problem_count(&self) -> usize {
        self.problems.len()
    }

    /// Records a problem.
    pub fn push(&mut self, problem: Problem) {
        self.problems.push(problem);
    }

    /// Records that `value` of `key` is not allowed; `allowed` says what is.
    pub fn problem(&mut self, key: &str, value: impl fmt::Display, allowed: impl Into<String>) {
        self.push(Problem::new(key, value, allowed));
    }

    /// The outcome of a check: `true` when it passed, otherwise the problem is recorded.
    pub fn passed(&mut self, check: Result<(), Problem>) -> bool {
        match check {
            Ok(()) => true,
            Err(problem) => {
                self.push(problem);
                false
            }
        }
    }

    /// `value` if it lies in `lo..=hi`, `default` if it is absent or (with a problem) out of range.
    pub fn int_in(&mut self, key: &str, value: Option<i64>, lo: i64, hi: i64, default: i64) -> i64 {
        self.in_range(key, value, lo, hi).unwrap_or(default)
    }

    /// `value` in units of `unit` (`Duration::from_secs`, `Duration::from_millis`) if it lies
    /// in `lo..=hi` (`lo` at least 0), `default` if it is absent or (with a problem) out of range.
    pub fn duration_in(
        &mut self,
        key: &str,
        value: Option<i64>,
        lo: i64,
        hi: i64,
        default: Duration,
        unit: fn(u64) -> Duration,
    ) -> Duration {
        self.in_range(key, value, lo, hi)
            .and_then(|v| u64::try_from(v).ok())
            .map_or(default, unit)
    }

    /// `value` when it is given and lies in `lo..=hi`; a problem when it is given outside.
    fn in_range(&mut self, key: &str, value: Option<i64>, lo: i64, hi: i64) -> Option<i64> {
        let v = value?;
        if (lo..=hi).contains(&v) {
            Some(v)
        } else {
            self.problem(key, v, format!("must be an integer from {lo} to {hi}"));
            None
        }
    }

    /// The certificate files of the section `section` (`redis`, `amqp`), with a problem when
    /// one is an empty path (it would fail only at the first `rediss://` or `amqps://` connect,
    /// as a file that cannot be read), or when only one of its `tls_cert_file` and
    /// `tls_key_file` is given (a client certificate needs its key).
    pub fn tls_files(
        &mut self,
        section: &str,
        ca_file: Option<PathBuf>,
        cert_file: Option<PathBuf>,
        key_file: Option<PathBuf>,
    ) -> TlsFiles {
        let mut path = |name: &str, file: Option<PathBuf>| {
            let file = file?;
            if file.as_os_str().is_empty() {
                self.problem(
                    &format!("{section}.{name}"),
                    "\"\"",
                    "must be the path of a PEM file",
                );
                return None;
            }
            Some(file)
        };
        let ca_file = path("tls_ca_file", ca_file);
        let cert_file = path("tls_cert_file", cert_file);
        let key_file = path("tls_key_file", key_file);
        if cert_file.is_some() != key_file.is_some() {
            self.problem(
                &format!("{section}.tls_cert_file"),
                "(only one of the pair)",
                format!("{section}.tls_cert_file and {section}.tls_key_file must be set together"),
            );
        }
        TlsFiles {
            ca_file,
            cert_file,
            key_file,
        }
    }

    /// The section at `at` as its own whole-section check found it (`checked`, once each value
    /// passed): the value, or `None` with the error recorded as the section's problem.
    pub fn section<T, E: fmt::Display>(&mut self, at: &str, checked: Result<T, E>) -> Option<T> {
        match checked {
            Ok(value) => Some(value),
            Err(e) => {
                self.problem(at, "the section", e.to_string());
                None
            }
        }
    }

    /// `name` as a dependency, when it is a valid dependency name (a problem says why not).
    pub(super) fn dependency_name(&mut self, key: &str, name: &str) -> Option<Dependency> {
        match Dependency::new(name) {
            Ok(dependency) => Some(dependency),
            Err(e) => {
                self.problem(key, quoted(name), format!("dependency name {e}"));
                None
            }
        }
    }
}

/// A key as TOML would need it written in a dotted path: bare when it can be, else
/// [`quoted`].
pub(super) fn toml_key(name: &str) -> String {
    if !name.is_empty()
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
    {
        return name.to_owned();
    }
    quoted(name)
}

/// `text` in double quotes as a problem shows a name: `\\`, `"`, tab, line feed, carriage
/// return and NUL escaped as TOML and Rust write them, and every other character
/// [`is_unsafe_char`] names as `\u{…}`, so that a key or value never prints as something it is
/// not. The Python client's `_quoted` writes them the same way.
pub(super) fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for ch in text.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            ch if is_unsafe_char(ch) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(ch));
            }
            ch => out.push(ch),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_need_one_of_the_schemes_and_a_rest() {
        assert!(check_url("k", "redis://h:1", &["redis", "rediss"]).is_ok());
        assert!(check_url("k", "rediss://h", &["redis", "rediss"]).is_ok());
        for bad in ["redis://", "http://h", "redis:/h", ""] {
            let p = check_url("k", bad, &["redis", "rediss"]).unwrap_err();
            assert_eq!(p.key, "k");
            assert_eq!(
                p.allowed,
                "must be a URL of the form redis://... or rediss://..."
            );
        }
    }

    #[test]
    fn a_tls_scheme_this_build_cannot_honour_is_refused_not_downgraded() {
        for (url, schemes) in [
            ("rediss://u:hunter2@h:6380", &["redis", "unix"][..]),
            ("amqps://u:hunter2@h/v", &["amqp"][..]),
        ] {
            let p = check_url("k", url, schemes).unwrap_err();
            assert!(p.allowed.contains("not available in this build"), "{p}");
            assert!(p.allowed.contains("not be encrypted"), "{p}");
            assert!(!p.to_string().contains("hunter2"), "{p}");
        }
        // A scheme that is not the TLS form of an allowed one gets the usual problem.
        let p = check_url("k", "https://h", &["redis"]).unwrap_err();
        assert_eq!(p.allowed, "must be a URL of the form redis://...");
    }

    #[test]
    fn durations_in_range_or_the_default_with_a_problem() {
        let mut c = Checker::new();
        let d = Duration::from_secs(7);
        assert_eq!(c.duration_in("k", None, 0, 10, d, Duration::from_secs), d);
        let three = c.duration_in("k", Some(3), 0, 10, d, Duration::from_millis);
        assert_eq!(three, Duration::from_millis(3));
        assert_eq!(c.problem_count(), 0);
        assert_eq!(
            c.duration_in("k", Some(11), 0, 10, d, Duration::from_secs),
            d
        );
        assert_eq!(
            c.duration_in("k", Some(-1), 0, 10, d, Duration::from_secs),
            d
        );
        let p = c.into_problems();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].allowed, "must be an integer from 0 to 10");
    }

    /// `tls_ca_file = ""` was accepted and failed only at the first TLS connect, as a file that
    /// cannot be read; the Python client refused it. Refused here too, named, and an empty half
    /// of the client pair counts as missing.
    #[test]
    fn empty_certificate_paths_are_refused() {
        let mut c = Checker::new();
        let files = c.tls_files("redis", Some(PathBuf::new()), None, None);
        assert_eq!(files.ca_file, None);
        let files = c.tls_files(
            "amqp",
            None,
            Some(PathBuf::new()),
            Some(PathBuf::from("k.pem")),
        );
        assert_eq!(files.cert_file, None);
        let keys: Vec<String> = c.into_problems().into_iter().map(|p| p.key).collect();
        assert_eq!(
            keys,
            [
                "redis.tls_ca_file",
                "amqp.tls_cert_file",
                "amqp.tls_cert_file"
            ]
        );
    }

    #[test]
    fn key_prefixes_without_braces_spaces_or_control_characters() {
        assert!(check_key_prefix("k", "fb").is_ok());
        assert!(check_key_prefix("k", &"p".repeat(64)).is_ok());
        assert!(check_key_prefix("k", "tenant-7.検索").is_ok());
        let long = "p".repeat(65);
        for (bad, why) in [
            ("", "is 0 bytes long"),
            ("a{b", "contains U+007B `{`"),
            ("a}b", "contains U+007D `}`"),
            ("a b", "contains U+0020 (a space)"),
            ("a\nb", "contains U+000A (a control character)"),
            (long.as_str(), "is 65 bytes long"),
        ] {
            let p = check_key_prefix("k", bad).unwrap_err();
            assert_eq!(p.key, "k");
            assert!(p.allowed.starts_with(why), "{bad:?}: {p}");
        }
    }

    /// Input review, session 6: a prefix holding a bidirectional control or an invisible
    /// character was accepted, and then was in every key name and in `status` and audit output.
    /// Refused now, the character named by its code point and never printed raw.
    #[test]
    fn key_prefixes_with_bidi_controls_or_invisible_characters_are_refused() {
        for (bad, code) in [
            ("fb\u{202E}x", "U+202E (a bidirectional control)"),
            ("fb\u{2066}", "U+2066 (a bidirectional control)"),
            ("\u{200E}fb", "U+200E (a bidirectional control)"),
            ("f\u{200F}b", "U+200F (a bidirectional control)"),
            ("f\u{061C}b", "U+061C (a bidirectional control)"),
            ("f\u{200B}b", "U+200B (an invisible character)"),
            ("f\u{200D}b", "U+200D (an invisible character)"),
            ("f\u{2060}b", "U+2060 (an invisible character)"),
            ("\u{FEFF}fb", "U+FEFF (an invisible character)"),
            ("f\u{00AD}b", "U+00AD (an invisible character)"),
            ("fb\u{E0041}", "U+E0041 (an invisible character)"),
            ("fb\u{3164}", "U+3164 (an invisible character)"),
            ("f\u{2028}b", "U+2028 (a line or paragraph separator)"),
            ("f\u{85}b", "U+0085 (a control character)"),
            ("f\u{1b}[2Jb", "U+001B (a control character)"),
        ] {
            let p = check_key_prefix("redis.key_prefix", bad).unwrap_err();
            assert_eq!(p.key, "redis.key_prefix");
            assert!(p.allowed.contains(code), "{bad:?}: {p}");
            let shown = p.to_string();
            assert!(!shown.contains(is_unsafe_char), "{shown:?}");
        }
    }

    #[test]
    fn quoted_names_escape_what_would_not_show() {
        assert_eq!(toml_key("search"), "search");
        assert_eq!(toml_key("a.b"), "\"a.b\"");
        assert_eq!(toml_key(""), "\"\"");
        assert_eq!(toml_key("a\"\\\t\n\r\0b"), "\"a\\\"\\\\\\t\\n\\r\\0b\"");
        assert_eq!(
            toml_key("pay\u{202E}x\u{200B}\u{3164}\u{1b}"),
            "\"pay\\u{202e}x\\u{200b}\\u{3164}\\u{1b}\""
        );
        assert_eq!(quoted("naïve 検索 é"), "\"naïve 検索 é\"");
    }
}
