//! The exporter's reading of the alerts: each dependency's alerts as the read model judges them
//! ([`crate::view`], the alerts `budgetctl status` and the console show), as a gauge.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fleet_budget_alert` | gauge | dependency, kind | the severity (1 to 5) of each alert in force (`kind`: `frozen`, `breaker`, `exhausted`, `shadow`, `amplified`, `denials`, `policy_conflict`); a dependency without alerts has no series |

use std::sync::{Arc, Mutex, PoisonError};

use prometheus::{IntGaugeVec, Opts, Registry};

use crate::metrics::{ExporterSource, ReadFuture};
use crate::redact::redact_text;
use crate::store::RedisStore;
use crate::{Config, Dependency, view};

/// `fleet_budget_alert{dependency,kind}` (module docs): the alerts of the dependencies
/// configured, then of those found under the prefix, at most `max` of them, read at each
/// scrape. `dependency` is bounded by `max`, `kind` by the read model's kinds.
pub struct AlertSource {
    store: Arc<RedisStore>,
    config: Config,
    found: Arc<Mutex<Vec<Dependency>>>,
    max: usize,
    alerts: IntGaugeVec,
}

impl std::fmt::Debug for AlertSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlertSource")
            .field("store", &self.store.target().display())
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl AlertSource {
    /// Registers `fleet_budget_alert` in `registry`. `found` holds the dependencies found in
    /// Redis beyond the configured ones (the exporter's discovery fills it; empty: the
    /// configured ones only).
    ///
    /// # Errors
    /// The name is registered already.
    pub fn register(
        store: Arc<RedisStore>,
        config: Config,
        found: Arc<Mutex<Vec<Dependency>>>,
        max: usize,
        registry: &Registry,
    ) -> prometheus::Result<Self> {
        let alerts = IntGaugeVec::new(
            Opts::new(
                "fleet_budget_alert",
                "Severity (1 to 5) of each alert in force on a dependency, as budgetctl status and the console show it.",
            ),
            &["dependency", "kind"],
        )?;
        registry.register(Box::new(alerts.clone()))?;
        Ok(Self {
            store,
            config,
            found,
            max,
            alerts,
        })
    }

    fn dependencies(&self) -> Vec<Dependency> {
        let mut deps: Vec<Dependency> = self.config.policies.keys().cloned().collect();
        let found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        for d in found.iter() {
            if !self.config.policies.contains_key(d) {
                deps.push(d.clone());
            }
        }
        deps.truncate(self.max);
        deps
    }
}

impl ExporterSource for AlertSource {
    fn name(&self) -> &'static str {
        "alerts"
    }

    fn read(&self) -> ReadFuture<'_> {
        Box::pin(async move {
            let deps = self.dependencies();
            let fleet = view::read_fleet(&self.store, &self.config, &deps)
                .await
                .map_err(|e| redact_text(&e.to_string()))?;
            self.alerts.reset();
            for v in &fleet.dependencies {
                for a in &v.alerts {
                    self.alerts
                        .with_label_values(&[v.dependency.as_str(), a.kind.as_str()])
                        .set(i64::from(a.severity));
                }
            }
            Ok(())
        })
    }

    fn clear(&self) {
        self.alerts.reset();
    }
}
