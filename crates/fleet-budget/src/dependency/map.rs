//! The task → dependency map ([`DependencyMap`]), and what becomes of a task the map does not
//! name ([`UnmappedTasks`], bounded by [`OwnBudgets`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use thiserror::Error;

use super::{Dependency, InvalidName};

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
