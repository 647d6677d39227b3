//! `budgetctl exporter`: one Prometheus scrape target for the whole fleet — every dependency's
//! budget read from Redis at scrape time (`fleet_budget::metrics::FleetExporter`), the Redis
//! settings that drop budgets silently (`fleet_budget::risks::RedisRiskSource`), and the work,
//! dead-letter and parked queues from RabbitMQ (`fleet_budget_amqp::QueueSource`, over one
//! connection kept across scrapes and named `fleet-budget exporter` on the broker), and each
//! dependency's alerts as the library's read model judges them (`fleet_budget::view`, the alerts
//! `budgetctl status` and the console show), served by `MetricsServer`.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fleet_budget_alert` | gauge | dependency, kind | the severity (1 to 5) of each alert in force (`kind`: `frozen`, `breaker`, `exhausted`, `amplified`, `denials`, `policy_conflict`); a dependency without alerts has no series |

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::Args;
use fleet_budget::control::DeadLetterIndex;
use fleet_budget::metrics::{ExporterSource, FleetExporter, MetricsServer, ReadFuture};
use fleet_budget::redact::{redact_text, redact_url};
use fleet_budget::risks::RedisRiskSource;
use fleet_budget::store::{BudgetStore, RedisStore};
use fleet_budget::view;
use fleet_budget::{Config, Dependency};
use fleet_budget_amqp::{QueueSource, Topology, WorkerConfig};
use prometheus::{IntGaugeVec, Opts};

use crate::exit::usage;
use crate::redis_conn;

/// `exporter`.
#[derive(Debug, Args)]
pub(crate) struct ExporterArgs {
    /// Address to serve /metrics on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9465")]
    listen: SocketAddr,
    /// How often to look for budget keys of dependencies that are not configured (seconds;
    /// 0: only the configured dependencies).
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    discover_secs: u64,
    /// Dependencies shown at most (configured ones first); more are counted as dropped.
    #[arg(long, value_name = "N", default_value_t = FleetExporter::DEFAULT_MAX_DEPENDENCIES)]
    max_dependencies: usize,
    /// Do not read RabbitMQ (budgets only).
    #[arg(long)]
    no_rabbitmq: bool,
    /// Do not serve `fleet_budget_alert` (it reads each dependency's overrides, breaker and
    /// leases at each scrape, beside its budget).
    #[arg(long)]
    no_alerts: bool,
}

/// Runs the command until interrupted.
pub(crate) async fn run(config: &WorkerConfig, args: &ExporterArgs) -> anyhow::Result<()> {
    let budget = &config.budget;
    let target = redis_conn::target(budget);
    let shown = target.display();
    let timeout = redis_conn::cli_timeout(budget);
    let store = Arc::new(
        RedisStore::new_with_tls(target, &budget.redis.key_prefix, timeout, &budget.redis.tls)
            .map_err(|e| usage(format!("--redis-url / redis.url {shown}: {e}")))?,
    );
    let mut exporter = FleetExporter::new(Arc::clone(&store) as Arc<dyn BudgetStore>, budget)?
        .max_dependencies(args.max_dependencies);
    // `fleet_budget_redis_risk{check}`: the settings that drop budgets silently (eviction, no
    // persistence), read at each scrape.
    let risks = RedisRiskSource::register(Arc::clone(&store), exporter.registry())?;
    exporter = exporter.source(Box::new(risks));
    if !args.no_rabbitmq {
        let queues = QueueSource::register(
            config.amqp.connection(),
            Topology::new(&config.amqp),
            exporter.registry(),
        )?
        .with_index(Some(DeadLetterIndex::new(Arc::clone(&store))));
        exporter = exporter.source(Box::new(queues));
    }
    let found = Arc::new(Mutex::new(Vec::new()));
    if !args.no_alerts {
        let alerts = AlertSource::register(
            Arc::clone(&store),
            budget.clone(),
            Arc::clone(&found),
            args.max_dependencies,
            exporter.registry(),
        )?;
        exporter = exporter.source(Box::new(alerts));
    }
    let exporter = Arc::new(exporter);
    if args.discover_secs > 0 {
        tokio::spawn(discover(
            store,
            Arc::clone(&exporter),
            found,
            Duration::from_secs(args.discover_secs),
        ));
    }
    let server = MetricsServer::bind(args.listen, Arc::clone(&exporter))
        .await
        .map_err(|e| usage(format!("--listen {}: {e}", args.listen)))?;
    let queues = if args.no_rabbitmq {
        String::new()
    } else {
        format!(" and the queues at {}", redact_url(&config.amqp.url))
    };
    eprintln!(
        "exporter: serving the fleet's budgets in {shown}{queues} on http://{}/metrics",
        server.local_addr()
    );
    let _ = tokio::signal::ctrl_c().await;
    server.shutdown().await;
    Ok(())
}

/// Looks for budget keys under the prefix every `every` (on every master of a cluster); a
/// failure keeps the last list and is logged.
async fn discover(
    store: Arc<RedisStore>,
    exporter: Arc<FleetExporter>,
    alerts_found: Arc<Mutex<Vec<Dependency>>>,
    every: Duration,
) {
    loop {
        match store.discover_dependencies().await {
            Ok(found) => {
                *alerts_found.lock().unwrap_or_else(PoisonError::into_inner) = found.clone();
                exporter.set_found_dependencies(found);
            }
            Err(e) => {
                tracing::warn!(error = %redact_text(&e.to_string()), "exporter: looking for budget keys failed");
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// `fleet_budget_alert{dependency,kind}` (module docs): the read model's alerts of the
/// dependencies configured, then those found, at most `max` of them, read at each scrape.
struct AlertSource {
    store: Arc<RedisStore>,
    config: Config,
    found: Arc<Mutex<Vec<Dependency>>>,
    max: usize,
    alerts: IntGaugeVec,
}

impl AlertSource {
    fn register(
        store: Arc<RedisStore>,
        config: Config,
        found: Arc<Mutex<Vec<Dependency>>>,
        max: usize,
        registry: &prometheus::Registry,
    ) -> Result<Self, prometheus::Error> {
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
