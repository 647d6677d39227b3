// Over ~500 lines on purpose: the replayer's behaviours against one broker, named by path in
// docs/semantics.md and docs/RELIABILITY.md; submodules would rename them.
//! The replayer against the real RabbitMQ: pacing, the bound, pausing on an exhausted budget,
//! loop protection, malformed messages, the dry run, and filters.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_budget::{DeadLetterReason, Dependency};
use fleet_budget_amqp::headers;
use fleet_budget_amqp::{ReplayFilter, ReplayOptions, ReplayProgress, Replayer};
use futures::StreamExt;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::common::{Env, header_str, header_u64, ids, message_id, wait_until};

const LONG: Duration = Duration::from_secs(60);

fn replayer(env: &Env) -> Replayer {
    Replayer::new(env.url.clone(), env.topology.clone(), None)
}

/// Paced replay: no move goes ahead of the rate's schedule. The pacer sends the k-th move no
/// sooner than k / rate after the run starts (late sends catch up, never run ahead), so the m-th
/// confirmed move is seen no sooner than (m - 1) / rate after the call: 120 moves at 40 msg/s take
/// at least 2.975 s, whatever the load (which can only make a run slower). How close a run comes
/// to the rate is printed, not asserted (a loaded machine achieved 22 msg/s once).
#[tokio::test]
async fn replay_never_moves_faster_than_the_rate() {
    let env = Env::new("pace", "", "", "").await;
    let publisher = env.publisher().await;
    env.seed_dead_letters(
        &publisher,
        120,
        "search",
        DeadLetterReason::BudgetExhausted,
        0,
        headers::now_ms(),
    )
    .await;
    let mut options = ReplayOptions::new(&env.config);
    options.rate = Some(40.0);
    let interval = Duration::from_millis(25);
    let moved_at = Arc::new(Mutex::new(Vec::new()));
    let m = Arc::clone(&moved_at);
    let mut last = 0;
    let called = Instant::now();
    let report = replayer(&env)
        .run(&options, move |p: &ReplayProgress| {
            if p.moved > last {
                last = p.moved;
                m.lock().unwrap().push((Instant::now(), p.moved));
            }
        })
        .await
        .unwrap();
    assert_eq!(report.moved, 120, "{report:?}");
    // Several confirms may be counted in one progress call (a loaded machine batches them): the
    // check is on the count each call shows.
    let moves = moved_at.lock().unwrap().clone();
    for &(at, moved) in &moves {
        let earliest = interval * u32::try_from(moved - 1).unwrap();
        let seen = at.duration_since(called);
        assert!(
            seen >= earliest,
            "move {moved} confirmed {seen:?} after the call, ahead of the schedule ({earliest:?})"
        );
    }
    let ((first_at, first), (last_at, last)) = (moves[0], *moves.last().unwrap());
    let span = last_at.duration_since(first_at).as_secs_f64();
    let rate = (last - first) as f64 / span;
    eprintln!("replay pacing: requested 40 msg/s, achieved {rate:.2} msg/s over {span:.2} s");
    assert_eq!(env.depth(&env.topology.work_queue).await, 120);
    // The last acks of a run go out after its consumer is cancelled (so the broker never pushes
    // past the bound); the quorum queue applies them a moment later.
    wait_until(LONG, "the dead-letter queue empties", || async {
        env.depth(&env.topology.dead_queue).await == 0
    })
    .await;
}

