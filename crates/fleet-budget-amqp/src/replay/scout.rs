//! The channels of a replay run's first moves to an exchange (`exchanges` says why): a scout, a
//! channel of its own that asks, moves and closes in flight with the other copies; and, when the
//! run moves one message at a time, the throwaway channel that asks once whether an exchange
//! exists.

use std::collections::HashMap;
use std::time::Duration;

use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel, ExchangeKind};

use crate::connection::Timeouts;
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
/// step is bounded by the operation timeout of `t` (the connection's).
pub(super) async fn scout_move(
    t: Timeouts,
    ch: Channel,
    exchange: String,
    routing_key: String,
    data: Vec<u8>,
    properties: BasicProperties,
) -> Result<(), PublishError> {
    let after = t.operation;
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
            bounded(&exchange, after, declared).await?;
        }
        bounded(
            &exchange,
            after,
            ch.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        let pending = Publisher::on_channel(ch.clone(), t)
            .send(&exchange, &routing_key, &data, properties)
            .await?;
        confirmed(pending).await
    }
    .await;
    if ch.status().connected() {
        let _ =
            tokio::time::timeout(after, ch.close(200, ShortString::from("first move done"))).await;
    }
    moved
}

/// `step` on a scout's channel, bounded by `after`, its failure a [`PublishError`] of `exchange`.
async fn bounded(
    exchange: &str,
    after: Duration,
    step: impl Future<Output = lapin::Result<()>>,
) -> Result<(), PublishError> {
    match tokio::time::timeout(after, step).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(PublishError::Channel {
            exchange: exchange.to_owned(),
            source,
        }),
        Err(_) => Err(PublishError::Timeout {
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
