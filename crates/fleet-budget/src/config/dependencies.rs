//! The `[dependencies.*]` sections: a policy per dependency and the tasks that spend it.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::check::{Checker, toml_key};
use super::defaults::PolicyFields;
use crate::dependency::{Dependency, DependencyMap};
use crate::policy::{BudgetPolicy, DepositBasis, WindowMode};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDependency {
    #[serde(default)]
    tasks: Vec<String>,
    window_secs: Option<i64>,
    ratio: Option<f64>,
    min_allowance: Option<i64>,
    deposit: Option<DepositBasis>,
    mode: Option<WindowMode>,
    /// `[dependencies.X.concurrency]`, resolved by `concurrency.rs`.
    pub(super) concurrency: Option<super::concurrency::RawConcurrency>,
    /// `[dependencies.X.breaker]`, resolved by `breaker.rs`.
    pub(super) breaker: Option<super::breaker::RawBreaker>,
}

/// The policies of the dependencies with a section (fields not given come from `defaults`), and
/// the task → dependency map; a task is mapped to one dependency at most.
pub(super) fn resolve(
    c: &mut Checker,
    sections: BTreeMap<String, RawDependency>,
    defaults: &BudgetPolicy,
) -> (BTreeMap<Dependency, BudgetPolicy>, DependencyMap) {
    let mut policies = BTreeMap::new();
    let mut map = DependencyMap::new();
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for (name, dep) in sections {
        let at = format!("dependencies.{}", toml_key(&name));
        let valid = c.dependency_name(&at, &name);
        let policy = PolicyFields {
            window_secs: dep.window_secs,
            ratio: dep.ratio,
            min_allowance: dep.min_allowance,
            deposit: dep.deposit,
            mode: dep.mode,
        }
        .resolve(c, &at, defaults);
        let Ok(dependency) = Dependency::new(&name) else {
            continue;
        };
        if !valid {
            continue;
        }
        policies.insert(dependency.clone(), policy);
        for (i, task) in dep.tasks.iter().enumerate() {
            let key = format!("{at}.tasks[{i}]");
            if task.is_empty() || task.chars().any(char::is_control) {
                c.problem(
                    &key,
                    format!("{task:?}"),
                    "a task name must be non-empty and hold no control characters",
                );
                continue;
            }
            if let Some(first) = owner.get(task) {
                if *first == name {
                    c.problem(
                        &key,
                        format!("{task:?}"),
                        "is listed twice in this dependency",
                    );
                } else {
                    c.problem(
                        &key,
                        format!("{task:?}"),
                        format!(
                            "is already mapped to dependency {first:?}; a task spends exactly one dependency's budget"
                        ),
                    );
                }
                continue;
            }
            owner.insert(task.clone(), name.clone());
            map.insert(task.clone(), dependency.clone());
        }
    }
    (policies, map)
}

#[cfg(test)]
mod tests {
    use super::super::tests::problems;

    #[test]
    fn invalid_dependency_names() {
        let long = "d".repeat(201);
        for (name, needle) in [
            ("", "empty"),
            (long.as_str(), "201 bytes"),
            ("a{b", "'{'"),
            ("a}b", "'}'"),
            ("a\\tb", "'\\t'"),
        ] {
            let p = problems(&format!("[dependencies.\"{name}\"]\ntasks = []\n"));
            assert_eq!(p.len(), 1, "{name}");
            assert!(p[0].key.starts_with("dependencies."), "{}", p[0]);
            assert!(p[0].allowed.contains(needle), "{name}: {}", p[0]);
        }
    }

    #[test]
    fn task_mapped_to_two_dependencies() {
        let p = problems(
            "[dependencies.search]\ntasks = [\"t\"]\n[dependencies.mail]\ntasks = [\"t\"]\n",
        );
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].key, "dependencies.search.tasks[0]");
        assert!(
            p[0].allowed
                .contains("already mapped to dependency \"mail\""),
            "{}",
            p[0]
        );
    }
}