/// Bounded: messages dead-lettered after the run started stay for the next run. Moved copies go
/// to the original exchange and routing key with the same id and body, attempt reset, replay
/// count incremented.
#[tokio::test]
async fn replay_is_bounded_to_the_messages_present_at_start() {
    let env = Env::new("bound", "", "", "").await;
    let publisher = Arc::new(env.publisher().await);
    let ids: BTreeSet<String> = env
        .seed_dead_letters(
            &publisher,
            30,
            "search",
            DeadLetterReason::BudgetExhausted,
            1,
            headers::now_ms(),
        )
        .await
        .into_iter()
        .collect();
    let mut options = ReplayOptions::new(&env.config);
    options.rate = Some(30.0);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let late = {
        let (publisher, dead_exchange) =
            (Arc::clone(&publisher), env.topology.dead_exchange.clone());
        let record = env.dead_letter_record(
            "search",
            DeadLetterReason::BudgetExhausted,
            headers::now_ms(),
        );
        tokio::spawn(async move {
            rx.recv().await;
            // New failures arrive while the replay runs.
            for i in 0..10 {
                let mut t = FieldTable::default();
                record.write(&mut t);
                let props = BasicProperties::default()
                    .with_message_id(ShortString::from(format!("late-{i}")))
                    .with_headers(t);
                publisher
                    .publish(&dead_exchange, "search", b"late", props)
                    .await
                    .unwrap();
            }
        })
    };
    let mut sent = false;
    let report = replayer(&env)
        .run(&options, move |p| {
            if p.seen >= 1 && !sent {
                sent = true;
                let _ = tx.send(());
            }
        })
        .await
        .unwrap();
    late.await.unwrap();
    assert_eq!(
        (report.total, report.seen, report.moved),
        (30, 30, 30),
        "{report:?}"
    );
    assert_eq!(
        env.depth(&env.topology.dead_queue).await,
        10,
        "the late dead-letters wait for the next run"
    );
    let moved = env.drain(&env.topology.work_queue).await;
    assert_eq!(moved.len(), 30);
    for (props, body) in &moved {
        assert!(ids.contains(&message_id(props)), "message id changed");
        assert!(body.starts_with(b"job "));
        assert_eq!(
            header_u64(props, headers::ATTEMPT),
            None,
            "attempt counter reset"
        );
        assert_eq!(
            header_u64(props, headers::REPLAYS),
            Some(2),
            "replay count incremented"
        );
        assert_eq!(header_str(props, headers::REASON), None);
        assert!(header_u64(props, headers::REPLAYED_MS).is_some());
        assert_eq!(header_str(props, headers::TASK).as_deref(), Some("search"));
    }
}

