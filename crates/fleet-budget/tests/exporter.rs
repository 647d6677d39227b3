//! The fleet exporter against a real Redis: what a scrape shows (operators' overrides included),
//! and what it shows when Redis stops answering (`fleet_budget_exporter_up{source="redis"} 0`,
//! no stale budget series).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use fleet_budget::control::{AuditLog, OverrideAction, overrides};
use fleet_budget::metrics::FleetExporter;
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
