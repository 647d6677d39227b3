//! Resource alarms: a connection the broker blocked (`connection.blocked`), and the deadline
//! of a step that waits behind one.
//!
//! When RabbitMQ's memory or disk alarm fires it stops reading from every connection that
//! publishes and tells it so (`connection.blocked`, with a reason such as `low on memory`).
//! lapin then stops writing on that connection altogether: a publish, and every ack or nack
//! behind it, waits in lapin's send queue until `connection.unblocked`, and is written then,
//! in order. A deadline that ends such a step does not take it back: a dead-letter copy whose
//! publish "timed out" while blocked is still written once the alarm clears, and a requeue of
//! its job queued after it makes a second copy (the 128 duplicate dead letters measured on
//! 2026-12-06). So a deadline of a step that waits on the connection runs only while the
//! connection is not blocked ([`unless_blocked`]): the step waits out the alarm, its delivery
//! unacked (nothing lost; at most `prefetch` of them per worker), and the deadline starts
//! again once the connection is unblocked.
//!
//! What the broker said is kept by the connection's [`ConnectionWatch`](super::ConnectionWatch)
//! ([`ConnectionWatch::blocked`](super::ConnectionWatch::blocked)), which logs the block once
//! with the broker's reason (warn) and the unblock (info), and counts it in the worker's metrics.

use std::future::Future;
use std::time::{Duration, Instant};

use lapin::ConnectionStatus;

/// How often a step waiting behind a blocked connection looks at its state: a step neither
/// spins nor misses an unblock by more than this.
pub(crate) const BLOCK_POLL: Duration = Duration::from_millis(200);

/// The broker's block of a connection, as its watch saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// The broker's reason (`low on memory`, `low on disk`), escaped for a log line.
    pub reason: String,
    /// Which alarm, as a bounded metric label.
    pub resource: BlockedBy,
    /// When the watch saw the block.
    pub since: Instant,
}

/// The resource whose alarm blocked a connection: the `resource` label of
/// `fleet_budget_amqp_connection_blocks_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlockedBy {
    /// The memory alarm (`vm_memory_high_watermark`).
    Memory,
    /// The free disk alarm (`disk_free_limit`).
    Disk,
    /// A reason this version does not know.
    Other,
}

impl BlockedBy {
    /// The resource the broker's `reason` names.
    #[must_use]
    pub fn of(reason: &str) -> Self {
        let reason = reason.to_ascii_lowercase();
        if reason.contains("memory") {
            Self::Memory
        } else if reason.contains("disk") {
            Self::Disk
        } else {
            Self::Other
        }
    }

    /// The label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Disk => "disk",
            Self::Other => "other",
        }
    }
}

/// Runs `step`, ended after `after` of time during which the connection of `status` was not
/// blocked: while the broker blocks it, the step waits (lapin writes nothing then, and what it
/// holds is written once the block is lifted), and once it is unblocked the step has the whole
/// of `after` again, for lapin to write what it queued meanwhile and the broker to answer.
/// The state is read every 200 ms. `None` when the deadline passed.
///
/// A connection that stays blocked keeps the step waiting as long as the alarm lasts: what
/// waits is bounded by what was in flight when the block came (a worker's `prefetch`), not by
/// time; a lost connection ends the step with lapin's error.
pub async fn unless_blocked<F: Future>(
    status: &ConnectionStatus,
    after: Duration,
    step: F,
) -> Option<F::Output> {
    tokio::pin!(step);
    let mut left = after;
    loop {
        let started = Instant::now();
        let tick = left.min(BLOCK_POLL);
        tokio::select! {
            biased;
            out = &mut step => return Some(out),
            () = tokio::time::sleep(tick) => {}
        }
        if status.blocked() {
            left = after;
        } else {
            left = left.saturating_sub(started.elapsed());
            if left.is_zero() {
                return None;
            }
        }
    }
}

/// Waits until the connection of `status` is not blocked (at once when it is not), reading the
/// state every 200 ms; also returns when the connection is lost, for the step after to
/// fail with its error.
pub async fn until_unblocked(status: &ConnectionStatus) {
    while status.blocked() && !(status.errored() || status.closed() || status.closing()) {
        tokio::time::sleep(BLOCK_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_reason_names_a_bounded_resource() {
        assert_eq!(BlockedBy::of("low on memory"), BlockedBy::Memory);
        assert_eq!(BlockedBy::of("low on disk"), BlockedBy::Disk);
        assert_eq!(BlockedBy::of("\u{1b}[31mwhatever"), BlockedBy::Other);
        assert_eq!(BlockedBy::of("").as_str(), "other");
    }
}
