//! What a replay run learns of the original exchanges it moves to: a move goes alone until a
//! move to its exchange is confirmed, a refused lone move refuses its exchange for the run, and a
//! refusal among pipelined moves makes the rest of the run move one at a time ([`super::run`]
//! says why).

use std::collections::{HashMap, HashSet};

use fleet_budget::printable::escape_text;

use crate::publish::PublishError;

/// Where a move went, and whether it was the only move in flight.
pub(super) struct Target {
    pub(super) exchange: String,
    pub(super) alone: bool,
}

/// What a run has learned of the original exchanges it moves to (see [`super::run`]'s documentation).
#[derive(Default)]
pub(super) struct Exchanges {
    /// Whether each exists, asked once.
    pub(super) exists: HashMap<String, bool>,
    /// A move to it was confirmed: moves to it are pipelined.
    pub(super) proven: HashSet<String>,
    /// The broker refused a lone move to it (`403`, `404`): why. Not sent to again this run.
    pub(super) refused: HashMap<String, String>,
    /// A move among others was refused: moves go one at a time for the rest of the run.
    pub(super) careful: bool,
}

impl Exchanges {
    /// Whether a move to `exchange` must go with no other move in flight.
    pub(super) fn alone(&self, exchange: &str) -> bool {
        self.careful || !self.proven.contains(exchange)
    }

    /// Learns from the outcome of a move to `target`.
    pub(super) fn learn(&mut self, target: &Target, result: &Result<(), PublishError>) {
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
        assert!(x.alone("work"));
        x.learn(&to("work", true), &Ok(()));
        assert!(!x.alone("work"), "proven: pipelined");
        assert!(x.alone("other"));
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
        assert!(x.refused.is_empty() && x.alone("work") && !x.careful);
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
        assert!(x.careful && x.alone("work") && x.refused.is_empty());
    }
}
