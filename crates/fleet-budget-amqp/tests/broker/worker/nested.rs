//! A message whose headers nest field tables 200 deep (1.4 KB of headers; a 128 KiB frame holds
//! some 18,000 levels) is accepted by RabbitMQ and kept in the queue. The field-table parser of
//! `amq-protocol-types` 10.6 (as every user resolves it from the registry) recurses once per
//! level on the 2 MiB stack of lapin's IO thread, so a process that read such a message aborted
//! ("thread 'lapin-io-loop' has overflowed its stack", SIGABRT; a debug build from about 200
//! levels on, a release build from about 2,000) before any code of this crate saw the delivery.
//!
//! Every connection of this crate now reads through the frame guard (`frame_guard`): the
//! entry nested past 100 levels is removed on receipt and named in `fb-unreadable-headers`, so
//! `basic.get` reads the message, the connection stays up, the worker dead-letters the job with
//! why and runs the one behind it on the same connection, and `dlq peek` and `replay` read the
//! dead letters (replay parks them: they are no longer what the producer sent). These tests
//! read such messages in a process of their own, so that an abort fails the test instead of the
//! test run. See docs/semantics.md, "Headers no client can parse".
//!
//! The messages are published with raw AMQP frames: lapin's own encoder (and the drop of the
//! value) recurses the same way.

use fleet_budget::FleetBudget;
use fleet_budget_amqp::connection::{ConnectionConfig, ConnectionWatch};
use fleet_budget_amqp::replay::peek_queue;
use fleet_budget_amqp::testing::amqp_url;
pub(super) use fleet_budget_amqp::testing::raw::{long, nested_table, publish_raw};
use fleet_budget_amqp::{
    ReplayFilter, ReplayOptions, Replayer, Topology, Worker, WorkerConfig, WorkerOptions,
};
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::LONG;
use crate::common::{Env, wait_until};

/// The deepest nesting the frame guard passes to lapin's parser.
const BOUND: usize = fleet_budget_amqp::frame_guard::MAX_DEPTH;

/// The variable that tells [`read_in_a_child`] what to read: the configuration of the test
/// (its queues and private Redis).
const CHILD_CONFIG: &str = "FB_TEST_NESTED_CONFIG";

/// The depth of the table nesting under header "a" (`headers` itself is level 1).
fn depth_of(table: &FieldTable) -> usize {
    let mut depth = 1;
    let mut at = table;
    while let Some(AMQPValue::FieldTable(inner)) = at.inner().get("a") {
        depth += 1;
        at = inner;
    }
    depth
}

/// The lines the child printed after `REPORT `.
fn reports(stdout: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("REPORT ").map(str::to_owned))
        .collect()
}

fn report<'a>(reports: &'a [String], key: &str) -> &'a str {
    reports
        .iter()
        .find_map(|r| r.strip_prefix(key))
        .unwrap_or_else(|| panic!("no report {key:?} in {reports:#?}"))
}

/// Publishes, to the work queue, a message nested to the bound ("at-the-bound"), one nested
/// `depth` deep below the headers table ("too-deep", `depth + 1` levels with it) and a plain one ("behind"), and the last two to the dead-letter
/// queue as well; then reads them in a child process with `basic.get` and a worker (the work
/// queue), `dlq peek` and `replay` (the dead-letter queue). Returns what the child reported,
/// once it has exited normally.
async fn read_nested(depth: usize) -> Vec<String> {
    let env = Env::with_amqp(
        &format!("nested{depth}"),
        "operation_timeout_ms = 10000\ndelivery_limit = 5",
        "",
        "",
        "",
    )
    .await;
    let (work, dead) = (&env.topology.work_queue, &env.topology.dead_queue);
    let plain = long(&[]);
    publish_raw(&env.url, work, "at-the-bound", &nested_table(BOUND - 1)).await;
    let started = std::time::Instant::now();
    publish_raw(&env.url, work, "too-deep", &nested_table(depth)).await;
    let broker_cost = started.elapsed();
    publish_raw(&env.url, work, "behind", &plain).await;
    publish_raw(&env.url, dead, "too-deep", &nested_table(depth)).await;
    publish_raw(&env.url, dead, "behind", &plain).await;
    assert_eq!(
        (env.depth(work).await, env.depth(dead).await),
        (3, 2),
        "the broker kept them"
    );
    let child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "worker::nested::read_in_a_child",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_CONFIG, child_config(&env.toml, broker_cost))
        .output();
    let out = tokio::time::timeout(LONG * 3, child)
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "the reader died ({:?}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let reports = reports(&out.stdout);
    eprintln!("{depth} levels: {reports:#?}");
    // Nothing lost: the work queue is empty (one acked by get, one dead-lettered, one run); the
    // three dead letters (two published there, one from the worker) are parked by the replay.
    wait_until(LONG, "every message is where the run put it", || async {
        (
            env.depth(work).await,
            env.depth(dead).await,
            env.depth(&env.topology.parked_queue).await,
        ) == (0, 0, 3)
    })
    .await;
    reports
}

