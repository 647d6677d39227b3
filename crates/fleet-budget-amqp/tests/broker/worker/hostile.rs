//! Hostile messages through the worker and the replayer (issue 9, items 1 and 3): a producer's
//! `expiration` never reaches a copy (dead-letter, parked, replayed, retry), and a job whose
//! original routing key is over 255 bytes is dead-lettered once and parked by replay, never
//! looping.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_budget::Failure;
use fleet_budget_amqp::headers;
use fleet_budget_amqp::{ReplayFilter, ReplayOptions, Replayer};
use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};

use super::{LONG, start, stop};
use crate::common::{Env, header_str, message_id, wait_until};

/// What the handler saw: (message id, attempt, replays, expiration, fb-original-expiration).
type Seen = Arc<Mutex<Vec<(String, u32, u32, Option<String>, Option<String>)>>>;

fn job_props(id: &str, expiration: &str, table: FieldTable) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(ShortString::from(id))
        .with_type(ShortString::from("t"))
        .with_delivery_mode(2)
        .with_expiration(ShortString::from(expiration))
        .with_headers(table)
}

/// Jobs published with `expiration = 4000`: one dead-lettered, one parked by replay, one that
/// retries through a tier. More than 4 s later the dead-letter and the parked copy are still
/// there, without `expiration` and with `fb-original-expiration = 4000`; the retry came back
/// without it; the dead-letter replayed to the work queue runs again without it.
#[tokio::test]
async fn copies_outlive_the_producers_expiration() {
    let env = Env::new(
        "expiration",
        "",
        "",
        "[dependencies.api]\ntasks = [\"t\"]\n",
    )
    .await;
    let seen: Seen = Arc::default();
    let runner = {
        let seen = Arc::clone(&seen);
        start(env.budget().await, &env, move |job| {
            let table = headers::table(&job.properties);
            seen.lock().unwrap().push((
                job.message_id.clone().unwrap(),
                job.attempt,
                job.replays,
                job.properties
                    .expiration()
                    .as_ref()
                    .map(|e| e.as_str().to_owned()),
                headers::get_str(&table, headers::ORIGINAL_EXPIRATION).unwrap(),
            ));
            let result = match (&job.payload[..], job.attempt) {
                (b"retry", 1) => Err(Failure::retryable("503")),
                (b"retry", _) => Ok(()),
                _ => Err(Failure::non_retryable("400")),
            };
            async move { result }
        })
    };
    let publisher = env.publisher().await;
    let (dead, parked, retried) = (
        headers::new_message_id(),
        headers::new_message_id(),
        headers::new_message_id(),
    );
    for (id, body) in [(&dead, "dead"), (&parked, "park"), (&retried, "retry")] {
        publisher
            .publish(
                &env.topology.work_exchange,
                "t",
                body.as_bytes(),
                job_props(id, "4000", FieldTable::default()),
            )
            .await
            .unwrap();
    }
    wait_until(LONG, "two dead-letters and the retry done", || async {
        let retried_twice = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.0 == retried)
            .count()
            == 2;
        retried_twice && env.depth(&env.topology.dead_queue).await == 2
    })
    .await;
    // Park one of them: a replay with max_replays = 0 parks what it selects.
    let mut options = ReplayOptions::new(&env.config);
    options.max_replays = 0;
    options.filter = ReplayFilter {
        message_id: Some(parked.clone()),
        ..ReplayFilter::default()
    };
    let replayer = Replayer::new(env.url.clone(), env.topology.clone(), None);
    let report = replayer.run(&options, |_| {}).await.unwrap();
    assert_eq!(report.parked, 1, "{report:?}");
    // Well past the producer's 4 s: with its expiration the broker would have deleted them.
    tokio::time::sleep(Duration::from_millis(5_000)).await;
    assert_eq!(env.depth(&env.topology.dead_queue).await, 1);
    assert_eq!(env.depth(&env.topology.parked_queue).await, 1);
    let (props, _) = env.get(&env.topology.parked_queue).await.unwrap();
    assert_eq!(message_id(&props), parked);
    assert!(props.expiration().is_none(), "{props:?}");
    assert_eq!(
        header_str(&props, headers::ORIGINAL_EXPIRATION).as_deref(),
        Some("4000")
    );
    // Replay the dead-letter: it runs again, without expiration, and is dead-lettered again.
    let report = replayer
        .run(&ReplayOptions::new(&env.config), |_| {})
        .await
        .unwrap();
    assert_eq!(report.moved, 1, "{report:?}");
    wait_until(LONG, "the replayed job ran", || async {
        seen.lock().unwrap().iter().any(|s| s.0 == dead && s.2 == 1)
    })
    .await;
    wait_until(LONG, "dead-lettered again", || async {
        env.depth(&env.topology.dead_queue).await == 1
    })
    .await;
    stop(runner).await;
    let (props, _) = env.get(&env.topology.dead_queue).await.unwrap();
    assert_eq!(message_id(&props), dead);
    assert!(props.expiration().is_none(), "{props:?}");
    assert_eq!(
        header_str(&props, headers::ORIGINAL_EXPIRATION).as_deref(),
        Some("4000")
    );
    for (id, attempt, replays, expiration, original) in seen.lock().unwrap().iter() {
        let first = *attempt == 1 && *replays == 0;
        if first {
            assert_eq!(expiration.as_deref(), Some("4000"), "{id}: the original");
        } else {
            // The retry's second attempt and the replayed job are copies.
            assert_eq!(
                expiration, &None,
                "{id} attempt {attempt} replays {replays}"
            );
            assert_eq!(original.as_deref(), Some("4000"), "{id}");
        }
    }
}

