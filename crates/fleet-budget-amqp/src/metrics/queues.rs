//! The queues as the fleet exporter shows them: depth of the work, dead-letter and parked
//! queues, and the age of the oldest dead-lettered and parked message.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `fleet_budget_queue_messages` | gauge | queue, role | ready messages (`role`: `work`, `dead_letter`, `parked`) |
//! | `fleet_budget_queue_oldest_message_age_seconds` | gauge | queue, role | age of the oldest message of the dead-letter or parked queue: with the dead-letter index, by the earliest minute it counts a message dead-lettered in; without, by `fb-dead-lettered-ms` / `fb-parked-ms` found by a look (absent when the queue is empty) |
//! | `fleet_budget_dead_letters` | gauge | queue, role, dependency, reason, error_class | messages of the dead-letter or parked queue by dependency × reason × error class, from the dead-letter index (no message read): the [`QueueSource::MAX_GROUPS`] largest groups of each queue, the rest under the values `(other)` |
//! | `fleet_budget_dead_letter_index_difference` | gauge | queue, role | the queue's depth minus what its dead-letter index counts: 0 when the counts above are exact (docs/semantics.md, "Dead letters at scale") |
//!
//! With a dead-letter index ([`QueueSource::with_index`], as `budgetctl exporter` gives it),
//! nothing below reads a message: the breakdown and the oldest age come from the index, read at
//! every scrape (one `HGETALL` per queue). Without one, the oldest age is found by a look:
//! Depths are passive declares, read at every scrape. The oldest message's age is the minimum
//! dead-letter (park) time over the queue, read through the non-destructive
//! [`crate::replay::inspect`] (each message put back as a confirmed copy, so no look raises a
//! delivery count: on RabbitMQ 4.x, where quorum queues get a default delivery limit of 20, a
//! `basic.get` left unacknowledged would bring the dead letter closer to deletion at every
//! scrape). A look moves messages to the tail, so the head is not the oldest: the whole queue is
//! read, up to [`QueueSource::DEFAULT_SCAN_LIMIT`] messages, at most every
//! [`QueueSource::DEFAULT_SCAN_EVERY`]; between looks the age grows from the time found. A look
//! runs in a task of its own, so a scrape that times out never cuts one short (a cut look would
//! return its unacknowledged messages, counted).
//!
//! One connection for every reading, not one per scrape: each AMQP connection costs the broker
//! a process and a pair of log lines, and a scraper every 15 s per exporter is the connection
//! churn RabbitMQ's documentation warns of
//! (<https://www.rabbitmq.com/docs/connections#high-connection-churn>); it also spares each
//! scrape a TCP and AMQP (and TLS) handshake. The depths are read on one channel of that
//! connection, one reading at a time (a mutex); a look opens two channels of its own on it and
//! closes them when done. A reading that fails, or is cut by the scrape's deadline, drops the
//! connection (a look still running keeps it until it ends, then it closes): the scrape shows
//! `fleet_budget_exporter_up{source="rabbitmq"} 0` without queue series, as for a broker it
//! cannot reach, and the next reading connects anew. A connection found closed (a broker
//! restart) is replaced before reading; one that fails during the reading after being reused
//! (closed by the broker a moment before) is replaced once more within the same reading.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::control::DeadLetterIndex;
use fleet_budget::metrics::{ExporterSource, ReadFuture};
use fleet_budget::redact::redact_text;
use lapin::{BasicProperties, Channel, Connection};
use prometheus::{GaugeVec, IntGaugeVec, Opts, Registry};
use tokio::sync::Mutex;

use crate::connection::{ConnectionConfig, connect};
use crate::dead_letters::QueueCounts;
use crate::error::AmqpError;
use crate::headers::{self, DEAD_LETTERED_MS, PARKED_MS};
use crate::inspect::{InspectOptions, Look as Then, inspect_on};
use crate::topology::{Topology, queue_depth_within};

