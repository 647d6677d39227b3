//! The worker: consume, run the handler, report to the budget, then ack, retry or dead-letter,
//! never losing a message.
//!
//! For each delivery (at most `prefetch` at a time):
//!
//! 1. read the attempt number ([`headers::ATTEMPT`], 1 when absent) and the task (the AMQP
//!    `type` property, else [`headers::TASK`], else the routing key); report the attempt;
//! 2. run the handler; `Ok` → ack, then count a success;
//! 3. `Err(failure)` → [`FleetBudget::on_failure`] decides (see `docs/semantics.md`):
//!    * retry → publish a copy to the retry tier at or above the delay, with the next attempt
//!      number ([`RetryRecord`]), to come back to this queue;
//!    * dead-letter → publish a copy to the dead-letter exchange with the headers of
//!      [`DeadLetterRecord`];
//! 4. the original is acked only after the broker confirmed the copy (`Ack`, not returned).
//!    Otherwise it is nacked with requeue after a short pause and comes back: nothing is lost,
//!    duplicates are possible (deduplicate on the message id, which never changes). The pause
//!    doubles while copies keep being refused for one cause (up to 10 s), and the cause is
//!    logged once.
//!
//! While the broker blocks the connection (a memory or disk alarm: `connection.blocked`) the
//! worker says so once, starts no job, and waits: no copy, ack or requeue is timed out while
//! blocked, since lapin writes them all once the alarm clears and a requeue behind a copy
//! made a second copy. A channel the broker closes for `consumer_timeout` names the job and
//! the worker consumes again (see `docs/semantics.md`).
//!
//! A handler that panics counts as a retryable failure of class `panic`. A delivery whose
//! headers of this crate are malformed is dead-lettered as `non_retryable` (class
//! `malformed_header`) without running the handler.
//!
//! [`WorkerHandle::shutdown`] stops consuming, lets in-flight jobs finish, closes the channels and
//! flushes the budget's coalesced counters. A lost connection is re-established with exponential
//! backoff (with jitter) and consuming resumes; unacked deliveries of the lost connection are
//! redelivered by the broker. The delay goes back to `reconnect_min` only after a connection
//! that stayed up for `reconnect_reset_after` or settled a delivery: a connection that dies
//! young (a message at the head of the queue that the client cannot read closes every
//! connection that consumes it) keeps the delay growing to `reconnect_max`, and the log and
//! `fleet_budget_amqp_short_lived_connections_in_a_row` say how many times in a row.
//!
//! How the parts fit, in the order a delivery meets them:
//!
//! * `consume`: the consume loop and shutdown ([`Worker::run`]): one connection at a time, one
//!   task per delivery;
//! * `backoff`: reconnecting, the delay after a lost connection and the count of young ones;
//! * `delivery`: one delivery from its headers to its counts, the steps 1–3 above, then the
//!   outcome handed to `settle` and how it ended counted (the one place an outcome is counted);
//! * [`outcome`]: the pure mapping from the budget's [`fleet_budget::Decision`] to an
//!   [`Outcome`] (retry in a tier, dead-letter with a reason, ack), usable without a broker;
//! * `settle`: step 4, carrying an outcome out with one publish-then-ack shared by retries,
//!   dead-letters and retries that came back early and wait again; it says how the delivery
//!   ended and counts nothing.
//!
//! [`RetryRecord`]: crate::headers::RetryRecord
//! [`DeadLetterRecord`]: crate::headers::DeadLetterRecord

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fleet_budget::FleetBudget;
use fleet_budget::tls::TlsFiles;
use lapin::BasicProperties;
use tokio::sync::watch;

use crate::config::WorkerConfig;
use crate::connection::{ConnectionConfig, Timeouts};
use crate::dead_letters::Tally;
use crate::headers;
use crate::topology::Topology;

mod backoff;
mod consume;
mod delivery;
pub mod outcome;
mod settle;

pub use outcome::{JobContext, Outcome};