/// A job whose `fb-original-routing-key` is 300 bytes (no AMQP short string can carry it): its
/// handler runs once, the dead-letter is published (the fanout ignores the key, the header keeps
/// it), and replay parks it, saying why, instead of failing on every run.
#[tokio::test]
async fn a_300_byte_routing_key_is_dead_lettered_once_and_parked_by_replay() {
    let env = Env::new("long-key", "", "", "[dependencies.api]\ntasks = [\"t\"]\n").await;
    let runs = Arc::new(Mutex::new(0_u32));
    let runner = {
        let runs = Arc::clone(&runs);
        start(env.budget().await, &env, move |_job| {
            *runs.lock().unwrap() += 1;
            async { Err(Failure::non_retryable("400")) }
        })
    };
    let long_key = "k".repeat(300);
    let mut t = FieldTable::default();
    headers::set_str(&mut t, headers::ORIGINAL_ROUTING_KEY, &long_key);
    let id = headers::new_message_id();
    let publisher = env.publisher().await;
    publisher
        .publish(
            &env.topology.work_exchange,
            "t",
            b"x",
            BasicProperties::default()
                .with_message_id(ShortString::from(id.as_str()))
                .with_type(ShortString::from("t"))
                .with_headers(t),
        )
        .await
        .unwrap();
    wait_until(LONG, "dead-lettered", || async {
        env.depth(&env.topology.dead_queue).await == 1
    })
    .await;
    let counts = stop(runner).await;
    assert_eq!(*runs.lock().unwrap(), 1, "the handler ran once: {counts:?}");
    assert_eq!(counts.requeued, 0, "{counts:?}");
    assert_eq!(counts.dead_lettered, 1, "{counts:?}");
    let replayer = Replayer::new(env.url.clone(), env.topology.clone(), None);
    let options = ReplayOptions::new(&env.config);
    let dry = replayer.dry_run_by_reading(&options).await.unwrap();
    let report = replayer.run(&options, |_| {}).await.unwrap();
    assert_eq!(
        (report.parked, report.failed),
        (1, 0),
        "{report:?} (dry run {dry:?})"
    );
    let again = replayer.run(&options, |_| {}).await.unwrap();
    assert_eq!(again.total, 0, "nothing left to fail on: {again:?}");
    let (props, _) = env.get(&env.topology.parked_queue).await.unwrap();
    assert_eq!(message_id(&props), id);
    assert_eq!(
        header_str(&props, headers::ORIGINAL_ROUTING_KEY).as_deref(),
        Some(long_key.as_str())
    );
    let why = header_str(&props, headers::PARK_REASON).unwrap();
    assert!(why.contains("255"), "{why}");
}