/// Reads the queues of a topology for the fleet exporter.
#[derive(Debug)]
pub struct QueueSource {
    /// The broker, its deadlines and certificate files: every connection of the source.
    connection: ConnectionConfig,
    topology: Topology,
    messages: IntGaugeVec,
    oldest_age: GaugeVec,
    scan_every: Duration,
    scan_limit: u64,
    /// The last look at the dead-letter queue, then at the parked queue.
    looks: [Arc<Mutex<Option<Look>>>; 2],
    /// Where the queues' contents are counted: the breakdown and the oldest age without a look.
    index: Option<DeadLetterIndex>,
    groups: IntGaugeVec,
    difference: IntGaugeVec,
    /// The name the broker shows for the connection.
    connection_name: String,
    /// The connection kept across readings, and its channel for the depths; `None` before the
    /// first reading and after a failed one.
    link: Mutex<Option<Link>>,
}

/// The connection a [`QueueSource`] keeps, shared with the looks running on it.
#[derive(Debug)]
struct Link {
    conn: Arc<Connection>,
    depths: Channel,
}

impl Link {
    async fn open(to: &ConnectionConfig, name: &str) -> Result<Self, AmqpError> {
        let conn = Arc::new(connect(to, name).await?);
        let depths = to
            .timeouts
            .within("open a channel", conn.create_channel())
            .await?;
        Ok(Self { conn, depths })
    }

    fn usable(&self) -> bool {
        self.conn.status().connected() && self.depths.status().connected()
    }
}

/// What the last non-destructive look at a queue found.
#[derive(Debug, Clone, Copy)]
struct Look {
    at: Instant,
    /// The oldest dead-letter (park) time, Unix ms; `None` when the queue was empty.
    oldest_ms: Option<u64>,
}

impl QueueSource {
    /// The name the broker shows for the exporter's connection, by default.
    pub const DEFAULT_CONNECTION_NAME: &'static str = "fleet-budget exporter";
    /// How often the oldest message is looked for, at most.
    pub const DEFAULT_SCAN_EVERY: Duration = Duration::from_secs(60);
    /// Messages a look reads at most per queue.
    pub const DEFAULT_SCAN_LIMIT: u64 = 10_000;

