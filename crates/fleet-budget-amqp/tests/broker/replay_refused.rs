//! Moves the broker refuses: a dead letter whose original exchange is one the broker will not
//! take a publish on (an internal exchange, or an `amq.` name that does not exist, which the
//! existence check takes on trust) closes the channel it was sent on. Every move in flight on
//! that channel then ends with an unknown outcome: those the broker had routed before the refusal
//! were put back into the dead-letter queue as well (a duplicate: the job runs now and again at
//! the next replay), and those sent after it were dropped by the broker and left behind (failed,
//! although nothing was wrong with them). The hostile dead letter must fail alone.

use std::collections::BTreeSet;

use fleet_budget::DeadLetterReason;
use fleet_budget_amqp::headers;
use fleet_budget_amqp::{ReplayOptions, Replayer};
use lapin::options::{ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions};
use lapin::types::{FieldTable, ShortString};

use crate::common::{Env, message_id};

/// Good dead letters before, between and after the hostile ones: more than fit the window of
/// confirms, so that moves are in flight when the broker refuses one.
const GOOD: [usize; 3] = [150, 150, 100];

/// Seeds `GOOD[0]` good dead letters, a hostile one naming `hostile_exchange`, `GOOD[1]` good
/// ones, another hostile one, `GOOD[2]` good ones; returns (good ids, hostile ids).
async fn seed(env: &Env, hostile_exchange: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let publisher = env.publisher().await;
    let good = env.dead_letter_record(
        "search",
        DeadLetterReason::BudgetExhausted,
        headers::now_ms(),
    );
    let hostile = fleet_budget_amqp::DeadLetterRecord {
        original_exchange: hostile_exchange.to_owned(),
        ..good.clone()
    };
    let (mut good_ids, mut hostile_ids) = (BTreeSet::new(), BTreeSet::new());
    for (i, n) in GOOD.into_iter().enumerate() {
        for j in 0..n {
            let body = format!("job {i}.{j}");
            good_ids.insert(
                env.publish_dead_letter(&publisher, &good, body.as_bytes())
                    .await,
            );
        }
        if i < 2 {
            hostile_ids.insert(
                env.publish_dead_letter(&publisher, &hostile, b"hostile")
                    .await,
            );
        }
    }
    publisher.close().await;
    (good_ids, hostile_ids)
}

/// One run, then a second: every good job is in the work queue exactly once, and only the
/// hostile dead letters are left in the dead-letter queue, once each, counted failed by both
/// runs.
async fn refused_moves_fail_alone(name: &str, hostile_exchange: &str) {
    let env = Env::new(name, "", "", "").await;
    let (good, hostile) = seed(&env, hostile_exchange).await;
    let replayer = Replayer::new(env.url.clone(), env.topology.clone(), None);
    let options = ReplayOptions::new(&env.config);
    // The run returns once the hostile ones it put back are ready; `ready_again` guards a run
    // that gave up waiting.
    let hostile_n = u32::try_from(hostile.len()).unwrap();
    let first = replayer.run(&options, |_| {}).await.unwrap();
    env.ready_again(&env.topology.dead_queue, hostile_n).await;
    let second = replayer.run(&options, |_| {}).await.unwrap();
    env.ready_again(&env.topology.dead_queue, hostile_n).await;
    let moved = env.drain(&env.topology.work_queue).await;
    let left = env.drain(&env.topology.dead_queue).await;
    let moved_ids: BTreeSet<String> = moved.iter().map(|(p, _)| message_id(p)).collect();
    let left_ids: BTreeSet<String> = left.iter().map(|(p, _)| message_id(p)).collect();
    let duplicated = moved_ids.intersection(&left_ids).count();
    let good_left = left_ids.intersection(&good).count();
    assert_eq!(
        (duplicated, good_left, moved.len(), left.len()),
        (0, 0, good.len(), hostile.len()),
        "good jobs both moved and left behind, good jobs left behind, jobs in the work queue, \
         messages in the dead-letter queue; first run {first:?}, second run {second:?}"
    );
    assert_eq!(moved_ids, good, "every good job moved once");
    assert_eq!(left_ids, hostile, "only the hostile ones left, once each");
    assert_eq!(
        (first.moved, first.failed),
        (good.len() as u64, hostile.len() as u64),
        "{first:?}"
    );
    assert_eq!((second.moved, second.failed), (0, 2), "{second:?}");
}

