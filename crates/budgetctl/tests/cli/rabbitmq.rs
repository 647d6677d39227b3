//! `migrate`, `dlq stats` and `replay` against RabbitMQ.

use fleet_budget::DeadLetterReason;
use fleet_budget::clock::now_ms;
use fleet_budget_amqp::testing::{TestBroker, block_on};
use serde_json::json;

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

    // Dead letters from before the index (published by hand): a look says its counts are an
    // estimate, and reads none of them; `migrate` on the upgrade indexes them, once.
    let stats = json(&with("dlq stats --json"));
    assert_eq!(
        (
            &stats["dead_letter"]["exact"],
            &stats["dead_letter"]["difference"]
        ),
        (&json!(false), &json!(3)),
        "{stats}"
    );
    let upgraded = json(&with("migrate --json"));
    assert_eq!(upgraded["indexed"][0]["indexed"], 3, "{upgraded}");
    assert_eq!(
        json(&with("migrate --json"))["indexed"],
        json!([]),
        "indexed once"
    );
    let stats = json(&with("dlq stats --json"));
    assert_eq!(stats["dead_letter"]["exact"], true, "{stats}");
    assert_eq!(stats["dead_letter"]["read"], 0, "{stats}");
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

/// Issue 9: the work queue dead-letters at least once where the broker supports it. A new work
/// queue is declared with `x-dead-letter-strategy = at-least-once` (and the `reject-publish`
/// overflow it requires), and the broker dead-letters through it; an existing one cannot take
/// new arguments, so `migrate` says it needs a policy, prints the command, and succeeds.
#[test]
fn the_work_queue_dead_letters_at_least_once_new_by_argument_existing_by_policy() {
    use fleet_budget_amqp::{Migrations, StepState};
    use lapin::BasicProperties;
    use lapin::options::{BasicGetOptions, BasicNackOptions};
    use lapin::types::ShortString;

    // A new deployment: created with the arguments; applying again finds them there (a
    // declaration with them would be refused by a queue without them).
    let broker = TestBroker::new("alo");
    let prefix = &broker.settings.prefix;
    let config = temp_file(
        &format!("{prefix}.toml"),
        &format!(
            "[amqp]\nprefix = \"{prefix}\"\nurl = \"{}\"\ndelivery_limit = 1\n",
            broker.url
        ),
    );
    let cfg = config.to_str().unwrap();
    let key_prefix = unique("alo");
    let base = ["--config", cfg, "--key-prefix", key_prefix.as_str()];
    let state_of_v3 = |v: &serde_json::Value| {
        v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["version"] == 3)
            .map(|s| s["state"].as_str().unwrap().to_owned())
    };
    let first = json(&run_with(&base, "migrate --json"));
    assert_eq!(state_of_v3(&first).as_deref(), Some("unchanged"), "{first}");
    let again = json(&run_with(&base, "migrate --json"));
    assert_eq!(state_of_v3(&again).as_deref(), Some("unchanged"), "{again}");

    // The broker dead-letters through it: a job past the delivery limit reaches the dead queue.
    block_on(async {
        let publisher = broker.publisher().await;
        publisher
            .publish(
                &broker.topology.work_exchange,
                "t",
                b"job",
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap();
        publisher.close().await;
        let conn = broker.connection().await;
        let ch = conn.create_channel().await.unwrap();
        for _ in 0..2 {
            if let Some(m) = ch
                .basic_get(
                    ShortString::from(broker.topology.work_queue.as_str()),
                    BasicGetOptions::default(),
                )
                .await
                .unwrap()
            {
                m.delivery
                    .acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    })
                    .await
                    .unwrap();
            }
        }
        let _ = conn.close(200, ShortString::from("bye")).await;
    });
    let mut dead = 0;
    for _ in 0..100 {
        dead = depth(&broker, &broker.topology.dead_queue);
        if dead == 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(dead, 1, "dead-lettered past the delivery limit");

    // An existing deployment (versions 1 and 2 only): not an error, a policy to set.
    let old = TestBroker::new("alo-old");
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fleet-budget-amqp/migrations");
    let files: Vec<(String, String)> = ["0001_base_topology.toml", "0002_retry_tiers.toml"]
        .iter()
        .map(|f| {
            (
                (*f).to_owned(),
                std::fs::read_to_string(dir.join(f)).unwrap(),
            )
        })
        .collect();
    let before = Migrations::from_files(files).unwrap();
    block_on(fleet_budget_amqp::migrate(
        &old.url,
        &old.settings,
        &before,
        false,
    ))
    .unwrap();
    let old_prefix = &old.settings.prefix;
    let old_config = temp_file(
        &format!("{old_prefix}.toml"),
        &format!("[amqp]\nprefix = \"{old_prefix}\"\nurl = \"{}\"\n", old.url),
    );
    let old_base = [
        "--config",
        old_config.to_str().unwrap(),
        "--key-prefix",
        key_prefix.as_str(),
    ];
    let plan = json(&run_with(&old_base, "migrate --dry-run --json"));
    assert_eq!(
        state_of_v3(&plan).as_deref(),
        Some("needs policy"),
        "{plan}"
    );
    let text = stdout(&run_with(&old_base, "migrate"));
    assert!(
        text.contains("needs policy")
            && text.contains("rabbitmqctl set_policy --apply-to queues")
            && text.contains("\"dead-letter-strategy\":\"at-least-once\""),
        "{text}"
    );
    assert_eq!(StepState::NeedsPolicy.as_str(), "needs policy");
}

/// Issue 25: `--amqp-url` repeated or comma-separated is a cluster's node list: the commands reach
/// the live node past one that refuses; a bad URL is refused by its place in the list, and no node
/// answering names every node, passwords redacted.
#[test]
fn a_node_list_reaches_the_live_node_and_names_every_node_redacted() {
    let broker = TestBroker::new("clinodes");
    let prefix = &broker.settings.prefix;
    let config = temp_file(
        &format!("{prefix}.toml"),
        &format!("[amqp]\nprefix = \"{prefix}\"\n"),
    );
    let cfg = config.to_str().unwrap();
    let dead = format!(
        "amqp://admin:hunter2@127.0.0.1:{}/%2f",
        fleet_budget::testing::free_port()
    );
    let live = broker.url.clone();
    let o = run(&[
        "--config",
        cfg,
        "--amqp-url",
        &format!("{dead},{live}"),
        "migrate",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(&[
        "--config",
        cfg,
        "--amqp-url",
        &dead,
        "--amqp-url",
        &live,
        "dlq",
        "stats",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(json(&o)["dead_letter"]["depth"], 0, "{}", stdout(&o));

    let o = run(&[
        "--amqp-url",
        &live,
        "--amqp-url",
        "http://u:hunter2@b",
        "dlq",
        "stats",
    ]);
    assert_exit(&o, 2, "--amqp-url[1]");
    assert!(!stderr(&o).contains("hunter2"), "{}", stderr(&o));

    let other = format!(
        "amqp://admin:hunter2@127.0.0.1:{}/%2f",
        fleet_budget::testing::free_port()
    );
    let o = run(&["--amqp-url", &format!("{dead},{other}"), "dlq", "stats"]);
    assert_exit(&o, 1, "does not answer");
    let text = stderr(&o);
    assert!(!text.contains("hunter2"), "{text}");
    for url in [&dead, &other] {
        assert!(
            text.contains(&fleet_budget::redact::redact_url(url)),
            "{url} not named: {text}"
        );
    }
}
