//! Dependencies (what a budget protects), the task → dependency map, and what becomes of a task
//! the map does not name.
//!
//! The task name comes from the message (the AMQP `type`, `fb-task` or the routing key), so an
//! unmapped name is input from whoever can publish, not configuration. Left unbounded, every new
//! name would be a fresh budget (a producer bug or a hostile producer escaping the fleet's
//! allowance) and new metric series that are never removed. [`UnmappedTasks`] says what an
//! unmapped name spends, and [`OwnBudgets`] bounds how many names get a budget of their own.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

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

/// The budget shared by unmapped names past the cap of [`UnmappedTasks::OwnBudget`].
pub const OVERFLOW_DEPENDENCY: &str = "unmapped";

/// How many unmapped names get a budget of their own by default, per process.
pub const DEFAULT_MAX_OWN_BUDGETS: usize = 100;

/// What a task without a mapping spends (`[unmapped_tasks]` in the configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnmappedTasks {
    /// Each unmapped name is its own dependency (the default: it never silently shares another
    /// dependency's allowance), for the first `max_own` names a process meets; every later name
    /// shares the one budget [`OVERFLOW_DEPENDENCY`] (`unmapped`). So budgets, their keys and
    /// metric label values grow by at most `max_own + 1` whatever names the broker delivers.
    OwnBudget {
        /// Names given a budget of their own, per process.
        max_own: usize,
    },
    /// Every unmapped name spends this dependency's budget.
    Share(Dependency),
    /// An unmapped name is refused ([`Unresolved::Rejected`]): the worker dead-letters the job
    /// `non_retryable`, class `unmapped_task`, without running it.
    Reject,
}

impl Default for UnmappedTasks {
    fn default() -> Self {
        Self::OwnBudget {
            max_own: DEFAULT_MAX_OWN_BUDGETS,
        }
    }
}

/// Why a task has no dependency.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Unresolved {
    /// Unmapped, to be its own dependency, and its name cannot be a dependency name.
    #[error("its name {0}")]
    InvalidName(#[from] InvalidName),
    /// Unmapped, and unmapped tasks are refused (`[unmapped_tasks] policy = "reject"`).
    #[error("unmapped tasks are rejected ([unmapped_tasks] policy = \"reject\")")]
    Rejected,
}

/// The unmapped names this process has given a budget of their own: at most the cap of
/// [`UnmappedTasks::OwnBudget`], first come, kept for the life of the process (a name admitted
/// keeps its budget; there is no churn of budgets or metric series).
#[derive(Debug, Default)]
pub struct OwnBudgets {
    names: Mutex<HashSet<Box<str>>>,
}

impl OwnBudgets {
    /// None admitted yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `name` has (or now gets, while fewer than `max` have one) a budget of its own.
    pub fn admit(&self, name: &str, max: usize) -> bool {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if names.contains(name) {
            return true;
        }
        if names.len() >= max {
            return false;
        }
        names.insert(name.into());
        true
    }

