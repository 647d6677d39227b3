//! Publishing with publisher confirms: a message counts as delivered only when the broker
//! answered `Ack` and did not return it (every publish is `mandatory`, so an unroutable message
//! comes back instead of vanishing).

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionStatus, PublisherConfirm,
};
use tokio::sync::Mutex;

use crate::connection::{ConnectionConfig, Timeouts, connect, unless_blocked};
use crate::error::AmqpError;
use crate::headers;

/// Why a publish is not known to be delivered. The caller must not ack the original.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The channel or connection failed (e.g. the exchange does not exist: the broker closed
    /// the channel).
    #[error("publish to {exchange:?} failed: {source}")]
    Channel {
        /// The exchange.
        exchange: String,
        /// Why.
        source: lapin::Error,
    },
    /// The broker refused it (`Nack`).
    #[error("the broker refused the message published to {exchange:?} (nack)")]
    Nacked {
        /// The exchange.
        exchange: String,
    },
    /// The broker returned it: no queue is bound for its routing key.
    #[error("the message published to {exchange:?} with key {routing_key:?} was returned: {reply}")]
    Returned {
        /// The exchange.
        exchange: String,
        /// The routing key.
        routing_key: String,
        /// The broker's reply (`312 NO_ROUTE`).
        reply: String,
    },
    /// A name too long for AMQP.
    #[error("{0}")]
    InvalidName(String),
    /// The broker did not confirm (or open the channel) within the operation deadline
    /// ([`crate::connection::Timeouts::operation`]): not known to be delivered. For a publisher
    /// that waits out blocks ([`Publisher::waiting_out_blocks`]), time spent while the broker
    /// blocked the connection does not count.
    #[error("publish to {exchange:?}: no answer from the broker within {after:?}")]
    Timeout {
        /// The exchange.
        exchange: String,
        /// The deadline.
        after: std::time::Duration,
    },
}

impl PublishError {
    /// Whether publishing the same message again can never succeed: a name over 255 bytes, or
    /// the broker refusing the message itself (`PRECONDITION_FAILED`, e.g. over its maximum
    /// message size; a frame it cannot parse). A caller parks such a message in a form that can
    /// be published instead of trying again; anything else is transient and backs off.
    #[must_use]
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::InvalidName(_) => true,
            Self::Channel { source, .. } => crate::error::protocol_message(source)
                .is_some_and(|(code, _)| matches!(code, 406 | 501 | 502 | 505)),
            Self::Nacked { .. } | Self::Returned { .. } | Self::Timeout { .. } => false,
        }
    }
}

/// Bytes a copy fitted by [`Publisher::fit`] leaves free in its frame for the header the broker
/// adds when it delivers the copy: `x-delivery-count` (26 bytes) on a quorum queue's
/// `basic.get` or redelivery. lapin takes a delivery over `frame_max` for a frame error and
/// closes the connection, so a copy that filled the frame could be published but never read.
pub const DELIVERY_ROOM: usize = 32;

/// `properties` fitted to a frame of `frame_max` bytes (as negotiated), [`DELIVERY_ROOM`] kept
/// free: see [`Publisher::fit`].
#[must_use]
pub fn fit_copy(properties: BasicProperties, frame_max: usize) -> BasicProperties {
    headers::fit_frame(properties, frame_max.saturating_sub(DELIVERY_ROOM))
}

/// The longest AMQP short string (exchange names, routing keys), in bytes.
pub const SHORT_STRING_MAX: usize = 255;

/// `routing_key` for a fanout exchange (which ignores it): itself when it is a valid short
/// string, else empty (the original stays in its long-string header).
#[must_use]
pub fn fanout_key(routing_key: &str) -> &str {
    if routing_key.len() <= SHORT_STRING_MAX {
        routing_key
    } else {
        ""
    }
}

