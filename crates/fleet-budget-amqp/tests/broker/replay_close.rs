//! The end of a replay run: every original whose copy was confirmed is acked, and the acks are
//! applied by the quorum dead-letter queue before the run closes its channel. Otherwise the
//! close returns the last originals beside their copies and the next run replays them twice.
//! And what the run leaves in the queue (copies put back) is counted there when it returns.

use std::collections::BTreeSet;

use fleet_budget::DeadLetterReason;
use fleet_budget_amqp::headers;
use fleet_budget_amqp::{ReplayOptions, Replayer, queue_depth};

use crate::common::{Env, message_id};

/// Dead letters per run: more than a window of confirms, so the run ends on a burst of acks.
const PER_RUN: usize = 400;

/// Four runs of 400 dead letters each, every run followed by a second run: the dead-letter
/// queue is empty the moment a run returns, the second run finds nothing, and the work queue
/// holds every job exactly once. Before the run waited behind its acks, the quorum queue
/// returned part of the last window at the close (a second run replayed them again).
#[tokio::test]
async fn runs_leave_no_original_beside_its_copy() {
    let env = Env::new("replayclose", "", "", "").await;
    let replayer = Replayer::new(env.url.clone(), env.topology.clone(), None);
    let options = ReplayOptions::new(&env.config);
    let publisher = env.publisher().await;
    let mut seeded = BTreeSet::new();
    let mut left_behind = Vec::new();
    for round in 0..4 {
        seeded.extend(
            env.seed_dead_letters(
                &publisher,
                PER_RUN,
                "search",
                DeadLetterReason::BudgetExhausted,
                0,
                headers::now_ms(),
            )
            .await,
        );
        let run = replayer.run(&options, |_| {}).await.unwrap();
        assert_eq!(
            (run.total, run.seen, run.moved, run.failed),
            (PER_RUN as u64, PER_RUN as u64, PER_RUN as u64, 0),
            "round {round}: {run:?}"
        );
        left_behind.push(env.depth(&env.topology.dead_queue).await);
        let again = replayer.run(&options, |_| {}).await.unwrap();
        assert_eq!(again.moved, 0, "round {round}: replayed twice: {again:?}");
    }
    publisher.close().await;
    assert_eq!(
        left_behind,
        vec![0; 4],
        "originals left in the dead-letter queue after each run"
    );
    let moved = env.drain(&env.topology.work_queue).await;
    let ids: BTreeSet<String> = moved.iter().map(|(p, _)| message_id(p)).collect();
    assert_eq!(moved.len(), seeded.len(), "every job once, no duplicate");
    assert_eq!(ids, seeded);
    assert_eq!(env.depth(&env.topology.dead_queue).await, 0);
}

/// Dead letters whose original exchange is gone cannot be moved: each run counts them failed
/// and leaves them, put back as copies. Twenty-five runs later they are all there, once, with a
/// delivery count of at most 1. Before, each run returned them with a nack (requeue), one more
/// delivery each time: 25 after 25 runs, past RabbitMQ 4.x's default limit of 20, at which a
/// quorum queue with nowhere to dead-letter to deletes them.
#[tokio::test]
async fn failed_moves_do_not_raise_the_delivery_count() {
    let env = Env::new("replaygone", "", "", "").await;
    let mut record = env.dead_letter_record(
        "search",
        DeadLetterReason::BudgetExhausted,
        headers::now_ms(),
    );
    record.original_exchange = format!("{}.gone", env.topology.work_exchange);
    let publisher = env.publisher().await;
    let mut seeded = BTreeSet::new();
    for i in 0..3 {
        seeded.insert(
            env.publish_dead_letter(&publisher, &record, format!("job {i}").as_bytes())
                .await,
        );
    }
    publisher.close().await;
    let replayer = Replayer::new(env.url.clone(), env.topology.clone(), None);
    let options = ReplayOptions::new(&env.config);
    for run in 0..25 {
        // The bound is the depth at the start: the copies the last run put back must be ready
        // (the run waits for them; `ready_again` guards a run that gave up waiting).
        env.ready_again(&env.topology.dead_queue, 3).await;
        let report = replayer.run(&options, |_| {}).await.unwrap();
        assert_eq!(
            (report.failed, report.moved, report.parked),
            (3, 0, 0),
            "run {run}: {report:?}"
        );
    }
    env.ready_again(&env.topology.dead_queue, 3).await;
    let left = env.drain(&env.topology.dead_queue).await;
    let ids: BTreeSet<String> = left.iter().map(|(p, _)| message_id(p)).collect();
    assert_eq!(
        (left.len(), ids),
        (3, seeded),
        "nothing lost, nothing duplicated"
    );
    for (props, _) in &left {
        let count = headers::get_u64(&headers::table(props), "x-delivery-count")
            .unwrap()
            .unwrap_or(0);
        assert!(count <= 1, "delivery count {count} after 25 runs");
        assert_eq!(
            crate::common::header_str(props, headers::REASON).as_deref(),
            Some("budget_exhausted"),
            "the dead-letter record is kept"
        );
    }
}