    /// How many names have a budget of their own.
    #[must_use]
    pub fn len(&self) -> usize {
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no name has one yet.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Maps task names to the dependency whose budget they spend, and says what an unmapped task
/// spends ([`UnmappedTasks`]).
#[derive(Debug, Clone, Default)]
pub struct DependencyMap {
    tasks: HashMap<String, Dependency>,
    unmapped: UnmappedTasks,
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

    /// Sets what unmapped tasks spend.
    pub fn set_unmapped(&mut self, unmapped: UnmappedTasks) {
        self.unmapped = unmapped;
    }

    /// What unmapped tasks spend.
    #[must_use]
    pub fn unmapped(&self) -> &UnmappedTasks {
        &self.unmapped
    }

    /// The dependency of `task`, not counting the cap on own budgets (an unmapped name under
    /// [`UnmappedTasks::OwnBudget`] is its own dependency): for showing a configuration. A
    /// worker resolves with [`DependencyMap::resolve_admitting`].
    ///
    /// # Errors
    /// An unmapped task that is refused, or whose name cannot be a dependency name.
    pub fn resolve(&self, task: &str) -> Result<Dependency, Unresolved> {
        self.resolve_with(task, |_| true)
    }

    /// The dependency of `task`, an unmapped name getting a budget of its own only while
    /// `own` admits it (else [`OVERFLOW_DEPENDENCY`]).
    ///
    /// # Errors
    /// An unmapped task that is refused, or whose name cannot be a dependency name.
    pub fn resolve_admitting(
        &self,
        task: &str,
        own: &OwnBudgets,
    ) -> Result<Dependency, Unresolved> {
        let max = match self.unmapped {
            UnmappedTasks::OwnBudget { max_own } => max_own,
            _ => 0,
        };
        self.resolve_with(task, |name| own.admit(name, max))
    }

    /// The dependency whose budget a failure naming `name` spends ([`crate::Failure::in_dependency`],
    /// a branch of a fan-out): `name` itself when `known` says a section configures it, or when a
    /// mapping, the shared dependency or the overflow budget is that name; any other name comes
    /// from the handler (often from the message), so it goes through `[unmapped_tasks]` exactly
    /// as an unmapped task does: a budget of its own while `own` admits it (the same cap, the
    /// same places), else [`OVERFLOW_DEPENDENCY`]; the shared dependency; or a refusal.
    ///
    /// # Errors
    /// An unknown name that is refused, or that is to be its own dependency and cannot be a
    /// dependency name.
    pub fn resolve_named_admitting(
        &self,
        name: &str,
        known: impl FnOnce(&Dependency) -> bool,
        own: &OwnBudgets,
    ) -> Result<Dependency, Unresolved> {
        if let Ok(dependency) = Dependency::new(name)
            && (self.names(&dependency) || known(&dependency))
        {
            return Ok(dependency);
        }
        let max = match self.unmapped {
            UnmappedTasks::OwnBudget { max_own } => max_own,
            _ => 0,
        };
        self.resolve_unmapped(name, |n| own.admit(n, max))
    }

    /// Whether this map itself names `dependency`: a mapping's target, the shared dependency,
    /// or the overflow budget of own budgets.
    fn names(&self, dependency: &Dependency) -> bool {
        match &self.unmapped {
            UnmappedTasks::Share(shared) if shared == dependency => return true,
            UnmappedTasks::OwnBudget { .. } if dependency.as_str() == OVERFLOW_DEPENDENCY => {
                return true;
            }
            _ => {}
        }
        self.tasks.values().any(|d| d == dependency)
    }

    fn resolve_with(
        &self,
        task: &str,
        admit: impl FnOnce(&str) -> bool,
    ) -> Result<Dependency, Unresolved> {
        if let Some(dependency) = self.tasks.get(task) {
            return Ok(dependency.clone());
        }
        self.resolve_unmapped(task, admit)
    }

    /// What an unmapped `name` spends under `[unmapped_tasks]`.
    fn resolve_unmapped(
        &self,
        name: &str,
        admit: impl FnOnce(&str) -> bool,
    ) -> Result<Dependency, Unresolved> {
        match &self.unmapped {
            UnmappedTasks::Share(dependency) => Ok(dependency.clone()),
            UnmappedTasks::Reject => Err(Unresolved::Rejected),
            UnmappedTasks::OwnBudget { .. } => {
                // Checked before admission: an invalid name never takes a place.
                let own = Dependency::new(name)?;
                if admit(name) {
                    Ok(own)
                } else {
                    Ok(Dependency(Arc::from(OVERFLOW_DEPENDENCY)))
                }
            }
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

    #[test]
    fn unmapped_names_past_the_cap_share_one_budget() {
        let mut map = DependencyMap::new();
        map.insert("index", Dependency::new("search").unwrap());
        map.set_unmapped(UnmappedTasks::OwnBudget { max_own: 3 });
        let own = OwnBudgets::new();
        let names: Vec<String> = (0..1000)
            .map(|i| {
                map.resolve_admitting(&format!("t{i}"), &own)
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(&names[..3], ["t0", "t1", "t2"]);
        assert!(names[3..].iter().all(|n| n == OVERFLOW_DEPENDENCY));
        assert_eq!(own.len(), 3);
        // An admitted name keeps its budget; a mapped task is never capped.
        assert_eq!(map.resolve_admitting("t1", &own).unwrap().as_str(), "t1");
        assert_eq!(
            map.resolve_admitting("index", &own).unwrap().as_str(),
            "search"
        );
        // An invalid name is refused and takes no place.
        let fresh = OwnBudgets::new();
        assert!(map.resolve_admitting("a{b}", &fresh).is_err());
        assert!(fresh.is_empty());
        // A cap of 0: every unmapped name shares the overflow budget.
        map.set_unmapped(UnmappedTasks::OwnBudget { max_own: 0 });
        assert_eq!(
            map.resolve_admitting("x", &OwnBudgets::new())
                .unwrap()
                .as_str(),
            OVERFLOW_DEPENDENCY
        );
    }

    #[test]
    fn unmapped_names_share_a_named_dependency_or_are_rejected() {
        let mut map = DependencyMap::new();
        map.insert("index", Dependency::new("search").unwrap());
        let own = OwnBudgets::new();
        map.set_unmapped(UnmappedTasks::Share(Dependency::new("search").unwrap()));
        assert_eq!(
            map.resolve_admitting("any", &own).unwrap().as_str(),
            "search"
        );
        assert_eq!(
            map.resolve_admitting("a{b}", &own).unwrap().as_str(),
            "search",
            "the name is not a key when it shares"
        );
        map.set_unmapped(UnmappedTasks::Reject);
        assert_eq!(
            map.resolve_admitting("any", &own),
            Err(Unresolved::Rejected)
        );
        assert_eq!(map.resolve("index").unwrap().as_str(), "search");
        assert!(own.is_empty());
    }
}
