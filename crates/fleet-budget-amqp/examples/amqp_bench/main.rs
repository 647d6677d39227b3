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
//!
//! One file per benchmark: `raw.rs` (1, and the raw move), `dead_letter.rs` (2), `worker.rs`
//! (3), `replay.rs` (4), `exchanges.rs` (5); this file runs 1–4 in rounds and prints them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::indexing_slicing,
    missing_docs
)]

mod dead_letter;
mod exchanges;
mod raw;
mod replay;
mod worker;

use std::time::Duration;

use fleet_budget_amqp::headers;
use fleet_budget_amqp::{
    Migrations, Publisher, Topology, WorkerConfig, connect, delete_topology, migrate, queue_depth,
};
use lapin::options::{ConfirmSelectOptions, QueuePurgeOptions};
use lapin::types::{FieldTable, ShortString};

use crate::dead_letter::{dead_letter_publish, record};
use crate::raw::{raw_move, raw_publish};
use crate::replay::unpaced_replay;
use crate::worker::worker_dead_lettering;

pub(crate) fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

pub(crate) async fn count(ch: &lapin::Channel, queue: &str) -> u32 {
    queue_depth(ch, queue).await.unwrap()
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
        exchanges::run(&args[2..]).await;
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
pub(crate) async fn delete(url: &str, topology: &Topology) {
    let conn = connect(url, "bench cleanup").await.unwrap();
    delete_topology(&conn, topology).await.unwrap();
    let _ = conn.close(200, ShortString::from("cleaned")).await;
}