/// `amq.rabbitmq.trace` exists in every virtual host and is internal: a publish to it is
/// refused with `403 ACCESS_REFUSED`, which closes the channel.
#[tokio::test]
async fn a_move_to_an_internal_exchange_fails_alone() {
    refused_moves_fail_alone("refusedinternal", "amq.rabbitmq.trace").await;
}

/// A missing exchange under the reserved `amq.` prefix (the existence check does not ask about
/// those): the publish is refused with `404 NOT_FOUND`, which closes the channel.
#[tokio::test]
async fn a_move_to_a_missing_amq_exchange_fails_alone() {
    refused_moves_fail_alone("refusedamq", "amq.no-such-exchange").await;
}

/// Exchanges the run has not reached yet, in turn: 20 good ones (each bound to the work queue)
/// and the two hostile ones, 15 rounds. The first move to each goes on a channel of its own
/// while moves to the exchanges already reached go on, so the refusals come while other first
/// moves and pipelined ones are in flight: every good job is moved once, the hostile ones are
/// left, once each, and nothing else fails.
#[tokio::test]
async fn first_moves_to_many_exchanges_fail_alone_when_refused() {
    let env = Env::new("refusedmany", "", "", "").await;
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    let good_exchanges: Vec<String> = (0..20)
        .map(|i| format!("{}.x{i}", env.topology.work_exchange))
        .collect();
    for name in &good_exchanges {
        ch.exchange_declare(
            ShortString::from(name.as_str()),
            lapin::ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_bind(
            ShortString::from(env.topology.work_queue.as_str()),
            ShortString::from(name.as_str()),
            ShortString::from("t"),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
    let mut exchanges = good_exchanges.clone();
    exchanges.insert(7, "amq.rabbitmq.trace".into());
    exchanges.insert(15, "amq.no-such-exchange".into());
    let publisher = env.publisher().await;
    let template = env.dead_letter_record(
        "search",
        DeadLetterReason::BudgetExhausted,
        headers::now_ms(),
    );
    let (mut good, mut hostile) = (BTreeSet::new(), BTreeSet::new());
    for round in 0..15 {
        for exchange in &exchanges {
            let record = fleet_budget_amqp::DeadLetterRecord {
                original_exchange: exchange.clone(),
                original_routing_key: "t".into(),
                ..template.clone()
            };
            let id = env
                .publish_dead_letter(&publisher, &record, format!("job {round}").as_bytes())
                .await;
            if exchange.starts_with("amq.") {
                hostile.insert(id);
            } else {
                good.insert(id);
            }
        }
    }
    publisher.close().await;
    let replayer = Replayer::new(env.url.clone(), env.topology.clone(), None);
    let run = replayer
        .run(&ReplayOptions::new(&env.config), |_| {})
        .await
        .unwrap();
    let moved = env.drain(&env.topology.work_queue).await;
    let left = env.drain(&env.topology.dead_queue).await;
    for name in &good_exchanges {
        let _ = ch
            .exchange_delete(
                ShortString::from(name.as_str()),
                ExchangeDeleteOptions::default(),
            )
            .await;
    }
    let _ = conn.close(200, ShortString::from("bye")).await;
    let moved_ids: BTreeSet<String> = moved.iter().map(|(p, _)| message_id(p)).collect();
    let left_ids: BTreeSet<String> = left.iter().map(|(p, _)| message_id(p)).collect();
    assert_eq!(
        (moved.len(), left.len(), run.moved, run.failed),
        (
            good.len(),
            hostile.len(),
            good.len() as u64,
            hostile.len() as u64
        ),
        "jobs in the work queue, messages in the dead-letter queue, moved, failed: {run:?}"
    );
    assert_eq!(moved_ids, good, "every good job moved once");
    assert_eq!(left_ids, hostile, "only the hostile ones left, once each");
}
