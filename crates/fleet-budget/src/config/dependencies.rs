//! The `[dependencies.*]` sections: a policy per dependency and the tasks that spend it; and
//! `[unmapped_tasks]`: what a task no section names spends.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::check::{Checker, quoted, toml_key};
use super::defaults::PolicyFields;
use crate::decision::Enforcement;
use crate::dependency::{DEFAULT_MAX_OWN_BUDGETS, Dependency, DependencyMap, UnmappedTasks};
use crate::policy::{BudgetPolicy, DepositBasis, WindowMode};
use crate::printable::{CodePoint, is_unsafe_char};

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
    /// `"enforce"` or `"shadow"`; absent: `[defaults]`'s.
    enforcement: Option<Enforcement>,
    /// `[dependencies.X.concurrency]`, resolved by `concurrency.rs`.
    pub(super) concurrency: Option<super::concurrency::RawConcurrency>,
    /// `[dependencies.X.breaker]`, resolved by `breaker.rs`.
    pub(super) breaker: Option<super::breaker::RawBreaker>,
}

/// The `[unmapped_tasks]` section, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUnmapped {
    policy: Option<UnmappedPolicy>,
    dependency: Option<String>,
    max_own_budgets: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum UnmappedPolicy {
    OwnBudget,
    Share,
    Reject,
}

/// Most unmapped names that may get a budget of their own, per process.
pub const MAX_OWN_BUDGETS: i64 = 100_000;

impl RawUnmapped {
    /// What unmapped tasks spend. `share` must name a dependency with a section, so that a typo
    /// does not quietly make a budget of its own; each key only goes with its policy.
    pub(super) fn resolve(
        self,
        c: &mut Checker,
        policies: &BTreeMap<Dependency, BudgetPolicy>,
    ) -> UnmappedTasks {
        let policy = self.policy.unwrap_or(UnmappedPolicy::OwnBudget);
        if policy != UnmappedPolicy::Share
            && let Some(d) = &self.dependency
        {
            c.problem(
                "unmapped_tasks.dependency",
                quoted(d),
                "goes only with policy = \"share\"",
            );
        }
        if policy != UnmappedPolicy::OwnBudget
            && let Some(n) = self.max_own_budgets
        {
            c.problem(
                "unmapped_tasks.max_own_budgets",
                n,
                "goes only with policy = \"own_budget\"",
            );
        }
        match policy {
            UnmappedPolicy::Reject => UnmappedTasks::Reject,
            UnmappedPolicy::OwnBudget => {
                let default = i64::try_from(DEFAULT_MAX_OWN_BUDGETS).unwrap_or(100);
                let n = c.int_in(
                    "unmapped_tasks.max_own_budgets",
                    self.max_own_budgets,
                    0,
                    MAX_OWN_BUDGETS,
                    default,
                );
                UnmappedTasks::OwnBudget {
                    max_own: usize::try_from(n).unwrap_or(DEFAULT_MAX_OWN_BUDGETS),
                }
            }
            UnmappedPolicy::Share => {
                let shared = self
                    .dependency
                    .as_deref()
                    .and_then(|d| Dependency::new(d).ok())
                    .filter(|d| policies.contains_key(d));
                if let Some(shared) = shared {
                    UnmappedTasks::Share(shared)
                } else {
                    let named: Vec<&str> = policies.keys().map(Dependency::as_str).collect();
                    c.problem(
                        "unmapped_tasks.dependency",
                        self.dependency
                            .as_deref()
                            .map_or_else(|| "none".to_owned(), quoted),
                        format!(
                            "policy = \"share\" needs the name of a [dependencies.*] section ({})",
                            if named.is_empty() {
                                "there is none".to_owned()
                            } else {
                                named.join(", ")
                            }
                        ),
                    );
                    UnmappedTasks::default()
                }
            }
        }
    }
}

