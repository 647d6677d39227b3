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

mod common;

#[path = "game_day/one_worker.rs"]
mod one_worker;
#[allow(dead_code, reason = "the node's restart serves the game day")]
#[path = "game_day/rabbit_node.rs"]
mod rabbit_node;

use std::time::Duration;

use fleet_budget::Failure;
use fleet_budget_amqp::{Publisher, headers};
use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};

use self::one_worker::{Setting, on_a_private_node, wait_until};

#[test]
fn a_foreign_user_id_is_dropped_from_the_dead_letter_and_kept_in_a_header() {
    on_a_private_node(foreign_user_id);
}

async fn foreign_user_id() {
    let setting = Setting::start("userid", "").await;
    let Setting {
        node,
        broker,
        topology,
        ..
    } = &setting;
    node.ctl(&["add_user", "producer", "producer-pw"]).unwrap();
    node.ctl(&["set_permissions", "-p", "/", "producer", ".*", ".*", ".*"])
        .unwrap();

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

    let worker = setting
        .failing_worker(|| Failure::non_retryable("bad input"))
        .await;
    wait_until(Duration::from_secs(60), "a dead letter", || async {
        broker.depth(&topology.dead_queue).await > 0
    })
    .await;
    let (runs, counts) = worker.stop().await;
    assert_eq!(
        (
            runs,
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
