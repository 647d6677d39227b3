//! A task mapped once: the dependency whose budget it spends and its ceiling, resolved by
//! [`Routes::route`] and handed to the `*_routed` calls. A caller that reports one job several
//! times (the AMQP worker asks to admit it, reports its attempt, then its failure or its success)
//! maps the task once per job instead of once per call, and every call of the job speaks of the
//! same dependency. Mapping a task, or a name a failure gives, to its dependency happens here and
//! only here, as does the choice of a dependency's policy.

use std::collections::BTreeMap;

use crate::ceiling::{Ceilings, TaskCeiling};
use crate::config::Config;
use crate::dependency::{Dependency, DependencyMap, OwnBudgets, Unresolved};
use crate::error::Error;
use crate::policy::BudgetPolicy;

/// A task and what it maps to, from [`FleetBudget::route`](super::FleetBudget::route).
#[derive(Debug, Clone)]
pub struct Route {
    task: String,
    dependency: Dependency,
    ceiling: TaskCeiling,
}

impl Route {
    /// The task's name.
    #[must_use]
    pub fn task(&self) -> &str {
        &self.task
    }

    /// The dependency whose budget the task spends.
    #[must_use]
    pub fn dependency(&self) -> &Dependency {
        &self.dependency
    }

    /// The task's attempt ceiling and backoff.
    #[must_use]
    pub fn ceiling(&self) -> &TaskCeiling {
        &self.ceiling
    }
}

/// The budget policy of each dependency: its section's, else `[defaults]`.
#[derive(Debug)]
pub(super) struct Policies {
    defaults: BudgetPolicy,
    by_dependency: BTreeMap<Dependency, BudgetPolicy>,
}

impl Policies {
    pub(super) fn new(config: &Config) -> Self {
        Self {
            defaults: config.defaults,
            by_dependency: config.policies.clone(),
        }
    }

    /// The policy of `dependency`.
    pub(super) fn of(&self, dependency: &Dependency) -> BudgetPolicy {
        self.by_dependency
            .get(dependency)
            .copied()
            .unwrap_or(self.defaults)
    }

    /// Whether a section configures `dependency`.
    fn configures(&self, dependency: &Dependency) -> bool {
        self.by_dependency.contains_key(dependency)
    }
}

/// Where tasks and the names failures give go: the dependency map, the unmapped names given a
/// budget of their own, and the ceilings.
#[derive(Debug)]
pub(super) struct Routes {
    map: DependencyMap,
    /// The unmapped names given a budget of their own (bounded: `[unmapped_tasks]`).
    own_budgets: OwnBudgets,
    ceilings: Ceilings,
}

impl Routes {
    pub(super) fn new(config: &Config) -> Self {
        Self {
            map: config.map.clone(),
            own_budgets: OwnBudgets::new(),
            ceilings: config.ceilings.clone(),
        }
    }

    /// `task`, its dependency and its ceiling.
    pub(super) fn route(&self, task: &str) -> Result<Route, Error> {
        Ok(Route {
            task: task.to_owned(),
            dependency: self.dependency(task)?,
            ceiling: self.ceiling(task),
        })
    }

    /// The attempt ceiling and backoff of `task`.
    pub(super) fn ceiling(&self, task: &str) -> TaskCeiling {
        self.ceilings.for_task(task)
    }

    /// See [`FleetBudget::dependency`](super::FleetBudget::dependency).
    pub(super) fn dependency(&self, task: &str) -> Result<Dependency, Error> {
        self.map
            .resolve_admitting(task, &self.own_budgets)
            .map_err(|e| match e {
                Unresolved::InvalidName(source) => Error::InvalidTask {
                    task: task.to_owned(),
                    source,
                },
                Unresolved::Rejected => Error::UnmappedTask {
                    task: task.to_owned(),
                },
            })
    }

    /// See [`FleetBudget::named_dependency`](super::FleetBudget::named_dependency).
    pub(super) fn named_dependency(
        &self,
        name: &str,
        policies: &Policies,
    ) -> Result<Dependency, Error> {
        self.map
            .resolve_named_admitting(name, |d| policies.configures(d), &self.own_budgets)
            .map_err(|e| match e {
                Unresolved::InvalidName(source) => Error::InvalidDependency {
                    dependency: name.to_owned(),
                    source,
                },
                Unresolved::Rejected => Error::UnmappedDependency {
                    dependency: name.to_owned(),
                },
            })
    }
}