/// The policies of the dependencies with a section (fields not given come from `defaults`), and
/// the task → dependency map (a task is mapped to one dependency at most), and the enforcement
/// the sections give.
pub(super) fn resolve(
    c: &mut Checker,
    sections: BTreeMap<String, RawDependency>,
    defaults: &BudgetPolicy,
) -> (
    BTreeMap<Dependency, BudgetPolicy>,
    DependencyMap,
    BTreeMap<Dependency, Enforcement>,
) {
    let mut policies = BTreeMap::new();
    let mut enforcement = BTreeMap::new();
    let mut map = DependencyMap::new();
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for (name, dep) in sections {
        let at = format!("dependencies.{}", toml_key(&name));
        let dependency = c.dependency_name(&at, &name);
        let policy = PolicyFields {
            window_secs: dep.window_secs,
            ratio: dep.ratio,
            min_allowance: dep.min_allowance,
            deposit: dep.deposit,
            mode: dep.mode,
        }
        .resolve(c, &at, defaults);
        let Some(dependency) = dependency else {
            continue;
        };
        policies.insert(dependency.clone(), policy);
        if let Some(given) = dep.enforcement {
            enforcement.insert(dependency.clone(), given);
        }
        for (i, task) in dep.tasks.iter().enumerate() {
            let key = format!("{at}.tasks[{i}]");
            if task.is_empty() {
                c.problem(&key, "\"\"", "a task name must not be empty");
                continue;
            }
            if let Some(ch) = task.chars().find(|ch| is_unsafe_char(*ch)) {
                c.problem(
                    &key,
                    quoted(task),
                    format!(
                        "contains {}; a task name holds no control, bidirectional control or invisible characters",
                        CodePoint(ch)
                    ),
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
    (policies, map, enforcement)
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::super::tests::problems;
    use crate::dependency::{OwnBudgets, UnmappedTasks, Unresolved, is_unsafe_char};

    #[test]
    fn unmapped_tasks_own_budget_share_or_reject() {
        let c = Config::from_toml("", "t").unwrap();
        assert_eq!(
            c.map.unmapped(),
            &UnmappedTasks::OwnBudget { max_own: 100 },
            "today's default, now capped"
        );
        let c = Config::from_toml("[unmapped_tasks]\nmax_own_budgets = 2\n", "t").unwrap();
        let own = OwnBudgets::new();
        let deps: Vec<String> = ["a", "b", "c", "a"]
            .iter()
            .map(|t| c.map.resolve_admitting(t, &own).unwrap().to_string())
            .collect();
        assert_eq!(deps, ["a", "b", "unmapped", "a"]);
        let c = Config::from_toml(
            "[unmapped_tasks]\npolicy = \"share\"\ndependency = \"search\"\n[dependencies.search]\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.map.resolve("whatever").unwrap().as_str(), "search");
        let c = Config::from_toml("[unmapped_tasks]\npolicy = \"reject\"\n", "t").unwrap();
        assert_eq!(c.map.resolve("whatever"), Err(Unresolved::Rejected));
    }

    #[test]
    fn invalid_unmapped_tasks_sections() {
        for (text, key, needle) in [
            (
                "[unmapped_tasks]\npolicy = \"share\"\n",
                "unmapped_tasks.dependency",
                "there is none",
            ),
            (
                "[unmapped_tasks]\npolicy = \"share\"\ndependency = \"serch\"\n[dependencies.search]\n",
                "unmapped_tasks.dependency",
                "(search)",
            ),
            (
                "[unmapped_tasks]\npolicy = \"reject\"\ndependency = \"search\"\n",
                "unmapped_tasks.dependency",
                "only with policy = \"share\"",
            ),
            (
                "[unmapped_tasks]\npolicy = \"reject\"\nmax_own_budgets = 3\n",
                "unmapped_tasks.max_own_budgets",
                "only with policy = \"own_budget\"",
            ),
            (
                "[unmapped_tasks]\nmax_own_budgets = -1\n",
                "unmapped_tasks.max_own_budgets",
                "0 to 100000",
            ),
        ] {
            let p = problems(text);
            assert_eq!(p.len(), 1, "{text}: {p:?}");
            assert_eq!(p[0].key, key, "{text}");
            assert!(p[0].allowed.contains(needle), "{text}: {}", p[0]);
        }
        assert!(Config::from_toml("[unmapped_tasks]\npolicy = \"own\"\n", "t").is_err());
    }

    #[test]
    fn invalid_dependency_names() {
        let long = "d".repeat(201);
        for (name, needle) in [
            ("", "empty"),
            (long.as_str(), "201 bytes"),
            ("a{b", "contains U+007B `{`"),
            ("a}b", "contains U+007D `}`"),
            ("a\\tb", "contains U+0009 (a control character)"),
            ("pay\\u202Ex", "contains U+202E (a bidirectional control)"),
            ("sea\\u200Brch", "contains U+200B (an invisible character)"),
            ("a\\uFEFFb", "contains U+FEFF (an invisible character)"),
            (
                "a\\u2028b",
                "contains U+2028 (a line or paragraph separator)",
            ),
            (
                "flag\\U000E0041",
                "contains U+E0041 (an invisible character)",
            ),
        ] {
            let p = problems(&format!("[dependencies.\"{name}\"]\ntasks = []\n"));
            assert_eq!(p.len(), 1, "{name}");
            assert!(p[0].key.starts_with("dependencies."), "{}", p[0]);
            assert!(p[0].allowed.contains(needle), "{name}: {}", p[0]);
            // Neither the key nor the message holds the character it is about.
            let shown = p[0].to_string();
            assert!(!shown.contains(is_unsafe_char), "{name}: {shown:?}");
        }
    }

    /// Regression: a task name in a `tasks` list with a bidi override was accepted (and printed
    /// raw by `config check`), while the same name as a `[tasks.*]` section was refused.
    #[test]
    fn task_names_with_bidi_or_control_characters_are_refused() {
        // As written in TOML: its \uXXXX escapes make the characters.
        for (task, why) in [
            (r"send\u202Eliam", "contains U+202E"),
            (r"a\u2066b", "contains U+2066"),
            (r"a\u0007b", "contains U+0007"),
            (r"a\u200Db", "contains U+200D"),
            ("", "must not be empty"),
        ] {
            let text = format!("[dependencies.search]\ntasks = [\"{task}\"]\n");
            let p = problems(&text);
            assert_eq!(p.len(), 1, "{task:?}: {p:?}");
            assert_eq!(p[0].key, "dependencies.search.tasks[0]");
            assert!(p[0].allowed.contains(why), "{}", p[0]);
            assert!(!p[0].to_string().contains(is_unsafe_char), "{}", p[0]);
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