/// How a worker connects and consumes.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Broker URL: the only node, or the first of a cluster's.
    pub url: String,
    /// The other nodes of a cluster: every connect and reconnect tries the nodes in turn.
    pub other_urls: Vec<String>,
    /// The deadlines of connecting and of each broker step (`[amqp]`'s by [`WorkerOptions::new`]).
    pub timeouts: Timeouts,
    /// Certificate files for an `amqps://` URL (`[amqp]`'s by [`WorkerOptions::new`]).
    pub tls: TlsFiles,
    /// The queue to consume (the topology's work queue by default).
    pub queue: String,
    /// Unacknowledged deliveries at a time (= jobs running concurrently).
    pub prefetch: u16,
    /// First reconnect delay; doubles up to `reconnect_max` (with jitter).
    pub reconnect_min: Duration,
    /// Longest reconnect delay.
    pub reconnect_max: Duration,
    /// How long a connection must stay up (or else settle a delivery) for the reconnect delay to
    /// start again from `reconnect_min` once it is lost. A connection lost sooner is
    /// short-lived: the delay keeps doubling.
    pub reconnect_reset_after: Duration,
    /// Pause before a delivery whose retry or dead-letter copy was not confirmed is requeued
    /// (keeps a broken exchange from turning into a hot loop).
    pub unconfirmed_pause: Duration,
    /// Connection name shown by the broker.
    pub name: String,
    /// Where to serve the budget's and this crate's metrics on `/metrics` (`[metrics] listen`),
    /// once per process however many workers share the budget; `None` serves nothing.
    pub metrics_listen: Option<std::net::SocketAddr>,
}

impl WorkerOptions {
    /// Options from `config.amqp` (its URL, deadlines and certificate files), consuming
    /// `topology`'s work queue.
    #[must_use]
    pub fn new(config: &WorkerConfig, topology: &Topology) -> Self {
        let ConnectionConfig {
            url,
            other_urls,
            timeouts,
            tls,
        } = config.amqp.connection();
        Self {
            url,
            other_urls,
            timeouts,
            tls,
            queue: topology.work_queue.clone(),
            prefetch: config.amqp.prefetch,
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(30),
            reconnect_reset_after: Duration::from_secs(10),
            unconfirmed_pause: Duration::from_millis(250),
            name: "fleet-budget worker".to_owned(),
            metrics_listen: config.budget.metrics.listen,
        }
    }

    /// How the worker connects, every time it does: the URL, deadlines and certificate files.
    #[must_use]
    pub fn connection(&self) -> ConnectionConfig {
        ConnectionConfig {
            url: self.url.clone(),
            other_urls: self.other_urls.clone(),
            timeouts: self.timeouts,
            tls: self.tls.clone(),
        }
    }
}

/// One delivery, as the handler sees it.
#[derive(Debug, Clone)]
pub struct Job {
    /// The AMQP message id (never changes across retries, dead-letters and replays).
    pub message_id: Option<String>,
    /// The task.
    pub task: String,
    /// This execution's number (1 = first).
    pub attempt: u32,
    /// Times replayed from the dead-letter queue.
    pub replays: u32,
    /// Whether the broker delivered it before (a worker died or a publish was not confirmed).
    pub redelivered: bool,
    /// The body.
    pub payload: Vec<u8>,
    /// The delivery's exchange.
    pub exchange: String,
    /// The delivery's routing key.
    pub routing_key: String,
    /// All properties, headers included.
    pub properties: BasicProperties,
}

impl Job {
    /// The backoff delay the previous attempt was given (retries only).
    #[must_use]
    pub fn retry_delay(&self) -> Option<Duration> {
        let table = headers::table(&self.properties);
        headers::get_u64(&table, headers::RETRY_DELAY_MS)
            .ok()
            .flatten()
            .map(Duration::from_millis)
    }
}

/// Counters of one worker (all connections of its life).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerCounts {
    /// Deliveries received.
    pub deliveries: u64,
    /// Jobs acked as successes.
    pub succeeded: u64,
    /// Retries published (confirmed) and originals acked.
    pub retried: u64,
    /// Dead-letters published (confirmed) and originals acked.
    pub dead_lettered: u64,
    /// Deliveries requeued because their copy was not confirmed.
    pub requeued: u64,
    /// Acks that failed (the channel closed first): the broker redelivers those.
    pub ack_failed: u64,
    /// Connections established.
    pub connections: u64,
    /// Connections lost shortly after connecting (before `reconnect_reset_after`, nothing
    /// settled), in all.
    pub short_lived_connections: u64,
    /// Retries that arrived before their delay (longer than the longest tier) and were sent to
    /// wait in a tier again, without running.
    pub waited_again: u64,
    /// Jobs whose copy could never be published (a name over 255 bytes, a message the broker
    /// refuses) and that were parked instead, then acked.
    pub parked: u64,
    /// Jobs held without running (a primary at the concurrency cap, a circuit open) and sent
    /// to wait in a tier, then acked.
    pub held: u64,
    /// Jobs of the work queue of which no copy at all could be published (not even a parked
    /// one), rejected without requeue so that the broker dead-letters them intact.
    pub broker_dead_lettered: u64,
    /// Dead letters (and parked copies) the dead-letter index could not count: Redis refused
    /// or did not answer a batch through all its tries. The index is short by this many until
    /// `budgetctl dlq reindex`, and every look says it is an estimate.
    pub index_unrecorded: u64,
    /// Batches of the dead-letter index sent again because Redis did not answer an earlier try
    /// in time (each applied once: `dead_letters.lua` numbers a writer's batches).
    pub index_sent_again: u64,
}

