//! Looking is not consuming: dry runs, `dlq stats` and the messages a replay skips leave every
//! dead-letter as fresh as it was, on a queue with RabbitMQ 4.x's default delivery limit too.

use std::time::Duration;

use fleet_budget::DeadLetterReason;
use fleet_budget_amqp::headers;
use fleet_budget_amqp::{
    InspectOptions, ReplayFilter, ReplayOptions, Replayer, inspect_queue, queue_depth,
};
use lapin::BasicProperties;
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};

use crate::common::{Env, ids};

fn delivery_count(props: &BasicProperties) -> u64 {
    headers::get_u64(&headers::table(props), "x-delivery-count")
        .unwrap()
        .unwrap_or(0)
}

/// 100 dry runs and skipping replays later, every dead-letter is still there, with a delivery
/// count of 0 (a nack with requeue made it 100: on RabbitMQ 4.x, deleted at 21).
#[tokio::test]
async fn a_hundred_looks_leave_dead_letters_untouched() {
    let env = Env::new("look100", "", "", "").await;
    let publisher = env.publisher().await;
    let seeded = env
        .seed_dead_letters(
            &publisher,
            5,
            "search",
            DeadLetterReason::BudgetExhausted,
            0,
            headers::now_ms(),
        )
        .await;
    publisher.close().await;
    let replayer = Replayer::new(env.url.clone(), env.topology.clone(), None);
    let mut options = ReplayOptions::new(&env.config);
    options.idle_timeout = Duration::from_secs(5);
    for _ in 0..95 {
        // What the last look read comes back after its close, on the broker's own time (CI2 of
        // session 13, under the concurrent lanes, read a depth of 0 right after one).
        env.ready_again(&env.topology.dead_queue, 5).await;
        let dry = replayer.dry_run_by_reading(&options).await.unwrap();
        assert_eq!((dry.total, dry.seen, dry.would_move), (5, 5, 5), "{dry:?}");
    }
    // A replay whose filter matches nothing skips (and puts back) every message.
    let mut elsewhere = options.clone();
    elsewhere.filter = ReplayFilter {
        dependency: Some("billing".into()),
        ..ReplayFilter::default()
    };
    for _ in 0..5 {
        // The copies the last run put back come back after its close (see `ready_again`).
        env.ready_again(&env.topology.dead_queue, 5).await;
        let run = replayer.run(&elsewhere, |_| {}).await.unwrap();
        assert_eq!((run.skipped, run.moved, run.failed), (5, 0, 0), "{run:?}");
    }
    env.ready_again(&env.topology.dead_queue, 5).await;
    let left = env.drain(&env.topology.dead_queue).await;
    assert_eq!(left.len(), 5, "nothing lost, nothing duplicated");
    assert_eq!(ids(&left), seeded.into_iter().collect());
    // A replay's consumer may have the copy of a skipped message pushed past its bound and
    // returned at its close (counted once); the next look replaces it with a fresh copy, so no
    // count grows from look to look.
    for (props, _) in &left {
        assert!(delivery_count(props) <= 1, "{props:?}");
    }
}

/// A quorum queue with `x-delivery-limit = 20` (RabbitMQ 4.x's default) and nowhere to
/// dead-letter to: 100 inspections delete nothing. A limited inspection reads only its limit.
#[tokio::test]
async fn a_queue_with_the_4x_default_limit_survives_100_inspections() {
    let env = Env::new("look4x", "", "", "").await;
    let queue = format!("{}.limited", env.topology.dead_queue);
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(20));
    ch.queue_declare(
        ShortString::from(queue.as_str()),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        args,
    )
    .await
    .unwrap();
    let publisher = env.publisher().await;
    let mut sent = std::collections::BTreeSet::new();
    for i in 0..3 {
        let id = format!("limited-{i}");
        let props = BasicProperties::default()
            .with_message_id(ShortString::from(id.as_str()))
            .with_delivery_mode(2);
        publisher.publish("", &queue, b"x", props).await.unwrap();
        sent.insert(id);
    }
    publisher.close().await;
    let look = InspectOptions::default();
    for _ in 0..100 {
        let mut seen = 0;
        let i = inspect_queue(&env.url, &queue, &look, |_| seen += 1)
            .await
            .unwrap();
        assert_eq!((i.total, i.seen, i.put_back, seen), (3, 3, 3, 3), "{i:?}");
    }
    let limited = InspectOptions {
        limit: Some(2),
        ..InspectOptions::default()
    };
    let i = inspect_queue(&env.url, &queue, &limited, |_| {})
        .await
        .unwrap();
    assert_eq!((i.total, i.seen, i.put_back), (3, 2, 2), "{i:?}");
    let left = env.drain(&queue).await;
    assert_eq!(left.len(), 3, "nothing lost, nothing duplicated");
    let _ = ch
        .queue_delete(
            ShortString::from(queue.as_str()),
            QueueDeleteOptions::default(),
        )
        .await;
    let _ = conn.close(200, ShortString::from("bye")).await;
    assert_eq!(ids(&left), sent);
    // The message a look takes behind its acks (and returns) carries 1, never more.
    for (props, _) in &left {
        assert!(delivery_count(props) <= 1, "{props:?}");
    }
}

