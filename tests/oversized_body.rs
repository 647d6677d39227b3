//! Issue 9, item 3: a job whose body the broker refuses on every copy. A private RabbitMQ node
//! holds a 64 KiB job; its maximum message size is then lowered to 16 KiB (as an operator might),
//! so no copy of the job (retry, dead letter, parked) can ever be published. The contract
//! (`docs/semantics.md`, "Copies that can never be published"): the job must not loop and must
//! not be acked silently; from the work queue it is rejected without requeue, and the broker
//! dead-letters it intact through the work queue's dead-letter exchange. Replay cannot park it
//! either: it counts it failed and leaves it in the dead-letter queue, and moves the dead letters
//! behind it exactly once.
//!
//! The shared broker's maximum is node-wide and is never changed: the node is the game day's
//! private one (`tests/game_day/rabbit_node.rs`).

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

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use fleet_budget::Failure;
use fleet_budget_amqp::{ReplayOptions, Replayer, headers};

use self::one_worker::{Setting, on_a_private_node, wait_until};

/// The job's body, and the maximum message size the node is lowered to.
const BODY: usize = 64 * 1024;
const MAX_MESSAGE_SIZE: usize = 16 * 1024;
/// Dead letters queued behind the refused one.
const SMALL: usize = 300;

#[test]
fn a_body_the_broker_refuses_on_every_copy_is_dead_lettered_by_the_broker_once() {
    on_a_private_node(refused_body);
}

#[allow(clippy::too_many_lines)]
async fn refused_body() {
    let setting = Setting::start(
        "oversize",
        "[defaults]\nbackoff_base_ms = 100\nbackoff_cap_ms = 400\nmin_allowance = 10\n",
    )
    .await;
    let Setting {
        node,
        config,
        broker,
        topology,
        ..
    } = &setting;
    let big = vec![b'x'; BODY];
    let publisher = broker.publisher().await;
    let id = publisher
        .publish_job(&topology.work_exchange, "t", "t", &big)
        .await
        .unwrap();
    publisher.close().await;

    // The node's maximum is lowered below the job it holds: new channels refuse its body.
    node.eval(&format!(
        "application:set_env(rabbit, max_message_size, {MAX_MESSAGE_SIZE})."
    ))
    .unwrap();
    let refused = broker.publisher().await;
    let again = refused
        .publish_job(&topology.work_exchange, "t", "t", &big)
        .await;
    assert!(
        again
            .as_ref()
            .is_err_and(fleet_budget_amqp::PublishError::is_permanent),
        "the lowered maximum is in force: {again:?}"
    );
    refused.close().await;

    // The handler fails retryably: the retry copy, then the parked copy, are refused.
    let worker = setting
        .failing_worker(|| Failure::retryable("upstream 503"))
        .await;
    wait_until(
        Duration::from_secs(60),
        "the broker dead-letters the job",
        || async { broker.depth(&topology.dead_queue).await == 1 },
    )
    .await;
    let (runs, counts) = worker.stop().await;
    assert_eq!(
        (runs, counts.deliveries, counts.broker_dead_lettered),
        (1, 1, 1),
        "ran once, delivered once, no loop: {counts:?}"
    );
    assert_eq!(
        (
            counts.retried,
            counts.dead_lettered,
            counts.parked,
            counts.requeued,
            counts.succeeded
        ),
        (0, 0, 0, 0, 0),
        "no copy was confirmed, so nothing was acked: {counts:?}"
    );
    assert_eq!(broker.depth(&topology.work_queue).await, 0);
    assert_eq!(broker.depth(&topology.parked_queue).await, 0);

    // Replay cannot park it (its park copy is refused too): counted failed, held and returned
    // at the end of each run. The dead letters behind it are moved, each acked on its own (a
    // multiple ack would cover the held one), and none is moved twice.
    let publisher = broker.publisher().await;
    let behind = broker
        .seed_dead_letters(
            &publisher,
            SMALL,
            "t",
            fleet_budget::DeadLetterReason::BudgetExhausted,
            0,
            headers::now_ms(),
        )
        .await;
    publisher.close().await;
    // The refusal closes the channel of the parks and put-backs, never the one of the moves:
    // every dead letter behind is moved once, by the first run; the second finds only the
    // refused one. (With one channel for all copies, the moves in flight beside the refused park
    // ended unknown, were put back and moved again: 70 to 142 duplicates over the runs, and a
    // few blocked behind it on every run.)
    let behind: BTreeSet<String> = behind.into_iter().collect();
    for (run, moved) in [(0, SMALL as u64), (1, 0)] {
        let report = Replayer::new(node.url(), topology.clone(), None)
            .run(&ReplayOptions::new(config), |_| {})
            .await
            .unwrap();
        assert_eq!(
            (report.malformed, report.failed, report.parked, report.moved),
            (1, 1, 0, moved),
            "replay {run}: {report:?}"
        );
    }
    let mut moved: BTreeMap<String, u32> = BTreeMap::new();
    for (props, _) in broker.drain(&topology.work_queue).await {
        *moved
            .entry(headers::message_id(&props).unwrap().to_owned())
            .or_default() += 1;
    }
    let ids: BTreeSet<String> = moved.keys().cloned().collect();
    assert_eq!(
        ids, behind,
        "every dead letter behind is moved, nothing lost"
    );
    assert!(moved.values().all(|n| *n == 1), "none moved twice");
    let left = broker.drain(&topology.dead_queue).await;
    assert_eq!(
        left.len(),
        1,
        "the refused job is in the dead-letter queue once"
    );
    let (props, body) = &left[0];
    assert_eq!(headers::message_id(props).unwrap(), id);
    assert_eq!(body.len(), BODY, "the body is intact");
    let table = headers::table(props);
    assert_eq!(
        headers::get_str(&table, headers::BROKER_FIRST_DEATH_REASON)
            .unwrap()
            .as_deref(),
        Some("rejected"),
        "dead-lettered by the broker: {props:?}"
    );
    assert_eq!(
        headers::get_str(&table, headers::REASON).unwrap(),
        None,
        "no fb- record"
    );
    assert_eq!(broker.depth(&topology.parked_queue).await, 0);
}
