//! `budgetctl exporter`: one Prometheus scrape target for the whole fleet — every dependency's
//! budget read from Redis at scrape time (`fleet_budget::metrics::FleetExporter`), the Redis
//! settings that drop budgets silently (`fleet_budget::risks::RedisRiskSource`), and the work,
//! dead-letter and parked queues from RabbitMQ (`fleet_budget_amqp::QueueSource`, over one
//! connection kept across scrapes and named `fleet-budget exporter` on the broker), and each
//! dependency's alerts as the library's read model judges them (`fleet_budget::view`, the alerts
//! `budgetctl status` and the console show: `fleet_budget::metrics::AlertSource`), served by
//! `MetricsServer`. Beside the scrapes it runs the overrides keeper
//! (`fleet_budget::control::keeper`): a copy of the operators' overrides put back when Redis
//! loses one before its end, and the audit trail watched for a loss
//! (`fleet_budget_overrides_restored_total`, `fleet_budget_audit_trail_lost_total`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::Args;
use fleet_budget::Dependency;
use fleet_budget::control::{DeadLetterIndex, Keeper};
use fleet_budget::metrics::{AlertSource, FleetExporter, MetricsServer};
use fleet_budget::redact::{redact_text, redact_url};
use fleet_budget::risks::RedisRiskSource;
use fleet_budget::store::{BudgetStore, RedisStore};
use fleet_budget_amqp::{QueueSource, Topology, WorkerConfig};

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
    /// How often the overrides keeper reads every dependency's overrides, keeping a copy it
    /// puts back when Redis loses one before its end (milliseconds; 0: no keeper). Putting back
    /// needs a Redis user that may run `override.lua` (the operator's).
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    keep_overrides_ms: u64,
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
    // The overrides keeper (`fleet_budget::control::keeper`): a copy of the overrides in this
    // process, put back when Redis loses one; its series in the exporter's registry.
    let keeper = if args.keep_overrides_ms > 0 {
        let keeper = Arc::new(Keeper::new(Arc::clone(&store), budget, "exporter")?);
        keeper.register(exporter.registry())?;
        tokio::spawn(Arc::clone(&keeper).run(Duration::from_millis(args.keep_overrides_ms)));
        Some(keeper)
    } else {
        None
    };
    let exporter = Arc::new(exporter);
    if args.discover_secs > 0 {
        tokio::spawn(discover(
            store,
            Arc::clone(&exporter),
            found,
            keeper,
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
    keeper: Option<Arc<Keeper>>,
    every: Duration,
) {
    loop {
        match store.discover_dependencies().await {
            Ok(found) => {
                if let Some(keeper) = &keeper {
                    keeper.set_found(found.clone());
                }
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
