//! Benchmark 5 (`amqp_bench exchanges`): what the replay's first move to each original
//! exchange costs, beside a raw move of the same messages and the probes alone.

use std::time::Instant;

use fleet_budget_amqp::headers;
use fleet_budget_amqp::publish::confirmed;
use fleet_budget_amqp::{Migrations, Publisher, Topology, WorkerConfig, connect, migrate};
use futures::stream::{FuturesUnordered, StreamExt};
use lapin::BasicProperties;
use lapin::options::QueuePurgeOptions;
use lapin::types::{FieldTable, ShortString};

use crate::dead_letter::record;
use crate::raw::raw_move;
use crate::replay::unpaced_replay;
use crate::{count, delete, rate};

/// `amqp_bench exchanges [messages] [window] [rounds] [K...]` (see the module documentation).
pub(crate) async fn run(args: &[String]) {
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
pub(crate) async fn probe_rate(conn: &lapin::Connection, names: &[String]) -> f64 {
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
