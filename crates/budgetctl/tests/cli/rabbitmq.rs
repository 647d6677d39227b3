//! `migrate`, `dlq stats` and `replay` against RabbitMQ.

use crate::{assert_exit, has_fields, json, run, stderr, stdout, temp_file, unique};

pub(crate) mod broker {
    use fleet_budget::DeadLetterReason;
    use fleet_budget_amqp::AmqpSettings;
    use fleet_budget_amqp::Topology;
    use fleet_budget_amqp::headers::{self, DeadLetterRecord};
    use lapin::options::{
        BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions,
        QueueDeleteOptions,
    };
    use lapin::types::{FieldTable, ShortString};

    /// The shared broker: `FLEET_BUDGET_AMQP_URL`, or guest on 127.0.0.1:5672.
    pub(crate) fn url() -> String {
        std::env::var("FLEET_BUDGET_AMQP_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
    }

    /// A topology of the test's own on the shared broker, deleted on drop.
    pub(crate) struct TestBroker {
        pub(crate) topology: Topology,
        rt: tokio::runtime::Runtime,
    }

    impl TestBroker {
        pub(crate) fn new(prefix: &str) -> Self {
            let settings = AmqpSettings {
                prefix: prefix.to_owned(),
                ..AmqpSettings::default()
            };
            let topology = Topology::new(&settings);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            Self { topology, rt }
        }

        async fn channel() -> (lapin::Connection, lapin::Channel) {
            let conn = fleet_budget_amqp::connect(&url(), "budgetctl cli test")
                .await
                .expect("RabbitMQ on 127.0.0.1:5672 (.ci/run starts it)");
            let ch = conn.create_channel().await.unwrap();
            (conn, ch)
        }

        /// Publishes a dead-letter of `dependency` / `reason` into the dead-letter exchange.
        pub(crate) fn dead_letter(&self, dependency: &str, reason: DeadLetterReason) {
            let exchange = self.topology.dead_exchange.clone();
            let work = self.topology.work_exchange.clone();
            let queue = self.topology.work_queue.clone();
            self.rt.block_on(async move {
                let (conn, ch) = Self::channel().await;
                ch.confirm_select(ConfirmSelectOptions::default())
                    .await
                    .unwrap();
                let now = headers::now_ms();
                let record = DeadLetterRecord {
                    task: "index_document".to_owned(),
                    dependency: dependency.to_owned(),
                    reason,
                    original_exchange: work,
                    original_routing_key: "index_document".to_owned(),
                    original_queue: queue,
                    attempts: 3,
                    first_failure_ms: now - 5000,
                    dead_lettered_ms: now - 1000,
                    error_class: "http_503".to_owned(),
                    error: "over capacity".to_owned(),
                    budget: None,
                    budget_source: None,
                    replays: 0,
                };
                let mut table = FieldTable::default();
                headers::set_str(&mut table, headers::TASK, "index_document");
                record.write(&mut table);
                let props = headers::with_message_id(lapin::BasicProperties::default())
                    .with_headers(table)
                    .with_delivery_mode(2);
                ch.basic_publish(
                    ShortString::from(exchange.as_str()),
                    ShortString::from(""),
                    BasicPublishOptions::default(),
                    b"{}",
                    props,
                )
                .await
                .unwrap()
                .await
                .unwrap();
                let _ = conn.close(200, ShortString::from("done")).await;
            });
        }

        /// Messages ready in `queue`.
        pub(crate) fn depth(&self, queue: &str) -> u32 {
            let queue = queue.to_owned();
            self.rt.block_on(async move {
                let (conn, ch) = Self::channel().await;
                let q = ch
                    .queue_declare(
                        ShortString::from(queue.as_str()),
                        QueueDeclareOptions {
                            passive: true,
                            ..QueueDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .unwrap();
                let _ = conn.close(200, ShortString::from("done")).await;
                q.message_count()
            })
        }
    }

    impl Drop for TestBroker {
        fn drop(&mut self) {
            let topology = self.topology.clone();
            self.rt.block_on(async move {
                let Ok(conn) =
                    fleet_budget_amqp::connect(&url(), "budgetctl cli test cleanup").await
                else {
                    return;
                };
                let Ok(ch) = conn.create_channel().await else {
                    return;
                };
                for q in topology.queues() {
                    let _ = ch
                        .queue_delete(ShortString::from(q.as_str()), QueueDeleteOptions::default())
                        .await;
                }
                for e in topology.exchanges() {
                    let _ = ch
                        .exchange_delete(
                            ShortString::from(e.as_str()),
                            ExchangeDeleteOptions::default(),
                        )
                        .await;
                }
                let _ = conn.close(200, ShortString::from("done")).await;
            });
        }
    }
}

#[test]
fn migrate_dlq_stats_and_replay_against_rabbitmq() {
    let prefix = unique("amqp");
    let broker = broker::TestBroker::new(&prefix);
    let config = temp_file(
        &format!("{prefix}.toml"),
        &format!(
            "[amqp]\nprefix = \"{prefix}\"\nurl = \"{}\"\n",
            broker::url()
        ),
    );
    let cfg = config.to_str().unwrap();
    let redis_prefix = unique("replay");
    let base = ["--config", cfg, "--key-prefix", redis_prefix.as_str()];
    let with = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        run(&args)
    };

    let plan = json(&with(&["migrate", "--dry-run", "--json"]));
    assert_eq!(plan["dry_run"], true);
    assert!(plan["created"].as_u64().unwrap() >= 6, "{plan}");
    has_fields(&plan["steps"][0], &["version", "object", "state"]);
    let applied = json(&with(&["migrate", "--json"]));
    assert_eq!(applied["created"], plan["created"]);
    assert_eq!(
        json(&with(&["migrate", "--json"]))["created"],
        0,
        "migrate is idempotent"
    );
    let text = stdout(&with(&["migrate"]));
    assert!(
        text.contains("unchanged") && !text.contains("guest:guest"),
        "{text}"
    );

    broker.dead_letter("search", fleet_budget::DeadLetterReason::BudgetExhausted);
    broker.dead_letter("search", fleet_budget::DeadLetterReason::BudgetExhausted);
    broker.dead_letter("mail", fleet_budget::DeadLetterReason::AttemptsExhausted);

    let stats = json(&with(&["dlq", "stats", "--json"]));
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
    assert!(stdout(&with(&["dlq", "stats"])).contains("budget_exhausted"));
    // Reading for stats puts the messages back.
    assert_eq!(broker.depth(&broker.topology.dead_queue), 3);

    let dry = json(&with(&[
        "replay",
        "--dependency",
        "search",
        "--dry-run",
        "--json",
    ]));
    for f in ["matched", "moved", "parked", "skipped", "failed", "dry_run"] {
        assert!(dry.get(f).is_some(), "{f} missing: {dry}");
    }
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["matched"], 2, "{dry}");
    assert_eq!(dry["skipped"], 1, "{dry}");
    assert_eq!(
        broker.depth(&broker.topology.dead_queue),
        3,
        "a dry run moves nothing"
    );

    let none = json(&with(&[
        "replay",
        "--dependency",
        "search",
        "--reason",
        "non_retryable",
        "--dry-run",
        "--json",
    ]));
    assert_eq!(none["matched"], 0, "{none}");

    let limited = json(&with(&[
        "replay",
        "--dependency",
        "search",
        "--limit",
        "1",
        "--dry-run",
        "--json",
    ]));
    assert_eq!(limited["moved"], 1, "{limited}");
    assert_eq!(limited["skipped"], 2, "{limited}");
    let one = json(&with(&[
        "replay",
        "--dependency",
        "search",
        "--limit",
        "1",
        "--json",
    ]));
    assert_eq!(one["moved"], 1, "{one}");
    assert_eq!(one["skipped"], 2, "{one}");
    assert_eq!(broker.depth(&broker.topology.work_queue), 1);
    assert_eq!(broker.depth(&broker.topology.dead_queue), 2);

    let done = json(&with(&[
        "replay",
        "--dependency",
        "search",
        "--rate",
        "100",
        "--since",
        "1h",
        "--json",
    ]));
    assert_eq!(done["dry_run"], false);
    assert_eq!(done["moved"], 1, "{done}");
    assert_eq!(done["skipped"], 1, "{done}");
    assert_eq!(done["failed"], 0, "{done}");
    assert_eq!(broker.depth(&broker.topology.work_queue), 2);
    assert_eq!(broker.depth(&broker.topology.dead_queue), 1);
    assert_exit(
        &with(&["replay", "--dependency", "search", "--limit", "0"]),
        2,
        "--limit",
    );

    assert_exit(
        &with(&["replay", "--dependency", "search", "--since", "yesterday"]),
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
