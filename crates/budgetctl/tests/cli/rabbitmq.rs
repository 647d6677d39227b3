//! `migrate`, `dlq stats` and `replay` against RabbitMQ.

use fleet_budget::DeadLetterReason;
use fleet_budget::clock::now_ms;
use fleet_budget_amqp::testing::{TestBroker, block_on};

use crate::{assert_exit, has_fields, json, run, run_with, stderr, stdout, temp_file, unique};

/// Ready messages in `queue`.
fn depth(broker: &TestBroker, queue: &str) -> u32 {
    block_on(broker.depth(queue))
}

/// Publishes a dead-letter of `dependency` / `reason`, dead-lettered a second ago, into the
/// broker's dead-letter exchange as a worker would.
fn dead_letter(broker: &TestBroker, dependency: &str, reason: DeadLetterReason) {
    block_on(async {
        let publisher = broker.publisher().await;
        let record = broker.dead_letter_record(dependency, reason, now_ms() - 1000);
        broker.publish_dead_letter(&publisher, &record, b"{}").await;
        publisher.close().await;
    });
}

#[test]
fn migrate_dlq_stats_and_replay_against_rabbitmq() {
    let broker = TestBroker::new("cli");
    let prefix = &broker.settings.prefix;
    let config = temp_file(
        &format!("{prefix}.toml"),
        &format!("[amqp]\nprefix = \"{prefix}\"\nurl = \"{}\"\n", broker.url),
    );
    let cfg = config.to_str().unwrap();
    let redis_prefix = unique("replay");
    let base = ["--config", cfg, "--key-prefix", redis_prefix.as_str()];
    let with = |command: &str| run_with(&base, command);

    let plan = json(&with("migrate --dry-run --json"));
    assert_eq!(plan["dry_run"], true);
    assert!(plan["created"].as_u64().unwrap() >= 6, "{plan}");
    has_fields(&plan["steps"][0], &["version", "object", "state"]);
    let applied = json(&with("migrate --json"));
    assert_eq!(applied["created"], plan["created"]);
    assert_eq!(
        json(&with("migrate --json"))["created"],
        0,
        "migrate is idempotent"
    );
    let text = stdout(&with("migrate"));
    assert!(
        text.contains("unchanged") && !text.contains("guest:guest"),
        "{text}"
    );

    dead_letter(&broker, "search", DeadLetterReason::BudgetExhausted);
    dead_letter(&broker, "search", DeadLetterReason::BudgetExhausted);
    dead_letter(&broker, "mail", DeadLetterReason::AttemptsExhausted);

    let stats = json(&with("dlq stats --json"));
    assert_eq!(stats["dead_letter"]["depth"], 3, "{stats}");
    assert_eq!(stats["parked"]["depth"], 0, "{stats}");
    let by = stats["dead_letter"]["by_dependency_reason"]
        .as_array()
        .unwrap();
    assert!(
        by.iter().any(|d| d["dependency"] == "search"
            && d["reason"] == "budget_exhausted"
            && d["count"] == 2),
        "{stats}"
    );
    assert!(
        by.iter().any(|d| d["dependency"] == "mail"
            && d["reason"] == "attempts_exhausted"
            && d["count"] == 1),
        "{stats}"
    );
    assert!(
        stats["dead_letter"]["oldest_age_secs"].as_f64().unwrap() >= 0.9,
        "{stats}"
    );
    assert!(stdout(&with("dlq stats")).contains("budget_exhausted"));
    // Reading for stats puts the messages back.
    assert_eq!(depth(&broker, &broker.topology.dead_queue), 3);

    let dry = json(&with("replay --dependency search --dry-run --json"));
    for f in ["matched", "moved", "parked", "skipped", "failed", "dry_run"] {
        assert!(dry.get(f).is_some(), "{f} missing: {dry}");
    }
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["matched"], 2, "{dry}");
    assert_eq!(dry["skipped"], 1, "{dry}");
    assert_eq!(
        depth(&broker, &broker.topology.dead_queue),
        3,
        "a dry run moves nothing"
    );

    let none = json(&with(
        "replay --dependency search --reason non_retryable --dry-run --json",
    ));
    assert_eq!(none["matched"], 0, "{none}");

    let limited = json(&with(
        "replay --dependency search --limit 1 --dry-run --json",
    ));
    assert_eq!(limited["moved"], 1, "{limited}");
    assert_eq!(limited["skipped"], 2, "{limited}");
    let one = json(&with("replay --dependency search --limit 1 --json"));
    assert_eq!(one["moved"], 1, "{one}");
    assert_eq!(one["skipped"], 2, "{one}");
    assert_eq!(depth(&broker, &broker.topology.work_queue), 1);
    assert_eq!(depth(&broker, &broker.topology.dead_queue), 2);

    let done = json(&with(
        "replay --dependency search --rate 100 --since 1h --json",
    ));
    assert_eq!(done["dry_run"], false);
    assert_eq!(done["moved"], 1, "{done}");
    assert_eq!(done["skipped"], 1, "{done}");
    assert_eq!(done["failed"], 0, "{done}");
    assert_eq!(depth(&broker, &broker.topology.work_queue), 2);
    assert_eq!(depth(&broker, &broker.topology.dead_queue), 1);
    assert_exit(&with("replay --dependency search --limit 0"), 2, "--limit");

    assert_exit(
        &with("replay --dependency search --since yesterday"),
        2,
        "--since",
    );
}

#[test]
fn rabbitmq_unreachable_is_a_runtime_failure_naming_the_redacted_url() {
    let port = fleet_budget::testing::free_port();
    let url = format!("amqp://admin:hunter2@127.0.0.1:{port}/%2f");
    for args in [
        vec!["migrate"],
        vec!["dlq", "stats"],
        vec!["replay", "--dependency", "search"],
        vec!["replay", "--dependency", "search", "--dry-run"],
    ] {
        let mut full = vec!["--amqp-url", url.as_str()];
        full.extend(args);
        let o = run(&full);
        assert_exit(&o, 1, &format!("amqp://admin:***@127.0.0.1:{port}"));
        assert!(!stderr(&o).contains("hunter2"), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("docker compose up -d"),
            "{}",
            stderr(&o)
        );
    }
}
