//! Looking at the broker without changing it: passive declares (does a queue or exchange exist,
//! how many messages does a queue hold) and the broker's refusal text when a declaration differs
//! from what exists.
//!
//! A passive declare of something absent is answered `NOT_FOUND` and closes the channel: callers
//! that go on afterwards open another channel (the migration's probe and the replayer do).

use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, ExchangeKind};

use super::names::{Topology, amqp_name};
use crate::connection::{ConnectionConfig, Timeouts, connect, process_wide};
use crate::error::{AmqpError, ArgumentDifference, protocol_message};

/// The broker's reply code for something absent.
pub(crate) const NOT_FOUND: u16 = 404;
/// The broker's reply code for a declaration that differs from what exists.
pub(crate) const PRECONDITION_FAILED: u16 = 406;

/// Ready messages in `queue` (a passive declare on `channel`), within the default deadline
/// ([`queue_depth_within`] takes the connection's).
///
/// # Errors
/// The queue does not exist (the broker then closes `channel`) or the channel failed.
pub async fn queue_depth(channel: &Channel, queue: &str) -> Result<u32, AmqpError> {
    queue_depth_within(channel, queue, process_wide().0).await
}

/// Ready messages in `queue` (a passive declare on `channel`) within the operation deadline of
/// `timeouts`.
///
/// # Errors
/// The queue does not exist (the broker then closes `channel`) or the channel failed.
pub async fn queue_depth_within(
    channel: &Channel,
    queue: &str,
    timeouts: Timeouts,
) -> Result<u32, AmqpError> {
    declare_queue_passively(channel, queue, timeouts)
        .await?
        .map_err(|e| AmqpError::broker(format!("inspect queue {queue}"), e))
}

/// Whether `queue` exists. After `false`, `channel` is closed.
///
/// # Errors
/// The channel failed for another reason.
pub(crate) async fn queue_exists(
    channel: &Channel,
    queue: &str,
    timeouts: Timeouts,
) -> Result<bool, AmqpError> {
    match declare_queue_passively(channel, queue, timeouts).await? {
        Ok(_) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(AmqpError::broker(format!("check queue {queue}"), e)),
    }
}

/// Whether `exchange` exists (the default exchange and `amq.*` always do). After `false`,
/// `channel` is closed.
///
/// # Errors
/// The name is not an AMQP name, or the channel failed for another reason.
pub(crate) async fn exchange_exists(
    channel: &Channel,
    exchange: &str,
    timeouts: Timeouts,
) -> Result<bool, AmqpError> {
    if exchange.is_empty() || exchange.starts_with("amq.") {
        return Ok(true);
    }
    let opts = ExchangeDeclareOptions {
        passive: true,
        ..ExchangeDeclareOptions::default()
    };
    let name = amqp_name("exchange", exchange)?;
    match timeouts
        .deadline(
            format!("check exchange {exchange}"),
            channel.exchange_declare(name, ExchangeKind::Direct, opts, FieldTable::default()),
        )
        .await?
    {
        Ok(()) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(AmqpError::broker(format!("check exchange {exchange}"), e)),
    }
}

/// The one passive queue declare: the outer error is a bad name, the inner the broker's answer.
async fn declare_queue_passively(
    channel: &Channel,
    queue: &str,
    timeouts: Timeouts,
) -> Result<Result<u32, lapin::Error>, AmqpError> {
    let name = amqp_name("queue", queue)?;
    let opts = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    Ok(timeouts
        .deadline(
            format!("inspect queue {queue}"),
            channel.queue_declare(name, opts, FieldTable::default()),
        )
        .await?
        .map(|q| q.message_count()))
}

fn is_not_found(e: &lapin::Error) -> bool {
    protocol_message(e).is_some_and(|(code, _)| code == NOT_FOUND)
}

/// Ready messages in each queue of a topology (`budgetctl dlq stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueDepths {
    /// The work queue.
    pub work: u32,
    /// The dead-letter queue.
    pub dead: u32,
    /// The parked queue.
    pub parked: u32,
    /// Each retry tier queue, shortest first.
    pub retry: Vec<(String, u32)>,
}

impl QueueDepths {
    /// Reads the depth of every queue of `topology` on `channel`, within the default deadline
    /// ([`QueueDepths::read_within`] takes the connection's).
    ///
    /// # Errors
    /// A queue does not exist (run [`super::migrate`]) or the channel failed.
    pub async fn read(channel: &Channel, topology: &Topology) -> Result<Self, AmqpError> {
        Self::read_within(channel, topology, process_wide().0).await
    }

    /// Reads the depth of every queue of `topology` on `channel`, each within the operation
    /// deadline of `timeouts`.
    ///
    /// # Errors
    /// A queue does not exist (run [`super::migrate`]) or the channel failed.
    pub async fn read_within(
        channel: &Channel,
        topology: &Topology,
        timeouts: Timeouts,
    ) -> Result<Self, AmqpError> {
        let depth = |queue| queue_depth_within(channel, queue, timeouts);
        let mut d = Self {
            work: depth(&topology.work_queue).await?,
            dead: depth(&topology.dead_queue).await?,
            parked: depth(&topology.parked_queue).await?,
            retry: Vec::new(),
        };
        for t in &topology.retry_tiers {
            d.retry.push((t.queue.clone(), depth(&t.queue).await?));
        }
        Ok(d)
    }

