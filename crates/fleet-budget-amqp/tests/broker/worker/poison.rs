//! A message whose headers no client can parse (nested past 100 levels, see [`super::nested`])
//! used to close every connection that read it, while the broker kept it at the head of its
//! queue: a worker reconnected onto it for ever, and the tools failed on it. Through the frame
//! guard it is an ordinary bad job:
//!
//! * the worker dead-letters it (`malformed_header`, the removed entry named in the error) on the
//!   connection it has, and runs the job behind it; no connection is lost;
//! * `dlq peek` and `replay --dry-run` read it at once, and `replay` parks it with why.
//!
//! The worker's backoff for connections that die young stays (other causes: a broker that
//! closes them); see docs/RELIABILITY.md, "Poison messages".

use fleet_budget_amqp::metrics::LossCause;
use fleet_budget_amqp::replay::peek_queue;
use fleet_budget_amqp::{AmqpMetrics, ReplayFilter, ReplayOptions, Replayer};

use super::nested::{long, nested_table, publish_raw};
use super::{LONG, start, stop};
use crate::common::{Env, header_str, wait_until};

/// A worker on a queue whose head was unreadable (200 and 18,000 levels, a classic-queue-like
/// delivery limit it never reaches) dead-letters both with why and runs the job behind them, on
/// one connection, with no short-lived connection counted.
#[tokio::test]
async fn a_worker_dead_letters_a_job_whose_headers_it_cannot_parse_and_goes_on() {
    let env = Env::with_amqp("poison_worker", "delivery_limit = 1000000", "", "", "").await;
    let work = env.topology.work_queue.clone();
    publish_raw(&env.url, &work, "nested-200", &nested_table(200)).await;
    publish_raw(&env.url, &work, "nested-18000", &nested_table(18_000)).await;
    let behind = env.publish_one(b"behind").await;
    let budget = env.budget().await;
    let metrics = AmqpMetrics::of(&budget).expect("the metrics");
    let runner = start(budget, &env, |_job| async { Ok(()) });
    let handle = runner.0.clone();
    wait_until(LONG, "the worker handles all three", || {
        let counts = handle.counts();
        async move { counts.succeeded == 1 && counts.dead_lettered == 2 }
    })
    .await;
    let counts = stop(runner).await;
    assert_eq!(
        (
            counts.connections,
            counts.short_lived_connections,
            counts.deliveries
        ),
        (1, 0, 3),
        "{behind} ran behind them: {counts:?}"
    );
    assert_eq!(
        metrics.connections_lost(false, LossCause::UnreadableMessage)
            + metrics.connections_lost(true, LossCause::UnreadableMessage),
        0
    );
    assert_eq!(env.depth(&work).await, 0, "nothing left in the work queue");
    env.ready_again(&env.topology.dead_queue, 2).await;
    let dead = env.drain(&env.topology.dead_queue).await;
    for (id, depth) in [("nested-200", 200), ("nested-18000", 18_000)] {
        let (props, body) = dead
            .iter()
            .find(|(p, _)| p.message_id().as_ref().map(|i| i.as_str()) == Some(id))
            .unwrap_or_else(|| panic!("{id} was dead-lettered"));
        assert_eq!(
            header_str(props, "fb-error-class").as_deref(),
            Some("malformed_header")
        );
        let error = header_str(props, "fb-error").unwrap_or_default();
        assert!(
            error.contains(&format!("\"a\" nested {} levels deep", depth + 1)),
            "{id}: {error}"
        );
        assert_eq!(body.as_slice(), b"job", "{id}: the body is kept");
    }
}

/// `dlq peek` and `replay --dry-run` read the unreadable dead letter at once, naming what was
/// removed; `replay` parks it (it is no longer what its producer sent) and moves the one behind.
#[tokio::test]
async fn the_tools_read_an_unreadable_dead_letter_and_replay_parks_it() {
    let env = Env::with_amqp("poison_tools", "operation_timeout_ms = 20000", "", "", "").await;
    let dead = env.topology.dead_queue.clone();
    publish_raw(&env.url, &dead, "unreadable", &nested_table(18_000)).await;
    publish_raw(&env.url, &dead, "behind", &long(&[])).await;
    let peek = tokio::time::timeout(
        LONG,
        peek_queue(&env.url, &dead, &ReplayFilter::default(), 10),
    )
    .await
    .expect("the peek ends")
    .expect("the peek reads both");
    assert_eq!((peek.total, peek.seen), (2, 2), "{peek:?}");
    let replayer = Replayer::new(env.url.clone(), env.topology.clone(), None);
    let options = ReplayOptions::new(&env.config);
    let dry = tokio::time::timeout(LONG, replayer.dry_run_by_reading(&options))
        .await
        .expect("the dry run ends")
        .expect("the dry run reads both");
    assert_eq!((dry.total, dry.seen), (2, 2), "{dry:?}");
    let run = tokio::time::timeout(LONG, replayer.run(&options, |_| {}))
        .await
        .expect("the replay ends")
        .expect("the replay runs");
    assert_eq!((run.moved, run.failed), (0, 0), "{run:?}");
    env.ready_again(&env.topology.parked_queue, 2).await;
    let parked = env.drain(&env.topology.parked_queue).await;
    let (unreadable, _) = parked
        .iter()
        .find(|(p, _)| p.message_id().as_ref().map(|i| i.as_str()) == Some("unreadable"))
        .expect("parked");
    let reason = header_str(unreadable, "fb-park-reason").unwrap_or_default();
    assert!(reason.contains("malformed dead-letter"), "{reason}");
}
