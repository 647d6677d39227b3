//! Reconnecting: the delay before the worker's next connection after it lost one, and the count
//! of connections lost young (see the module documentation of [`super`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;

use super::{Stats, WorkerOptions, bump};
use crate::error::AmqpError;
use crate::metrics::{AmqpMetrics, LossCause};

/// The reconnect delay: doubles after each failure up to `reconnect_max`, with jitter, and
/// starts again from `reconnect_min` only once a connection has lived: stayed up for
/// `reconnect_reset_after`, or settled a delivery. A connection lost younger counts as a failure
/// like a refused connect: a message that closes every connection that consumes it must not
/// turn the worker into a reconnect loop. Also counts the losses in a row of young connections,
/// for the log and the metrics.
#[derive(Debug)]
pub(super) struct Backoff {
    min: Duration,
    max: Duration,
    reset_after: Duration,
    delay: Duration,
    stats: Arc<Stats>,
    metrics: Option<AmqpMetrics>,
    queue: String,
    /// When the connection consuming now started to consume (`None` between connections).
    since: Option<Instant>,
    /// While that connection has not lived yet: the deliveries settled before it (any settled
    /// after are its progress).
    young: Option<u64>,
    /// Connections lost in a row shortly after connecting.
    short_in_a_row: u64,
}

impl Backoff {
    pub(super) fn new(o: &WorkerOptions, stats: &Arc<Stats>, metrics: Option<AmqpMetrics>) -> Self {
        Self {
            min: o.reconnect_min,
            max: o.reconnect_max,
            reset_after: o.reconnect_reset_after,
            delay: o.reconnect_min,
            stats: Arc::clone(stats),
            metrics,
            queue: o.queue.clone(),
            since: None,
            young: None,
            short_in_a_row: 0,
        }
    }

    /// A connection started consuming.
    pub(super) fn consuming(&mut self) {
        self.since = Some(Instant::now());
        self.young = Some(self.stats.settled());
    }

    /// Whether the connection consuming now has not lived yet.
    pub(super) fn is_young(&self) -> bool {
        self.young.is_some()
    }

    /// A delivery ended: a settled one means the connection lives.
    pub(super) fn check_settled(&mut self) {
        if self
            .young
            .is_some_and(|before| self.stats.settled() > before)
        {
            self.lived();
        }
    }

    /// The connection consuming now has lived: the next loss starts from `reconnect_min`.
    pub(super) fn lived(&mut self) {
        self.young = None;
        self.delay = self.min;
        self.end_run();
    }

    /// Counts the loss of the session that ended with `e`, logs it, and returns the (jittered)
    /// delay before the next connection.
    pub(super) fn after_loss(&mut self, e: &AmqpError) -> Duration {
        let cause = LossCause::of(e);
        let lived_for = self.since.take().map(|since| since.elapsed());
        if let Some(lived) = lived_for {
            // Deliveries settled in its last moments count too (the check runs as they end).
            let short = lived < self.reset_after
                && self
                    .young
                    .is_some_and(|before| self.stats.settled() == before);
            if short {
                self.short_in_a_row += 1;
                bump(&self.stats.short_lived_connections);
            } else if self.young.is_some() {
                self.lived();
            }
            self.young = None;
            if let Some(m) = &self.metrics {
                m.connection_lost(short, cause);
                if short {
                    m.short_lived_in_a_row_add(1);
                }
            }
        }
        let retry_in = self.delay.mul_f64(rand::rng().random_range(0.5..=1.0));
        let queue = &self.queue;
        let n = self.short_in_a_row;
        if n >= UNREADABLE_AFTER && cause == LossCause::UnreadableMessage {
            tracing::error!(error = %e, lived = ?lived_for, short_lived_in_a_row = n, retry_in = ?retry_in, queue = %queue,
                "worker connection lost {n} times in a row shortly after connecting: likely a message at the head of {queue} that this client cannot read; take it out by hand (runbook: docs/guides/operations.md, \"A message no client can read\")");
        } else if n > 0 {
            tracing::warn!(error = %e, lived = ?lived_for, short_lived_in_a_row = n, retry_in = ?retry_in, queue = %queue,
                "worker lost the broker {n} times in a row shortly after connecting; reconnecting");
        } else {
            tracing::warn!(error = %e, lived = ?lived_for, retry_in = ?retry_in, queue = %queue, "worker lost the broker; reconnecting");
        }
        self.delay = (self.delay * 2).min(self.max);
        retry_in
    }

    /// Ends the run of short-lived connections (a connection lived, or the worker stops).
    pub(super) fn end_run(&mut self) {
        if let Some(m) = &self.metrics {
            m.short_lived_in_a_row_add(-i64::try_from(self.short_in_a_row).unwrap_or(i64::MAX));
        }
        self.short_in_a_row = 0;
    }
}

/// Short-lived connections in a row from which a loss on a message the client cannot read is
/// logged as an error that names the likely cause and the runbook.
const UNREADABLE_AFTER: u64 = 3;