    /// Messages waiting for a worker: the work queue and every retry tier.
    #[must_use]
    pub fn waiting(&self) -> u64 {
        u64::from(self.work) + self.retry.iter().map(|(_, n)| u64::from(*n)).sum::<u64>()
    }
}

/// Reads the depth (ready messages) of every queue of `topology`, on a connection of its own to
/// the broker of `to` (a [`ConnectionConfig`], or a bare URL).
///
/// # Errors
/// The broker cannot be reached or a queue does not exist (run [`super::migrate`]).
pub async fn queue_depths(
    to: impl Into<ConnectionConfig>,
    topology: &Topology,
) -> Result<QueueDepths, AmqpError> {
    let to = to.into();
    let t = to.timeouts;
    let conn = connect(&to, "fleet-budget queue depths").await?;
    let result = async {
        let ch = t.within("open a channel", conn.create_channel()).await?;
        QueueDepths::read_within(&ch, topology, t).await
    }
    .await;
    t.close_connection(&conn, "bye").await;
    result
}

/// What the broker said the existing object has.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Existing {
    /// The argument is absent.
    None,
    /// A property flag (`durable`).
    Flag(bool),
    /// An argument value.
    Value(AMQPValue),
    /// Something this parser does not know.
    Unknown,
}

/// Parses `PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in vhost
/// '/': received the value '50' of type 'long' but current is none`.
pub(crate) fn parse_inequivalent(text: &str) -> Option<(ArgumentDifference, Existing)> {
    let rest = text.split("inequivalent arg '").nth(1)?;
    let (argument, rest) = rest.split_once('\'')?;
    let rest = rest.split_once(": received ")?.1;
    let (received, current) = rest.split_once(" but current is ")?;
    let existing = parse_side(current);
    let difference = ArgumentDifference {
        argument: argument.to_owned(),
        declared: describe(received),
        existing: describe(current),
    };
    Some((difference, existing))
}

fn describe(side: &str) -> String {
    match side_parts(side) {
        Some((value, ty)) => format!("{value} ({ty})"),
        None => side.trim().trim_matches('\'').to_owned(),
    }
}

fn side_parts(side: &str) -> Option<(&str, &str)> {
    let rest = side.trim().strip_prefix("the value '")?;
    let (value, rest) = rest.rsplit_once("' of type '")?;
    Some((value, rest.trim_end_matches('\'')))
}

fn parse_side(side: &str) -> Existing {
    let s = side.trim();
    if s == "none" {
        return Existing::None;
    }
    match s.trim_matches('\'') {
        "true" if !s.starts_with("the value") => return Existing::Flag(true),
        "false" if !s.starts_with("the value") => return Existing::Flag(false),
        _ => {}
    }
    let Some((value, ty)) = side_parts(s) else {
        // Numbers are printed bare: `received '50' but current is '5'`. The broker compares
        // integers by value across widths, so a long stands for any of them.
        return s.trim_matches('\'').parse().map_or(Existing::Unknown, |i| {
            Existing::Value(AMQPValue::LongLongInt(i))
        });
    };
    let v = match ty {
        "longstr" => AMQPValue::LongString(LongString::from(value)),
        "long" => value
            .parse()
            .map_or(AMQPValue::Void, AMQPValue::LongLongInt),
        "signedint" => value.parse().map_or(AMQPValue::Void, AMQPValue::LongInt),
        "short" => value.parse().map_or(AMQPValue::Void, AMQPValue::ShortInt),
        "byte" => value
            .parse()
            .map_or(AMQPValue::Void, AMQPValue::ShortShortInt),
        "bool" => AMQPValue::Boolean(value == "true"),
        _ => return Existing::Unknown,
    };
    if v == AMQPValue::Void {
        Existing::Unknown
    } else {
        Existing::Value(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_refusals_are_parsed() {
        let (d, e) = parse_inequivalent("PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/': received the value '50' of type 'long' but current is the value '5' of type 'long'").unwrap();
        assert_eq!(d.argument, "x-delivery-limit");
        assert_eq!(d.declared, "50 (long)");
        assert_eq!(d.existing, "5 (long)");
        assert_eq!(e, Existing::Value(AMQPValue::LongLongInt(5)));
        let (d, e) = parse_inequivalent("PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received the value 'quorum' of type 'longstr' but current is none").unwrap();
        assert_eq!((d.existing.as_str(), e), ("none", Existing::None));
        let (d, e) = parse_inequivalent("PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'").unwrap();
        assert_eq!((d.argument.as_str(), e), ("durable", Existing::Flag(false)));
        assert!(parse_inequivalent("PRECONDITION_FAILED - something else").is_none());
        let (d, e) = parse_inequivalent("PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/': received '50' but current is '5'").unwrap();
        assert_eq!((d.declared.as_str(), d.existing.as_str()), ("50", "5"));
        assert_eq!(e, Existing::Value(AMQPValue::LongLongInt(5)));
    }
}
