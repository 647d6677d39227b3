//! What a replay run learns of the original exchanges it moves to, and so which channel each move
//! goes on.
//!
//! A move the broker refuses outright (an internal exchange, one the user may not write to, an
//! `amq.` name that does not exist: `403` or `404`) closes the channel it was sent on, and every
//! move in flight there ends with an unknown outcome: routed before the refusal (putting it back
//! would make a duplicate) or dropped after it. The broker's `channel.close` names the method
//! (`basic.publish`), not which publish, so the run cannot tell the two apart. Hence a move to
//! an exchange no move of this run has reached yet goes with no other move in flight on its
//! channel: a refused lone move is known not to have been routed, is put back and counted failed,
//! and its exchange is refused for the rest of the run (its other messages are put back without
//! being sent).
//!
//! "Alone" is per channel, not per run: that first move goes on a *scout*, a channel of its own
//! on the moves' connection, which asks whether the exchange exists (a passive declare, whose
//! `404` is learnt like a refused move), selects confirms, publishes the move, awaits its confirm
//! and closes, all in flight with the other copies: the first moves to many exchanges overlap,
//! and the moves to exchanges already proven stay pipelined on the moves' channel. A refusal
//! closes only the scout's channel. Only opening that channel is awaited in turn (a round trip
//! per exchange). The later moves to an exchange whose scout is in flight wait for it: they go
//! pipelined once it is confirmed, are put back unsent once it is refused. Until 2026-11-30 the
//! first move went alone on the moves' channel, emptied before and waited for after, each
//! exchange asked about on a throwaway channel first: a run over many exchanges paid a drained
//! window and four round trips per exchange, in turn (docs/BENCHMARKS.md, "Replay to many
//! exchanges").
//!
//! A refusal that only concerns one message (say a body over a maximum the broker was given
//! since) can still come among pipelined moves to a proven exchange; then the moves in flight are
//! in doubt (each put back, a duplicate where it had been routed) and the rest of the run moves
//! one message at a time on the moves' channel, emptied before and after each, every exchange
//! asked about first on a throwaway channel ([`Route::Alone`]), so that it happens at most once
//! per run.

use std::collections::{HashMap, HashSet};

use fleet_budget::printable::escape_text;

use crate::publish::PublishError;

/// Which channel a move goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// Its exchange is proven: pipelined on the moves' channel.
    Pipelined,
    /// Its exchange is not proven yet: on a scout, a channel of its own.
    Scout,
    /// A refusal came among pipelined moves: alone on the moves' channel, emptied before.
    Alone,
}

/// Where a move went, and whether it was the only move in flight on its channel.
pub(super) struct Target {
    pub(super) exchange: String,
    pub(super) alone: bool,
}

/// What a run has learned of the original exchanges it moves to (see [`super::run`]'s documentation).
#[derive(Default)]
pub(super) struct Exchanges {
    /// Whether each exists, asked once (when moving one at a time: a scout asks for itself).
    pub(super) exists: HashMap<String, bool>,
    /// A move to it was confirmed: moves to it are pipelined.
    pub(super) proven: HashSet<String>,
    /// The broker refused a lone move to it (`403`, `404`): why. Not sent to again this run.
    pub(super) refused: HashMap<String, String>,
    /// A move among others was refused: moves go one at a time for the rest of the run.
    pub(super) careful: bool,
    /// Exchanges whose scout is in flight: the next move to one waits for its outcome.
    pub(super) scouting: HashSet<String>,
}

impl Exchanges {
    /// Which channel a move to `exchange` goes on.
    pub(super) fn route(&self, exchange: &str) -> Route {
        if self.careful {
            Route::Alone
        } else if self.proven.contains(exchange) {
            Route::Pipelined
        } else {
            Route::Scout
        }
    }

    /// Learns from the outcome of a move to `target`.
    pub(super) fn learn(&mut self, target: &Target, result: &Result<(), PublishError>) {
        if target.alone {
            self.scouting.remove(&target.exchange);
        }
        let e = match result {
            Ok(()) => {
                self.proven.insert(target.exchange.clone());
                return;
            }
            Err(e) => e,
        };
        let PublishError::Channel { source, .. } = e else {
            // Nacked, returned or unanswered: the channel stays open, nothing else is affected.
            return;
        };
        let refusal = crate::error::protocol_message(source);
        if !target.alone {
            if refusal.is_some() && !self.careful {
                tracing::warn!(error = %e, "a move was refused among others; the moves in flight with it may have been routed and are put back (duplicates possible); the rest of the run moves one message at a time");
                self.careful = true;
            }
            return;
        }
        if let Some((403 | 404, text)) = refusal {
            tracing::warn!(exchange = %escape_text(&target.exchange), reason = %escape_text(&text), "the broker refuses moves to this exchange; its dead letters stay in the dead-letter queue");
            self.proven.remove(&target.exchange);
            self.refused.insert(target.exchange.clone(), text);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use lapin::protocol::AMQPError;
    use lapin::types::ShortString;

    use super::*;

    fn refused(code: u16) -> Result<(), PublishError> {
        let error = AMQPError::from_id(code, ShortString::from("refused")).unwrap();
        Err(PublishError::Channel {
            exchange: "x".into(),
            source: lapin::ErrorKind::ProtocolError(error).into(),
        })
    }

    fn to(exchange: &str, alone: bool) -> Target {
        Target {
            exchange: exchange.into(),
            alone,
        }
    }

    #[test]
    fn a_move_goes_alone_until_its_exchange_is_proven() {
        let mut x = Exchanges::default();
        assert_eq!(x.route("work"), Route::Scout);
        x.scouting.insert("work".into());
        x.learn(&to("work", true), &Ok(()));
        assert_eq!(x.route("work"), Route::Pipelined, "proven: pipelined");
        assert!(x.scouting.is_empty(), "the scout is answered");
        assert_eq!(x.route("other"), Route::Scout);
    }

    #[test]
    fn a_lone_move_refused_for_its_exchange_refuses_the_exchange() {
        let mut x = Exchanges::default();
        x.learn(&to("amq.rabbitmq.trace", true), &refused(403));
        x.learn(&to("amq.gone", true), &refused(404));
        assert_eq!(
            x.refused
                .keys()
                .map(String::as_str)
                .collect::<BTreeSet<_>>(),
            BTreeSet::from(["amq.gone", "amq.rabbitmq.trace"])
        );
        assert!(!x.careful, "nothing else was in flight: nothing in doubt");
    }

    #[test]
    fn a_lone_move_refused_for_itself_leaves_the_exchange_unproven() {
        let mut x = Exchanges::default();
        x.learn(&to("work", true), &refused(406));
        assert!(x.refused.is_empty() && x.route("work") == Route::Scout && !x.careful);
        x.learn(
            &to("work", true),
            &Err(PublishError::Nacked {
                exchange: "work".into(),
            }),
        );
        assert!(x.refused.is_empty() && !x.careful);
    }

    #[test]
    fn a_refusal_among_pipelined_moves_makes_the_rest_of_the_run_move_one_at_a_time() {
        let mut x = Exchanges::default();
        x.learn(&to("work", true), &Ok(()));
        x.learn(
            &to("work", false),
            &Err(PublishError::Nacked {
                exchange: "work".into(),
            }),
        );
        assert!(!x.careful, "a nack closes no channel");
        x.learn(&to("work", false), &refused(406));
        assert!(x.careful && x.route("work") == Route::Alone && x.refused.is_empty());
        assert_eq!(x.route("other"), Route::Alone);
    }
}
