//! `budgetctl exporter`: one Prometheus scrape target for the whole fleet — every dependency's
//! budget read from Redis at scrape time (`fleet_budget::metrics::FleetExporter`), the Redis
//! settings that drop budgets silently (`fleet_budget::risks::RedisRiskSource`), and the work,
//! dead-letter and parked queues from RabbitMQ (`fleet_budget_amqp::QueueSource`, over one
//! connection kept across scrapes and named `fleet-budget exporter` on the broker), served by
//! `MetricsServer`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use fleet_budget::control::DeadLetterIndex;
use fleet_budget::metrics::{FleetExporter, MetricsServer};
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
    let exporter = Arc::new(exporter);
    if args.discover_secs > 0 {
        tokio::spawn(discover(
            store,
            Arc::clone(&exporter),
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
async fn discover(store: Arc<RedisStore>, exporter: Arc<FleetExporter>, every: Duration) {
    loop {
        match store.discover_dependencies().await {
            Ok(found) => exporter.set_found_dependencies(found),
            Err(e) => {
                tracing::warn!(error = %redact_text(&e.to_string()), "exporter: looking for budget keys failed");
            }
        }
        tokio::time::sleep(every).await;
    }
}
