//! A job published by another user than the worker's, with `user_id` set (RabbitMQ checks it
//! against the publishing connection's user, so only that user can send it). Any copy the
//! worker (user `guest`) makes must not carry that `user_id`, or the broker refuses it
//! (`PRECONDITION_FAILED`): the copies drop it and keep it in `fb-original-user-id`
//! (`docs/semantics.md`, "Copies that can never be published"). The second user exists only on
//! the game day's private node (`tests/game_day/rabbit_node.rs`); the shared broker's users are
//! never changed.

#![allow(
    clippy::expect_used,
    clippy::panic,
    clippy::unwrap_used,
    clippy::indexing_slicing,
    missing_docs
)]

#[allow(dead_code)]
#[path = "game_day/rabbit_node.rs"]
mod rabbit_node;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_budget::testing::RedisServer;
use fleet_budget::{Failure, FleetBudget};
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use fleet_budget_amqp::{Publisher, Worker, WorkerConfig, WorkerOptions, headers};
use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};

use self::rabbit_node::RabbitNode;

#[test]
fn a_foreign_user_id_is_dropped_from_the_dead_letter_and_kept_in_a_header() {
    if !Path::new("/usr/lib/rabbitmq/bin/rabbitmq-server").exists() {
        eprintln!("skipped: RabbitMQ's server scripts are not installed, no private node");
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(foreign_user_id());
}

async fn foreign_user_id() {
    let node = RabbitNode::start().await.expect("a private RabbitMQ node");
    node.ctl(&["add_user", "producer", "producer-pw"]).unwrap();
    node.ctl(&["set_permissions", "-p", "/", "producer", ".*", ".*", ".*"])
        .unwrap();
    let redis = RedisServer::start();
    let toml = format!(
        "[redis]\nurl = \"{}\"\ntimeout_ms = 2000\ndeposit_flush_ms = 0\n\
         [amqp]\nurl = \"{}\"\nprefix = \"{}\"\nprefetch = 4\nretry_tiers_secs = [0.2, 0.5]\n",
        redis.url(),
        node.url(),
        unique_prefix("userid")
    );
    let config = WorkerConfig::from_toml(&toml, "test").unwrap();
    let broker = TestBroker::with_settings(config.amqp.clone());
    broker.migrate().await;
    let topology = broker.topology.clone();

    let producer = Publisher::connect(&format!(
        "amqp://producer:producer-pw@127.0.0.1:{}/%2f",
        node.port
    ))
    .await
    .unwrap();
    let mut t = FieldTable::default();
    headers::set_str(&mut t, headers::TASK, "t");
    let props = BasicProperties::default()
        .with_message_id(ShortString::from("from-producer"))
        .with_user_id(ShortString::from("producer"))
        .with_delivery_mode(2)
        .with_headers(t);
    producer
        .publish(&topology.work_exchange, "t", b"job", props)
        .await
        .expect("the producer's own user_id is accepted");
    producer.close().await;

    let runs = Arc::new(AtomicU64::new(0));
    let budget = FleetBudget::from_config(&config.budget).await.unwrap();
    let worker = Worker::new(
        budget,
        topology.clone(),
        WorkerOptions::new(&config, &topology),
    );
    let handle = worker.handle();
    let join = {
        let runs = Arc::clone(&runs);
        tokio::spawn(async move {
            worker
                .run(move |_job| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async { Err(Failure::non_retryable("bad input")) }
                })
                .await
                .unwrap()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while broker.depth(&topology.dead_queue).await == 0 {
        assert!(Instant::now() < deadline, "no dead letter within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    handle.shutdown();
    let counts = tokio::time::timeout(Duration::from_secs(60), join)
        .await
        .expect("the worker stops")
        .unwrap();
    assert_eq!(
        (
            runs.load(Ordering::SeqCst),
            counts.dead_lettered,
            counts.parked,
            counts.broker_dead_lettered,
            counts.requeued
        ),
        (1, 1, 0, 0, 0),
        "dead-lettered by the worker, once: {counts:?}"
    );
    let dead = broker.drain(&topology.dead_queue).await;
    assert_eq!(dead.len(), 1);
    let (props, body) = &dead[0];
    assert_eq!(body, b"job");
    assert_eq!(props.user_id(), &None, "the copy carries no user_id");
    let table = headers::table(props);
    assert_eq!(
        headers::get_str(&table, headers::ORIGINAL_USER_ID)
            .unwrap()
            .as_deref(),
        Some("producer")
    );
    assert_eq!(
        headers::get_str(&table, headers::REASON)
            .unwrap()
            .as_deref(),
        Some("non_retryable"),
        "the worker's dead-letter record"
    );
}