/// What a run leaves in the dead-letter queue is ready when the run returns: a depth read the
/// moment it returns (as `budgetctl dlq stats` and the "after" of the replay's audit entry read
/// it) counts all of it. 300 dead letters: 200 moved, 100 of another dependency skipped (put back
/// as copies) and 3 whose exchange is gone (failed, put back as copies); then a second run over
/// the 103 left. The copies land at the tail of the queue the run consumes, so its consumer is
/// pushed them past its bound; they were held by its channel, not ready, until the queue applied
/// the close's return, after the run had returned: the depth read then was short by up to the
/// prefetch.
#[tokio::test]
async fn what_a_run_leaves_is_ready_when_it_returns() {
    let env = Env::new("replayready", "", "", "").await;
    let publisher = env.publisher().await;
    let now = headers::now_ms();
    env.seed_dead_letters(
        &publisher,
        100,
        "billing",
        DeadLetterReason::BudgetExhausted,
        0,
        now,
    )
    .await;
    let mut gone = env.dead_letter_record("search", DeadLetterReason::BudgetExhausted, now);
    gone.original_exchange = format!("{}.gone", env.topology.work_exchange);
    for i in 0..3 {
        env.publish_dead_letter(&publisher, &gone, format!("gone {i}").as_bytes())
            .await;
    }
    env.seed_dead_letters(
        &publisher,
        200,
        "search",
        DeadLetterReason::BudgetExhausted,
        0,
        now,
    )
    .await;
    publisher.close().await;
    // Opened before the run, so that the depth is read the moment the run returns.
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    let replayer = Replayer::new(env.url.clone(), env.topology.clone(), None);
    let mut options = ReplayOptions::new(&env.config);
    options.filter.dependency = Some("search".into());
    for (round, moved) in [(1, 200), (2, 0), (3, 0), (4, 0)] {
        let run = replayer.run(&options, |_| {}).await.unwrap();
        let depth = queue_depth(&ch, &env.topology.dead_queue).await.unwrap();
        let stats = replayer
            .dry_run_by_reading(&ReplayOptions::new(&env.config))
            .await
            .unwrap();
        assert_eq!(
            (run.moved, run.skipped, run.failed),
            (moved, 100, 3),
            "round {round}: {run:?}"
        );
        assert_eq!(run.not_ready, 0, "round {round}: {run:?}");
        assert_eq!(
            depth, 103,
            "round {round}: dead-letter queue depth read the moment the run returned"
        );
        assert_eq!(
            (stats.total, stats.seen),
            (103, 103),
            "round {round}: `dlq stats` right after the run"
        );
        // The dry run's copies (it puts back what it reads), before the next round's bound.
        env.ready_again(&env.topology.dead_queue, 103).await;
    }
    let _ = conn
        .close(200, lapin::types::ShortString::from("bye"))
        .await;
    assert_eq!(env.depth(&env.topology.work_queue).await, 200);
}

/// A run whose messages another reader takes ends as a run, not as `Undelivered`: it goes quiet
/// short of its bound, and what it did not see is not back in the queue (the other reader acked
/// it). 300 dead letters, more than the run's prefetch (256), moved at 20 a second; a second
/// consumer starts once the run has counted them and acks what the queue pushes it.
#[tokio::test]
async fn a_run_whose_messages_another_reader_takes_is_not_undelivered() {
    use futures::StreamExt;
    use lapin::options::{BasicAckOptions, BasicConsumeOptions};
    use lapin::types::{FieldTable, ShortString};

    let env = Env::new("replayother", "", "", "").await;
    let publisher = env.publisher().await;
    env.seed_dead_letters(
        &publisher,
        300,
        "search",
        DeadLetterReason::BudgetExhausted,
        0,
        headers::now_ms(),
    )
    .await;
    publisher.close().await;
    let replayer = Replayer::new(env.url.clone(), env.topology.clone(), None);
    let mut options = ReplayOptions::new(&env.config);
    options.rate = Some(20.0);
    let run = tokio::spawn(async move { replayer.run(&options, |_| {}).await });
    // The run counts the queue and is pushed its prefetch at once; the other reader then
    // takes what is left ready.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    let mut other = ch
        .basic_consume(
            ShortString::from(env.topology.dead_queue.as_str()),
            ShortString::from("another-reader"),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let taker = tokio::spawn(async move {
        let mut taken = 0u64;
        while let Ok(Some(Ok(d))) =
            tokio::time::timeout(std::time::Duration::from_secs(20), other.next()).await
        {
            d.acker.ack(BasicAckOptions::default()).await.unwrap();
            taken += 1;
        }
        taken
    });
    let report = run
        .await
        .unwrap()
        .expect("a run another reader shares ends as a run");
    let _ = conn.close(200, ShortString::from("bye")).await;
    let taken = taker.await.unwrap();
    assert!(taken > 0, "the other reader took nothing: {report:?}");
    assert_eq!(report.total, 300, "{report:?}");
    assert_eq!(report.seen + taken, 300, "{report:?}, other reader {taken}");
    assert_eq!(report.moved, report.seen, "{report:?}");
    assert_eq!(report.not_ready, taken, "{report:?}");
    assert_eq!(env.depth(&env.topology.dead_queue).await, 0);
}