/// The test's configuration for the child, with a broker deadline that allows for what the
/// broker spends on one deep message.
///
/// RabbitMQ 3.10's own handling of a nested table grows faster than its depth: a confirmed
/// publish of the message 18,000 levels deep took 1.8 s on this machine against 45 ms for a plain
/// one, and a `basic.get` of it 2 s against 2 ms at 200 levels (strace of the test: the broker's
/// answer comes late, the frame guard's own work is a few milliseconds). On a loaded machine
/// that passed the fixed 10 s deadline now and then, and the test failed though nothing hung.
/// So each broker step of the child may take ten times what the broker took to confirm the
/// deep message in this run, and never less than 10 s: a hang still fails the test.
fn child_config(toml: &str, broker_cost: std::time::Duration) -> String {
    const FIXED: &str = "operation_timeout_ms = 10000";
    assert!(
        toml.contains(FIXED),
        "the test's configuration sets {FIXED}"
    );
    let deadline_ms = (broker_cost * 10).as_millis().max(10_000);
    eprintln!(
        "the broker confirmed the deep message in {broker_cost:?}: deadline {deadline_ms} ms"
    );
    toml.replace(FIXED, &format!("operation_timeout_ms = {deadline_ms}"))
}

/// What the readers of a message nested `depth` deep report through the frame guard:
///
/// * the message at the bound arrives whole; the deeper one arrives with the entry removed and
///   named in `fb-unreadable-headers`, and the connection stays up;
/// * the worker, on one connection, dead-letters the deep job (`malformed_header`, the note as
///   its error) and runs the job behind it;
/// * `dlq peek` reads the three dead letters; `replay` parks them, moving nothing.
fn assert_reports(depth: usize, reports: &[String]) {
    assert_eq!(
        report(reports, "at the bound: "),
        "at-the-bound, 100 levels"
    );
    let note = report(reports, "too deep: ");
    assert!(
        note.starts_with("too-deep, ")
            && note.contains(&format!("\"a\" nested {} levels deep", depth + 1)),
        "{depth} levels: {note}"
    );
    assert_eq!(report(reports, "connected after: "), "true");
    assert_eq!(
        report(reports, "worker: "),
        "1 connections, 2 deliveries, 1 succeeded, 1 dead-lettered",
        "{depth} levels"
    );
    let error = report(reports, "dead letter error: ");
    assert!(
        error.contains("fb-unreadable-headers")
            && error.contains(&format!("nested {} levels deep", depth + 1)),
        "{depth} levels: {error}"
    );
    assert_eq!(report(reports, "peek "), "read 3 of 3", "{depth} levels");
    assert_eq!(
        report(reports, "replay "),
        "moved 0, parked 3, failed 0",
        "{depth} levels"
    );
}

/// 200 levels, where the debug build used to abort.
#[tokio::test]
async fn a_header_nested_200_deep_is_removed_on_receipt_and_the_job_dead_lettered() {
    let reports = read_nested(200).await;
    assert_reports(200, &reports);
}

/// About the deepest a 128 KiB frame holds (7 bytes a level).
#[tokio::test]
async fn a_header_nested_18000_deep_is_removed_on_receipt_and_the_job_dead_lettered() {
    let reports = read_nested(18_000).await;
    assert_reports(18_000, &reports);
}