/// Pauses while the dependency's budget is exhausted and resumes when it is not.
#[tokio::test]
async fn replay_pauses_while_the_budget_is_exhausted_and_resumes() {
    let env = Env::new(
        "pause",
        "",
        "",
        // No floor, so with no successes the allowance is 0: exhausted until work succeeds.
        "[dependencies.search]\nwindow_secs = 60\nmin_allowance = 0\nratio = 1.0\n",
    )
    .await;
    let publisher = env.publisher().await;
    env.seed_dead_letters(
        &publisher,
        5,
        "search",
        DeadLetterReason::BudgetExhausted,
        0,
        headers::now_ms(),
    )
    .await;
    let budget = env.budget().await;
    let dep = Dependency::new("search").unwrap();
    assert_eq!(budget.status(&dep).await.0.remaining(), 0);
    let events: Arc<Mutex<Vec<ReplayProgress>>> = Arc::default();
    let run = {
        let (events, r, mut options) = (
            Arc::clone(&events),
            Replayer::new(env.url.clone(), env.topology.clone(), Some(budget.clone())),
            ReplayOptions::new(&env.config),
        );
        options.budget_poll = Duration::from_millis(100);
        tokio::spawn(async move {
            r.run(&options, move |p| events.lock().unwrap().push(p.clone()))
                .await
        })
    };
    wait_until(LONG, "the replay to pause", || async {
        events
            .lock()
            .unwrap()
            .iter()
            .any(|p| p.paused_on.as_deref() == Some("search"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        events.lock().unwrap().last().unwrap().moved,
        0,
        "nothing moves while the budget is exhausted"
    );
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
    // The dependency recovers: successes earn allowance (ratio 1.0), the replay resumes.
    for _ in 0..3 {
        budget.on_success("search").await.unwrap();
    }
    let report = tokio::time::timeout(LONG, run)
        .await
        .expect("the replay resumes and ends")
        .unwrap()
        .unwrap();
    assert_eq!(report.moved, 5, "{report:?}");
    assert!(!report.paused.is_zero());
    assert!(events.lock().unwrap().last().unwrap().paused_on.is_none());
    assert_eq!(env.depth(&env.topology.work_queue).await, 5);
}

/// A message replayed `max_replays` times is parked, not replayed again.
#[tokio::test]
async fn loop_protection_parks_messages_replayed_too_often() {
    let env = Env::new("loop", "", "", "").await;
    let publisher = env.publisher().await;
    let looping: BTreeSet<String> = env
        .seed_dead_letters(
            &publisher,
            3,
            "search",
            DeadLetterReason::BudgetExhausted,
            3,
            headers::now_ms(),
        )
        .await
        .into_iter()
        .collect();
    env.seed_dead_letters(
        &publisher,
        2,
        "search",
        DeadLetterReason::BudgetExhausted,
        2,
        headers::now_ms(),
    )
    .await;
    let options = ReplayOptions::new(&env.config);
    assert_eq!(
        options.max_replays, 3,
        "the default comes from amqp.max_replays"
    );
    let report = replayer(&env).run(&options, |_| {}).await.unwrap();
    assert_eq!(
        (
            report.moved,
            report.parked,
            report.malformed,
            report.matched
        ),
        (2, 3, 0, 5),
        "{report:?}"
    );
    let parked = env.drain(&env.topology.parked_queue).await;
    assert_eq!(ids(&parked), looping);
    for (props, _) in &parked {
        let reason = header_str(props, headers::PARK_REASON).unwrap();
        assert!(reason.contains("replayed 3 times"), "{reason}");
        assert_eq!(
            header_str(props, headers::REASON).as_deref(),
            Some("budget_exhausted"),
            "the dead-letter headers are kept"
        );
    }
    assert_eq!(env.depth(&env.topology.work_queue).await, 2);
    wait_until(LONG, "the dead-letter queue empties", || async {
        env.depth(&env.topology.dead_queue).await == 0
    })
    .await;
}

/// Garbage and malformed headers go to the parked queue with the reason; nothing is dropped.
#[tokio::test]
async fn malformed_messages_are_parked_with_the_reason() {
    let env = Env::new("malformed", "", "", "").await;
    let publisher = env.publisher().await;
    let dead = env.topology.dead_exchange.clone();
    let mut ids = BTreeSet::new();
    let mut send = async |id: &str, body: &[u8], table: Option<FieldTable>| {
        let mut props = BasicProperties::default().with_message_id(ShortString::from(id));
        if let Some(t) = table {
            props = props.with_headers(t);
        }
        publisher.publish(&dead, "k", body, props).await.unwrap();
        ids.insert(id.to_owned());
    };
    send("no-headers", &[0, 159, 146, 150], None).await;
    let valid = |t: &mut FieldTable| {
        fleet_budget_amqp::DeadLetterRecord {
            task: "t".into(),
            dependency: "search".into(),
            reason: DeadLetterReason::NonRetryable,
            original_exchange: env.topology.work_exchange.clone(),
            original_routing_key: "t".into(),
            original_queue: env.topology.work_queue.clone(),
            attempts: 1,
            first_failure_ms: 1,
            dead_lettered_ms: 2,
            error_class: "c".into(),
            error: "e".into(),
            budget: None,
            budget_source: None,
            replays: 0,
        }
        .write(t);
    };
    let mut t = FieldTable::default();
    valid(&mut t);
    headers::set_str(&mut t, headers::REASON, "gremlins");
    send("bad-reason", b"x", Some(t)).await;
    let mut t = FieldTable::default();
    valid(&mut t);
    t.insert(
        ShortString::from(headers::DEAD_LETTERED_MS),
        AMQPValue::LongString(LongString::from("yesterday")),
    );
    send("bad-time", b"x", Some(t)).await;
    let mut t = FieldTable::default();
    valid(&mut t);
    t.insert(
        ShortString::from(headers::REPLAYS),
        AMQPValue::LongString(LongString::from(vec![0xff, 0x00])),
    );
    send("bad-replays", b"x", Some(t)).await;
    let mut t = FieldTable::default();
    valid(&mut t);
    headers::remove(&mut t, headers::ORIGINAL_EXCHANGE);
    send("no-origin", b"x", Some(t)).await;
    // What the broker dead-letters itself (the work queue's delivery limit) has no fb- headers.
    let mut t = FieldTable::default();
    t.insert(
        ShortString::from(headers::BROKER_FIRST_DEATH_REASON),
        AMQPValue::LongString(LongString::from("delivery_limit")),
    );
    send("by-broker", b"x", Some(t)).await;

    let dry = replayer(&env)
        .dry_run_by_reading(&ReplayOptions::new(&env.config))
        .await
        .unwrap();
    assert_eq!(
        (dry.total, dry.malformed, dry.would_move),
        (6, 6, 0),
        "{dry:?}"
    );
    let report = replayer(&env)
        .run(&ReplayOptions::new(&env.config), |_| {})
        .await
        .unwrap();
    assert_eq!(
        (report.parked, report.malformed, report.moved, report.failed),
        (6, 6, 0, 0),
        "{report:?}"
    );
    let parked = env.drain(&env.topology.parked_queue).await;
    assert_eq!(crate::common::ids(&parked), ids);
    for (props, _) in &parked {
        let reason = header_str(props, headers::PARK_REASON).unwrap();
        let expected = match message_id(props).as_str() {
            "no-headers" => headers::REASON,
            "bad-reason" => "gremlins",
            "bad-time" => headers::DEAD_LETTERED_MS,
            "bad-replays" => headers::REPLAYS,
            "by-broker" => "dead-lettered by the broker, reason delivery_limit",
            _ => headers::ORIGINAL_EXCHANGE,
        };
        assert!(reason.contains(expected), "{}: {reason}", message_id(props));
    }
    wait_until(LONG, "the dead-letter queue empties", || async {
        env.depth(&env.topology.dead_queue).await == 0
    })
    .await;
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
}

/// The dry run counts by dependency × reason and changes nothing; filters select by
/// dependency, reason and time, and skipped messages stay in the dead-letter queue.
#[tokio::test]
async fn dry_run_counts_and_filters_select() {
    let env = Env::new("dry", "", "", "").await;
    let publisher = env.publisher().await;
    let now = headers::now_ms();
    let hour_ago = now - 3_600_000;
    env.seed_dead_letters(
        &publisher,
        4,
        "search",
        DeadLetterReason::BudgetExhausted,
        0,
        now,
    )
    .await;
    env.seed_dead_letters(
        &publisher,
        2,
        "search",
        DeadLetterReason::AttemptsExhausted,
        0,
        hour_ago,
    )
    .await;
    env.seed_dead_letters(
        &publisher,
        3,
        "mail",
        DeadLetterReason::BudgetExhausted,
        0,
        now,
    )
    .await;
    let options = ReplayOptions::new(&env.config);
    let dry = replayer(&env).dry_run_by_reading(&options).await.unwrap();
    assert_eq!(
        (dry.total, dry.seen, dry.would_move, dry.skipped),
        (9, 9, 9, 0),
        "{dry:?}"
    );
    let key = |d: &str, r: &str| (d.to_owned(), r.to_owned());
    assert_eq!(
        dry.by_dependency_reason
            .get(&key("search", "budget_exhausted")),
        Some(&4)
    );
    assert_eq!(
        dry.by_dependency_reason
            .get(&key("search", "attempts_exhausted")),
        Some(&2)
    );
    assert_eq!(
        dry.by_dependency_reason
            .get(&key("mail", "budget_exhausted")),
        Some(&3)
    );
    assert_eq!(
        env.depth(&env.topology.dead_queue).await,
        9,
        "a dry run changes nothing"
    );
    assert_eq!(dry.oldest_dead_lettered_ms, Some(hour_ago));
    let depths = fleet_budget_amqp::queue_depths(&env.url, &env.topology)
        .await
        .unwrap();
    assert_eq!(
        (depths.dead, depths.parked, depths.work, depths.retry.len()),
        (9, 0, 0, 4),
        "{depths:?}"
    );

    let mut only = options.clone();
    only.filter = ReplayFilter {
        dependency: Some("search".into()),
        reason: None,
        since_ms: Some(now - 600_000),
        ..ReplayFilter::default()
    };
    let dry = replayer(&env).dry_run_by_reading(&only).await.unwrap();
    assert_eq!((dry.would_move, dry.skipped), (4, 5), "{dry:?}");
    let report = replayer(&env).run(&only, |_| {}).await.unwrap();
    assert_eq!(
        (
            report.matched,
            report.moved,
            report.skipped,
            report.parked,
            report.failed
        ),
        (4, 4, 5, 0, 0),
        "{report:?}"
    );
    // The run returns once the copies of the skipped ones are ready (`ReplayReport::not_ready`);
    // `ready_again` guards a run that gave up waiting.
    env.ready_again(&env.topology.dead_queue, 5).await;
    assert_eq!(
        env.depth(&env.topology.dead_queue).await,
        5,
        "skipped messages stay"
    );

    only.filter = ReplayFilter {
        dependency: None,
        reason: Some(DeadLetterReason::AttemptsExhausted),
        until_ms: Some(now - 600_000),
        ..ReplayFilter::default()
    };
    let report = replayer(&env).run(&only, |_| {}).await.unwrap();
    assert_eq!((report.moved, report.skipped), (2, 3), "{report:?}");
    assert_eq!(env.depth(&env.topology.work_queue).await, 6);
    env.ready_again(&env.topology.dead_queue, 3).await;
    let left = env.drain(&env.topology.dead_queue).await;
    assert!(
        left.iter()
            .all(|(p, _)| header_str(p, headers::DEPENDENCY).as_deref() == Some("mail"))
    );
}

/// The work queue's delivery limit (a broker-side net): a message requeued past it is
/// dead-lettered by the broker, without fb- headers; the replayer parks it with that reason.
#[tokio::test]
async fn the_broker_delivery_limit_dead_letters_and_replay_parks_with_the_reason() {
    let env = Env::with_amqp("limit", "delivery_limit = 2", "", "", "").await;
    let publisher = env.publisher().await;
    let id = publisher
        .publish_job(&env.topology.work_exchange, "t", "t", b"crashes its worker")
        .await
        .unwrap();
    // A consumer that gives the message back every time, as a crashing worker would.
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    let mut consumer = ch
        .basic_consume(
            ShortString::from(env.topology.work_queue.as_str()),
            ShortString::from("crasher"),
            lapin::options::BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut deliveries = 0;
    while env.depth(&env.topology.dead_queue).await == 0 {
        let next = tokio::time::timeout(Duration::from_secs(2), consumer.next()).await;
        if let Ok(Some(Ok(d))) = next {
            deliveries += 1;
            d.acker
                .nack(lapin::options::BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        assert!(deliveries <= 10, "the delivery limit did not stop the loop");
    }
    let _ = conn.close(200, ShortString::from("bye")).await;
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
    let report = replayer(&env)
        .run(&ReplayOptions::new(&env.config), |_| {})
        .await
        .unwrap();
    assert_eq!(
        (report.parked, report.malformed, report.moved),
        (1, 1, 0),
        "{report:?}"
    );
    let parked = env.drain(&env.topology.parked_queue).await;
    assert_eq!(message_id(&parked[0].0), id);
    let reason = header_str(&parked[0].0, headers::PARK_REASON).unwrap();
    assert!(reason.contains("reason delivery_limit"), "{reason}");
}

/// `limit` moves at most that many; further matching messages stay and count as skipped.
#[tokio::test]
async fn a_limit_moves_at_most_that_many() {
    let env = Env::new("limit-n", "", "", "").await;
    let publisher = env.publisher().await;
    env.seed_dead_letters(
        &publisher,
        5,
        "search",
        DeadLetterReason::BudgetExhausted,
        0,
        headers::now_ms(),
    )
    .await;
    let mut options = ReplayOptions::new(&env.config);
    options.limit = Some(2);
    let dry = replayer(&env).dry_run_by_reading(&options).await.unwrap();
    assert_eq!((dry.would_move, dry.skipped), (2, 3), "{dry:?}");
    let report = replayer(&env).run(&options, |_| {}).await.unwrap();
    assert_eq!(
        (report.moved, report.skipped, report.matched),
        (2, 3, 2),
        "{report:?}"
    );
    // The run returns once the copies of the skipped ones are ready (`ReplayReport::not_ready`);
    // `ready_again` guards a run that gave up waiting.
    env.ready_again(&env.topology.dead_queue, 3).await;
    assert_eq!(env.depth(&env.topology.dead_queue).await, 3);
    assert_eq!(env.depth(&env.topology.work_queue).await, 2);
}

/// `replay --task`, `--message-id` and `--error-contains` (issue 11) select on the record and
/// the message id.
#[tokio::test]
async fn filters_select_by_task_message_id_and_error_text() {
    let env = Env::new("filters", "", "", "").await;
    let mut record = env
        .broker
        .dead_letter_record("search", DeadLetterReason::BudgetFrozen, 1_000);
    record.task = "index".to_owned();
    record.error = "search returned 503 (shard 7)".to_owned();
    let by = |f: ReplayFilter, id: Option<&str>| f.matches_message(&record, id);
    assert!(by(ReplayFilter::default(), None));
    let task = |t: &str| ReplayFilter {
        task: Some(t.to_owned()),
        ..ReplayFilter::default()
    };
    assert!(by(task("index"), None));
    assert!(!by(task("mail"), None));
    let id = ReplayFilter {
        message_id: Some("m-1".to_owned()),
        ..ReplayFilter::default()
    };
    assert!(by(id.clone(), Some("m-1")));
    assert!(!by(id.clone(), Some("m-2")));
    assert!(!by(id, None));
    let text = |t: &str| ReplayFilter {
        error_contains: Some(t.to_owned()),
        ..ReplayFilter::default()
    };
    assert!(by(text("shard 7"), None));
    assert!(!by(text("timeout"), None));
    let until = ReplayFilter {
        reason: Some(DeadLetterReason::BudgetFrozen),
        until_ms: Some(1_001),
        ..ReplayFilter::default()
    };
    assert!(by(until, None));
}