/// A publisher with confirms on its own channel, reopened when the broker closes it.
///
/// Cheap to share: publishes from many tasks are pipelined on the channel.
#[derive(Debug)]
pub struct Publisher {
    connection: Option<Connection>,
    channel: Mutex<Option<Channel>>,
    opener: ChannelSource,
    /// The deadlines of opening the channel, each publish and each confirm.
    timeouts: Timeouts,
    /// Whether those deadlines stop while the broker blocks the connection
    /// ([`Publisher::waiting_out_blocks`]).
    wait_out_blocks: bool,
}

#[derive(Debug)]
enum ChannelSource {
    Own,
    Borrowed(Channel),
}

impl Publisher {
    /// Connects to the broker of `to` (a [`ConnectionConfig`], or a bare URL) with a
    /// connection of its own, and keeps its deadlines.
    ///
    /// # Errors
    /// The broker cannot be reached.
    pub async fn connect(to: impl Into<ConnectionConfig>) -> Result<Self, AmqpError> {
        let to = to.into();
        let connection = connect(&to, "fleet-budget publisher").await?;
        Ok(Self::on(connection, to.timeouts))
    }

    /// A publisher on an existing connection (the worker's and the replayer's), with its
    /// deadlines.
    pub(crate) fn on(connection: Connection, timeouts: Timeouts) -> Self {
        Self {
            connection: Some(connection),
            channel: Mutex::new(None),
            opener: ChannelSource::Own,
            timeouts,
            wait_out_blocks: false,
        }
    }

    /// The publisher, its deadlines running only while the broker does not block its
    /// connection (a memory or disk alarm: `connection.blocked`; see
    /// [`crate::connection::unless_blocked`]). lapin writes nothing on a
    /// blocked connection and writes what it holds once the alarm clears: a publish timed out
    /// meanwhile is published all the same, so a caller that took the timeout for "not
    /// delivered" and sent the message again, or requeued the job it copies, makes a duplicate.
    /// Waiting out the block, a publish fails only on a connection that is not blocked and does
    /// not answer, or on its loss. The worker's copies are published so; a publisher on a
    /// borrowed channel ([`Publisher::on_channel`]) has no connection to watch and is not
    /// changed. Such a publisher also replaces a channel on which the broker nacked a publish
    /// (RabbitMQ 3.10 goes on nacking there after a quorum queue's `reject-publish` limit is
    /// gone).
    #[must_use]
    pub fn waiting_out_blocks(mut self) -> Self {
        self.wait_out_blocks = true;
        self
    }

    /// The state of the connection whose blocks the deadlines wait out, if they do.
    fn blockable(&self) -> Option<ConnectionStatus> {
        self.connection
            .as_ref()
            .filter(|_| self.wait_out_blocks)
            .map(|c| c.status().clone())
    }

    /// `step` within `after`, not counting time blocked when the publisher waits out blocks.
    async fn bounded<F: std::future::Future>(
        status: Option<&ConnectionStatus>,
        after: std::time::Duration,
        step: F,
    ) -> Option<F::Output> {
        match status {
            Some(status) => unless_blocked(status, after, step).await,
            None => tokio::time::timeout(after, step).await.ok(),
        }
    }

    /// A publisher on a channel already in confirm mode, with the deadlines of its connection:
    /// a replay's scout (a first move to an exchange, alone on its channel), a look's copies,
    /// and the benchmarks.
    #[doc(hidden)]
    #[must_use]
    pub fn on_channel(channel: Channel, timeouts: Timeouts) -> Self {
        Self {
            connection: None,
            channel: Mutex::new(Some(channel.clone())),
            opener: ChannelSource::Borrowed(channel),
            timeouts,
            wait_out_blocks: false,
        }
    }

    /// The deadlines of this publisher's steps (those of its connection).
    #[must_use]
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// The largest frame the connection takes (`frame_max` as negotiated), when the publisher
    /// owns one: a message's properties must fit one frame ([`headers::fit_frame`]).
    #[must_use]
    pub fn frame_max(&self) -> Option<usize> {
        let n = self.connection.as_ref()?.configuration().frame_max();
        usize::try_from(n).ok().filter(|n| *n > 0)
    }

