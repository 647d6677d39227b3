//! The crate's metrics against the real broker: a worker serving `/metrics` through
//! `[metrics] listen` (budget and AMQP metrics on one registry), and the exporter's queue
//! source reading depths and the oldest dead letter's age without taking it, on one broker
//! connection kept across readings (and replaced when it fails).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use fleet_budget::metrics::ExporterSource;
use fleet_budget::{DeadLetterReason, Failure};
use fleet_budget_amqp::headers;
use fleet_budget_amqp::testing::TestBroker;
use fleet_budget_amqp::{AmqpMetrics, QueueSource, Worker, WorkerOptions};
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{FieldTable, ShortString};
use prometheus::Registry;

use crate::common::{Env, close_the_connection_named, connections_named, wait_until};

const LONG: Duration = Duration::from_secs(60);

fn get_metrics(addr: std::net::SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_serve_one_metrics_endpoint_and_the_queue_source_reads_without_taking() {
    let env = Env::new(
        "metrics",
        "",
        "",
        "[dependencies.search]\ntasks = [\"t\"]\n[metrics]\nlisten = \"127.0.0.1:0\"\n",
    )
    .await;
    let budget = env.budget().await;
    let mut runners = Vec::new();
    for _ in 0..2 {
        let options = WorkerOptions::new(&env.config, &env.topology);
        assert!(options.metrics_listen.is_some(), "from [metrics] listen");
        let worker = Worker::new(budget.clone(), env.topology.clone(), options);
        let handle = worker.handle();
        let join =
            tokio::spawn(worker.run(|_job| async {
                Err(Failure::non_retryable("bad input").with_class("http_400"))
            }));
        runners.push((handle, join));
    }
    for i in 0..5 {
        env.publish_one(format!("{i}").as_bytes()).await;
    }
    wait_until(LONG, "5 dead-letters", || async {
        env.depth(&env.topology.dead_queue).await == 5
    })
    .await;

    // Both workers share the budget: one server, found again by its address.
    let addr = budget
        .metrics()
        .serve("127.0.0.1:0".parse().unwrap())
        .unwrap();
    let text = tokio::task::spawn_blocking(move || get_metrics(addr))
        .await
        .unwrap();
    for line in [
        "fleet_budget_first_attempts_total{dependency=\"search\"} 5",
        "fleet_budget_amqp_dead_letters_published_total{reason=\"non_retryable\"} 5",
        "fleet_budget_amqp_deliveries_in_flight 0",
        "fleet_budget_amqp_publish_confirm_duration_seconds_count{kind=\"dead_letter\"} 5",
        "fleet_budget_fallback_active{dependency=\"search\"} 0",
    ] {
        assert!(
            text.contains(&format!("{line}\n")),
            "{line} missing in\n{text}"
        );
    }
    let amqp = AmqpMetrics::of(&budget).unwrap();
    assert_eq!(
        amqp.dead_letters_published(DeadLetterReason::NonRetryable),
        5
    );
    for (handle, join) in runners {
        handle.shutdown();
        tokio::time::timeout(LONG, join)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    let registry = Registry::new();
    // A new look at every reading: the exporter's default looks at most once a minute.
    let source = QueueSource::register(env.url.clone(), env.topology.clone(), &registry)
        .unwrap()
        .scan_every(Duration::ZERO);
    for _ in 0..3 {
        source.read().await.unwrap();
    }
    let text = fleet_budget::metrics::encode(&registry.gather());
    let dead = &env.topology.dead_queue;
    assert!(
        text.contains(&format!(
            "fleet_budget_queue_messages{{queue=\"{dead}\",role=\"dead_letter\"}} 5\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "fleet_budget_queue_oldest_message_age_seconds{{queue=\"{dead}\",role=\"dead_letter\"}}"
        )),
        "{text}"
    );
    let parked = &env.topology.parked_queue;
    assert!(
        !text.contains(&format!(
            "fleet_budget_queue_oldest_message_age_seconds{{queue=\"{parked}\",role=\"parked\"}}"
        )),
        "an empty parked queue has no age: {text}"
    );
    assert_eq!(env.depth(dead).await, 5, "every look put the messages back");
    // Three looks and none brought a message closer to a delivery limit: each message read was
    // put back as a fresh copy; the one the look's last `basic.get` (its wait behind the acks)
    // takes goes back with a count of 1, never more, because the next look replaces it first.
    let left = env.drain(dead).await;
    assert_eq!(left.len(), 5);
    for (props, _) in &left {
        let count = fleet_budget_amqp::headers::get_u64(
            &fleet_budget_amqp::headers::table(props),
            "x-delivery-count",
        )
        .unwrap()
        .unwrap_or(0);
        assert!(count <= 1, "{props:?}");
    }
}

/// A source for `broker`'s topology whose connection is named after the test's unique prefix,
/// looking at the oldest message at every reading.
fn named_source(broker: &TestBroker, registry: &Registry) -> (QueueSource, String) {
    let name = format!("{} exporter", broker.settings.prefix);
    let source = QueueSource::register(broker.url.clone(), broker.topology.clone(), registry)
        .unwrap()
        .scan_every(Duration::ZERO)
        .connection_name(name.clone());
    (source, name)
}

async fn seed_three_dead_letters(broker: &TestBroker) {
    let publisher = broker.publisher().await;
    broker
        .seed_dead_letters(
            &publisher,
            3,
            "search",
            DeadLetterReason::BudgetExhausted,
            0,
            headers::now_ms().saturating_sub(5_000),
        )
        .await;
    publisher.close().await;
}

fn queue_series(registry: &Registry) -> String {
    fleet_budget::metrics::encode(&registry.gather())
}

/// Five readings one after the other, then four at once, each with a look at the oldest dead
/// letter: the broker shows one connection of the source after each, always the same one (before,
/// every reading opened a connection and closed it, and every look one more). The looks on the
/// kept connection still put every message back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readings_share_one_broker_connection() {
    let broker = TestBroker::new("exporterconn");
    broker.migrate().await;
    seed_three_dead_letters(&broker).await;
    let registry = Registry::new();
    let (source, name) = named_source(&broker, &registry);

    let mut seen = BTreeSet::new();
    for _ in 0..5 {
        source.read().await.unwrap();
        let pids = connections_named(&name).await;
        assert_eq!(pids.len(), 1, "one connection of the source: {pids:?}");
        seen.extend(pids);
    }
    let at_once = futures::future::join_all((0..4).map(|_| source.read())).await;
    assert!(at_once.iter().all(Result::is_ok), "{at_once:?}");
    seen.extend(connections_named(&name).await);
    assert_eq!(
        seen.len(),
        1,
        "the same connection for every reading: {seen:?}"
    );

    // Readings at once read depths while another's look holds messages: one more, alone.
    source.read().await.unwrap();
    assert_eq!(
        connections_named(&name).await,
        seen.iter().cloned().collect::<Vec<_>>()
    );
    let text = queue_series(&registry);
    let dead = &broker.topology.dead_queue;
    assert!(
        text.contains(&format!(
            "fleet_budget_queue_messages{{queue=\"{dead}\",role=\"dead_letter\"}} 3\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "fleet_budget_queue_oldest_message_age_seconds{{queue=\"{dead}\",role=\"dead_letter\"}}"
        )),
        "{text}"
    );
    assert_eq!(
        broker.depth(dead).await,
        3,
        "every look put the messages back"
    );
    drop(source);
    wait_until(LONG, "the source's connection closed with it", || async {
        connections_named(&name).await.is_empty()
    })
    .await;
}

/// The broker closes the kept connection (as at a restart, or an operator's
/// `rabbitmqctl close_connection`): the next reading succeeds, on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_by_the_broker_is_replaced_at_the_next_reading() {
    let broker = TestBroker::new("exporterclosed");
    broker.migrate().await;
    seed_three_dead_letters(&broker).await;
    let registry = Registry::new();
    let (source, name) = named_source(&broker, &registry);
    source.read().await.unwrap();
    let first = close_the_connection_named(&name, "exporter test: closed by the broker").await;

    source.read().await.unwrap();
    let dead = &broker.topology.dead_queue;
    assert!(
        queue_series(&registry).contains(&format!(
            "fleet_budget_queue_messages{{queue=\"{dead}\",role=\"dead_letter\"}} 3\n"
        )),
        "{}",
        queue_series(&registry)
    );
    wait_until(
        LONG,
        "the closed connection gone from the broker",
        || async { !connections_named(&name).await.contains(&first) },
    )
    .await;
    let now = connections_named(&name).await;
    assert_eq!(now.len(), 1, "one new connection: {now:?}");
    source.read().await.unwrap();
    assert_eq!(connections_named(&name).await, now, "and it is kept");
    assert_eq!(broker.depth(dead).await, 3);
}

/// A queue that is missing (deleted under the exporter) makes the broker close the kept
/// connection's channel at the passive declare: that reading fails and clears the queue series
/// (the exporter shows `up 0`, as for a broker it cannot reach); once the queue is back, the next
/// reading succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_queue_fails_its_reading_and_not_the_next() {
    let broker = TestBroker::new("exportermissing");
    broker.migrate().await;
    let registry = Registry::new();
    let (source, _name) = named_source(&broker, &registry);
    source.read().await.unwrap();
    let parked = broker.topology.parked_queue.clone();
    let conn = broker.connection().await;
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete(
        ShortString::from(parked.as_str()),
        QueueDeleteOptions::default(),
    )
    .await
    .unwrap();

    for _ in 0..2 {
        let why = source.read().await.unwrap_err();
        assert!(why.contains(&parked), "{why}");
        assert!(
            !queue_series(&registry).contains("fleet_budget_queue_messages{"),
            "a failed reading shows no depth: {}",
            queue_series(&registry)
        );
    }

    ch.queue_declare(
        ShortString::from(parked.as_str()),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    let _ = conn.close(200, ShortString::from("bye")).await;
    for _ in 0..2 {
        source.read().await.unwrap();
        assert!(
            queue_series(&registry).contains(&format!(
                "fleet_budget_queue_messages{{queue=\"{parked}\",role=\"parked\"}} 0\n"
            )),
            "{}",
            queue_series(&registry)
        );
    }
}

/// With the dead-letter index, the exporter reads no message: the breakdown by dependency ×
/// reason × error class, the difference to the depth and the oldest age come from the index,
/// and hostile error classes past the bound of groups are summed under `(other)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_index_the_exporter_shows_every_group_and_reads_no_message() {
    let env = crate::common::Env::new(
        "exporterindex",
        "",
        "",
        "[dependencies.search]\ntasks = [\"index\"]\n",
    )
    .await;
    // Dead-lettered by a worker, counted as it goes: nothing ever reads the queue.
    let publisher = env.publisher().await;
    for i in 0..60 {
        let copies = if i == 0 { 5 } else { 1 };
        for _ in 0..copies {
            publisher
                .publish_job(
                    &env.topology.work_exchange,
                    "index",
                    "index",
                    format!("class-{i:02}").as_bytes(),
                )
                .await
                .unwrap();
        }
    }
    publisher.close().await;
    let runner = crate::worker::start_worker(env.budget().await, &env, |job| async move {
        let class = String::from_utf8_lossy(&job.payload).into_owned();
        Err(Failure::non_retryable("it failed").with_class(class))
    });
    let handle = runner.0.clone();
    wait_until(Duration::from_secs(60), "64 dead letters", || {
        let counts = handle.counts();
        async move { counts.dead_lettered == 64 }
    })
    .await;
    crate::worker::stop_worker(runner).await;
    let index = fleet_budget::control::DeadLetterIndex::new(std::sync::Arc::new(
        fleet_budget::store::RedisStore::new(
            fleet_budget::store::RedisTarget::Single(env.redis.url()),
            &env.config.budget.redis.key_prefix,
            Duration::from_secs(5),
        )
        .unwrap(),
    ));
    let registry = Registry::new();
    let source = QueueSource::register(env.url.clone(), env.topology.clone(), &registry)
        .unwrap()
        .with_index(Some(index));
    source.read().await.unwrap();
    let text = fleet_budget::metrics::encode(&registry.gather());
    let dead = &env.topology.dead_queue;
    let series = |class: &str| {
        format!(
            "fleet_budget_dead_letters{{dependency=\"search\",error_class=\"{class}\",queue=\"{dead}\",reason=\"non_retryable\",role=\"dead_letter\"}}"
        )
    };
    assert!(
        text.contains(&format!("{} 5\n", series("class-00"))),
        "{text}"
    );
    let shown = text
        .lines()
        .filter(|l| l.starts_with("fleet_budget_dead_letters{") && l.contains(dead.as_str()))
        .count();
    assert_eq!(
        shown,
        QueueSource::MAX_GROUPS + 1,
        "50 groups and (other): {text}"
    );
    assert!(
        text.contains(&format!(
            "fleet_budget_dead_letters{{dependency=\"(other)\",error_class=\"(other)\",queue=\"{dead}\",reason=\"(other)\",role=\"dead_letter\"}} 10\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "fleet_budget_dead_letter_index_difference{{queue=\"{dead}\",role=\"dead_letter\"}} 0\n"
        )),
        "{text}"
    );
    let age = text
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "fleet_budget_queue_oldest_message_age_seconds{{queue=\"{dead}\""
            ))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("an oldest age: {text}"));
    // By the minute it was dead-lettered in: never younger than the message, at most a
    // minute older.
    assert!((0.0..120.0).contains(&age), "{age}");
    // No look: every message is where it was, never read.
    let left = env.drain(dead).await;
    assert_eq!(left.len(), 64);
    for (props, _) in &left {
        let count = headers::get_u64(&headers::table(props), "x-delivery-count")
            .unwrap()
            .unwrap_or(0);
        assert_eq!(count, 0, "{props:?}");
    }
}
