//! The fleet's budgets as Redis holds them, as Prometheus gauges: what the fleet exporter
//! (`budgetctl exporter`) serves, so that one scrape target shows every dependency of the fleet.
//!
//! A worker's own metrics say what *that process* counted and saw at its last decision; these
//! say what the whole fleet spent, read with the status script (`lua/status.lua`, no writes), at
//! scrape time. Counts are the sliding estimates over the last window, the same numbers the
//! allowance is computed from and `budgetctl status` prints.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fleet_budget_window_allowance` | gauge | dependency | retries allowed in the last window |
//! | `fleet_budget_window_headroom` | gauge | dependency | retries still grantable now |
//! | `fleet_budget_window_first_attempts` | gauge | dependency | first attempts in the last window |
//! | `fleet_budget_window_executions` | gauge | dependency | first attempts + retries granted in the last window |
//! | `fleet_budget_window_successes` | gauge | dependency | successes in the last window |
//! | `fleet_budget_window_deposits` | gauge | dependency | what earns allowance in the last window (successes or first attempts, by the policy's `deposit`) |
//! | `fleet_budget_window_retries_granted` | gauge | dependency | retries granted in the last window |
//! | `fleet_budget_window_retries_denied` | gauge | dependency | retries denied in the last window |
//! | `fleet_budget_window_progress_ratio` | gauge | dependency | how far the current window has run, 0 to 1 |
//! | `fleet_budget_policy_ratio` | gauge | dependency | the ratio the allowance uses (retries per deposit): the policy in force's, or an operator's `set` override's |
//! | `fleet_budget_policy_min_allowance` | gauge | dependency | the floor the allowance uses (retries per window): the policy in force's, or an operator's `set` override's |
//! | `fleet_budget_policy_window_seconds` | gauge | dependency | the window length of the policy in force |
//! | `fleet_budget_override_frozen` | gauge | dependency | 1 while an operator's freeze is in force (no retry granted, the floor included), else 0 |
//! | `fleet_budget_override_set` | gauge | dependency | 1 while an operator's `set` override replaces the ratio and/or the floor, else 0 |
//! | `fleet_budget_fleet_dependencies` | gauge | — | dependencies read (configured and found in Redis) |
//!
//! Amplification over the last window is `fleet_budget_window_executions /
//! fleet_budget_window_first_attempts`.
//!
//! The policy gauges show the policy in force in Redis (`lua/README.md`, "The policy in force"),
//! which the workers' calls decided, not the exporter's configuration: they follow a fleet that
//! moved to another policy and an operator's override. Where Redis holds no key for a dependency
//! (no policy in force yet: nothing spent or deposited for two windows), they show the policy the
//! exporter is configured with for it, the one the next call would most likely bring.

use std::sync::Arc;

use futures::StreamExt;

use crate::allowance::BudgetSnapshot;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::policy::{BudgetPolicy, DepositBasis};
use crate::store::BudgetStore;

/// Store calls in flight at once while reading the fleet: enough to pipeline thousands of reads
/// on one multiplexed Redis connection, few enough not to crowd out the workers' calls.
pub const READ_CONCURRENCY: usize = 128;

/// One dependency's budget as the store holds it now.
#[derive(Debug, Clone, PartialEq)]
pub struct DependencyBudget {
    /// The dependency.
    pub dependency: Dependency,
    /// The policy in force in the store (the exporter's configured one where there is none).
    pub policy: BudgetPolicy,
    /// What the store holds.
    pub snapshot: BudgetSnapshot,
    /// The ratio the allowance uses: the policy's, or a set override's in its place.
    pub ratio: f64,
    /// The floor the allowance uses: the policy's, or a set override's in its place.
    pub min_allowance: u64,
}

#[allow(clippy::cast_precision_loss)]
impl DependencyBudget {
    /// Successes in the last window ([`BudgetSnapshot::estimates`]).
    #[must_use]
    pub fn successes(&self) -> f64 {
        self.snapshot.estimates().successes as f64
    }

    /// First attempts in the last window.
    #[must_use]
    pub fn first_attempts(&self) -> f64 {
        self.snapshot.estimates().first_attempts as f64
    }

    /// Retries granted in the last window.
    #[must_use]
    pub fn retries_granted(&self) -> f64 {
        self.snapshot.estimates().retries as f64
    }