/// 1,000 dead letters, three looks in a row: every dead letter is there once, fresh (no
/// duplicate, nothing lost). Before the look waited for its acks to be applied by the quorum
/// queue, the channel's close overtook them even on an idle broker: the second look left 223
/// duplicates of the messages it read last (a burst of acks is what a look of a large queue
/// sends at its end; under CPU load 40 messages were enough).
#[tokio::test]
async fn three_looks_at_a_thousand_dead_letters_leave_no_duplicate() {
    let env = Env::new("lookdup", "", "", "").await;
    let publisher = env.publisher().await;
    let seeded = env
        .seed_dead_letters(
            &publisher,
            1000,
            "search",
            DeadLetterReason::BudgetExhausted,
            0,
            headers::now_ms(),
        )
        .await;
    publisher.close().await;
    let queue = &env.topology.dead_queue;
    for look in 0..3 {
        let i = inspect_queue(&env.url, queue, &InspectOptions::default(), |_| {})
            .await
            .unwrap();
        assert_eq!(
            (i.total, i.seen, i.put_back, i.requeued, i.uncertain),
            (1000, 1000, 1000, 0, 0),
            "look {look}: {i:?}"
        );
        assert_eq!(env.depth(queue).await, 1000, "look {look}: no duplicate");
    }
    // A look that stops early leaves no duplicate either.
    let limited = InspectOptions {
        limit: Some(10),
        ..InspectOptions::default()
    };
    let i = inspect_queue(&env.url, queue, &limited, |_| {})
        .await
        .unwrap();
    assert_eq!((i.seen, i.put_back, i.uncertain), (10, 10, 0), "{i:?}");
    let left = env.drain(queue).await;
    assert_eq!(left.len(), 1000, "nothing lost, nothing duplicated");
    assert_eq!(ids(&left), seeded.into_iter().collect());
    for (props, _) in &left {
        assert!(delivery_count(props) <= 1, "{props:?}");
    }
}

/// When a look returns, the queue holds what it held: a depth read at once, on a channel already
/// open, counts every message, after a full look and after one stopped by its limit. The message
/// a look takes behind its acks is returned by a nack the broker does not answer; before the
/// look waited until it was ready again, the depth read right after a look came out one short
/// (999 of 1,000 in a loaded run of the test above).
#[tokio::test]
async fn a_look_returns_once_every_message_is_back() {
    let env = Env::new("lookback", "", "", "").await;
    let publisher = env.publisher().await;
    let seeded = env
        .seed_dead_letters(
            &publisher,
            5,
            "search",
            DeadLetterReason::BudgetExhausted,
            0,
            headers::now_ms(),
        )
        .await;
    publisher.close().await;
    let queue = &env.topology.dead_queue;
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    let limited = InspectOptions {
        limit: Some(2),
        ..InspectOptions::default()
    };
    for look in 0..40 {
        let options = if look % 2 == 0 {
            InspectOptions::default()
        } else {
            limited.clone()
        };
        let i = inspect_queue(&env.url, queue, &options, |_| {})
            .await
            .unwrap();
        assert_eq!((i.total, i.uncertain), (5, 0), "look {look}: {i:?}");
        assert_eq!(
            queue_depth(&ch, queue).await.unwrap(),
            5,
            "look {look}: every message back when the look returns"
        );
    }
    let _ = conn.close(200, ShortString::from("bye")).await;
    let left = env.drain(queue).await;
    assert_eq!(left.len(), 5, "nothing lost, nothing duplicated");
    assert_eq!(ids(&left), seeded.into_iter().collect());
    for (props, _) in &left {
        assert!(delivery_count(props) <= 1, "{props:?}");
    }
}
