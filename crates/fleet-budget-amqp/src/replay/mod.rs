//! Replay: moving dead-lettered jobs back to where they came from, after the incident.
//!
//! A run is bounded to the messages the dead-letter queue holds when it starts (its message
//! count, read first): it never chases failures that arrive meanwhile. Each message is read
//! (consumed, not yet acked) and sorted:
//!
//! * headers missing or malformed, or not a dead-letter at all → **parked** with the reason
//!   ([`crate::headers::PARK_REASON`]), whatever the filter: nothing could ever replay it;
//! * not matching the filter (dependency, reason, dead-letter time) → **skipped**: left in the
//!   dead-letter queue, put back as a copy the way [`inspect`] does (a nack with requeue would
//!   count against the queue's delivery limit);
//! * replayed `max_replays` times already → **parked** (loop protection);
//! * otherwise → **moved**: republished to its original exchange and routing key with the same
//!   message id and body, the attempt counter reset and the replay count incremented, at a
//!   pace that starts slow and doubles while the dependency's successes grow, up to the
//!   requested rate, cut when its failures rise, and held while its breaker is open or its
//!   budget frozen (`control`).
//!
//! Every copy is published with confirms and the dead-letter acked only after `Ack` without a
//! return; a message whose move is not confirmed (or whose original exchange is gone) is
//! counted **failed** and stays in the dead-letter queue, put back as a copy like a skipped one
//! (its delivery count not raised). Nothing is dropped. How a run ends without leaving
//! originals beside their copies, and returns only once what it left in the queue is counted
//! there again: `end`.
//!
//! How the parts fit: [`select`] holds the filter and the options and sorts each message;
//! [`run`] moves them (paced, bounded, held on open breakers and freezes, confirm then ack), with
//! `copies` counting the copies in flight, `settle` acking their originals, `exchanges` what the
//! run learns of the exchanges it moves to (and `scout` the channels of first moves), `pacer`
//! and `pause` holding moves to the rate and the budget, and `end` how it stops; [`dry_run`]
//! counts what a run would do without moving anything, reading through [`inspect`], the
//! non-destructive read; [`peek`] shows messages one by one and [`purge`] removes selected ones
//! for good (the parked queue's `purge`); [`audit`] makes the audit entries of replays and
//! purges, for any tool that runs them.
//!
//! The parked queue is replayed by the same code ([`Replayer::parked`]): an operator's decision
//! to try parked jobs again, so `max_replays` does not park them again, and a message that
//! cannot be replayed (unreadable headers) stays in the parked queue instead of being parked
//! again.

use fleet_budget::FleetBudget;
use fleet_budget::control::DeadLetterIndex;
use lapin::Channel;
use lapin::options::BasicConsumeOptions;
use lapin::types::FieldTable;

use crate::connection::{ConnectionConfig, ConnectionWatch, connect};
use crate::error::AmqpError;
use crate::publish::Publisher;
use crate::topology::names::amqp_name;
use crate::topology::{Topology, queue_depth_within};

pub mod audit;
pub mod control;
mod copies;
pub mod dry_run;
mod end;
mod exchanges;
mod gate;
pub mod handle;
/// Looking at a queue without consuming it (a module of its own: the exporter looks too).
pub use crate::inspect;
mod paced;
mod pacer;
pub mod peek;
pub mod purge;
pub mod reindex;
mod report;
pub mod run;
mod scout;
pub mod select;
mod settle;

pub use control::{HoldReason, Pace, RateControl};
pub use dry_run::DryRunReport;
pub use gate::Breakers;
pub use handle::{ReplayHandle, ReplayMode, ReplayOutcome};
pub use inspect::{InspectOptions, Inspection, Look, inspect_queue, inspect_queue_with};
pub use paced::PacedMoves;
pub use peek::{Peek, QueuedMessage, peek_queue};
pub use purge::{PurgeIndex, PurgeReport, purge_queue, purge_queue_by_group};
pub use reindex::Reindexed;
pub use report::{GroupMoves, Held, Rate, ReplayProgress, ReplayReport};
pub use select::{ReplayFilter, ReplayOptions};

/// Replays dead-lettered messages (see the module documentation).
#[derive(Debug, Clone)]
pub struct Replayer {
    /// The broker, its deadlines and certificate files: every connection of the replay.
    connection: ConnectionConfig,
    topology: Topology,
    budget: Option<FleetBudget>,
    /// The breakers the run is held by (`gate`).
    breakers: Option<Breakers>,
    source_queue: String,
    /// Replaying the parked queue (see the module documentation).
    from_parked: bool,
    /// Where the queues' contents are counted (`crate::dead_letters`): the budget's fleet
    /// store's, or one given.
    index: Option<DeadLetterIndex>,
    /// Where a started run leaves the watch of the connection it opens, for its handle to say
    /// whether the broker blocks it ([`ReplayHandle::blocked`]).
    opened: Option<handle::Opened>,
}

/// The queue a [`Replayer`] reads: the dead-letter queue, or the parked queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceQueue {
    /// `topology.dead_queue` ([`Replayer::new`]).
    DeadLetters,
    /// `topology.parked_queue` ([`Replayer::parked`]).
    Parked,
}