    /// `properties` fitted to one frame of the publisher's connection, [`DELIVERY_ROOM`] kept
    /// free ([`headers::fit_frame`]): a copy can be larger than the message it copies, and a
    /// header frame over `frame_max` makes the broker close the whole connection
    /// (`501 FRAME_ERROR`). Unchanged when they fit or the publisher owns no connection.
    #[must_use]
    pub fn fit(&self, properties: BasicProperties) -> BasicProperties {
        match self.frame_max() {
            Some(frame_max) => fit_copy(properties, frame_max),
            None => properties,
        }
    }

    /// The connection, when the publisher owns one.
    #[must_use]
    pub fn connection(&self) -> Option<&Connection> {
        self.connection.as_ref()
    }

    async fn channel(&self, exchange: &str) -> Result<Channel, PublishError> {
        let mut guard = self.channel.lock().await;
        if let Some(ch) = guard.as_ref()
            && ch.status().connected()
        {
            return Ok(ch.clone());
        }
        let fail = |source| PublishError::Channel {
            exchange: exchange.to_owned(),
            source,
        };
        let ch = match (&self.opener, &self.connection) {
            (ChannelSource::Borrowed(ch), _) => ch.clone(),
            (ChannelSource::Own, Some(conn)) => {
                let timeout = || PublishError::Timeout {
                    exchange: exchange.to_owned(),
                    after: self.timeouts.operation,
                };
                let open = async {
                    let ch = conn.create_channel().await.map_err(fail)?;
                    ch.confirm_select(ConfirmSelectOptions::default())
                        .await
                        .map_err(fail)?;
                    Ok(ch)
                };
                Self::bounded(self.blockable().as_ref(), self.timeouts.operation, open)
                    .await
                    .ok_or_else(timeout)??
            }
            (ChannelSource::Own, None) => {
                return Err(PublishError::InvalidName(
                    "publisher has no connection".into(),
                ));
            }
        };
        *guard = Some(ch.clone());
        Ok(ch)
    }

