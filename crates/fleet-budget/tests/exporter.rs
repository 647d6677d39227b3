//! The fleet exporter against a real Redis: what a scrape shows (operators' overrides included),
//! and what it shows when Redis stops answering (`fleet_budget_exporter_up{source="redis"} 0`,
//! no stale budget series), and that a source that hangs costs a scraper that source only, within
//! the timeout the scraper announces.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use fleet_budget::control::{AuditLog, OverrideAction, overrides};
use fleet_budget::metrics::{ExporterSource, FleetExporter, MetricsServer, ReadFuture};
use fleet_budget::store::{BudgetStore, Deposits, RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{Config, Dependency};

fn config() -> Config {
    Config::from_toml(
        "[dependencies.search]\ntasks = [\"index_document\"]\nratio = 0.1\nmin_allowance = 1\n",
        "test",
    )
    .unwrap()
}

#[tokio::test]
async fn a_scrape_shows_configured_and_found_dependencies_and_says_when_redis_is_gone() {
    let mut server = RedisServer::start();
    let config = config();
    let store: Arc<dyn BudgetStore> = Arc::new(
        RedisStore::new(
            RedisTarget::Single(server.url()),
            &config.redis.key_prefix,
            Duration::from_millis(500),
        )
        .unwrap(),
    );
    let search = Dependency::new("search").unwrap();
    let found = Dependency::new("mail").unwrap();
    let deposits = Deposits {
        successes: 40,
        first_attempts: 50,
    };
    store
        .deposit(&search, &config.policy(&search), deposits)
        .await
        .unwrap();
    for _ in 0..6 {
        store
            .withdraw(&search, &config.policy(&search))
            .await
            .unwrap();
    }
    let exporter = FleetExporter::new(Arc::clone(&store), &config)
        .unwrap()
        .max_dependencies(2);
    exporter.set_found_dependencies(vec![
        found.clone(),
        Dependency::new("zz-beyond-the-maximum").unwrap(),
    ]);

    let text = exporter.scrape().await;
    for line in [
        "fleet_budget_exporter_up{source=\"redis\"} 1",
        "fleet_budget_exporter_dependencies_dropped 1",
        "fleet_budget_fleet_dependencies 2",
        "fleet_budget_window_allowance{dependency=\"search\"} 4",
        "fleet_budget_window_retries_granted{dependency=\"search\"} 4",
        "fleet_budget_window_retries_denied{dependency=\"search\"} 2",
        "fleet_budget_window_headroom{dependency=\"search\"} 0",
        "fleet_budget_window_first_attempts{dependency=\"search\"} 50",
        "fleet_budget_policy_ratio{dependency=\"search\"} 0.1",
        "fleet_budget_policy_ratio{dependency=\"mail\"} 0.2",
    ] {
        assert!(
            text.contains(&format!("{line}\n")),
            "{line} missing in\n{text}"
        );
    }
    assert!(!text.contains("zz-beyond-the-maximum"), "{text}");

    // An operator's overrides show as gauges of their own: a freeze on one, a set on the other.
    assert!(
        text.contains("fleet_budget_override_frozen{dependency=\"search\"} 0\n"),
        "{text}"
    );
    let operator = RedisStore::new(
        RedisTarget::Single(server.url()),
        &config.redis.key_prefix,
        Duration::from_millis(500),
    )
    .unwrap();
    let (audit, week) = (AuditLog::default(), Duration::from_secs(7 * 24 * 3600));
    let freeze = OverrideAction::Freeze { duration: week };
    overrides::apply(&operator, &audit, &search, freeze, "test", "exporter")
        .await
        .unwrap();
    let set = OverrideAction::Set {
        duration: week,
        ratio: Some(0.5),
        min_allowance: None,
    };
    overrides::apply(&operator, &audit, &found, set, "test", "exporter")
        .await
        .unwrap();
    let text = exporter.scrape().await;
    for line in [
        "fleet_budget_override_frozen{dependency=\"search\"} 1",
        "fleet_budget_override_set{dependency=\"search\"} 0",
        "fleet_budget_window_allowance{dependency=\"search\"} 0",
        "fleet_budget_override_frozen{dependency=\"mail\"} 0",
        "fleet_budget_override_set{dependency=\"mail\"} 1",
    ] {
        assert!(
            text.contains(&format!("{line}\n")),
            "{line} missing in\n{text}"
        );
    }

    server.stop();
    let text = exporter.scrape().await;
    assert!(
        text.contains("fleet_budget_exporter_up{source=\"redis\"} 0\n"),
        "{text}"
    );
    assert!(
        !text.contains("fleet_budget_window_allowance{"),
        "stale: {text}"
    );
}

/// A source that never answers (a broker that accepts the connection and then says nothing).
struct Hanging;

impl ExporterSource for Hanging {
    fn name(&self) -> &'static str {
        "hanging"
    }

    fn read(&self) -> ReadFuture<'_> {
        Box::pin(std::future::pending())
    }

    fn clear(&self) {}
}

