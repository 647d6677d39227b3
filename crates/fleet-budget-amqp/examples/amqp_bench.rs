//! Throughput of the RabbitMQ paths, each beside raw `lapin` publish-with-confirms measured in
//! the same run (docs/BENCHMARKS.md, "RabbitMQ (issue 4)").
//!
//! ```sh
//! cargo run --release -p fleet-budget-amqp --example amqp_bench -- [messages] [window]
//! ```
//!
//! 1. raw: `basic_publish` + confirm, `window` confirms outstanding, to a quorum queue;
//! 2. dead-letter publish: the worker's dead-letter copy (headers built, error redacted) through
//!    [`Publisher`] with confirms, same window, to the dead-letter quorum queue;
//! 3. worker dead-lettering end to end: consume, handler fails non-retryably, dead-letter copy
//!    confirmed, original acked (prefetch = window);
//! 4. unpaced replay of the dead-letter queue back to the work exchange (confirm, then ack),
//!    also beside a raw lapin "move" (consume, publish with confirm, ack) of the same messages.
//!
//! `amqp_bench exchanges [messages] [window] [rounds] [K...]` measures what the replay's first
//! move to each original exchange costs: the dead letters name K exchanges in turn (the worst
//! order: every exchange's first move comes early), and each round replays them beside, in the
//! same round, a raw lapin move of the same messages to the exchange each names (pipelined, no
//! probe, no move alone) and K probes of an exchange on a throwaway channel (what the replay asks
//! once per exchange).
//!
//! Uses `FLEET_BUDGET_AMQP_URL` or 127.0.0.1:5672, a unique prefix, and deletes what it declared.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::indexing_slicing,
    missing_docs
)]

use std::time::{Duration, Instant};

use fleet_budget::{DeadLetterReason, Failure, FleetBudget};
use fleet_budget_amqp::headers::{self, DeadLetterRecord};
use fleet_budget_amqp::publish::confirmed;
use fleet_budget_amqp::{
    Migrations, Publisher, ReplayOptions, Replayer, Topology, Worker, WorkerConfig, WorkerOptions,
    connect, delete_topology, migrate, queue_depth,
};
use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions,
    ConfirmSelectOptions, QueuePurgeOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Confirmation};

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn record(topology: &Topology, i: usize) -> DeadLetterRecord {
    DeadLetterRecord {
        task: "index_document".into(),
        dependency: "search".into(),
        reason: DeadLetterReason::BudgetExhausted,
        original_exchange: topology.work_exchange.clone(),
        original_routing_key: "index_document".into(),
        original_queue: topology.work_queue.clone(),
        attempts: 2,
        first_failure_ms: headers::now_ms(),
        dead_lettered_ms: headers::now_ms(),
        error_class: "http_503".into(),
        error: format!("search returned 503 for doc {i} (token=abc)"),
        budget: None,
        budget_source: None,
        replays: 0,
    }
}

async fn count(ch: &lapin::Channel, queue: &str) -> u32 {
    queue_depth(ch, queue).await.unwrap()
}

/// Raw lapin: publish with confirms to the parked queue (quorum, same headers), then purge.
async fn raw_publish(
    ch: &lapin::Channel,
    topology: &Topology,
    template: &FieldTable,
    body: &[u8],
    n: usize,
    window: usize,
) -> f64 {
    let start = Instant::now();
    let mut inflight = FuturesUnordered::new();
    for i in 0..n {
        let props = BasicProperties::default()
            .with_message_id(ShortString::from(format!("raw-{i}")))
            .with_delivery_mode(2)
            .with_headers(template.clone());
        let confirm = ch
            .basic_publish(
                ShortString::from(topology.parked_exchange.as_str()),
                ShortString::from("k"),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                props,
            )
            .await
            .unwrap();
        inflight.push(confirm);
        while inflight.len() >= window {
            assert!(matches!(
                inflight.next().await,
                Some(Ok(Confirmation::Ack(None)))
            ));
        }
    }
    while let Some(c) = inflight.next().await {
        assert!(matches!(c, Ok(Confirmation::Ack(None))));
    }
    let r = rate(n, start.elapsed());
    ch.queue_purge(
        ShortString::from(topology.parked_queue.as_str()),
        QueuePurgeOptions::default(),
    )
    .await
    .unwrap();
    r
}

