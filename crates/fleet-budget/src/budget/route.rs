//! A task mapped once: the dependency whose budget it spends and its ceiling, resolved by
//! [`FleetBudget::route`] and handed to the `*_routed` calls. A caller that reports one job
//! several times (the AMQP worker asks to admit it, reports its attempt, then its failure or its
//! success) maps the task once per job instead of once per call, and every call of the job
//! speaks of the same dependency. Mapping a task, or a name a failure gives, to its dependency
//! happens here and only here.

use super::FleetBudget;
use crate::ceiling::TaskCeiling;
use crate::dependency::{Dependency, Unresolved};
use crate::error::Error;

/// A task and what it maps to, from [`FleetBudget::route`].
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

impl FleetBudget {
    /// Maps `task` once: its dependency ([`FleetBudget::dependency`]) and its ceiling
    /// ([`FleetBudget::ceiling`]), for [`FleetBudget::admit_routed`],
    /// [`FleetBudget::on_attempt_routed`], [`FleetBudget::on_failure_routed`] and
    /// [`FleetBudget::on_success_routed`].
    ///
    /// # Errors
    /// As [`FleetBudget::dependency`].
    pub fn route(&self, task: &str) -> Result<Route, Error> {
        Ok(Route {
            task: task.to_owned(),
            dependency: self.dependency(task)?,
            ceiling: self.inner.ceilings.for_task(task),
        })
    }

    /// The dependency whose budget `task` spends: its mapping, else what `[unmapped_tasks]`
    /// says (its own budget while fewer than the cap have one, else the shared `unmapped`
    /// budget; a named dependency's; or a refusal).
    ///
    /// # Errors
    /// An unmapped task that is refused ([`Error::UnmappedTask`]), or that is to be its own
    /// dependency and whose name cannot be a dependency name ([`Error::InvalidTask`]).
    pub fn dependency(&self, task: &str) -> Result<Dependency, Error> {
        self.inner
            .map
            .resolve_admitting(task, &self.inner.own_budgets)
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

    /// The dependency whose budget a failure naming `name` spends
    /// ([`Failure::in_dependency`](crate::Failure::in_dependency), a branch of a
    /// [`FanOut`](super::FanOut)): `name` when a
    /// section configures it (or a mapping, the shared dependency or `unmapped` is that name),
    /// else what `[unmapped_tasks]` says, with the same cap and the same admitted names as
    /// unmapped tasks: a name chosen by a handler (often read from the message) makes no more
    /// budgets or metric label values than an unmapped task name does.
    ///
    /// # Errors
    /// An unknown name that is refused ([`Error::UnmappedDependency`]), or that is to be its
    /// own dependency and cannot be a dependency name ([`Error::InvalidDependency`]).
    pub fn named_dependency(&self, name: &str) -> Result<Dependency, Error> {
        let policies = &self.inner.policies;
        self.inner
            .map
            .resolve_named_admitting(name, |d| policies.contains_key(d), &self.inner.own_budgets)
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
