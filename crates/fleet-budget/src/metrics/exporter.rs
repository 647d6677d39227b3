//! The fleet exporter: one scrape target that shows the whole fleet's budgets (read from Redis
//! at scrape time, [`super::write_budgets`]) and whatever other sources add (the AMQP crate adds
//! the dead-letter and parked queues). `budgetctl exporter` serves it with
//! [`super::MetricsServer`].
//!
//! A scrape is bounded: one at a time (a second scraper waits for the first and gets its own
//! reading), every store call within the store's deadline, the whole reading within
//! [`FleetExporter::scrape_timeout`] — or within [`SCRAPER_SHARE`] of the scraper's own timeout
//! when it says so (Prometheus' `X-Prometheus-Scrape-Timeout-Seconds`) and that is shorter — at
//! most [`FleetExporter::max_dependencies`] dependencies. A source that fails or times out shows
//! `fleet_budget_exporter_up{source} 0` and its series disappear, instead of the scrape failing:
//! a slow RabbitMQ does not cost the scraper the budgets.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fleet_budget_exporter_up` | gauge | source | 1 when the last reading of `redis` (or `rabbitmq`, ...) succeeded |
//! | `fleet_budget_exporter_read_duration_seconds` | gauge | source | how long the last reading took |
//! | `fleet_budget_exporter_dependencies_dropped` | gauge | — | dependencies beyond `max_dependencies`, not shown |

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus::{GaugeVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::fleet::{read_budgets, write_budgets};
use super::server::{Exposition, RenderFuture, encode};
use crate::config::Config;
use crate::dependency::Dependency;
use crate::store::BudgetStore;

/// The share of the scraper's timeout a reading may take; the rest is for the answer to travel.
pub const SCRAPER_SHARE: f64 = 0.8;

/// A boxed future returned by [`ExporterSource::read`].
pub type ReadFuture<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// Another source of fleet state, read at each scrape into gauges registered on the exporter's
/// registry ([`FleetExporter::registry`]).
pub trait ExporterSource: Send + Sync + 'static {
    /// The `source` label (`rabbitmq`).
    fn name(&self) -> &'static str;

    /// Reads the source and sets its gauges; on failure, clears them and says why.
    fn read(&self) -> ReadFuture<'_>;

    /// Clears the gauges (the reading timed out).
    fn clear(&self);
}

/// The fleet exporter (module docs).
pub struct FleetExporter {
    registry: Registry,
    store: Arc<dyn BudgetStore>,
    config: Config,
    found: Mutex<Vec<Dependency>>,
    up: IntGaugeVec,
    read_duration: GaugeVec,
    dropped: IntGauge,
    sources: Vec<Box<dyn ExporterSource>>,
    scrape: tokio::sync::Mutex<()>,
    scrape_timeout: Duration,
    max_dependencies: usize,
}

impl std::fmt::Debug for FleetExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetExporter")
            .field("store", &self.store)
            .field(
                "sources",
                &self.sources.iter().map(|s| s.name()).collect::<Vec<_>>(),
            )
            .field("scrape_timeout", &self.scrape_timeout)
            .field("max_dependencies", &self.max_dependencies)
            .finish_non_exhaustive()
    }
}

impl FleetExporter {
    /// Dependencies shown at most, by default (configured ones first, then those found).
    pub const DEFAULT_MAX_DEPENDENCIES: usize = 10_000;
    /// Time a whole reading may take, by default.
    pub const DEFAULT_SCRAPE_TIMEOUT: Duration = Duration::from_secs(8);