/// `GET /metrics` as Prometheus sends it, announcing a scrape timeout of `timeout_secs`.
async fn scrape_as_prometheus(addr: std::net::SocketAddr, timeout_secs: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!(
                "GET /metrics HTTP/1.0\r\nHost: {addr}\r\nX-Prometheus-Scrape-Timeout-Seconds: {timeout_secs}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

/// Regression: a scrape waited for a slow source as long as the exporter's own bound (8 s by
/// default) whatever the scraper's timeout, so a Prometheus that waits less got no answer at all:
/// the budgets, which Redis had given at once, were lost with the slow source (the end-to-end
/// test's alert never fired on a loaded machine, where reading RabbitMQ took seconds). Now the
/// reading ends within a share of the timeout Prometheus announces.
#[tokio::test]
async fn a_hanging_source_costs_the_scraper_that_source_only_within_its_timeout() {
    let server = RedisServer::start();
    let config = config();
    let store: Arc<dyn BudgetStore> = Arc::new(
        RedisStore::new(
            RedisTarget::Single(server.url()),
            &config.redis.key_prefix,
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    let exporter = Arc::new(
        FleetExporter::new(store, &config)
            .unwrap()
            .scrape_timeout(Duration::from_secs(600))
            .source(Box::new(Hanging)),
    );
    let metrics = MetricsServer::bind(([127, 0, 0, 1], 0).into(), Arc::clone(&exporter))
        .await
        .unwrap();
    // The scraper waits 5 s; 60 s is only a guard against the hang (the exporter's own bound
    // here is 600 s).
    let response = tokio::time::timeout(
        Duration::from_secs(60),
        scrape_as_prometheus(metrics.local_addr(), "5"),
    )
    .await
    .expect("an answer within the scraper's timeout, not the exporter's 600 s");
    for line in [
        "fleet_budget_exporter_up{source=\"hanging\"} 0",
        "fleet_budget_exporter_up{source=\"redis\"} 1",
        "fleet_budget_policy_ratio{dependency=\"search\"} 0.1",
    ] {
        assert!(
            response.contains(&format!("{line}\n")),
            "{line} missing in\n{response}"
        );
    }
    metrics.shutdown().await;
}

/// An exporter without a bound of its own (`Duration::MAX`) still scrapes: a deadline too far to
/// compute is no deadline, not a panic.
#[tokio::test]
async fn an_unbounded_exporter_scrapes() {
    let server = RedisServer::start();
    let config = config();
    let store: Arc<dyn BudgetStore> = Arc::new(
        RedisStore::new(
            RedisTarget::Single(server.url()),
            &config.redis.key_prefix,
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    let exporter = FleetExporter::new(store, &config)
        .unwrap()
        .scrape_timeout(Duration::MAX);
    let text = exporter.scrape().await;
    assert!(
        text.contains("fleet_budget_exporter_up{source=\"redis\"} 1\n"),
        "{text}"
    );
}

/// Regression: the `fleet_budget_policy_*` gauges showed the exporter's own configuration, not
/// the policy in force in Redis, so after an operator's `set` override, or with workers that run
/// another ratio than the exporter's configuration, the retry-fraction alert and panel compared
/// against the wrong ratio. Now they show what `status.lua` reads: the policy in force, with the
/// ratio and floor a set override puts in its place; the configured policy only where no key
/// holds one yet.
#[tokio::test]
async fn policy_gauges_show_the_policy_in_force_and_follow_a_set_override() {
    let server = RedisServer::start();
    let worker_config = Config::from_toml(
        "[dependencies.search]\ntasks = [\"index_document\"]\nratio = 0.05\nmin_allowance = 3\n",
        "worker",
    )
    .unwrap();
    let exporter_config = Config::from_toml(
        "[dependencies.search]\ntasks = [\"index_document\"]\nratio = 0.2\nmin_allowance = 7\n\
         [dependencies.idle]\ntasks = [\"send_mail\"]\nratio = 0.3\nmin_allowance = 4\n",
        "exporter",
    )
    .unwrap();
    let store = || {
        RedisStore::new(
            RedisTarget::Single(server.url()),
            &worker_config.redis.key_prefix,
            Duration::from_millis(500),
        )
        .unwrap()
    };
    let search = Dependency::new("search").unwrap();
    let worker = store();
    let deposits = Deposits {
        successes: 100,
        first_attempts: 100,
    };
    worker
        .deposit(&search, &worker_config.policy(&search), deposits)
        .await
        .unwrap();
    let exporter = FleetExporter::new(Arc::new(store()), &exporter_config).unwrap();

    let text = exporter.scrape().await;
    for line in [
        "fleet_budget_policy_ratio{dependency=\"search\"} 0.05",
        "fleet_budget_policy_min_allowance{dependency=\"search\"} 3",
        "fleet_budget_override_set{dependency=\"search\"} 0",
        // No key, no policy in force: the exporter's configured policy.
        "fleet_budget_policy_ratio{dependency=\"idle\"} 0.3",
        "fleet_budget_policy_min_allowance{dependency=\"idle\"} 4",
    ] {
        assert!(
            text.contains(&format!("{line}\n")),
            "{line} missing in\n{text}"
        );
    }

    let audit = AuditLog::default();
    let set = OverrideAction::Set {
        duration: Duration::from_secs(3600),
        ratio: Some(0.5),
        min_allowance: None,
    };
    overrides::apply(&store(), &audit, &search, set, "test", "exporter")
        .await
        .unwrap();
    let text = exporter.scrape().await;
    for line in [
        "fleet_budget_policy_ratio{dependency=\"search\"} 0.5",
        "fleet_budget_policy_min_allowance{dependency=\"search\"} 3",
        "fleet_budget_override_set{dependency=\"search\"} 1",
    ] {
        assert!(
            text.contains(&format!("{line}\n")),
            "{line} missing in\n{text}"
        );
    }

    let floor = OverrideAction::Set {
        duration: Duration::from_secs(3600),
        ratio: None,
        min_allowance: Some(40),
    };
    overrides::apply(&store(), &audit, &search, floor, "test", "exporter")
        .await
        .unwrap();
    let text = exporter.scrape().await;
    assert!(
        text.contains("fleet_budget_policy_min_allowance{dependency=\"search\"} 40\n"),
        "{text}"
    );
}