/// Raw lapin "move": consume n messages from `from`, publish each to `to` with confirms, ack
/// after the confirm (pipelined like the replayer): the minimal equivalent of a replay.
async fn raw_ack(acker: lapin::Acker) {
    acker.ack(BasicAckOptions::default()).await.unwrap();
}

async fn raw_move(url: &str, from: &str, to: Option<&str>, n: usize, window: usize) -> f64 {
    let conn = connect(url, "bench raw move").await.unwrap();
    let consume = conn.create_channel().await.unwrap();
    let publish = conn.create_channel().await.unwrap();
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let start = Instant::now();
    let mut consumer = consume
        .basic_consume(
            ShortString::from(from),
            ShortString::from("bench-raw-move"),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut inflight = FuturesUnordered::new();
    let mut acks = FuturesUnordered::new();
    for _ in 0..n {
        let d = consumer.next().await.unwrap().unwrap();
        // Without `to`, the original exchange the dead letter names.
        let to = match to {
            Some(to) => to.to_owned(),
            None => headers::get_str(&headers::table(&d.properties), headers::ORIGINAL_EXCHANGE)
                .unwrap()
                .unwrap()
                .to_owned(),
        };
        let confirm = publish
            .basic_publish(
                ShortString::from(to),
                d.routing_key.clone(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &d.data,
                d.properties.clone(),
            )
            .await
            .unwrap();
        let acker = d.acker;
        inflight.push(async move { (acker, confirm.await) });
        while inflight.len() >= window {
            let (acker, c) = inflight.next().await.unwrap();
            assert!(matches!(c, Ok(Confirmation::Ack(None))));
            acks.push(raw_ack(acker));
        }
        while let Some(Some(_)) = acks.next().now_or_never() {}
    }
    while let Some((acker, c)) = inflight.next().await {
        assert!(matches!(c, Ok(Confirmation::Ack(None))));
        acks.push(raw_ack(acker));
    }
    while acks.next().await.is_some() {}
    let r = rate(n, start.elapsed());
    // Cancel (a round trip on the consuming channel, answered after the acks before it) and
    // close the channels before the connection: a connection close can overtake queued acks.
    consume
        .basic_cancel(
            ShortString::from("bench-raw-move"),
            BasicCancelOptions::default(),
        )
        .await
        .unwrap();
    let _ = consume.close(200, ShortString::from("bye")).await;
    let _ = publish.close(200, ShortString::from("bye")).await;
    let _ = conn.close(200, ShortString::from("bye")).await;
    r
}

/// The worker's dead-letter copy (record built, error redacted) through [`Publisher`].
async fn dead_letter_publish(
    publisher: &Publisher,
    topology: &Topology,
    body: &[u8],
    n: usize,
    window: usize,
) -> f64 {
    let start = Instant::now();
    let mut inflight = FuturesUnordered::new();
    for i in 0..n {
        let mut t = FieldTable::default();
        record(topology, i).write(&mut t);
        let props = headers::with_message_id(BasicProperties::default())
            .with_delivery_mode(2)
            .with_headers(t);
        let pending = publisher
            .send(&topology.dead_exchange, "index_document", body, props)
            .await
            .unwrap();
        inflight.push(confirmed(pending));
        while inflight.len() >= window {
            inflight.next().await.unwrap().unwrap();
        }
    }
    while let Some(c) = inflight.next().await {
        c.unwrap();
    }
    rate(n, start.elapsed())
}

/// Replays the dead-letter queue (n messages) to the work queue, unpaced.
async fn unpaced_replay(
    url: &str,
    topology: &Topology,
    config: &WorkerConfig,
    n: usize,
    window: usize,
) -> f64 {
    let replayer = Replayer::new(url.to_owned(), topology.clone(), None);
    let mut options = ReplayOptions::new(config);
    options.window = window;
    let report = replayer.run(&options, |_| {}).await.unwrap();
    assert_eq!(usize::try_from(report.moved).unwrap(), n, "{report:?}");
    rate(n, report.elapsed)
}

/// A worker consuming the work queue (n jobs), failing each non-retryably: dead-letter copy
/// confirmed, original acked.
async fn worker_dead_lettering(
    url: &str,
    topology: &Topology,
    config: &WorkerConfig,
    n: usize,
) -> f64 {
    let budget = FleetBudget::local(&config.budget);
    let worker = Worker::new(
        budget,
        topology.clone(),
        WorkerOptions {
            url: url.to_owned(),
            ..WorkerOptions::new(config, topology)
        },
    );
    let handle = worker.handle();
    let start = Instant::now();
    let join = tokio::spawn(worker.run(|_job| async { Err(Failure::non_retryable("bench")) }));
    while handle.counts().dead_lettered < n as u64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = rate(n, start.elapsed());
    handle.shutdown();
    let counts = join.await.unwrap().unwrap();
    assert_eq!(
        (counts.dead_lettered, counts.requeued, counts.ack_failed),
        (n as u64, 0, 0),
        "{counts:?}"
    );
    r
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("cleanup") {
        let url = std::env::var("FLEET_BUDGET_AMQP_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
        for prefix in args.iter().skip(2) {
            let config =
                WorkerConfig::from_toml(&format!("[amqp]\nprefix = \"{prefix}\"\n"), "cleanup")
                    .unwrap();
            delete(&url, &Topology::new(&config.amqp)).await;
        }
        return;
    }
    if args.get(1).map(String::as_str) == Some("exchanges") {
        exchanges_main(&args[2..]).await;
        return;
    }
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let window: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(256);
    let rounds: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(3).max(1);
    let url = std::env::var("FLEET_BUDGET_AMQP_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let prefix = format!("fbbench.{}", &headers::new_message_id()[..8]);
    let config = WorkerConfig::from_toml(
        &format!(
            "[amqp]\nprefix = \"{prefix}\"\nprefetch = {}\n",
            window.min(65_535)
        ),
        "bench",
    )
    .unwrap();
    let topology = Topology::new(&config.amqp);
    migrate(&url, &config.amqp, &Migrations::embedded().unwrap(), false)
        .await
        .unwrap();
    let body = vec![b'x'; 256];
    println!(
        "messages per path: {n}, window (confirms outstanding / prefetch): {window}, body: {} bytes, rounds: {rounds}",
        body.len()
    );

    // A template of dead-letter headers, for the raw publish (same bytes on the wire).
    let mut template = FieldTable::default();
    record(&topology, 0).write(&mut template);
    let conn = connect(&url, "bench raw").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let publisher = Publisher::connect(&url).await.unwrap();

    let mut rows: Vec<[f64; 5]> = Vec::new();
    for round in 1..=rounds {
        for q in [
            &topology.parked_queue,
            &topology.dead_queue,
            &topology.work_queue,
        ] {
            ch.queue_purge(ShortString::from(q.as_str()), QueuePurgeOptions::default())
                .await
                .unwrap();
        }
        let raw_a = raw_publish(&ch, &topology, &template, &body, n, window).await;
        let dl = dead_letter_publish(&publisher, &topology, &body, n, window).await;
        let moved = raw_move(
            &url,
            &topology.dead_queue,
            Some(&topology.work_exchange),
            n,
            window,
        )
        .await;
        let worker = worker_dead_lettering(&url, &topology, &config, n).await;
        let in_dead = count(&ch, &topology.dead_queue).await as usize;
        let in_work = count(&ch, &topology.work_queue).await as usize;
        assert_eq!(
            (in_dead, in_work),
            (n, 0),
            "dead-letter and work queue depths after the worker"
        );
        let replay = unpaced_replay(&url, &topology, &config, n, window).await;
        let raw_b = raw_publish(&ch, &topology, &template, &body, n, window).await;
        let raw = raw_a.max(raw_b);
        println!(
            "round {round}: raw {raw_a:.0} / {raw_b:.0} msg/s | dead-letter publish {dl:.0} ({:.0}%) | unpaced replay {replay:.0} ({:.0}%; raw move {moved:.0}) | worker consume+dead-letter+ack {worker:.0} ({:.0}%)",
            100.0 * dl / raw,
            100.0 * replay / raw,
            100.0 * worker / raw
        );
        rows.push([raw, dl, replay, worker, moved]);
    }
    let median = |i: usize| {
        let mut v: Vec<f64> = rows.iter().map(|r| r[i]).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let raw = median(0);
    println!("median of {rounds} rounds (raw = the faster of the two raw runs of a round):");
    println!("  raw lapin publish+confirm        {:>8.0} msg/s", raw);
    println!(
        "  dead-letter publish+confirm      {:>8.0} msg/s  {:>4.0}% of raw",
        median(1),
        100.0 * median(1) / raw
    );
    println!(
        "  unpaced replay (confirm, ack)    {:>8.0} msg/s  {:>4.0}% of raw",
        median(2),
        100.0 * median(2) / raw
    );
    println!(
        "  worker consume+dead-letter+ack   {:>8.0} msg/s  {:>4.0}% of raw",
        median(3),
        100.0 * median(3) / raw
    );

    println!(
        "  raw lapin move (consume, publish+confirm, ack) {:>8.0} msg/s: the replay's minimal equivalent; replay is {:.0}% of it",
        median(4),
        100.0 * median(2) / median(4)
    );

    publisher.close().await;
    let _ = conn.close(200, ShortString::from("bench done")).await;
    delete(&url, &topology).await;
}

/// Deletes what the bench declared (also `amqp_bench cleanup PREFIX...` after an aborted run).
async fn delete(url: &str, topology: &Topology) {
    let conn = connect(url, "bench cleanup").await.unwrap();
    delete_topology(&conn, topology).await.unwrap();
    let _ = conn.close(200, ShortString::from("cleaned")).await;
}

/// `amqp_bench exchanges [messages] [window] [rounds] [K...]` (see the module documentation).
async fn exchanges_main(args: &[String]) {
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let window: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(3).max(1);
    let mut ks: Vec<usize> = args.iter().skip(3).filter_map(|a| a.parse().ok()).collect();
    if ks.is_empty() {
        ks = vec![1, 10, 100, 1000];
    }
    let most = ks.iter().copied().max().unwrap_or(1).max(1);
    let url = std::env::var("FLEET_BUDGET_AMQP_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let prefix = format!("fbbench.{}", &headers::new_message_id()[..8]);
    let config = WorkerConfig::from_toml(
        &format!(
            "[amqp]\nprefix = \"{prefix}\"\nprefetch = {}\n",
            window.min(65_535)
        ),
        "bench",
    )
    .unwrap();
    let topology = Topology::new(&config.amqp);
    migrate(&url, &config.amqp, &Migrations::embedded().unwrap(), false)
        .await
        .unwrap();
    let conn = connect(&url, "bench exchanges").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    // The original exchanges: direct, each bound to the work queue by the jobs' routing key.
    let names: Vec<String> = (0..most).map(|j| format!("{prefix}.x{j}")).collect();
    for name in &names {
        ch.exchange_declare(
            ShortString::from(name.as_str()),
            lapin::ExchangeKind::Direct,
            lapin::options::ExchangeDeclareOptions {
                durable: true,
                ..lapin::options::ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        ch.queue_bind(
            ShortString::from(topology.work_queue.as_str()),
            ShortString::from(name.as_str()),
            ShortString::from("index_document"),
            lapin::options::QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
    let publisher = Publisher::connect(&url).await.unwrap();
    let body = vec![b'x'; 256];
    println!(
        "messages per run: {n}, window / prefetch: {window}, body: {} bytes, rounds: {rounds}, original exchanges named in turn: {ks:?}",
        body.len()
    );
    // Seeds `n` dead letters naming the first `k` exchanges in turn.
    let seed = async |k: usize| {
        let mut inflight = FuturesUnordered::new();
        for i in 0..n {
            let mut r = record(&topology, i);
            r.original_exchange.clone_from(&names[i % k]);
            let mut t = FieldTable::default();
            r.write(&mut t);
            let props = headers::with_message_id(BasicProperties::default())
                .with_delivery_mode(2)
                .with_headers(t);
            let pending = publisher
                .send(&topology.dead_exchange, "index_document", &body, props)
                .await
                .unwrap();
            inflight.push(confirmed(pending));
            while inflight.len() >= window {
                inflight.next().await.unwrap().unwrap();
            }
        }
        while let Some(c) = inflight.next().await {
            c.unwrap();
        }
    };
    let purge = async |q: &str| {
        ch.queue_purge(ShortString::from(q), QueuePurgeOptions::default())
            .await
            .unwrap();
    };
    // rows[k index] = per round (replay, raw move, probes per second)
    let mut rows: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); ks.len()];
    for round in 1..=rounds {
        for (i, &k) in ks.iter().enumerate() {
            purge(&topology.dead_queue).await;
            purge(&topology.work_queue).await;
            seed(k).await;
            let moved = raw_move(&url, &topology.dead_queue, None, n, window).await;
            assert_eq!(count(&ch, &topology.work_queue).await as usize, n);
            purge(&topology.work_queue).await;
            seed(k).await;
            let replay = unpaced_replay(&url, &topology, &config, n, window).await;
            assert_eq!(count(&ch, &topology.work_queue).await as usize, n);
            let probes = probe_rate(&conn, &names[..k]).await;
            println!(
                "round {round}, {k:>4} exchanges: replay {replay:>6.0} msg/s | raw move {moved:>6.0} msg/s ({:>3.0}%) | {k} probes at {probes:>5.0}/s ({:.0} ms)",
                100.0 * replay / moved,
                1000.0 * k as f64 / probes,
            );
            rows[i].push((replay, moved, probes));
        }
    }
    println!("median of {rounds} rounds:");
    for (i, &k) in ks.iter().enumerate() {
        let median = |f: fn(&(f64, f64, f64)) -> f64| {
            let mut v: Vec<f64> = rows[i].iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (replay, moved, probes) = (median(|r| r.0), median(|r| r.1), median(|r| r.2));
        println!(
            "  {k:>4} exchanges: replay {replay:>6.0} msg/s, raw move {moved:>6.0} msg/s, replay/raw {:>3.0}%; replay run {:>6.0} ms of which probes ~{:>5.0} ms",
            100.0 * replay / moved,
            1000.0 * n as f64 / replay,
            1000.0 * k as f64 / probes,
        );
    }
    publisher.close().await;
    for name in &names {
        let _ = ch
            .exchange_delete(
                ShortString::from(name.as_str()),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await;
    }
    let _ = conn.close(200, ShortString::from("bench done")).await;
    delete(&url, &topology).await;
}

/// Probes per second: each of `names` asked on a throwaway channel (open, passive declare,
/// close), one after another, as the replay asks each original exchange once per run.
async fn probe_rate(conn: &lapin::Connection, names: &[String]) -> f64 {
    let start = Instant::now();
    for name in names {
        let probe = conn.create_channel().await.unwrap();
        probe
            .exchange_declare(
                ShortString::from(name.as_str()),
                lapin::ExchangeKind::Direct,
                lapin::options::ExchangeDeclareOptions {
                    passive: true,
                    ..lapin::options::ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        let _ = probe.close(200, ShortString::from("probed")).await;
    }
    rate(names.len(), start.elapsed())
}
