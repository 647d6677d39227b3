//! A message no client of this crate can read (headers nested past the parser's bound of 100
//! levels, see [`super::nested`]) closes every connection that reads it, and the broker keeps it
//! at the head of its queue. What must not follow from it:
//!
//! * a worker reconnecting onto it 10 to 20 times a second for ever (a classic queue, or a
//!   quorum queue whose delivery limit is far away): the reconnect delay keeps doubling while
//!   the connections die young, and the worker counts and says so;
//! * `dlq peek`, `dlq stats` and `replay --dry-run` waiting for the operation timeout on the
//!   `basic.get` lapin leaves unanswered: they fail at once, naming the connection's error and
//!   the likely cause.
//!
//! Both end the way the README's runbook says: the message is taken out by a client that does
//! not parse headers, and everything behind it goes on. See docs/RELIABILITY.md, "Poison
//! messages, session 6".

use std::time::{Duration, Instant};

use fleet_budget_amqp::metrics::LossCause;
use fleet_budget_amqp::replay::peek_queue;
use fleet_budget_amqp::{AmqpError, AmqpMetrics, ReplayFilter, ReplayOptions, Replayer};

use super::nested::{long, nested_table, publish_raw, take_head_raw};
use super::{LONG, start, stop};
use crate::common::{Env, wait_until};

/// How long the worker is watched on the unreadable message.
const WATCH: Duration = Duration::from_secs(5);

/// Connections a worker may open in [`WATCH`] on the message: the delays from 100 ms doubling
/// with jitter (each 50 to 100 % of its step) allow 7. Before, the delay went back to 100 ms after
/// every connection: one every 50 to 100 ms, some 50 to 60 in 5 s (see RELIABILITY).
const AT_MOST: u64 = 12;

/// The deepest-nested message of the tests of [`super::nested`] that a debug build of the
/// unpatched parser aborted on.
const DEPTH: usize = 200;

/// A worker on a queue whose head it cannot read backs off instead of looping, counts the
/// short-lived connections in a row (metric, counts) and their cause, and once the message is
/// taken out by hand runs the job behind it, its backoff and count reset.
#[tokio::test]
async fn a_worker_backs_off_while_an_unreadable_message_closes_its_connections() {
    // A delivery limit the test never reaches: the queue keeps the message as a classic queue
    // on RabbitMQ 3.10 does (no limit at all).
    let env = Env::with_amqp("poison_worker", "delivery_limit = 1000000", "", "", "").await;
    let work = env.topology.work_queue.clone();
    publish_raw(&env.url, &work, "unreadable", &nested_table(DEPTH)).await;
    let budget = env.budget().await;
    let metrics = AmqpMetrics::of(&budget).expect("the metrics");
    let runner = start(budget, &env, |_job| async { Ok(()) });
    let handle = runner.0.clone();
    wait_until(LONG, "the worker connects", || {
        let counts = handle.counts();
        async move { counts.connections > 0 }
    })
    .await;
    tokio::time::sleep(WATCH).await;
    let counts = handle.counts();
    let in_a_row = metrics.short_lived_connections_in_a_row();
    let unreadable = metrics.connections_lost(true, LossCause::UnreadableMessage);
    eprintln!(
        "in {WATCH:?}: {counts:?}; short-lived in a row {in_a_row}, lost on an unreadable message {unreadable}"
    );
    assert!(
        counts.connections <= AT_MOST,
        "{} connections in {WATCH:?} (at most {AT_MOST}): the delay is not growing",
        counts.connections
    );
    assert!(
        counts.short_lived_connections >= 3,
        "the connections died young: {counts:?}"
    );
    assert_eq!(
        counts.deliveries, 0,
        "the message never reached the handler"
    );
    assert!(
        in_a_row >= 3 && unreadable >= 3,
        "in a row {in_a_row}, unreadable {unreadable}"
    );
    assert_eq!(
        metrics.connections_lost(false, LossCause::UnreadableMessage),
        0,
        "no connection lived"
    );

    // The runbook: take it out with a client that does not parse headers; the job behind runs.
    assert!(
        take_head_raw(&env.url, &work).await.is_some(),
        "the message stayed at the head of the queue"
    );
    let behind = env.publish_one(b"behind").await;
    wait_until(LONG, "the worker runs the job behind", || {
        let counts = handle.counts();
        async move { counts.succeeded == 1 }
    })
    .await;
    wait_until(LONG, "the run of short-lived connections ends", || {
        let m = metrics.clone();
        async move { m.short_lived_connections_in_a_row() == 0 }
    })
    .await;
    let counts = stop(runner).await;
    assert_eq!(
        (counts.deliveries, counts.succeeded),
        (1, 1),
        "only {behind} was delivered: {counts:?}"
    );
    assert_eq!(env.depth(&work).await, 0, "nothing left in the work queue");
}