    /// Sends a message (mandatory) and returns the pending confirmation, so that callers can
    /// pipeline many publishes before awaiting their confirms with [`confirmed`].
    ///
    /// # Errors
    /// The channel failed before the message was sent.
    pub async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) -> Result<PendingConfirm, PublishError> {
        let ex =
            ShortString::try_new(exchange).map_err(|e| PublishError::InvalidName(e.to_string()))?;
        let rk = ShortString::try_new(routing_key)
            .map_err(|e| PublishError::InvalidName(e.to_string()))?;
        let ch = self.channel(exchange).await?;
        let opts = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        // Bounded like the confirm: a publish racing the broker's close of the channel (a copy
        // it refused) must not wait for ever.
        let after = self.timeouts.operation;
        let status = self.blockable();
        let publishing = ch.basic_publish(ex, rk, opts, payload, properties);
        let confirm = Self::bounded(status.as_ref(), after, publishing)
            .await
            .ok_or_else(|| PublishError::Timeout {
                exchange: exchange.to_owned(),
                after,
            })?
            .map_err(|source| PublishError::Channel {
                exchange: exchange.to_owned(),
                source,
            })?;
        Ok(PendingConfirm {
            confirm,
            exchange: exchange.to_owned(),
            routing_key: routing_key.to_owned(),
            after,
            status,
            channel_id: ch.id(),
        })
    }

    /// Publishes and waits for the broker's confirmation.
    ///
    /// # Errors
    /// Anything but `Ack` without a returned message.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let pending = self
            .send(exchange, routing_key, payload, properties)
            .await?;
        let channel_id = pending.channel_id;
        let answer = confirmed(pending).await;
        if matches!(answer, Err(PublishError::Nacked { .. })) && self.wait_out_blocks {
            self.retire(channel_id).await;
        }
        answer
    }

    /// Takes the channel `id` out of use after the broker nacked a publish on it: RabbitMQ
    /// 3.10 keeps nacking on a channel that met a quorum queue's `reject-publish` limit after
    /// the limit is gone (the policy cleared, the queue emptied), so the next publish opens a
    /// fresh channel. The old one is closed after the operation deadline, once the confirms
    /// still pending on it had their time.
    async fn retire(&self, id: lapin::types::ChannelId) {
        if !matches!(self.opener, ChannelSource::Own) {
            return;
        }
        let retired = {
            let mut guard = self.channel.lock().await;
            if guard.as_ref().is_some_and(|ch| ch.id() == id) {
                guard.take()
            } else {
                None
            }
        };
        if let Some(ch) = retired {
            let t = self.timeouts;
            tokio::spawn(async move {
                tokio::time::sleep(t.operation).await;
                t.close_channel(&ch, "nacked; replaced").await;
            });
        }
    }

    /// Publishes a new job: persistent, with a fresh message id (returned) and the task as AMQP
    /// `type` and [`headers::TASK`].
    ///
    /// # Errors
    /// See [`Publisher::publish`].
    pub async fn publish_job(
        &self,
        exchange: &str,
        routing_key: &str,
        task: &str,
        payload: &[u8],
    ) -> Result<String, PublishError> {
        let id = headers::new_message_id();
        let mut table = FieldTable::default();
        headers::set_str(&mut table, headers::TASK, task);
        let kind =
            ShortString::try_new(task).map_err(|e| PublishError::InvalidName(e.to_string()))?;
        let props = BasicProperties::default()
            .with_message_id(ShortString::from(id.clone()))
            .with_type(kind)
            .with_delivery_mode(2)
            .with_headers(table);
        self.publish(exchange, routing_key, payload, props).await?;
        Ok(id)
    }

    /// Closes the publisher's channel and connection.
    pub async fn close(&self) {
        let taken = self.channel.lock().await.take();
        if let Some(ch) = taken
            && matches!(self.opener, ChannelSource::Own)
        {
            self.timeouts.close_channel(&ch, "bye").await;
        }
        if let Some(conn) = &self.connection {
            self.timeouts.close_connection(conn, "bye").await;
        }
    }
}

/// A sent message whose confirmation has not been awaited yet.
#[derive(Debug)]
pub struct PendingConfirm {
    confirm: PublisherConfirm,
    exchange: String,
    routing_key: String,
    /// The operation deadline of the publisher that sent it.
    after: std::time::Duration,
    /// The connection whose blocks that deadline waits out, if it does.
    status: Option<ConnectionStatus>,
    /// The channel it was sent on.
    channel_id: lapin::types::ChannelId,
}

/// Awaits a confirmation, within the operation deadline of the publisher that sent it: `Ok`
/// only for `Ack` without a returned message.
///
/// # Errors
/// Nack, returned, or the channel failed before confirming.
pub async fn confirmed(pending: PendingConfirm) -> Result<(), PublishError> {
    let PendingConfirm {
        confirm,
        exchange,
        routing_key,
        after,
        status,
        ..
    } = pending;
    let Some(answer) = Publisher::bounded(status.as_ref(), after, confirm).await else {
        return Err(PublishError::Timeout { exchange, after });
    };
    match answer {
        Ok(Confirmation::Ack(None)) => Ok(()),
        Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned))) => {
            Err(PublishError::Returned {
                exchange,
                routing_key,
                reply: format!("{} {}", returned.reply_code, returned.reply_text),
            })
        }
        Ok(Confirmation::Nack(None) | Confirmation::NotRequested) => {
            Err(PublishError::Nacked { exchange })
        }
        Err(source) => Err(PublishError::Channel { exchange, source }),
    }
}
