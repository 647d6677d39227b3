//! The reference: raw `lapin`, publish with confirms (benchmark 1) and a move (consume,
//! publish with confirm, ack: what a replay minimally does, beside benchmarks 4 and 5).

use std::time::Instant;

use fleet_budget_amqp::headers;
use fleet_budget_amqp::{Topology, connect};
use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions,
    ConfirmSelectOptions, QueuePurgeOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Confirmation};

use crate::rate;

/// Raw lapin: publish with confirms to the parked queue (quorum, same headers), then purge.
pub(crate) async fn raw_publish(
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
pub(crate) async fn raw_ack(acker: lapin::Acker) {
    acker.ack(BasicAckOptions::default()).await.unwrap();
}

pub(crate) async fn raw_move(
    url: &str,
    from: &str,
    to: Option<&str>,
    n: usize,
    window: usize,
) -> f64 {
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
