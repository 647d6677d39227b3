//! Dependencies (what a budget protects) and their names; the task → dependency map, and what
//! becomes of a task the map does not name, is `map.rs`.
//!
//! The task name comes from the message (the AMQP `type`, `fb-task` or the routing key), so an
//! unmapped name is input from whoever can publish, not configuration. Left unbounded, every new
//! name would be a fresh budget (a producer bug or a hostile producer escaping the fleet's
//! allowance) and new metric series that are never removed. [`UnmappedTasks`] says what an
//! unmapped name spends, and [`OwnBudgets`] bounds how many names get a budget of their own.

use std::fmt;
use std::sync::Arc;

use thiserror::Error;

mod map;

pub use self::map::{
    DEFAULT_MAX_OWN_BUDGETS, DependencyMap, OVERFLOW_DEPENDENCY, OwnBudgets, UnmappedTasks,
    Unresolved,
};
// The characters a name must not hold are those no printed text may (`printable.rs`); named
// here, where they were public before.
pub use crate::printable::{CodePoint, is_bidi_control, is_unsafe_char};

/// Longest dependency name accepted, in bytes.
pub const MAX_DEPENDENCY_LEN: usize = 200;

/// Why a name cannot be a dependency name.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum InvalidName {
    /// The name is empty.
    #[error("must not be empty")]
    Empty,
    /// The name is longer than allowed.
    #[error("is {len} bytes long; at most {max} bytes are allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The longest allowed.
        max: usize,
    },
    /// The name holds a character that would break the Redis hash tag or a log line, or make
    /// the name print as something it is not ([`is_unsafe_char`]).
    #[error(
        "contains {}; `{{`, `}}`, control, bidirectional control and invisible characters are not allowed",
        CodePoint(*found)
    )]
    ForbiddenChar {
        /// The first offending character.
        found: char,
    },
}

/// The name of a protected system (`search`, `mail`, ...). Budgets are keyed by dependency.
///
/// A valid name is non-empty, at most [`MAX_DEPENDENCY_LEN`] bytes, and holds no `{` or `}`,
/// because it becomes the Redis Cluster hash tag of its keys (`{search}`), and no character that
/// [`is_unsafe_char`] names, because it is printed in logs, metrics and `budgetctl status`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dependency(Arc<str>);

impl Dependency {
    /// Validates `name` as a dependency name.
    ///
    /// # Errors
    /// [`InvalidName`] says what is wrong with it.
    pub fn new(name: &str) -> Result<Self, InvalidName> {
        validate_name(name)?;
        Ok(Self(Arc::from(name)))
    }

    /// The name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Checks a dependency name; the error says what is wrong.
///
/// # Errors
/// Empty, too long, or holding `{`, `}` or a character [`is_unsafe_char`] names.
pub fn validate_name(name: &str) -> Result<(), InvalidName> {
    if name.is_empty() {
        return Err(InvalidName::Empty);
    }
    if name.len() > MAX_DEPENDENCY_LEN {
        return Err(InvalidName::TooLong {
            len: name.len(),
            max: MAX_DEPENDENCY_LEN,
        });
    }
    if let Some(c) = name
        .chars()
        .find(|c| *c == '{' || *c == '}' || is_unsafe_char(*c))
    {
        return Err(InvalidName::ForbiddenChar { found: c });
    }
    Ok(())
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

impl AsRef<str> for Dependency {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_names_are_refused() {
        assert_eq!(Dependency::new(""), Err(InvalidName::Empty));
        assert!(matches!(
            Dependency::new("pay\u{202E}lanoitan"),
            Err(InvalidName::ForbiddenChar { found: '\u{202E}' })
        ));
        assert!(matches!(
            Dependency::new("a\u{2067}b"),
            Err(InvalidName::ForbiddenChar { found: '\u{2067}' })
        ));
        assert!(matches!(
            Dependency::new("a{b"),
            Err(InvalidName::ForbiddenChar { found: '{' })
        ));
        assert!(matches!(
            Dependency::new("a}b"),
            Err(InvalidName::ForbiddenChar { found: '}' })
        ));
        assert!(matches!(
            Dependency::new("a\nb"),
            Err(InvalidName::ForbiddenChar { .. })
        ));
        assert!(matches!(
            Dependency::new(&"x".repeat(201)),
            Err(InvalidName::TooLong { .. })
        ));
        assert!(Dependency::new(&"x".repeat(200)).is_ok());
        assert!(Dependency::new("naïve-検索 v2").is_ok());
        let mut map = DependencyMap::new();
        map.insert("ok", Dependency::new("ok").unwrap());
        assert!(map.resolve("bad{task}").is_err());
    }

    /// Input review, session 6: zero-width and other invisible characters were accepted in a
    /// name (only controls and bidirectional controls were refused), so `sea\u{200B}rch` was a
    /// budget of its own that printed as `search`. The error names the character by its code.
    #[test]
    fn invisible_characters_are_refused_and_named_by_code_point() {
        for (name, code) in [
            ("sea\u{200B}rch", "U+200B (an invisible character)"),
            ("sea\u{200C}rch", "U+200C (an invisible character)"),
            ("sea\u{200D}rch", "U+200D (an invisible character)"),
            ("sea\u{2060}rch", "U+2060 (an invisible character)"),
            ("\u{FEFF}search", "U+FEFF (an invisible character)"),
            ("sea\u{00AD}rch", "U+00AD (an invisible character)"),
            ("search\u{FE0F}", "U+FE0F (an invisible character)"),
            ("search\u{E0001}", "U+E0001 (an invisible character)"),
            ("search\u{3164}", "U+3164 (an invisible character)"),
            ("a\u{2028}b", "U+2028 (a line or paragraph separator)"),
            ("pay\u{202E}x", "U+202E (a bidirectional control)"),
            ("a\u{9b}b", "U+009B (a control character)"),
        ] {
            let e = Dependency::new(name).unwrap_err();
            let text = e.to_string();
            assert!(text.contains(code), "{name:?}: {text}");
            assert!(!text.contains(is_unsafe_char), "{text:?}");
        }
    }
}
