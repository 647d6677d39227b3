//! The channels of a replay run's first moves to an exchange (`exchanges` says why): a scout, a
//! channel of its own that asks, moves and closes in flight with the other copies; and, when the
//! run moves one message at a time, the throwaway channel that asks once whether an exchange
//! exists.

use std::collections::HashMap;
use std::time::Duration;

use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel, ConnectionStatus, ExchangeKind};

use crate::connection::{Timeouts, unless_blocked};
use crate::publish::{PublishError, Publisher, confirmed};
use crate::topology::inspect::exchange_exists;

/// A scout's channel: a channel of its own on the moves' connection, for the first move to an
/// exchange not proven yet (see `exchanges`). `None` when it cannot be opened (logged).
pub(super) async fn open_scout(publisher: &Publisher) -> Option<Channel> {
    let conn = publisher.connection()?;
    let opened = publisher
        .timeouts()
        .within("open a channel for a first move", conn.create_channel())
        .await;
    match opened {
        Ok(ch) => Some(ch),
        Err(e) => {
            tracing::warn!(error = %e, "no channel of its own for a first move; it goes alone on the moves' channel");
            None
        }
    }
}

/// A scout: the first move to `exchange`, alone on `ch`. Asks whether the exchange exists (a
/// passive declare: `404` when it does not, which closes `ch` and is learnt as a refusal), selects
/// confirms, publishes, awaits the confirm, and closes `ch` (unless the broker closed it). Every
/// step is bounded by the operation timeout of `t` (the connection's), counting only time the
/// connection of `status` is not blocked by a resource alarm (`connection::unless_blocked`): a
/// copy whose deadline passed while lapin held it would be written after the alarm all the same,
/// while its dead letter, taken for not moved, stays (a copy in the work queue and its original
/// in the dead-letter queue, found on a private node under a memory alarm).
pub(super) async fn scout_move(
    t: Timeouts,
    status: Option<ConnectionStatus>,
    ch: Channel,
    exchange: String,
    routing_key: String,
    data: Vec<u8>,
    properties: BasicProperties,
) -> Result<(), PublishError> {
    let after = t.operation;
    let status = status.as_ref();
    // The publish and its confirm are bounded here as a whole, blocks not counted; the
    // publisher's own deadline is set out of the way.
    let unbounded = Timeouts {
        operation: HELD_AT_MOST,
        ..t
    };
    let moved = async {
        // The default exchange and `amq.` names are taken on trust, as the existence check does.
        if !(exchange.is_empty() || exchange.starts_with("amq.")) {
            let passive = ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            };
            let name = ShortString::try_new(exchange.as_str())
                .map_err(|e| PublishError::InvalidName(e.to_string()))?;
            let declared =
                ch.exchange_declare(name, ExchangeKind::Direct, passive, FieldTable::default());
            bounded(status, &exchange, after, declared).await?;
        }
        bounded(
            status,
            &exchange,
            after,
            ch.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        let copy = async {
            let pending = Publisher::on_channel(ch.clone(), unbounded)
                .send(&exchange, &routing_key, &data, properties)
                .await?;
            confirmed(pending).await
        };
        match waiting_out_blocks(status, after, copy).await {
            Some(done) => done,
            None => Err(PublishError::Timeout {
                exchange: exchange.clone(),
                after,
            }),
        }
    }
    .await;
    if ch.status().connected() {
        let _ =
            tokio::time::timeout(after, ch.close(200, ShortString::from("first move done"))).await;
    }
    moved
}

/// The longest a scout's publish and confirm may be held by lapin behind a block: a day, far
/// past any alarm one waits out (the step's own deadline counts unblocked time only).
const HELD_AT_MOST: Duration = Duration::from_secs(24 * 3600);

/// `step` within `after` of time the connection of `status` is not blocked (all of it without a
/// status); `None` when the deadline passed.
async fn waiting_out_blocks<F: Future>(
    status: Option<&ConnectionStatus>,
    after: Duration,
    step: F,
) -> Option<F::Output> {
    match status {
        Some(status) => unless_blocked(status, after, step).await,
        None => tokio::time::timeout(after, step).await.ok(),
    }
}

/// `step` on a scout's channel, bounded by `after` (blocks not counted), its failure a
/// [`PublishError`] of `exchange`.
async fn bounded(
    status: Option<&ConnectionStatus>,
    exchange: &str,
    after: Duration,
    step: impl Future<Output = lapin::Result<()>>,
) -> Result<(), PublishError> {
    match waiting_out_blocks(status, after, step).await {
        Some(Ok(())) => Ok(()),
        Some(Err(source)) => Err(PublishError::Channel {
            exchange: exchange.to_owned(),
            source,
        }),
        None => Err(PublishError::Timeout {
            exchange: exchange.to_owned(),
            after,
        }),
    }
}

/// Whether the original exchange `name` exists, asked once per exchange and run.
pub(super) async fn original_exchange_exists(
    publisher: &Publisher,
    name: &str,
    known: &mut HashMap<String, bool>,
) -> bool {
    if let Some(exists) = known.get(name) {
        return *exists;
    }
    // A publish to a missing exchange would close the channel under every pipelined copy:
    // ask on a throwaway channel (a missing exchange closes it).
    let Some(conn) = publisher.connection() else {
        return true;
    };
    let t = publisher.timeouts();
    let Ok(probe) = t
        .within("open a channel to probe an exchange", conn.create_channel())
        .await
    else {
        return true;
    };
    let exists = exchange_exists(&probe, name, t).await.unwrap_or(false);
    if exists {
        t.close_channel(&probe, "probed").await;
    }
    known.insert(name.to_owned(), exists);
    exists
}