    /// A source for `topology` on the broker of `to` (a [`ConnectionConfig`], or a bare URL),
    /// its gauges registered on `registry` (the exporter's: `FleetExporter::registry`).
    ///
    /// # Errors
    /// The registry already holds metrics of these names.
    pub fn register(
        to: impl Into<ConnectionConfig>,
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
                "Age of the oldest message in the queue, by its dead-letter or park time.",
            ),
            &["queue", "role"],
        )?;
        let groups = IntGaugeVec::new(
            Opts::new(
                "fleet_budget_dead_letters",
                "Messages of the dead-letter or parked queue by dependency, reason and error class, from the dead-letter index.",
            ),
            &["queue", "role", "dependency", "reason", "error_class"],
        )?;
        let difference = IntGaugeVec::new(
            Opts::new(
                "fleet_budget_dead_letter_index_difference",
                "The queue's depth minus what its dead-letter index counts (0: the breakdown is exact).",
            ),
            &["queue", "role"],
        )?;
        registry.register(Box::new(messages.clone()))?;
        registry.register(Box::new(oldest_age.clone()))?;
        registry.register(Box::new(groups.clone()))?;
        registry.register(Box::new(difference.clone()))?;
        Ok(Self {
            connection: to.into(),
            topology,
            messages,
            oldest_age,
            scan_every: Self::DEFAULT_SCAN_EVERY,
            scan_limit: Self::DEFAULT_SCAN_LIMIT,
            looks: [Arc::default(), Arc::default()],
            index: None,
            groups,
            difference,
            connection_name: Self::DEFAULT_CONNECTION_NAME.to_owned(),
            link: Mutex::new(None),
        })
    }

    /// Names the connection this way on the broker (`connection_name` among its client
    /// properties), instead of [`QueueSource::DEFAULT_CONNECTION_NAME`].
    #[must_use]
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// Groups of a queue shown with labels of their own; the rest are summed under `(other)`
    /// (label values come from message headers: bounded).
    pub const MAX_GROUPS: usize = 50;

    /// Reads the breakdown and the oldest ages from `index` (no look at any message).
    #[must_use]
    pub fn with_index(mut self, index: Option<DeadLetterIndex>) -> Self {
        self.index = index;
        self
    }

    /// Looks for the oldest message at most this often (`Duration::ZERO`: at every reading).
    #[must_use]
    pub fn scan_every(mut self, every: Duration) -> Self {
        self.scan_every = every;
        self
    }

    /// Reads at most this many messages of a queue when looking for its oldest (at least 1).
    #[must_use]
    pub fn scan_limit(mut self, limit: u64) -> Self {
        self.scan_limit = limit.max(1);
        self
    }

    /// Reads the depths, then the oldest ages; a failure says why, redacted.
    async fn read_all(&self) -> Result<(), String> {
        let why = |e: AmqpError| redact_text(&e.to_string());
        let (conn, depths) = self.depths().await.map_err(why)?;
        let t = &self.topology;
        self.messages.reset();
        self.oldest_age.reset();
        for (queue, role, depth) in [
            (&t.work_queue, "work", depths[0]),
            (&t.dead_queue, "dead_letter", depths[1]),
            (&t.parked_queue, "parked", depths[2]),
        ] {
            self.messages
                .with_label_values(&[queue, role])
                .set(i64::from(depth));
        }
        self.groups.reset();
        self.difference.reset();
        let now = headers::now_ms();
        if let Some(index) = &self.index {
            for (queue, role, depth) in [
                (&t.dead_queue, "dead_letter", depths[1]),
                (&t.parked_queue, "parked", depths[2]),
            ] {
                let rows = index
                    .read(queue)
                    .await
                    .map_err(|e| redact_text(&format!("the dead-letter index of {queue}: {e}")))?;
                let counts = QueueCounts::of_index(queue, u64::from(depth), rows);
                self.difference
                    .with_label_values(&[queue, role])
                    .set(counts.difference());
                let groups = counts.groups();
                let (shown, rest) = groups.split_at(groups.len().min(Self::MAX_GROUPS));
                for g in shown {
                    self.groups
                        .with_label_values(&[queue, role, &g.dependency, &g.reason, &g.error_class])
                        .set(i64::try_from(g.messages).unwrap_or(i64::MAX));
                }
                let other: u64 = rest.iter().map(|g| g.messages).sum::<u64>() + counts.beyond;
                if other > 0 {
                    self.groups
                        .with_label_values(&[queue, role, OTHER, OTHER, OTHER])
                        .set(i64::try_from(other).unwrap_or(i64::MAX));
                }
                if depth > 0
                    && let Some(minute) = counts.oldest_minute()
                {
                    #[allow(clippy::cast_precision_loss)]
                    let age = now.saturating_sub(minute.saturating_mul(60_000)) as f64 / 1000.0;
                    self.oldest_age.with_label_values(&[queue, role]).set(age);
                }
            }
            return Ok(());
        }
        for (i, (queue, role, header, depth)) in [
            (&t.dead_queue, "dead_letter", DEAD_LETTERED_MS, depths[1]),
            (&t.parked_queue, "parked", PARKED_MS, depths[2]),
        ]
        .into_iter()
        .enumerate()
        {
            let Some(look) = self.looks.get(i) else {
                continue;
            };
            if depth == 0 {
                // Nothing to be old: no series, and the next message starts a fresh look.
                *look.lock().await = None;
                continue;
            }
            if let Some(at_ms) = self.oldest(&conn, look, queue, header).await? {
                #[allow(clippy::cast_precision_loss)]
                let age = now.saturating_sub(at_ms) as f64 / 1000.0;
                self.oldest_age.with_label_values(&[queue, role]).set(age);
            }
        }
        Ok(())
    }

    /// The depths of the work, dead-letter and parked queues, read on the kept connection (one
    /// reading at a time), and that connection for the looks.
    ///
    /// The link is out of its slot while it is used and goes back only after a good reading: a
    /// failure (a refused passive declare closes the channel; a lost connection; a timeout) or a
    /// caller that gives up (the scrape's deadline drops this future) drops it, and the next
    /// reading connects anew. A link that fails after being reused is replaced once, here: the
    /// broker may have closed it (a restart, `rabbitmqctl close_connection`) before the client
    /// saw it.
    async fn depths(&self) -> Result<(Arc<Connection>, [u32; 3]), AmqpError> {
        let mut slot = self.link.lock().await;
        let kept = slot.take().filter(Link::usable);
        let reused = kept.is_some();
        let link = match kept {
            Some(link) => link,
            None => Link::open(&self.connection, &self.connection_name).await?,
        };
        let (link, depths) = match self.read_depths(&link.depths).await {
            Ok(depths) => (link, depths),
            Err(e) if !reused => return Err(e),
            Err(e) => {
                tracing::debug!(error = %redact_text(&e.to_string()), "exporter: the kept RabbitMQ connection failed; connecting again");
                drop(link);
                let link = Link::open(&self.connection, &self.connection_name).await?;
                let depths = self.read_depths(&link.depths).await?;
                (link, depths)
            }
        };
        let conn = Arc::clone(&link.conn);
        *slot = Some(link);
        Ok((conn, depths))
    }

    async fn read_depths(&self, ch: &Channel) -> Result<[u32; 3], AmqpError> {
        let (t, within) = (&self.topology, self.connection.timeouts);
        Ok([
            queue_depth_within(ch, &t.work_queue, within).await?,
            queue_depth_within(ch, &t.dead_queue, within).await?,
            queue_depth_within(ch, &t.parked_queue, within).await?,
        ])
    }

    /// The oldest time in `header` over `queue`, from the last look when it is recent enough,
    /// else from a new one. The look runs in a task of its own: a caller that gives up (the
    /// scrape's deadline) leaves it to finish, and the next reading finds its result.
    async fn oldest(
        &self,
        conn: &Arc<Connection>,
        look: &Arc<Mutex<Option<Look>>>,
        queue: &str,
        header: &'static str,
    ) -> Result<Option<u64>, String> {
        let look = Arc::clone(look);
        let (conn, queue) = (Arc::clone(conn), queue.to_owned());
        let (every, limit) = (self.scan_every, self.scan_limit);
        let timeouts = self.connection.timeouts;
        let task = tokio::spawn(async move {
            let mut last = look.lock().await;
            if let Some(l) = *last
                && l.at.elapsed() < every
                && !every.is_zero()
            {
                return Ok(l.oldest_ms);
            }
            let mut oldest: Option<u64> = None;
            let options = InspectOptions {
                limit: Some(limit),
                ..InspectOptions::default()
            };
            inspect_on(&conn, timeouts, &queue, &options, |d| {
                if let Some(t) = message_time(&d.properties, header) {
                    oldest = Some(oldest.map_or(t, |o| o.min(t)));
                }
                Then::Next
            })
            .await
            .map_err(|e| redact_text(&e.to_string()))?;
            *last = Some(Look {
                at: Instant::now(),
                oldest_ms: oldest,
            });
            Ok(oldest)
        });
        task.await.map_err(|e| {
            format!(
                "looking at {}: {e}",
                if header == PARKED_MS {
                    "the parked queue"
                } else {
                    "the dead-letter queue"
                }
            )
        })?
    }
}

impl ExporterSource for QueueSource {
    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    fn read(&self) -> ReadFuture<'_> {
        Box::pin(async move { self.read_all().await.inspect_err(|_| self.clear()) })
    }

    fn clear(&self) {
        self.messages.reset();
        self.oldest_age.reset();
        self.groups.reset();
        self.difference.reset();
    }
}

/// The label value of the groups past [`QueueSource::MAX_GROUPS`].
const OTHER: &str = "(other)";

/// A message's time in `header` (its AMQP timestamp when the header is absent or unreadable).
fn message_time(properties: &BasicProperties, header: &str) -> Option<u64> {
    headers::get_u64(&headers::table(properties), header)
        .ok()
        .flatten()
        .or_else(|| properties.timestamp().map(|s| s.saturating_mul(1000)))
}
