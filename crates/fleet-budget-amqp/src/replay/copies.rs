//! The copies of a replay run in flight: each awaited, then counted. A move or a park that
//! failed is put back into the source queue as a copy, its original acked once that copy is
//! confirmed; only when that copy fails too is the original held (returned at the end of the
//! run). What a move's outcome says of its exchange goes to `exchanges`.

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use lapin::{Acker, BasicProperties};

use super::Replayer;
use super::exchanges::{Exchanges, Target};
use super::report::ReplayProgress;
use super::settle::Settler;
use crate::headers;
use crate::publish::{PublishError, Publisher, confirmed};

/// What a copy is: a move back to the original exchange, a park, a skipped message put back
/// into the dead-letter queue (see [`super::inspect`]), or a message that cannot be moved (its
/// original exchange is gone) put back the same way, counted failed; or no copy at all: a dead
/// letter an interrupted run moved already, dropped (see [`fleet_budget::control::ReplayMoves`]).
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Move,
    Park,
    Keep,
    Return,
    Drop,
}

/// A copy whose confirmation has come: the original's tag and acker, what the copy was, and,
/// for a move or a park, the body and properties to put the message back with if it failed.
pub(super) struct Done {
    tag: u64,
    acker: Acker,
    kind: Kind,
    result: Result<(), PublishError>,
    kept: Option<(Vec<u8>, BasicProperties)>,
    /// For a move: where to, and whether it went alone (see [`Exchanges`]).
    target: Option<Target>,
}

/// The copies awaiting their confirmation. Nothing in them publishes on a shared channel: a
/// publish waits for the publisher's channel, which a copy polled only by this set could hold (a
/// deadlock). A scout publishes on its own channel, which nothing else holds.
pub(super) type InFlight = FuturesUnordered<BoxFuture<'static, Done>>;

/// What a copy's confirmation is: [`confirmed`] for a copy sent, or a whole [`super::scout::scout_move`].
pub(super) type Confirm = BoxFuture<'static, Result<(), PublishError>>;

/// Awaits the confirmation of a copy.
pub(super) fn await_copy(
    tag: u64,
    acker: Acker,
    kind: Kind,
    confirm: Confirm,
    kept: Option<(Vec<u8>, BasicProperties)>,
    target: Option<Target>,
) -> BoxFuture<'static, Done> {
    async move {
        let result = confirm.await;
        Done {
            tag,
            acker,
            kind,
            result,
            kept,
            target,
        }
    }
    .boxed()
}

impl Replayer {
    /// Waits for every copy in flight and counts each as [`Self::count_confirmed`] does.
    pub(super) async fn settle_all(
        &self,
        p: &mut ReplayProgress,
        settler: &mut Settler,
        (keeper, exchanges): (&Publisher, &mut Exchanges),
        inflight: &mut InFlight,
    ) {
        while let Some(done) = inflight.next().await {
            self.count_confirmed(done, p, settler, (keeper, &mut *exchanges), inflight)
                .await;
        }
    }

    /// Counts a copy whose confirmation has come, and hands its original to the settler: to ack
    /// when the copy was confirmed, else to hold (returned at the end of the run). A move or a
    /// park that failed is counted failed and the message put back in the source queue as a
    /// copy (like a skipped one), so that its original can be acked without a nack raising its
    /// delivery count; only if that copy fails too is the original held. What a move's outcome
    /// says of its exchange goes to `exchanges`.
    pub(super) async fn count_confirmed(
        &self,
        done: Done,
        p: &mut ReplayProgress,
        settler: &mut Settler,
        (keeper, exchanges): (&Publisher, &mut Exchanges),
        inflight: &mut InFlight,
    ) {
        let Done {
            tag,
            acker,
            kind,
            result,
            kept,
            target,
        } = done;
        if let Some(target) = &target {
            exchanges.learn(target, &result);
        }
        let e = match result {
            Ok(()) => {
                match kind {
                    Kind::Move => p.moved += 1,
                    Kind::Park => p.parked += 1,
                    Kind::Keep | Kind::Return | Kind::Drop => {}
                }
                settler.confirmed(tag, acker, matches!(kind, Kind::Move | Kind::Park));
                return;
            }
            Err(e) => e,
        };
        // Nacked, returned, or refused alone on its channel (`exchanges`: a missing exchange):
        // certainly not delivered, moved again by the next run. Any other failure (no answer in
        // time, a channel closed under copies in flight) may have delivered it: the claim stays,
        // and the next run parks it rather than copy it twice.
        let refused_alone = matches!(e, PublishError::Channel { .. })
            && target
                .as_ref()
                .is_some_and(|t| t.alone && exchanges.refused.contains_key(&t.exchange));
        if refused_alone
            || matches!(
                e,
                PublishError::Nacked { .. } | PublishError::Returned { .. }
            )
        {
            settler.release_claim(tag).await;
        } else {
            settler.keep_claim(tag);
        }
        let Some((data, props)) = kept else {
            tracing::warn!(error = %e, "copy not confirmed; message left in the dead-letter queue");
            settler.hold(tag, acker);
            return;
        };
        p.failed += 1;
        tracing::warn!(error = %e, "copy not confirmed; the message is put back in the dead-letter queue");
        let sent = keeper
            .send(
                "",
                &self.source_queue,
                &data,
                keeper.fit(headers::put_back(&props)),
            )
            .await;
        match sent {
            Ok(pending) => {
                let confirm = confirmed(pending).boxed();
                inflight.push(await_copy(tag, acker, Kind::Return, confirm, None, None));
            }
            Err(e) => {
                tracing::warn!(error = %e, "put-back copy not sent; message left in the dead-letter queue");
                settler.hold(tag, acker);
            }
        }
    }
}
