//! A message whose headers nest field tables 200 deep (1.4 KB of headers; a 128 KiB frame holds
//! some 18,000 levels) is accepted by RabbitMQ and kept in the queue. The field-table parser of
//! `amq-protocol-types` 10.6 recursed once per level on the 2 MiB stack of lapin's IO thread, so
//! the process that read such a message aborted ("thread 'lapin-io-loop' has overflowed its
//! stack", SIGABRT; a debug build from about 200 levels on, 100 passed; a release build from
//! about 2,000, 1,000 passed) before any code of this crate saw the delivery; every worker that
//! took it died in turn, and so would `dlq peek`, `dlq stats` and `replay` on the dead-letter
//! queue.
//!
//! The workspace now builds a patched copy (vendor/amq-protocol-types, VENDORED.md) that refuses
//! more than 100 levels as a parse error. lapin treats it as a critical error of the connection:
//! the connection closes and the broker requeues the delivery where it was. These tests read
//! such messages in a process of their own (so that an abort fails the test instead of the test
//! run) and show what each reader reports, that it goes on or stops cleanly, and that no message
//! is lost. They also show what is left: the message goes back to the head of its queue, so a
//! worker reconnects onto it until the work queue's delivery limit dead-letters it (a quorum
//! queue; on a classic queue, RabbitMQ 3.10, it backs off to `reconnect_max`: [`super::poison`]),
//! and the tools fail on it (at once, naming the cause) each time they reach it. See
//! docs/RELIABILITY.md, "Broker review, session 5" and "Poison messages, session 6".
//!
//! The messages are published with raw AMQP frames: lapin's own encoder (and the drop of the
//! value) recurses the same way.

use std::str::FromStr;

use fleet_budget::FleetBudget;
use fleet_budget_amqp::connection::{ConnectionConfig, ConnectionWatch};
use fleet_budget_amqp::replay::peek_queue;
use fleet_budget_amqp::testing::amqp_url;
use fleet_budget_amqp::{
    ReplayFilter, ReplayOptions, Replayer, Topology, Worker, WorkerConfig, WorkerOptions,
};
use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::uri::AMQPUri;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::LONG;
use crate::common::{Env, wait_until};

/// The deepest nesting the patched parser reads (`MAX_NESTING_DEPTH` of the vendored crate).
const BOUND: usize = 100;

/// The variable that tells [`read_in_a_child`] what to read: the configuration of the test
/// (its queues and private Redis).
const CHILD_CONFIG: &str = "FB_TEST_NESTED_CONFIG";

/// One frame: type, channel, payload, end octet.
fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![kind];
    f.extend_from_slice(&channel.to_be_bytes());
    f.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    f.extend_from_slice(payload);
    f.push(0xce);
    f
}

fn method(channel: u16, class: u16, id: u16, args: &[u8]) -> Vec<u8> {
    let mut p = class.to_be_bytes().to_vec();
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(args);
    frame(1, channel, &p)
}

fn short(s: &str) -> Vec<u8> {
    let mut v = vec![u8::try_from(s.len()).unwrap()];
    v.extend_from_slice(s.as_bytes());
    v
}

pub(super) fn long(b: &[u8]) -> Vec<u8> {
    let mut v = u32::try_from(b.len()).unwrap().to_be_bytes().to_vec();
    v.extend_from_slice(b);
    v
}

/// A field table `{"a": {"a": ... {} ...}}` nested `depth` tables deep, encoded.
pub(super) fn nested_table(depth: usize) -> Vec<u8> {
    let mut table = long(&[]);
    for _ in 0..depth {
        let mut entry = short("a");
        entry.push(b'F');
        entry.extend_from_slice(&table);
        table = long(&entry);
    }
    table
}

async fn read_frame(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut head = [0u8; 7];
    s.read_exact(&mut head).await.unwrap();
    let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]);
    let mut payload = vec![0u8; usize::try_from(size).unwrap() + 1];
    s.read_exact(&mut payload).await.unwrap();
    payload.pop();
    (head[0], payload)
}

