//! Dependencies (what a budget protects) and the task → dependency map.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use thiserror::Error;

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
    /// The name holds a character that would break the Redis hash tag or a log line.
    #[error(
        "contains {found:?}; `{{`, `}}`, control and bidirectional control characters are not allowed"
    )]
    ForbiddenChar {
        /// The first offending character.
        found: char,
    },
}

/// The name of a protected system (`search`, `mail`, ...). Budgets are keyed by dependency.
///
/// A valid name is non-empty, at most [`MAX_DEPENDENCY_LEN`] bytes, and holds no `{`, `}` or
/// control characters, because it becomes the Redis Cluster hash tag of its keys (`{search}`).
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
/// Empty, too long, or holding `{`, `}` or a control character.
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
        .find(|c| *c == '{' || *c == '}' || c.is_control() || is_bidi_control(*c))
    {
        return Err(InvalidName::ForbiddenChar { found: c });
    }
    Ok(())
}

/// Whether `c` changes the direction of the text around it (U+061C, U+200E, U+200F,
/// U+202A to U+202E, U+2066 to U+2069): a name holding one prints as something it is not.
#[must_use]
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
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

/// Maps task names to the dependency whose budget they spend.
///
/// A task with no mapping is its own dependency: it fails safe, never silently sharing another
/// dependency's allowance.
#[derive(Debug, Clone, Default)]
pub struct DependencyMap {
    tasks: HashMap<String, Dependency>,
}

impl DependencyMap {
    /// An empty map: every task is its own dependency.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `task` to `dependency`, returning the dependency it was mapped to before, if any.
    pub fn insert(
        &mut self,
        task: impl Into<String>,
        dependency: Dependency,
    ) -> Option<Dependency> {
        self.tasks.insert(task.into(), dependency)
    }

    /// The dependency of `task`.
    ///
    /// # Errors
    /// An unmapped task whose name is not a valid dependency name (e.g. it holds `{`).
    pub fn resolve(&self, task: &str) -> Result<Dependency, InvalidName> {
        match self.tasks.get(task) {
            Some(dependency) => Ok(dependency.clone()),
            None => Dependency::new(task),
        }
    }

    /// Whether `task` has an explicit mapping.
    #[must_use]
    pub fn is_mapped(&self, task: &str) -> bool {
        self.tasks.contains_key(task)
    }

    /// The explicit mappings, sorted by task name.
    #[must_use]
    pub fn entries(&self) -> Vec<(&str, &Dependency)> {
        let mut entries: Vec<_> = self.tasks.iter().map(|(t, d)| (t.as_str(), d)).collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmapped_task_is_its_own_dependency() {
        let mut map = DependencyMap::new();
        map.insert("index_document", Dependency::new("search").unwrap());
        assert_eq!(map.resolve("index_document").unwrap().as_str(), "search");
        assert_eq!(map.resolve("send_sms").unwrap().as_str(), "send_sms");
    }

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
        let mut map = DependencyMap::new();
        map.insert("ok", Dependency::new("ok").unwrap());
        assert!(map.resolve("bad{task}").is_err());
    }
}
