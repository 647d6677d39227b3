//! Benchmark 2: the worker's dead-letter copy (headers built, error redacted) published
//! through [`Publisher`] with confirms.

use std::time::Instant;

use fleet_budget::DeadLetterReason;
use fleet_budget_amqp::headers::{self, DeadLetterRecord};
use fleet_budget_amqp::publish::confirmed;
use fleet_budget_amqp::{Publisher, Topology};
use futures::stream::{FuturesUnordered, StreamExt};
use lapin::BasicProperties;
use lapin::types::FieldTable;

use crate::rate;

pub(crate) fn record(topology: &Topology, i: usize) -> DeadLetterRecord {
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

/// The worker's dead-letter copy (record built, error redacted) through [`Publisher`].
pub(crate) async fn dead_letter_publish(
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