/// A job whose headers nearly fill the broker's frame (a hostile or unlucky producer): the
/// dead-letter copy, with its own headers added, would not fit one frame (the broker closes the
/// connection on such a frame, and the job would come back forever). The largest header is
/// dropped with a note instead: the handler runs once, the dead-letter is published on the first
/// connection, body and the other headers intact.
#[tokio::test]
async fn headers_that_fill_the_frame_are_dead_lettered_with_the_largest_dropped() {
    let env = Env::new("frame", "", "", "[dependencies.api]\ntasks = [\"t\"]\n").await;
    let runs = Arc::new(Mutex::new(0_u32));
    let runner = {
        let runs = Arc::clone(&runs);
        start(env.budget().await, &env, move |_job| {
            *runs.lock().unwrap() += 1;
            async { Err(Failure::non_retryable("400")) }
        })
    };
    let publisher = env.publisher().await;
    let frame_max = publisher.frame_max().expect("a negotiated frame_max");
    let id = headers::new_message_id();
    let mut t = FieldTable::default();
    headers::set_str(&mut t, "keep", "small");
    headers::set_str(&mut t, "big", "");
    let empty = headers::header_frame_size(&job_props(&id, "60000", t.clone()));
    headers::set_str(&mut t, "big", &"b".repeat(frame_max - empty - 100));
    let props = job_props(&id, "60000", t);
    assert_eq!(headers::header_frame_size(&props), frame_max - 100);
    publisher
        .publish(&env.topology.work_exchange, "t", b"the job", props)
        .await
        .unwrap();
    wait_until(LONG, "dead-lettered", || async {
        env.depth(&env.topology.dead_queue).await == 1
    })
    .await;
    let counts = stop(runner).await;
    assert_eq!(*runs.lock().unwrap(), 1, "ran once: {counts:?}");
    assert_eq!(counts.connections, 1, "{counts:?}");
    assert_eq!(
        (counts.dead_lettered, counts.requeued),
        (1, 0),
        "{counts:?}"
    );
    let (props, body) = env.get(&env.topology.dead_queue).await.unwrap();
    assert_eq!(body, b"the job");
    assert_eq!(message_id(&props), id);
    assert_eq!(header_str(&props, "keep").as_deref(), Some("small"));
    assert_eq!(header_str(&props, "big"), None);
    let note = header_str(&props, headers::DROPPED_HEADERS).unwrap();
    assert!(note.contains("big ("), "{note}");
    assert_eq!(
        header_str(&props, headers::REASON).as_deref(),
        Some("non_retryable")
    );
}

/// A broker that accepts TCP and never answers: the worker's connect ends at the connect
/// deadline (10 s by default) and the reconnect loop tries again, instead of hanging in the
/// first handshake forever; shutdown ends it.
#[tokio::test]
async fn a_broker_that_never_answers_is_retried_by_the_reconnect_loop() {
    let env = Env::new("mute-broker", "", "", "").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let held = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            held.lock().unwrap().push(stream); // held open, never a byte sent
        }
    });
    let mut opts = super::options(&env);
    opts.url = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
    let worker = fleet_budget_amqp::Worker::new(env.budget().await, env.topology.clone(), opts);
    let handle = worker.handle();
    let join = tokio::spawn(async move { worker.run(|_job| async { Ok(()) }).await.unwrap() });
    wait_until(LONG, "a second connection attempt", || async {
        accepted.lock().unwrap().len() >= 2
    })
    .await;
    let counts = stop((handle, join)).await;
    assert_eq!(counts.connections, 0, "{counts:?}");
    assert_eq!(counts.deliveries, 0, "{counts:?}");
}