/// A raw AMQP 0-9-1 connection to `url` with channel 1 open: a client that never parses a
/// message's headers.
async fn open_raw(url: &str) -> TcpStream {
    let uri = AMQPUri::from_str(url).unwrap();
    let mut s = TcpStream::connect((uri.authority.host.as_str(), uri.authority.port))
        .await
        .unwrap();
    s.write_all(b"AMQP\x00\x00\x09\x01").await.unwrap();
    read_frame(&mut s).await; // connection.start
    let user = &uri.authority.userinfo;
    let mut start_ok = long(&[]);
    start_ok.extend(short("PLAIN"));
    start_ok.extend(long(
        format!("\0{}\0{}", user.username, user.password).as_bytes(),
    ));
    start_ok.extend(short("en_US"));
    s.write_all(&method(0, 10, 11, &start_ok)).await.unwrap();
    let (_, tune) = read_frame(&mut s).await;
    // tune-ok: the server's channel_max and frame_max, no heartbeat.
    let mut tune_ok = tune[4..10].to_vec();
    tune_ok.extend_from_slice(&[0, 0]);
    s.write_all(&method(0, 10, 31, &tune_ok)).await.unwrap();
    let mut open = short(&uri.vhost);
    open.extend(short(""));
    open.push(0);
    s.write_all(&method(0, 10, 40, &open)).await.unwrap();
    read_frame(&mut s).await; // open-ok
    s.write_all(&method(1, 20, 10, &short(""))).await.unwrap();
    read_frame(&mut s).await; // channel.open-ok
    s
}

/// Takes the message at the head of `queue` out for good (`basic.get` without ack) over raw
/// AMQP, as a tool that does not parse headers can (the broker's management API, see the
/// README's runbook); returns the size of its content header, or `None` when the queue is empty.
pub(super) async fn take_head_raw(url: &str, queue: &str) -> Option<usize> {
    let mut s = open_raw(url).await;
    let mut get = vec![0, 0];
    get.extend(short(queue));
    get.push(1); // no-ack
    s.write_all(&method(1, 60, 70, &get)).await.unwrap();
    let (kind, answer) = read_frame(&mut s).await;
    assert_eq!(kind, 1, "a method frame");
    let taken = match &answer[..4] {
        [0, 60, 0, 71] => {
            let (kind, header) = read_frame(&mut s).await;
            assert_eq!(kind, 2, "the content header");
            let size = u64::from_be_bytes(header[4..12].try_into().unwrap());
            let mut read = 0;
            while read < size {
                let (kind, body) = read_frame(&mut s).await;
                assert_eq!(kind, 3, "a body frame");
                read += body.len() as u64;
            }
            Some(header.len())
        }
        [0, 60, 0, 72] => None, // get-empty
        other => panic!("basic.get answered {other:?}"),
    };
    let _ = s.shutdown().await;
    taken
}

/// Publishes one persistent message with `headers` (an encoded table) and message id `id` to
/// `queue` through the default exchange, with publisher confirms, over raw AMQP 0-9-1.
pub(super) async fn publish_raw(url: &str, queue: &str, id: &str, headers: &[u8]) {
    let mut s = open_raw(url).await;
    s.write_all(&method(1, 85, 10, &[0])).await.unwrap();
    read_frame(&mut s).await; // confirm.select-ok
    let mut publish = vec![0, 0];
    publish.extend(short(""));
    publish.extend(short(queue));
    publish.push(1); // mandatory
    s.write_all(&method(1, 60, 40, &publish)).await.unwrap();
    let body = b"job";
    // Content header: class 60, weight 0, body size, flags headers | delivery-mode | message-id.
    let mut header = 60u16.to_be_bytes().to_vec();
    header.extend_from_slice(&[0, 0]);
    header.extend_from_slice(&(body.len() as u64).to_be_bytes());
    header.extend_from_slice(&((1u16 << 13) | (1 << 12) | (1 << 7)).to_be_bytes());
    header.extend_from_slice(headers);
    header.push(2);
    header.extend(short(id));
    s.write_all(&frame(2, 1, &header)).await.unwrap();
    s.write_all(&frame(3, 1, body)).await.unwrap();
    let (kind, answer) = read_frame(&mut s).await;
    assert_eq!(
        (kind, &answer[..4]),
        (1, &[0, 60, 0, 80][..]),
        "basic.ack expected, got {:?}",
        String::from_utf8_lossy(&answer)
    );
    let _ = s.shutdown().await;
}

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
/// `depth` deep ("too-deep") and a plain one ("behind"), and the last two to the dead-letter
/// queue as well; then reads them in a child process with `basic.get` and a worker (the work
/// queue), `dlq peek` and `replay` (the dead-letter queue). Returns what the child reported,
/// once it has exited normally.
async fn read_nested(depth: usize) -> Vec<String> {
    // A reader that waited on the lost message would end at the operation timeout (see below).
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
    publish_raw(&env.url, work, "too-deep", &nested_table(depth)).await;
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
        .env(CHILD_CONFIG, &env.toml)
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
    // Nothing lost: in the work queue, the message at the bound was read and acked, the one
    // behind the deep one was run by the worker, and the deep one was dead-lettered by the
    // broker at its delivery limit; the dead-letter queue holds it beside the two published
    // there, which the tools left where they were.
    // The deliveries of the child's last connections come back once the broker has seen them
    // close.
    wait_until(LONG, "the messages are back in their queues", || async {
        (env.depth(work).await, env.depth(dead).await) == (0, 3)
    })
    .await;
    reports
}