/// What a look at the dead-letter queue says when `result` is its error.
fn assert_named(what: &str, result: Result<impl std::fmt::Debug, AmqpError>) {
    let e = match result {
        Ok(r) => panic!("{what} read the dead-letter queue: {r:?}"),
        Err(e) => e,
    };
    let text = e.to_string();
    eprintln!("{what}: {text}");
    assert!(!e.is_timeout(), "{what} waited for the deadline: {text}");
    assert!(
        matches!(e, AmqpError::ConnectionLost { .. }) && e.is_unreadable_message(),
        "{what}: {e:?}"
    );
    for said in [
        "connection lost during get from",
        "failed to parse",
        "a message this client cannot read",
        "nested more than 100 levels deep",
        "A message no client can read",
    ] {
        assert!(text.contains(said), "{what}: {said:?} not in {text:?}");
    }
}

/// `dlq peek`, `dlq stats` and `replay --dry-run` (peek and the dry run they call) fail on the
/// unreadable dead letter with the connection's error, not at the operation deadline (20 s
/// here), and leave both dead letters where they were; once it is taken out by hand, they read
/// the one behind.
#[tokio::test]
async fn the_tools_fail_at_once_on_an_unreadable_dead_letter_naming_the_cause() {
    let env = Env::with_amqp("poison_tools", "operation_timeout_ms = 20000", "", "", "").await;
    let broker = fleet_budget_amqp::ConnectionConfig {
        url: env.url.clone(),
        ..env.config.amqp.connection()
    };
    let dead = env.topology.dead_queue.clone();
    publish_raw(&env.url, &dead, "unreadable", &nested_table(DEPTH)).await;
    publish_raw(&env.url, &dead, "behind", &long(&[])).await;
    let replayer = Replayer::new(&broker, env.topology.clone(), None);
    let options = ReplayOptions::new(&env.config);

    let started = Instant::now();
    let peek = tokio::time::timeout(
        LONG,
        peek_queue(&broker, &dead, &ReplayFilter::default(), 10),
    )
    .await
    .expect("the peek ends");
    eprintln!("peek ended after {:?}", started.elapsed());
    assert_named("peek", peek);
    let started = Instant::now();
    let dry_run = tokio::time::timeout(LONG, replayer.dry_run(&options))
        .await
        .expect("the dry run ends");
    eprintln!("dry run ended after {:?}", started.elapsed());
    assert_named("dry run", dry_run);
    // The readers' connections died holding the message: the broker puts it back.
    env.ready_again(&dead, 2).await;

    assert!(take_head_raw(&env.url, &dead).await.is_some());
    let peek = peek_queue(&broker, &dead, &ReplayFilter::default(), 10)
        .await
        .expect("the peek reads the message behind");
    assert_eq!((peek.total, peek.seen), (1, 1), "{peek:?}");
    assert_eq!(
        peek.messages[0].message_id.as_deref(),
        Some("behind"),
        "{peek:?}"
    );
    let report = replayer.dry_run(&options).await.expect("the dry run reads");
    assert_eq!((report.total, report.seen), (1, 1), "{report:?}");
}