impl SourceQueue {
    /// Its name in `topology`.
    #[must_use]
    pub fn name(self, topology: &Topology) -> &str {
        match self {
            Self::DeadLetters => &topology.dead_queue,
            Self::Parked => &topology.parked_queue,
        }
    }

    /// Both, the dead-letter queue first.
    pub const BOTH: [Self; 2] = [Self::DeadLetters, Self::Parked];

    /// The parked queue when `parked`.
    #[must_use]
    pub fn parked_if(parked: bool) -> Self {
        if parked {
            Self::Parked
        } else {
            Self::DeadLetters
        }
    }
}

impl Replayer {
    /// A replayer of `topology`'s dead-letter queue on the broker of `to` (a
    /// [`ConnectionConfig`], or a bare URL). With a `budget`, it pauses while a dependency's
    /// budget is exhausted and its rate follows the dependency's failures
    /// ([`ReplayOptions::control`]); [`Replayer::with_breakers`] adds its breakers.
    #[must_use]
    pub fn new(
        to: impl Into<ConnectionConfig>,
        topology: Topology,
        budget: Option<FleetBudget>,
    ) -> Self {
        let source_queue = topology.dead_queue.clone();
        Self {
            connection: to.into(),
            topology,
            index: budget
                .as_ref()
                .and_then(FleetBudget::dead_letter_index)
                .cloned(),
            budget,
            breakers: None,
            source_queue,
            from_parked: false,
            opened: None,
        }
    }

    /// Counts moves, parks and purges in `index` (and predicts dry runs from it), instead of
    /// the budget's (a tool without a budget: the console's dry run, `budgetctl dlq stats`).
    #[must_use]
    pub fn with_index(mut self, index: Option<DeadLetterIndex>) -> Self {
        self.index = index;
        self
    }

    /// Holds moves while a dependency's breaker is open, and paces them by its probes while it
    /// is half-open (see `control`).
    #[must_use]
    pub fn with_breakers(mut self, breakers: Option<Breakers>) -> Self {
        self.breakers = breakers;
        self
    }

    /// A replayer of `topology`'s parked queue: parked jobs go back to their original exchange
    /// whatever their replay count; unreadable ones stay parked (counted skipped and
    /// malformed).
    #[must_use]
    pub fn parked(
        to: impl Into<ConnectionConfig>,
        topology: Topology,
        budget: Option<FleetBudget>,
    ) -> Self {
        let source_queue = topology.parked_queue.clone();
        Self {
            from_parked: true,
            source_queue,
            ..Self::new(to, topology, budget)
        }
    }

    /// A replayer of `queue`: [`Replayer::new`] or [`Replayer::parked`], for tools that act on
    /// either.
    #[must_use]
    pub fn of(
        queue: SourceQueue,
        to: impl Into<ConnectionConfig>,
        topology: Topology,
        budget: Option<FleetBudget>,
    ) -> Self {
        match queue {
            SourceQueue::DeadLetters => Self::new(to, topology, budget),
            SourceQueue::Parked => Self::parked(to, topology, budget),
        }
    }

    /// `options` as this replayer applies them: from the parked queue, no replay count parks.
    fn effective(&self, options: &ReplayOptions) -> ReplayOptions {
        let mut options = options.clone();
        if self.from_parked {
            options.max_replays = u32::MAX;
        }
        options
    }

    /// How the source queue's messages are counted in the dead-letter index.
    pub(crate) fn counted(&self) -> crate::dead_letters::Counted {
        if self.from_parked {
            crate::dead_letters::Counted::Parked
        } else {
            crate::dead_letters::Counted::DeadLetters
        }
    }

    /// Reads another queue than the topology's dead-letter queue.
    #[must_use]
    pub fn source_queue(mut self, queue: impl Into<String>) -> Self {
        self.source_queue = queue.into();
        self
    }

    /// Connects, opens a channel and reads the depth of the source queue (the run's bound); the
    /// watch sees the connection's loss (and its error) where lapin would leave a step waiting.
    async fn open(
        &self,
        what: &str,
    ) -> Result<(Publisher, Channel, u64, ConnectionWatch), AmqpError> {
        let t = self.connection.timeouts;
        let conn = connect(&self.connection, what).await?;
        let watch = ConnectionWatch::new(&conn).with_timeouts(t);
        if let Some(opened) = &self.opened {
            opened.set(&watch);
        }
        let ch = t.within("open a channel", conn.create_channel()).await?;
        let depth = queue_depth_within(&ch, &self.source_queue, t).await?;
        Ok((Publisher::on(conn, t), ch, u64::from(depth), watch))
    }

    async fn consume(&self, ch: &Channel, tag: &str) -> Result<lapin::Consumer, AmqpError> {
        self.connection
            .timeouts
            .within(
                format!("consume {}", self.source_queue),
                ch.basic_consume(
                    amqp_name("queue", &self.source_queue)?,
                    amqp_name("consumer tag", tag)?,
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                ),
            )
            .await
    }
}