/// What the readers of a message nested `depth` deep report, as found against RabbitMQ 3.10:
///
/// * the message at the bound arrives whole;
/// * `basic.get` (and `dlq peek`, `dlq stats`, `replay --dry-run`, which read with it) fails:
///   lapin closes the connection on the parse error but leaves the pending get unanswered; the
///   get raced against the connection's loss ([`ConnectionWatch`]) ends with the connection's
///   error ("connection lost during get from <queue>: failed to parse ..."), not the operation
///   timeout, and the connection is closed;
/// * `replay` (a consumer) fails: "consume <queue> failed: failed to parse"; or, when lapin
///   keeps its connection open and says nothing (about half the runs at 18,000 levels), "3 of the
///   3 messages counted at the start never reached the run ..., and they are still in the queue"
///   (it used to stop at its idle timeout and report success, moving nothing);
/// * the worker reconnects onto the message (with a growing delay), never delivered, until the
///   broker dead-letters it at the work queue's delivery limit (5 here, `amqp.delivery_limit`);
///   then it runs the job behind it.
fn assert_reports(depth: usize, reports: &[String]) {
    assert_eq!(
        report(reports, "at the bound: "),
        "at-the-bound, 100 levels"
    );
    assert_eq!(report(reports, "connected after the error: "), "false");
    for reader in ["get ", "peek "] {
        let said = report(reports, reader);
        assert!(
            said.starts_with("failed: RabbitMQ connection lost during get from ")
                && said.contains("failed to parse"),
            "{depth} levels, {reader}{said}"
        );
    }
    let replay = report(reports, "replay ");
    assert!(
        replay.starts_with("failed: "),
        "{depth} levels, replay {replay}"
    );
    let worker = report(reports, "worker: ");
    let count = |what: &str| -> u64 {
        worker
            .split(", ")
            .find_map(|part| part.strip_suffix(what))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{depth} levels, no {what:?} in {worker:?}"))
    };
    // Only the message behind the deep one was delivered, after at least one reconnection.
    assert_eq!(
        (count(" deliveries"), count(" succeeded")),
        (1, 1),
        "{depth} levels: {worker}"
    );
    assert!(count(" connections") >= 2, "{depth} levels: {worker}");
}

/// 200 levels, where the debug build used to abort.
#[tokio::test]
async fn a_header_nested_200_deep_is_a_parse_error_of_its_reader_not_an_abort() {
    let reports = read_nested(200).await;
    assert_reports(200, &reports);
}

/// About the deepest a 128 KiB frame holds (7 bytes a level).
#[tokio::test]
async fn a_header_nested_18000_deep_is_a_parse_error_of_its_reader_not_an_abort() {
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
    // basic.get: the message at the bound arrives whole; the next one is a parse error.
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
    match get().await {
        Ok(got) => println!("REPORT get read: {:?}", got.map(|g| g.delivery.properties)),
        Err(e) => println!("REPORT get failed: {e}"),
    }
    println!(
        "REPORT connected after the error: {}",
        conn.status().connected()
    );
    // The worker: comes back onto the message after each reconnection, never delivered, until
    // the broker dead-letters it at the delivery limit; then runs the job behind it.
    let budget = FleetBudget::from_config(&config.budget).await.unwrap();
    let worker = Worker::new(
        budget,
        topology.clone(),
        WorkerOptions::new(&config, &topology),
    );
    let handle = worker.handle();
    let running = tokio::spawn(worker.run(|_job| async { Ok(()) }));
    wait_until(LONG, "the worker gets past the message", || {
        let counts = handle.counts();
        async move { counts.deliveries > 0 }
    })
    .await;
    handle.shutdown();
    let counts = tokio::time::timeout(LONG, running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    println!(
        "REPORT worker: {} connections, {} deliveries, {} succeeded",
        counts.connections, counts.deliveries, counts.succeeded
    );
    // The tools on the dead-letter queue.
    let peek = tokio::time::timeout(
        LONG,
        peek_queue(&broker, &topology.dead_queue, &ReplayFilter::default(), 10),
    )
    .await
    .unwrap();
    match peek {
        Ok(p) => println!("REPORT peek read {} of {}", p.seen, p.total),
        Err(e) => println!("REPORT peek failed: {e}"),
    }
    let replayer = Replayer::new(&broker, topology.clone(), None);
    let replay = tokio::time::timeout(LONG, replayer.run(&ReplayOptions::new(&config), |_| {}))
        .await
        .unwrap();
    match replay {
        Ok(r) => println!(
            "REPORT replay moved {}, seen {} of {}: {r:?}",
            r.moved, r.seen, r.total
        ),
        Err(e) => println!("REPORT replay failed: {e}"),
    }
}