    /// Retries denied in the last window.
    #[must_use]
    pub fn retries_denied(&self) -> f64 {
        self.snapshot.estimates().denied as f64
    }

    /// Deposits in the last window (successes or first attempts, by the policy).
    #[must_use]
    pub fn deposits(&self) -> f64 {
        match self.policy.deposit {
            DepositBasis::Success => self.successes(),
            DepositBasis::Request => self.first_attempts(),
        }
    }

    /// Executions per first attempt in the last window; `None` without first attempts.
    #[must_use]
    pub fn amplification(&self) -> Option<f64> {
        let first = self.first_attempts();
        (first > 0.0).then(|| (first + self.retries_granted()) / first)
    }

    /// How far the current window has run, from 0 to 1.
    #[must_use]
    pub fn window_progress(&self) -> f64 {
        let s = &self.snapshot;
        (s.elapsed_ms as f64 / s.window_ms.max(1) as f64).clamp(0.0, 1.0)
    }
}

/// Reads the budget of every dependency in `dependencies` with the policy in force
/// ([`BudgetStore::status_in_force`]; the policy given only counts where the store holds none),
/// at most [`READ_CONCURRENCY`] store calls at once (each bounded by the store's own deadline).
/// Budgets come back in the order given; the first error is returned with those that were read.
pub async fn read_budgets(
    store: &Arc<dyn BudgetStore>,
    dependencies: Vec<(Dependency, BudgetPolicy)>,
) -> (Vec<DependencyBudget>, Option<StoreError>) {
    let mut results: Vec<(usize, Result<DependencyBudget, StoreError>)> =
        futures::stream::iter(dependencies.into_iter().enumerate())
            .map(|(i, (dependency, policy))| {
                let store = Arc::clone(store);
                async move {
                    let read = store.status_in_force(&dependency, &policy).await;
                    (
                        i,
                        read.map(|status| DependencyBudget {
                            dependency,
                            policy: status.policy,
                            snapshot: status.snapshot,
                            ratio: status.ratio,
                            min_allowance: status.min_allowance,
                        }),
                    )
                }
            })
            .buffer_unordered(READ_CONCURRENCY)
            .collect()
            .await;
    results.sort_by_key(|(i, _)| *i);
    let mut budgets = Vec::with_capacity(results.len());
    let mut first_error = None;
    for (_, r) in results {
        match r {
            Ok(b) => budgets.push(b),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    (budgets, first_error)
}

/// One gauge family of [`write_budgets`]: name, help, and its value for a dependency.
type Family = (&'static str, &'static str, fn(&DependencyBudget) -> f64);

/// The gauges of the fleet's budgets (module docs), in the order they are written.
#[allow(clippy::cast_precision_loss)]
const FAMILIES: [Family; 14] = [
    (
        "fleet_budget_window_allowance",
        "Retries allowed in the last window, fleet-wide.",
        |b| b.snapshot.allowance as f64,
    ),
    (
        "fleet_budget_window_headroom",
        "Retries still grantable now, fleet-wide.",
        |b| b.snapshot.remaining() as f64,
    ),
    (
        "fleet_budget_window_first_attempts",
        "First attempts in the last window (sliding estimate), fleet-wide.",
        DependencyBudget::first_attempts,
    ),
    (
        "fleet_budget_window_executions",
        "First attempts and retries granted in the last window (sliding estimate).",
        |b| b.first_attempts() + b.retries_granted(),
    ),
    (
        "fleet_budget_window_successes",
        "Successes in the last window (sliding estimate), fleet-wide.",
        DependencyBudget::successes,
    ),
    (
        "fleet_budget_window_deposits",
        "Deposits (successes or first attempts, by policy) in the last window.",
        DependencyBudget::deposits,
    ),
    (
        "fleet_budget_window_retries_granted",
        "Retries granted in the last window (sliding estimate), fleet-wide.",
        DependencyBudget::retries_granted,
    ),
    (
        "fleet_budget_window_retries_denied",
        "Retries denied in the last window (sliding estimate), fleet-wide.",
        DependencyBudget::retries_denied,
    ),
    (
        "fleet_budget_window_progress_ratio",
        "How far the current window has run, 0 to 1.",
        DependencyBudget::window_progress,
    ),
    (
        "fleet_budget_policy_ratio",
        "Retries allowed per deposit: the policy in force's ratio, or a set override's.",
        |b| b.ratio,
    ),
    (
        "fleet_budget_policy_min_allowance",
        "Retries always allowed per window: the policy in force's floor, or a set override's.",
        |b| b.min_allowance as f64,
    ),
    (
        "fleet_budget_policy_window_seconds",
        "Window length of the policy in force.",
        |b| b.policy.window.as_secs_f64(),
    ),
    (
        "fleet_budget_override_frozen",
        "1 while an operator's freeze is in force (no retry granted, the floor included).",
        |b| f64::from(u8::from(b.snapshot.control.frozen)),
    ),
    (
        "fleet_budget_override_set",
        "1 while an operator's set override replaces the ratio and/or the floor.",
        |b| f64::from(u8::from(b.snapshot.control.overridden)),
    ),
];

/// Writes the gauges of `budgets` (module docs) in the Prometheus text format.
///
/// Written directly rather than through a `prometheus::Registry`: at 10,000 dependencies that is
/// 140,000 series per scrape, and building, gathering and sorting them as metric objects took
/// most of the scrape (docs/BENCHMARKS.md, "Fleet exporter").
pub fn write_budgets(out: &mut String, budgets: &[DependencyBudget]) {
    use std::fmt::Write;
    let labels: Vec<String> = budgets
        .iter()
        .map(|b| escape_label(b.dependency.as_str()))
        .collect();
    for (name, help, value) in FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (b, label) in budgets.iter().zip(&labels) {
            let _ = writeln!(out, "{name}{{dependency=\"{label}\"}} {}", value(b));
        }
    }
    let _ = writeln!(
        out,
        "# HELP fleet_budget_fleet_dependencies Dependencies read from the fleet store (configured and found).\n# TYPE fleet_budget_fleet_dependencies gauge\nfleet_budget_fleet_dependencies {}",
        budgets.len()
    );
}

/// A label value as the text format writes it: `\`, `"` and newlines escaped.
fn escape_label(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::time::Duration;

    use super::{read_budgets, write_budgets};
    use crate::Dependency;
    use crate::policy::BudgetPolicy;
    use crate::store::{BudgetStore, Deposits, LocalStore};

    #[tokio::test]
    async fn gauges_show_what_the_store_counted() {
        let store: Arc<dyn BudgetStore> = Arc::new(LocalStore::new());
        let policy = BudgetPolicy {
            window: Duration::from_secs(3600),
            ratio: 0.1,
            min_allowance: 2,
            ..BudgetPolicy::default()
        };
        let search = Dependency::new("search").unwrap();
        let odd = Dependency::new("a \"quoted\" \\ name").unwrap();
        let deposits = Deposits {
            successes: 30,
            first_attempts: 40,
        };
        store.deposit(&search, &policy, deposits).await.unwrap();
        // Allowance 3 (10% of 30): three granted, two denied.
        for _ in 0..5 {
            store.withdraw(&search, &policy).await.unwrap();
        }
        let (budgets, error) = read_budgets(
            &store,
            vec![(search.clone(), policy), (odd.clone(), policy)],
        )
        .await;
        assert!(error.is_none());
        assert_eq!(budgets.len(), 2);
        assert_eq!(budgets[0].dependency, search);
        assert_eq!(budgets[0].amplification(), Some(43.0 / 40.0));

        let mut text = String::new();
        write_budgets(&mut text, &budgets);
        for line in [
            "fleet_budget_window_allowance{dependency=\"search\"} 3",
            "fleet_budget_window_headroom{dependency=\"search\"} 0",
            "fleet_budget_window_retries_granted{dependency=\"search\"} 3",
            "fleet_budget_window_retries_denied{dependency=\"search\"} 2",
            "fleet_budget_window_first_attempts{dependency=\"search\"} 40",
            "fleet_budget_window_executions{dependency=\"search\"} 43",
            "fleet_budget_window_deposits{dependency=\"search\"} 30",
            "fleet_budget_policy_ratio{dependency=\"search\"} 0.1",
            "fleet_budget_policy_window_seconds{dependency=\"search\"} 3600",
            "fleet_budget_window_allowance{dependency=\"a \\\"quoted\\\" \\\\ name\"} 2",
            "# TYPE fleet_budget_window_allowance gauge",
            "fleet_budget_fleet_dependencies 2",
        ] {
            assert!(
                text.contains(&format!("{line}\n")),
                "{line} missing in\n{text}"
            );
        }
    }
}