    /// An exporter of the budgets in `store` with the policies of `config` (its dependencies
    /// are always shown; add those found in the store with
    /// [`FleetExporter::set_found_dependencies`]).
    ///
    /// # Errors
    /// Only if metric names clash, which they do not on a new registry.
    pub fn new(store: Arc<dyn BudgetStore>, config: &Config) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let up = IntGaugeVec::new(
            Opts::new(
                "fleet_budget_exporter_up",
                "1 when the last reading of the source succeeded.",
            ),
            &["source"],
        )?;
        let read_duration = GaugeVec::new(
            Opts::new(
                "fleet_budget_exporter_read_duration_seconds",
                "How long the last reading of the source took.",
            ),
            &["source"],
        )?;
        let dropped = IntGauge::new(
            "fleet_budget_exporter_dependencies_dropped",
            "Dependencies beyond the exporter's maximum, not shown.",
        )?;
        registry.register(Box::new(up.clone()))?;
        registry.register(Box::new(read_duration.clone()))?;
        registry.register(Box::new(dropped.clone()))?;
        Ok(Self {
            registry,
            store,
            config: config.clone(),
            found: Mutex::new(Vec::new()),
            up,
            read_duration,
            dropped,
            sources: Vec::new(),
            scrape: tokio::sync::Mutex::new(()),
            scrape_timeout: Self::DEFAULT_SCRAPE_TIMEOUT,
            max_dependencies: Self::DEFAULT_MAX_DEPENDENCIES,
        })
    }

    /// The registry other sources register their gauges on.
    #[must_use]
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Adds a source read at each scrape.
    #[must_use]
    pub fn source(mut self, source: Box<dyn ExporterSource>) -> Self {
        self.sources.push(source);
        self
    }

    /// Sets the time a whole reading may take.
    #[must_use]
    pub fn scrape_timeout(mut self, timeout: Duration) -> Self {
        self.scrape_timeout = timeout;
        self
    }

    /// Sets how many dependencies are shown at most.
    #[must_use]
    pub fn max_dependencies(mut self, max: usize) -> Self {
        self.max_dependencies = max;
        self
    }

    /// The dependencies found in the store (by a scan of its keys), shown beside the
    /// configured ones.
    pub fn set_found_dependencies(&self, found: Vec<Dependency>) {
        *self.found.lock().unwrap_or_else(PoisonError::into_inner) = found;
    }

    /// The dependencies a scrape reads, with their policies: the configured ones, then those
    /// found, without duplicates, at most `max_dependencies`; and how many were left out.
    fn dependencies(&self) -> (Vec<(Dependency, crate::BudgetPolicy)>, usize) {
        let mut all: Vec<Dependency> = self.config.policies.keys().cloned().collect();
        let configured = all.len();
        {
            let found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
            all.extend(
                found
                    .iter()
                    .filter(|d| !self.config.policies.contains_key(*d))
                    .cloned(),
            );
        }
        if let Some(tail) = all.get_mut(configured..) {
            tail.sort();
        }
        all.dedup();
        let dropped = all.len().saturating_sub(self.max_dependencies);
        all.truncate(self.max_dependencies);
        let with_policies = all
            .into_iter()
            .map(|d| {
                let policy = self.config.policy(&d);
                (d, policy)
            })
            .collect();
        (with_policies, dropped)
    }

    /// Reads every source now and returns the text exposition.
    pub async fn scrape(&self) -> String {
        self.scrape_within(None).await
    }

    /// As [`FleetExporter::scrape`] for a scraper that gives up after `scraper_timeout`: the
    /// reading (the wait for an earlier scrape included) ends within [`SCRAPER_SHARE`] of it when
    /// that is shorter than [`FleetExporter::scrape_timeout`].
    pub async fn scrape_within(&self, scraper_timeout: Option<Duration>) -> String {
        let bound = scraper_timeout.map_or(self.scrape_timeout, |t| {
            self.scrape_timeout.min(t.mul_f64(SCRAPER_SHARE))
        });
        let now = tokio::time::Instant::now();
        // A bound too large to add to now is no bound, as `tokio::time::timeout` takes it.
        let deadline = now
            .checked_add(bound)
            .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600));
        let _one_at_a_time = self.scrape.lock().await;
        let redis = async {
            let started = Instant::now();
            let (dependencies, dropped) = self.dependencies();
            let read =
                tokio::time::timeout_at(deadline, read_budgets(&self.store, dependencies)).await;
            let budgets = match read {
                Ok((budgets, None)) => Some(budgets),
                Ok((_, Some(e))) => {
                    tracing::warn!(error = %e, "exporter: reading the fleet store failed");
                    None
                }
                Err(_) => {
                    tracing::warn!(timeout = ?bound, "exporter: reading the fleet store timed out");
                    None
                }
            };
            self.dropped.set(i64::try_from(dropped).unwrap_or(i64::MAX));
            self.mark("redis", budgets.is_some(), started.elapsed());
            budgets.unwrap_or_default()
        };
        let others = futures::future::join_all(self.sources.iter().map(|source| async move {
            let started = Instant::now();
            let ok = match tokio::time::timeout_at(deadline, source.read()).await {
                Ok(Ok(())) => true,
                Ok(Err(why)) => {
                    tracing::warn!(source = source.name(), error = %why, "exporter: reading failed");
                    source.clear();
                    false
                }
                Err(_) => {
                    tracing::warn!(source = source.name(), "exporter: reading timed out");
                    source.clear();
                    false
                }
            };
            self.mark(source.name(), ok, started.elapsed());
        }));
        let (budgets, ()) = futures::join!(redis, async {
            others.await;
        });
        let mut text = encode(&self.registry.gather());
        write_budgets(&mut text, &budgets);
        text
    }

    fn mark(&self, source: &str, ok: bool, took: Duration) {
        self.up.with_label_values(&[source]).set(i64::from(ok));
        self.read_duration
            .with_label_values(&[source])
            .set(took.as_secs_f64());
    }
}

impl Exposition for Arc<FleetExporter> {
    fn render(&self) -> RenderFuture<'_> {
        Box::pin(self.scrape())
    }

    fn render_within(&self, scraper_timeout: Option<Duration>) -> RenderFuture<'_> {
        Box::pin(self.scrape_within(scraper_timeout))
    }
}
