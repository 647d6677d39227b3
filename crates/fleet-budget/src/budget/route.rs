//! A task mapped once: the dependency whose budget it spends and its ceiling, resolved by
//! [`FleetBudget::route`] and handed to the `*_routed` calls. A caller that reports one job
//! several times (the AMQP worker asks to admit it, reports its attempt, then its failure or its
//! success) maps the task once per job instead of once per call, and every call of the job
//! speaks of the same dependency.

use super::FleetBudget;
use crate::ceiling::TaskCeiling;
use crate::dependency::Dependency;
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
            ceiling: self.ceiling(task),
        })
    }
}
