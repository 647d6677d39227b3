//! How a replay run ends: its last acks applied before its channel closes, the originals it could
//! not put back returned, and what it leaves in its source queue ready again before it returns.
//!
//! **The last acks.** The dead-letter queue is a quorum queue, which applies an ack as a command
//! of its log, sent by the broker's channel without waiting; a channel's close returns every
//! message the channel still holds, and that return can overtake acks the queue has not applied
//! yet (the channel holds settlements back once 32 await the log, and drops what it holds at the
//! close). An overtaken ack leaves the original beside its copy: the next run replays it twice.
//! So, as [`super::inspect`] does, the originals are acked in few commands (one `basic.ack` with
//! `multiple` over every original settled so far, see [`Settler`]), and the run waits behind its
//! last acks before the close: the consumer's `basic.cancel` is a synchronous command of the same
//! log, sent by the same channel, answered once every ack sent before it is applied.
//! (`basic.get`, which [`super::inspect`] uses, would do as well, but takes a message and raises
//! its delivery count.)
//!
//! **What the run leaves, ready.** The copies a run puts back (skipped messages, moves that
//! failed) are confirmed, so in the queue, and ready: until the queue pushes them to the run's own
//! consumer. They land at the tail, past the run's bound, and the consumer is pushed messages as
//! long as its prefetch has room, which every ack makes: near the end of a run (the last
//! `prefetch` messages of the bound), the queue pushes it the copies put back earlier (and any
//! dead letter that arrived meanwhile). The run never reads past its bound, so these are held by
//! its channel, unacked: a quorum queue counts them neither ready nor gone. The cancel does not
//! give them back, the close does: the broker answers the close, the channel's process ends, and
//! the queue, told by a monitor, returns what it held by a command of its log, applied after the
//! run has its answer. The originals held to the end (their put-back copy failed) are returned by
//! a `basic.nack` with requeue, which the broker does not answer either. A passive declare made in
//! between (`budgetctl dlq stats`, the depths in the replay's audit entry, the bound of the next
//! run) counts all of these missing, up to a prefetch's worth (256) short.
//!
//! No AMQP 0-9-1 command of the run's channel waits for them (after the cancel, only another
//! consume or a `basic.get` would be a command of the queue's log, and either takes messages
//! again). So the run, once its channel is closed, reads its source queue's depth until it holds
//! at least what the run leaves there: the messages counted at the start, less those moved and
//! parked ([`wait_until_ready`]). Dead letters that arrive meanwhile can only make that come
//! sooner; another consumer of the queue (a second replay at the same time) can keep it from
//! coming, so the wait is bounded (the run's `idle_timeout`) and what was still missing at its end
//! is reported ([`super::ReplayReport::not_ready`]) and logged, not an error: nothing is lost, a
//! count reads short for a moment.

use std::time::Duration;

use lapin::options::BasicCancelOptions;
use lapin::types::ShortString;
use lapin::{Channel, Connection};
use tokio::time::Instant;

use super::settle::Settler;
use crate::connection::Timeouts;
use crate::topology::queue_depth_within;

/// Ends the run's consuming on `ch`: the last acks, the cancel of consumer `tag` (behind which
/// they are applied), the held originals returned, the channel closed; each step within the
/// deadline of `t`.
pub(super) async fn stop_consuming(
    t: Timeouts,
    ch: &Channel,
    tag: ShortString,
    settler: &mut Settler,
) {
    settler.ack(true).await;
    let cancelled = t
        .within(
            "cancel the replay's consumer",
            ch.basic_cancel(tag, BasicCancelOptions::default()),
        )
        .await;
    if let Err(e) = cancelled {
        tracing::warn!(error = %e, originals = settler.acked, "no answer behind the last acks; the last originals may stay beside their copies (duplicates)");
    }
    // Returned after the cancel, so that the consumer does not read them again; a nack the
    // close overtakes returns the message all the same.
    settler.return_held().await;
    // Deliveries pushed after the bound are unacked: closing the channel requeues them.
    t.close_channel(ch, "replay done").await;
}

/// Waits, up to `patience`, until `queue` holds at least `leaves` ready messages (looking on a
/// channel of `conn`); returns how many it was still short at the last look (`Some(0)`: all
/// ready), or `None` when it could not look (no connection, a failed look: logged), which the
/// caller must not take for "all ready". Each look within the deadline of `t`.
pub(super) async fn wait_until_ready(
    t: Timeouts,
    conn: Option<&Connection>,
    queue: &str,
    leaves: u64,
    patience: Duration,
) -> Option<u64> {
    if leaves == 0 {
        return Some(0);
    }
    let conn = conn?;
    let opened = t
        .within("open a channel to read the depth", conn.create_channel())
        .await;
    let probe = match opened {
        Ok(ch) => ch,
        Err(e) => {
            tracing::warn!(error = %e, queue = %queue, "could not read the depth the run left; it may read short for a moment");
            return None;
        }
    };
    let deadline = Instant::now() + patience;
    let mut pause = Duration::from_millis(2);
    let short = loop {
        let short = match queue_depth_within(&probe, queue, t).await {
            Ok(depth) => leaves.saturating_sub(u64::from(depth)),
            Err(e) => {
                tracing::warn!(error = %e, queue = %queue, "could not read the depth the run left; it may read short for a moment");
                break None;
            }
        };
        let now = Instant::now();
        if short == 0 || now >= deadline {
            break Some(short);
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    };
    if short.is_some_and(|n| n > 0) {
        tracing::warn!(queue = %queue, leaves, short, waited = ?patience, "the run left messages its source queue does not count ready yet: another consumer reads it, or the broker is slow to return them; its depth reads short until then");
    }
    t.close_channel(&probe, "depth read").await;
    short
}
