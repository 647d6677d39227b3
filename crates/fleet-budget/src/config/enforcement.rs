//! `enforcement` in `[defaults]` and `[dependencies.X]`: whether a dependency's rate budget
//! dead-letters what it refuses (`"enforce"`, the default) or only counts it (`"shadow"`,
//! [`Enforcement`]).

use std::collections::BTreeMap;

use crate::decision::Enforcement;
use crate::dependency::Dependency;

/// The configured enforcement of each dependency.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Enforcements {
    /// `[defaults] enforcement`.
    pub default: Enforcement,
    /// `[dependencies.X] enforcement`, where a section gives one.
    pub by_dependency: BTreeMap<Dependency, Enforcement>,
}

impl Enforcements {
    /// The configured enforcement of `dependency`: its section's, else the default.
    #[must_use]
    pub fn of(&self, dependency: &Dependency) -> Enforcement {
        self.by_dependency
            .get(dependency)
            .copied()
            .unwrap_or(self.default)
    }
}
