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
//! | `fleet_budget_policy_ratio` | gauge | dependency | the policy's ratio (retries per deposit) |
//! | `fleet_budget_policy_min_allowance` | gauge | dependency | the policy's floor (retries per window) |
//! | `fleet_budget_policy_window_seconds` | gauge | dependency | the policy's window length |
//! | `fleet_budget_fleet_dependencies` | gauge | — | dependencies read (configured and found in Redis) |
//!
//! Amplification over the last window is `fleet_budget_window_executions /
//! fleet_budget_window_first_attempts`.

use std::sync::Arc;

use futures::StreamExt;
use prometheus::{GaugeVec, IntGauge, Opts, Registry};

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
    /// The policy it was read with (the one in force in this configuration).
    pub policy: BudgetPolicy,
    /// What the store holds.
    pub snapshot: BudgetSnapshot,
}

impl DependencyBudget {
    /// Sliding estimate over the last window of a count whose current-window value is
    /// `current` and previous-window value is `previous`.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn estimate(&self, current: u64, previous: u64) -> f64 {
        let s = &self.snapshot;
        let window = s.window_ms.max(1) as f64;
        (current as f64 * window + previous as f64 * s.previous_weight_ms as f64) / window
    }

    /// Successes in the last window.
    #[must_use]
    pub fn successes(&self) -> f64 {
        let s = &self.snapshot;
        self.estimate(s.current.successes, s.previous.successes)
    }

    /// First attempts in the last window.
    #[must_use]
    pub fn first_attempts(&self) -> f64 {
        let s = &self.snapshot;
        self.estimate(s.current.first_attempts, s.previous.first_attempts)
    }

    /// Retries granted in the last window.
    #[must_use]
    pub fn retries_granted(&self) -> f64 {
        let s = &self.snapshot;
        self.estimate(s.current.retries, s.previous.retries)
    }

    /// Retries denied in the last window.
    #[must_use]
    pub fn retries_denied(&self) -> f64 {
        let s = &self.snapshot;
        self.estimate(s.current.denied, s.previous.denied)
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
    #[allow(clippy::cast_precision_loss)]
    pub fn window_progress(&self) -> f64 {
        let s = &self.snapshot;
        (s.elapsed_ms as f64 / s.window_ms.max(1) as f64).clamp(0.0, 1.0)
    }
}

