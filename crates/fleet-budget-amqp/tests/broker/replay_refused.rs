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
    // The hostile ones put back by a run come back after its close (see `ready_again`).
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
