//! The queues as the fleet exporter shows them: depth of the work, dead-letter and parked
//! queues, and the age of the oldest dead-lettered and parked message.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fleet_budget_queue_messages` | gauge | queue, role | ready messages (`role`: `work`, `dead_letter`, `parked`) |
//! | `fleet_budget_queue_oldest_message_age_seconds` | gauge | queue, role | age of the message at the head of the dead-letter or parked queue, by its `fb-dead-lettered-ms` / `fb-parked-ms` (absent when the queue is empty) |
//!
//! Depths are passive declares. The head's age is read by getting the head message and closing
//! the channel without acknowledging it, which puts it back at the head; on RabbitMQ 3.x quorum
//! queues that counts as a delivery attempt (`x-delivery-count`), harmless on these queues,
//! which have no delivery limit. One connection per reading; the exporter bounds its time.

use std::time::Duration;

use fleet_budget::metrics::{ExporterSource, ReadFuture};
use lapin::options::BasicGetOptions;
use lapin::types::ShortString;
use lapin::{Channel, Connection};
use prometheus::{GaugeVec, IntGaugeVec, Opts, Registry};

use crate::connection::connect;
use crate::error::AmqpError;
use crate::headers::{self, DEAD_LETTERED_MS, PARKED_MS};
use crate::topology::names::amqp_name;
use crate::topology::{Topology, queue_depth};

/// Reads the queues of a topology for the fleet exporter.
#[derive(Debug)]
pub struct QueueSource {
    url: String,
    topology: Topology,
    messages: IntGaugeVec,
    oldest_age: GaugeVec,
}

impl QueueSource {
    /// A source for `topology` on the broker at `url`, its gauges registered on `registry`
    /// (the exporter's: `FleetExporter::registry`).
    ///
    /// # Errors
    /// The registry already holds metrics of these names.
    pub fn register(
        url: impl Into<String>,
        topology: Topology,
        registry: &Registry,
    ) -> Result<Self, prometheus::Error> {
        let messages = IntGaugeVec::new(
            Opts::new(
                "fleet_budget_queue_messages",
                "Ready messages in the queue.",
            ),
            &["queue", "role"],
        )?;
        let oldest_age = GaugeVec::new(
            Opts::new(
                "fleet_budget_queue_oldest_message_age_seconds",
                "Age of the message at the head of the queue, by its dead-letter or park time.",
            ),
            &["queue", "role"],
        )?;
        registry.register(Box::new(messages.clone()))?;
        registry.register(Box::new(oldest_age.clone()))?;
        Ok(Self {
            url: url.into(),
            topology,
            messages,
            oldest_age,
        })
    }

    async fn read_all(&self) -> Result<(), AmqpError> {
        let conn = connect(&self.url, "fleet-budget exporter").await?;
        let result = self.read_on(&conn).await;
        let _ = conn.close(200, ShortString::from("bye")).await;
        result
    }

    async fn read_on(&self, conn: &Connection) -> Result<(), AmqpError> {
        let t = &self.topology;
        let ch = channel(conn).await?;
        let depths = [
            (
                &t.work_queue,
                "work",
                queue_depth(&ch, &t.work_queue).await?,
            ),
            (
                &t.dead_queue,
                "dead_letter",
                queue_depth(&ch, &t.dead_queue).await?,
            ),
            (
                &t.parked_queue,
                "parked",
                queue_depth(&ch, &t.parked_queue).await?,
            ),
        ];
        let _ = ch.close(200, ShortString::from("bye")).await;
        self.messages.reset();
        self.oldest_age.reset();
        for (queue, role, depth) in depths {
            self.messages
                .with_label_values(&[queue, role])
                .set(i64::from(depth));
        }
        let now = headers::now_ms();
        for (queue, role, header) in [
            (&t.dead_queue, "dead_letter", DEAD_LETTERED_MS),
            (&t.parked_queue, "parked", PARKED_MS),
        ] {
            if let Some(at_ms) = head_time(conn, queue, header).await? {
                #[allow(clippy::cast_precision_loss)]
                let age = now.saturating_sub(at_ms) as f64 / 1000.0;
                self.oldest_age.with_label_values(&[queue, role]).set(age);
            }
        }
        Ok(())
    }
}

impl ExporterSource for QueueSource {
    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    fn read(&self) -> ReadFuture<'_> {
        Box::pin(async move {
            self.read_all().await.map_err(|e| {
                self.clear();
                fleet_budget::redact::redact_text(&e.to_string())
            })
        })
    }

    fn clear(&self) {
        self.messages.reset();
        self.oldest_age.reset();
    }
}

async fn channel(conn: &Connection) -> Result<Channel, AmqpError> {
    conn.create_channel()
        .await
        .map_err(|e| AmqpError::broker("open a channel", e))
}

/// The time in `header` of the message at the head of `queue` (its AMQP timestamp when the
/// header is absent), or `None` when the queue is empty. The message goes back to the head when
/// the channel closes unacknowledged.
async fn head_time(conn: &Connection, queue: &str, header: &str) -> Result<Option<u64>, AmqpError> {
    let ch = channel(conn).await?;
    let got = ch
        .basic_get(
            amqp_name("queue", queue)?,
            BasicGetOptions { no_ack: false },
        )
        .await
        .map_err(|e| AmqpError::broker(format!("peek at {queue}"), e));
    let time = match got {
        Ok(Some(message)) => {
            let properties = &message.delivery.properties;
            headers::get_u64(&headers::table(properties), header)
                .ok()
                .flatten()
                .or_else(|| properties.timestamp().map(|s| s.saturating_mul(1000)))
        }
        Ok(None) => None,
        Err(e) => {
            let _ = ch.close(200, ShortString::from("bye")).await;
            return Err(e);
        }
    };
    // Closing the channel returns the unacknowledged message to the head of the queue.
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        ch.close(200, ShortString::from("bye")),
    )
    .await;
    Ok(time)
}