/// Reads the budget of every dependency in `dependencies`, at most [`READ_CONCURRENCY`] store
/// calls at once (each bounded by the store's own deadline). Budgets come back in the order
/// given; the first error is returned with those that were read.
pub async fn read_budgets(
    store: &Arc<dyn BudgetStore>,
    dependencies: Vec<(Dependency, BudgetPolicy)>,
) -> (Vec<DependencyBudget>, Option<StoreError>) {
    let mut results: Vec<(usize, Result<DependencyBudget, StoreError>)> =
        futures::stream::iter(dependencies.into_iter().enumerate())
            .map(|(i, (dependency, policy))| {
                let store = Arc::clone(store);
                async move {
                    let read = store.status(&dependency, &policy).await;
                    (
                        i,
                        read.map(|snapshot| DependencyBudget {
                            dependency,
                            policy,
                            snapshot,
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

/// The gauges of the fleet's budgets (module docs), on a registry of the caller's.
#[derive(Debug, Clone)]
pub struct FleetGauges {
    allowance: GaugeVec,
    headroom: GaugeVec,
    first_attempts: GaugeVec,
    executions: GaugeVec,
    successes: GaugeVec,
    deposits: GaugeVec,
    retries_granted: GaugeVec,
    retries_denied: GaugeVec,
    window_progress: GaugeVec,
    policy_ratio: GaugeVec,
    policy_min_allowance: GaugeVec,
    policy_window: GaugeVec,
    dependencies: IntGauge,
}

impl FleetGauges {
    /// The gauges, registered on `registry`.
    ///
    /// # Errors
    /// The registry already holds metrics of these names.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let gauge = |name: &str, help: &str| -> Result<GaugeVec, prometheus::Error> {
            let g = GaugeVec::new(Opts::new(name, help), &["dependency"])?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let dependencies = IntGauge::new(
            "fleet_budget_fleet_dependencies",
            "Dependencies read from the fleet store (configured and found).",
        )?;
        registry.register(Box::new(dependencies.clone()))?;
        Ok(Self {
            allowance: gauge(
                "fleet_budget_window_allowance",
                "Retries allowed in the last window, fleet-wide.",
            )?,
            headroom: gauge(
                "fleet_budget_window_headroom",
                "Retries still grantable now, fleet-wide.",
            )?,
            first_attempts: gauge(
                "fleet_budget_window_first_attempts",
                "First attempts in the last window (sliding estimate), fleet-wide.",
            )?,
            executions: gauge(
                "fleet_budget_window_executions",
                "First attempts and retries granted in the last window (sliding estimate).",
            )?,
            successes: gauge(
                "fleet_budget_window_successes",
                "Successes in the last window (sliding estimate), fleet-wide.",
            )?,
            deposits: gauge(
                "fleet_budget_window_deposits",
                "Deposits (successes or first attempts, by policy) in the last window.",
            )?,
            retries_granted: gauge(
                "fleet_budget_window_retries_granted",
                "Retries granted in the last window (sliding estimate), fleet-wide.",
            )?,
            retries_denied: gauge(
                "fleet_budget_window_retries_denied",
                "Retries denied in the last window (sliding estimate), fleet-wide.",
            )?,
            window_progress: gauge(
                "fleet_budget_window_progress_ratio",
                "How far the current window has run, 0 to 1.",
            )?,
            policy_ratio: gauge(
                "fleet_budget_policy_ratio",
                "Retries allowed per deposit by the policy in force.",
            )?,
            policy_min_allowance: gauge(
                "fleet_budget_policy_min_allowance",
                "Retries always allowed per window by the policy in force.",
            )?,
            policy_window: gauge(
                "fleet_budget_policy_window_seconds",
                "Window length of the policy in force.",
            )?,
            dependencies,
        })
    }

    /// Replaces every series with those of `budgets` (dependencies no longer read disappear).
    #[allow(clippy::cast_precision_loss)]
    pub fn set(&self, budgets: &[DependencyBudget]) {
        for g in self.all() {
            g.reset();
        }
        for b in budgets {
            let d = [b.dependency.as_str()];
            let set = |g: &GaugeVec, v: f64| g.with_label_values(&d).set(v);
            set(&self.allowance, b.snapshot.allowance as f64);
            set(&self.headroom, b.snapshot.remaining() as f64);
            set(&self.first_attempts, b.first_attempts());
            set(&self.executions, b.first_attempts() + b.retries_granted());
            set(&self.successes, b.successes());
            set(&self.deposits, b.deposits());
            set(&self.retries_granted, b.retries_granted());
            set(&self.retries_denied, b.retries_denied());
            set(&self.window_progress, b.window_progress());
            set(&self.policy_ratio, b.policy.ratio);
            set(&self.policy_min_allowance, b.policy.min_allowance as f64);
            set(&self.policy_window, b.policy.window.as_secs_f64());
        }
        self.dependencies
            .set(i64::try_from(budgets.len()).unwrap_or(i64::MAX));
    }

    fn all(&self) -> [&GaugeVec; 12] {
        [
            &self.allowance,
            &self.headroom,
            &self.first_attempts,
            &self.executions,
            &self.successes,
            &self.deposits,
            &self.retries_granted,
            &self.retries_denied,
            &self.window_progress,
            &self.policy_ratio,
            &self.policy_min_allowance,
            &self.policy_window,
        ]
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::time::Duration;

    use prometheus::Registry;

    use super::{FleetGauges, read_budgets};
    use crate::Dependency;
    use crate::metrics::encode;
    use crate::policy::BudgetPolicy;
    use crate::store::{BudgetStore, Deposits, LocalStore};

    #[tokio::test]
    async fn gauges_show_what_the_store_counted_and_forget_dependencies_no_longer_read() {
        let store: Arc<dyn BudgetStore> = Arc::new(LocalStore::new());
        let policy = BudgetPolicy {
            window: Duration::from_secs(3600),
            ratio: 0.1,
            min_allowance: 2,
            ..BudgetPolicy::default()
        };
        let search = Dependency::new("search").unwrap();
        let mail = Dependency::new("mail").unwrap();
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
            vec![(search.clone(), policy), (mail.clone(), policy)],
        )
        .await;
        assert!(error.is_none());
        assert_eq!(budgets.len(), 2);
        assert_eq!(budgets[0].dependency, search);
        assert_eq!(budgets[0].amplification(), Some(43.0 / 40.0));

        let registry = Registry::new();
        let gauges = FleetGauges::register(&registry).unwrap();
        gauges.set(&budgets);
        let text = encode(&registry.gather());
        for line in [
            "fleet_budget_window_allowance{dependency=\"search\"} 3",
            "fleet_budget_window_headroom{dependency=\"search\"} 0",
            "fleet_budget_window_retries_granted{dependency=\"search\"} 3",
            "fleet_budget_window_retries_denied{dependency=\"search\"} 2",
            "fleet_budget_window_first_attempts{dependency=\"search\"} 40",
            "fleet_budget_window_executions{dependency=\"search\"} 43",
            "fleet_budget_window_deposits{dependency=\"search\"} 30",
            "fleet_budget_policy_ratio{dependency=\"search\"} 0.1",
            "fleet_budget_policy_min_allowance{dependency=\"mail\"} 2",
            "fleet_budget_policy_window_seconds{dependency=\"mail\"} 3600",
            "fleet_budget_window_allowance{dependency=\"mail\"} 2",
            "fleet_budget_fleet_dependencies 2",
        ] {
            assert!(
                text.contains(&format!("{line}\n")),
                "{line} missing in\n{text}"
            );
        }

        gauges.set(&budgets[..1]);
        let text = encode(&registry.gather());
        assert!(!text.contains("dependency=\"mail\""), "{text}");
        assert!(text.contains("fleet_budget_fleet_dependencies 1\n"));
    }
}
