//! The `[tasks.*]` sections: the attempt ceiling, backoff and `max_delay` of each task.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Deserialize;

use super::check::{Checker, toml_key};
use super::defaults::{backoff, max_delay};
use crate::ceiling::{JobClass, TaskCeiling};
use crate::dependency::{DependencyMap, UnmappedTasks};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTask {
    class: Option<JobClass>,
    max_attempts: Option<i64>,
    recovery_window_secs: Option<i64>,
    backoff_base_ms: Option<i64>,
    backoff_cap_ms: Option<i64>,
    max_delay_secs: Option<i64>,
}

/// The ceiling of each task with a section: from its class, its `max_attempts`, or its recovery
/// window (a ceiling by time; at most one of the three), else `default`'s.
pub(super) fn resolve(
    c: &mut Checker,
    sections: BTreeMap<String, RawTask>,
    map: &DependencyMap,
    default: TaskCeiling,
) -> HashMap<String, TaskCeiling> {
    let mut ceilings = HashMap::new();
    for (task, t) in sections {
        let at = format!("tasks.{}", toml_key(&task));
        if !map.is_mapped(&task) && matches!(map.unmapped(), UnmappedTasks::OwnBudget { .. }) {
            // An unmapped task is its own dependency, so its name must be a valid one.
            let _ = c.dependency_name(&at, &task);
        }
        let given = [
            t.class.is_some(),
            t.max_attempts.is_some(),
            t.recovery_window_secs.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            c.problem(
                &at,
                "class, max_attempts and recovery_window_secs",
                "set at most one of them",
            );
        }
        let backoff = backoff(c, &at, t.backoff_base_ms, t.backoff_cap_ms, default.backoff);
        let max_delay = max_delay(c, &at, t.max_delay_secs).or(default.max_delay);
        let ceiling = if let Some(class) = t.class {
            TaskCeiling {
                max_attempts: class.max_attempts(),
                backoff,
                recovery_window: None,
                max_delay,
            }
        } else if let Some(n) = t.max_attempts {
            TaskCeiling {
                max_attempts: u32::try_from(c.int_in(
                    &format!("{at}.max_attempts"),
                    Some(n),
                    1,
                    1000,
                    5,
                ))
                .unwrap_or(5),
                backoff,
                recovery_window: None,
                max_delay,
            }
        } else if let Some(secs) = t.recovery_window_secs {
            let secs = c.int_in(
                &format!("{at}.recovery_window_secs"),
                Some(secs),
                1,
                7 * 86_400,
                60,
            );
            TaskCeiling {
                max_delay,
                ..TaskCeiling::recovery_window(
                    backoff,
                    Duration::from_secs(u64::try_from(secs).unwrap_or(60)),
                )
            }
        } else {
            TaskCeiling {
                backoff,
                max_delay,
                ..default
            }
        };
        ceilings.insert(task, ceiling);
    }
    ceilings
}