/// The reader of [`read_nested`], in a process of its own; does nothing without
/// [`CHILD_CONFIG`]. Prints what each reader reports on lines starting with `REPORT `.
#[tokio::test]
#[ignore = "run by the tests of this module"]
async fn read_in_a_child() {
    let Ok(toml) = std::env::var(CHILD_CONFIG) else {
        return;
    };
    let config = WorkerConfig::from_toml(&toml, "test").unwrap();
    let topology = Topology::new(&config.amqp);
    let broker = ConnectionConfig {
        url: amqp_url(),
        ..config.amqp.connection()
    };
    let conn = fleet_budget_amqp::connect(&broker, "fleet-budget test: nested headers")
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let watch = ConnectionWatch::new(&conn).with_timeouts(broker.timeouts);
    let get = || {
        watch.within(
            format!("get from {}", topology.work_queue),
            ch.basic_get(
                ShortString::from(topology.work_queue.clone()),
                BasicGetOptions::default(),
            ),
        )
    };
    let first = get().await.unwrap().expect("the message at the bound");
    let props = &first.delivery.properties;
    println!(
        "REPORT at the bound: {}, {} levels",
        props.message_id().as_ref().unwrap(),
        depth_of(props.headers().as_ref().unwrap())
    );
    first
        .delivery
        .acker
        .ack(BasicAckOptions::default())
        .await
        .unwrap();
    let second = get().await.unwrap().expect("the deep message");
    let props = &second.delivery.properties;
    let note = fleet_budget_amqp::headers::get_str(
        props.headers().as_ref().unwrap(),
        fleet_budget_amqp::headers::UNREADABLE_HEADERS,
    )
    .unwrap()
    .unwrap_or_default();
    println!(
        "REPORT too deep: {}, {note}",
        props.message_id().as_ref().unwrap()
    );
    second
        .delivery
        .acker
        .nack(BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        })
        .await
        .unwrap();
    println!("REPORT connected after: {}", conn.status().connected());
    broker.timeouts.close_connection(&conn, "done").await;
    // The worker: dead-letters the deep job, runs the one behind, on one connection.
    let budget = FleetBudget::from_config(&config.budget).await.unwrap();
    let worker = Worker::new(
        budget,
        topology.clone(),
        WorkerOptions::new(&config, &topology),
    );
    let handle = worker.handle();
    let running = tokio::spawn(worker.run(|_job| async { Ok(()) }));
    wait_until(LONG, "the worker handles both", || {
        let counts = handle.counts();
        async move { counts.succeeded == 1 && counts.dead_lettered == 1 }
    })
    .await;
    handle.shutdown();
    let counts = tokio::time::timeout(LONG, running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    println!(
        "REPORT worker: {} connections, {} deliveries, {} succeeded, {} dead-lettered",
        counts.connections, counts.deliveries, counts.succeeded, counts.dead_lettered
    );
    // The tools on the dead-letter queue.
    let peek = tokio::time::timeout(
        LONG,
        peek_queue(&broker, &topology.dead_queue, &ReplayFilter::default(), 10),
    )
    .await
    .unwrap();
    match peek {
        Ok(p) => {
            let error = p
                .messages
                .iter()
                .find_map(|m| {
                    m.error
                        .clone()
                        .filter(|_| m.message_id.as_deref() == Some("too-deep"))
                })
                .unwrap_or_default();
            println!("REPORT dead letter error: {error}");
            println!("REPORT peek read {} of {}", p.seen, p.total);
        }
        Err(e) => println!("REPORT peek failed: {e}"),
    }
    let replayer = Replayer::new(&broker, topology.clone(), None);
    let replay = tokio::time::timeout(LONG, replayer.run(&ReplayOptions::new(&config), |_| {}))
        .await
        .unwrap();
    match replay {
        Ok(r) => println!(
            "REPORT replay moved {}, parked {}, failed {}",
            r.moved, r.parked, r.failed
        ),
        Err(e) => println!("REPORT replay failed: {e}"),
    }
}