#[derive(Debug, Default)]
struct Stats {
    deliveries: AtomicU64,
    succeeded: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    requeued: AtomicU64,
    ack_failed: AtomicU64,
    connections: AtomicU64,
    short_lived_connections: AtomicU64,
    waited_again: AtomicU64,
    parked: AtomicU64,
    held: AtomicU64,
    broker_dead_lettered: AtomicU64,
    index_unrecorded: Arc<AtomicU64>,
    index_sent_again: Arc<AtomicU64>,
}

impl Stats {
    fn counts(&self) -> WorkerCounts {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WorkerCounts {
            deliveries: l(&self.deliveries),
            succeeded: l(&self.succeeded),
            retried: l(&self.retried),
            dead_lettered: l(&self.dead_lettered),
            requeued: l(&self.requeued),
            ack_failed: l(&self.ack_failed),
            connections: l(&self.connections),
            short_lived_connections: l(&self.short_lived_connections),
            waited_again: l(&self.waited_again),
            parked: l(&self.parked),
            held: l(&self.held),
            broker_dead_lettered: l(&self.broker_dead_lettered),
            index_unrecorded: l(&self.index_unrecorded),
            index_sent_again: l(&self.index_sent_again),
        }
    }

    /// Deliveries settled so far (acked after success, a confirmed copy, or rejected to the
    /// broker's dead-lettering): progress, which a requeue or a failed ack is not.
    fn settled(&self) -> u64 {
        let c = self.counts();
        c.succeeded
            + c.retried
            + c.dead_lettered
            + c.waited_again
            + c.parked
            + c.held
            + c.broker_dead_lettered
    }
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// Controls a running worker from elsewhere.
#[derive(Debug, Clone)]
pub struct WorkerHandle {
    stats: Arc<Stats>,
    stop: Arc<watch::Sender<bool>>,
}

impl WorkerHandle {
    /// Asks the worker to stop: no new deliveries, in-flight jobs finish, counters are flushed,
    /// then [`Worker::run`] returns.
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }

    /// The counters so far.
    #[must_use]
    pub fn counts(&self) -> WorkerCounts {
        self.stats.counts()
    }
}

/// A RabbitMQ worker embedding a [`FleetBudget`].
#[derive(Debug)]
pub struct Worker {
    budget: FleetBudget,
    topology: Arc<Topology>,
    options: WorkerOptions,
    stats: Arc<Stats>,
    stop: Arc<watch::Sender<bool>>,
    /// What it dead-letters and parks, counted for the dead-letter index (with a fleet store).
    tally: Option<Tally>,
    /// The causes of copies the broker did not confirm, said once each across reconnects.
    refusals: Arc<settle::Refusals>,
}

impl Worker {
    /// A worker for `topology` reporting to `budget`.
    #[must_use]
    pub fn new(budget: FleetBudget, topology: Topology, options: WorkerOptions) -> Self {
        let (stop, _) = watch::channel(false);
        let stats = Arc::new(Stats::default());
        let tally = budget.dead_letter_index().cloned().map(|index| {
            Tally::new(index).counting_in(
                Arc::clone(&stats.index_unrecorded),
                Arc::clone(&stats.index_sent_again),
            )
        });
        Self {
            tally,
            budget,
            topology: Arc::new(topology),
            options,
            stats,
            stop: Arc::new(stop),
            refusals: Arc::default(),
        }
    }

    /// A handle to stop the worker and read its counters.
    #[must_use]
    pub fn handle(&self) -> WorkerHandle {
        WorkerHandle {
            stats: Arc::clone(&self.stats),
            stop: Arc::clone(&self.stop),
        }
    }
}
