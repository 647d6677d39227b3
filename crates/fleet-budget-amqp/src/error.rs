//! Failures of the RabbitMQ machinery (not outcomes of jobs: those are decisions).

use std::fmt;

use thiserror::Error;

/// One argument or property of an existing queue or exchange that differs from the declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgumentDifference {
    /// The argument (`x-delivery-limit`) or property (`durable`, `type`).
    pub argument: String,
    /// What the migration declares, as the broker printed it (`none` when absent).
    pub declared: String,
    /// What the existing object has, as the broker printed it (`none` when absent).
    pub existing: String,
}

impl fmt::Display for ArgumentDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: declared {}, existing {}",
            self.argument, self.declared, self.existing
        )
    }
}

struct Differences<'a>(&'a [ArgumentDifference]);

impl fmt::Display for Differences<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// A failure of the broker connection, the topology or a migration file.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AmqpError {
    /// The broker could not be reached or refused the connection.
    #[error("cannot connect to RabbitMQ at {url}: {source}")]
    Connect {
        /// The URL, password redacted.
        url: String,
        /// Why.
        source: lapin::Error,
    },
    /// The TLS handshake of an `amqps://` URL failed: a plaintext broker, an untrusted
    /// certificate, another host's certificate. Nothing was sent in plaintext.
    #[error("cannot connect to RabbitMQ at {url}: TLS refused ({failure}): {}", failure.explain("amqp"))]
    Tls {
        /// The URL, password redacted.
        url: String,
        /// Which failure.
        failure: fleet_budget::tls::TlsFailure,
        /// The TLS library's error.
        source: lapin::Error,
    },
    /// The TLS settings cannot be used: a certificate file that cannot be read or holds no
    /// certificate (key).
    #[error("cannot connect to RabbitMQ at {url}: {detail}")]
    TlsSettings {
        /// The URL, password redacted.
        url: String,
        /// What is wrong, naming the setting.
        detail: String,
    },
    /// A broker operation failed.
    #[error("RabbitMQ {operation} failed: {source}")]
    Broker {
        /// What was being done (`declare queue fleet.work`).
        operation: String,
        /// Why.
        source: lapin::Error,
    },
    /// An existing queue or exchange was declared with other arguments than the migration's.
    #[error(
        "{kind} {name:?} already exists with different arguments: {}. Delete it (after moving its messages) or change the migration",
        Differences(differences)
    )]
    ArgumentsDiffer {
        /// `queue` or `exchange`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// Each differing argument.
        differences: Vec<ArgumentDifference>,
    },
    /// A migration file cannot be used.
    #[error("migration {file}: {message}")]
    Migration {
        /// The file name.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// A network step did not finish within its deadline (a broker that accepts TCP and never
    /// answers, a confirm that never comes).
    #[error("RabbitMQ did not answer within {after:?}: {step} timed out")]
    Timeout {
        /// What was being done.
        step: String,
        /// The deadline.
        after: std::time::Duration,
    },
    /// The connection was lost during a step that would otherwise have waited for its deadline
    /// (lapin leaves a `basic.get` unanswered when it closes the connection on a frame it cannot
    /// read). `source` is the connection's error, when lapin reported one.
    #[error("RabbitMQ connection lost during {step}: {}{}", Cause(source.as_ref()), Hint(source.as_ref()))]
    ConnectionLost {
        /// What was being done (`get from fleet.dead`).
        step: String,
        /// The error that ended the connection.
        source: Option<lapin::Error>,
    },
    /// A replay's consumer went quiet before the messages counted at the start reached it, and
    /// they are all still in the queue: no other reader took them, so the broker held them for
    /// this run and the client never passed them on (seen with a message lapin could not read,
    /// the connection still open).
    #[error(
        "replay of {queue}: {unseen} of the {total} messages counted at the start never reached the run within {idle:?}, and they are still in the queue (no other reader took them){UNREADABLE_HINT}"
    )]
    Undelivered {
        /// The queue replayed.
        queue: String,
        /// Messages that never reached the run.
        unseen: u64,
        /// Messages counted at the start.
        total: u64,
        /// How long the consumer was quiet.
        idle: std::time::Duration,
    },
    /// The dead-letter index (in the fleet store) could not be used: not configured, or Redis
    /// failed.
    #[error("the dead-letter index of {queue}: {detail}")]
    DeadLetterIndex {
        /// The queue whose index it is.
        queue: String,
        /// What failed.
        detail: String,
    },
    /// A name that AMQP cannot carry (over 255 bytes).
    #[error("{what} {name:?} is not a valid AMQP name: {reason}")]
    InvalidName {
        /// What the name is for.
        what: &'static str,
        /// The name.
        name: String,
        /// Why.
        reason: String,
    },
}

impl AmqpError {
    pub(crate) fn broker(operation: impl Into<String>, source: lapin::Error) -> Self {
        Self::Broker {
            operation: operation.into(),
            source,
        }
    }

    /// Whether the failure is the connection's (worth reconnecting), not the request's.
    #[must_use]
    pub fn is_connection_error(&self) -> bool {
        match self {
            Self::Connect { .. }
            | Self::Timeout { .. }
            | Self::Tls { .. }
            | Self::ConnectionLost { .. } => true,
            Self::Broker { source, .. } => is_connection_error(source),
            _ => false,
        }
    }

    /// Whether the step ran out of its deadline ([`AmqpError::Timeout`]).
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }

    /// The client library's error behind this one, if any.
    #[must_use]
    pub fn lapin_error(&self) -> Option<&lapin::Error> {
        match self {
            Self::Connect { source, .. }
            | Self::Tls { source, .. }
            | Self::Broker { source, .. } => Some(source),
            Self::ConnectionLost { source, .. } => source.as_ref(),
            _ => None,
        }
    }

    /// Whether the connection ended on something the broker sent that this client cannot read
    /// (`error::is_unreadable_message`): most likely one message, which every reader fails on.
    #[must_use]
    pub fn is_unreadable_message(&self) -> bool {
        self.lapin_error().is_some_and(is_unreadable_message)
    }

    /// Whether the broker closed the channel because a delivery stayed unacked past its
    /// `consumer_timeout` ([`consumer_timeout_of`]).
    #[must_use]
    pub fn is_consumer_timeout(&self) -> bool {
        self.lapin_error()
            .is_some_and(|e| consumer_timeout_of(e).is_some())
    }
}

/// When `e` is the broker's close of a channel for a delivery left unacked past its
/// `consumer_timeout` (`406 PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed
/// out. Timeout value used: 5000 ms. ...`): the timeout it used, when its text says (zero when
/// it does not).
#[must_use]
pub fn consumer_timeout_of(e: &lapin::Error) -> Option<std::time::Duration> {
    let (code, text) = protocol_message(e)?;
    if code != PRECONDITION_FAILED || !text.contains("delivery acknowledgement") {
        return None;
    }
    let ms = text
        .split_once("Timeout value used:")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    Some(std::time::Duration::from_millis(ms))
}

/// AMQP's `PRECONDITION_FAILED` reply code.
const PRECONDITION_FAILED: u16 = 406;

/// Whether `e` is lapin's failure to read a frame the broker sent: a parse error (the frame
/// guard passes no header lapin cannot read, see `frame_guard`, so this is now rare) or a frame
/// over `frame_max` (lapin's own `FRAME_ERROR`). Either closes the connection, and the broker keeps
/// the message where it was.
pub(crate) fn is_unreadable_message(e: &lapin::Error) -> bool {
    match e.kind() {
        lapin::ErrorKind::ParsingError(_) => true,
        lapin::ErrorKind::ProtocolError(p) => {
            p.get_id() == FRAME_ERROR && p.get_message().as_str().starts_with("frame too large")
        }
        _ => false,
    }
}

/// AMQP's `FRAME_ERROR` reply code.
const FRAME_ERROR: u16 = 501;

/// The connection's error of [`AmqpError::ConnectionLost`].
struct Cause<'a>(Option<&'a lapin::Error>);

impl fmt::Display for Cause<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(e) => write!(f, "{e}"),
            None => f.write_str("the connection closed without an error from the client"),
        }
    }
}

/// What an operator should make of [`AmqpError::ConnectionLost`]'s error.
/// What an error caused by a message this client cannot read adds: the likely cause and where
/// the runbook says what to do.
const UNREADABLE_HINT: &str = ". Likely cause: a message this client cannot read (a frame over \
     frame_max), which the broker keeps at the head of \
     the queue: every reader fails on it until it is taken out by hand (runbook: \
     docs/guides/operations.md, \"A message no client can read\")";

struct Hint<'a>(Option<&'a lapin::Error>);

impl fmt::Display for Hint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_some_and(is_unreadable_message) {
            f.write_str(UNREADABLE_HINT)
        } else {
            Ok(())
        }
    }
}

pub(crate) fn is_connection_error(e: &lapin::Error) -> bool {
    e.is_io_error()
        || e.is_amqp_hard_error()
        || matches!(
            e.kind(),
            lapin::ErrorKind::InvalidConnectionState(_) | lapin::ErrorKind::MissingHeartbeatError
        )
}

/// The broker's reply text when `e` is a channel or connection close, e.g.
/// `PRECONDITION_FAILED - inequivalent arg ...`.
pub(crate) fn protocol_message(e: &lapin::Error) -> Option<(u16, String)> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(p) => {
            Some((p.get_id(), p.get_message().as_str().to_owned()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use lapin::protocol::AMQPError;
    use lapin::types::ShortString;

    use super::*;

    fn closed(code: u16, text: &str) -> lapin::Error {
        let error = AMQPError::from_id(code, ShortString::from(text)).unwrap();
        lapin::ErrorKind::ProtocolError(error).into()
    }

    fn lost(source: Option<lapin::Error>) -> AmqpError {
        AmqpError::ConnectionLost {
            step: "get from fleet.dead".into(),
            source,
        }
    }

    #[test]
    fn a_connection_lost_on_a_frame_too_large_names_the_unreadable_message() {
        let e = lost(Some(closed(FRAME_ERROR, "frame too large: 131100 bytes")));
        assert!(e.is_unreadable_message() && e.is_connection_error() && !e.is_timeout());
        let text = e.to_string();
        assert!(
            text.starts_with("RabbitMQ connection lost during get from fleet.dead: ")
                && text.contains("frame too large: 131100 bytes")
                && text.contains("Likely cause: a message this client cannot read"),
            "{text}"
        );
    }

    #[test]
    fn a_consumer_timeout_is_told_from_other_preconditions() {
        let e = closed(
            PRECONDITION_FAILED,
            "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value used: 5000 ms. This timeout value can be configured, see consumers doc guide to learn more",
        );
        assert_eq!(
            consumer_timeout_of(&e),
            Some(std::time::Duration::from_secs(5))
        );
        assert!(lost(Some(e)).is_consumer_timeout());
        let other = closed(
            PRECONDITION_FAILED,
            "PRECONDITION_FAILED - inequivalent arg",
        );
        assert_eq!(consumer_timeout_of(&other), None);
        assert!(!lost(None).is_consumer_timeout());
    }

    #[test]
    fn a_connection_lost_otherwise_says_no_more_than_it_knows() {
        let forced = lost(Some(closed(
            320,
            "CONNECTION_FORCED - closed via management",
        )));
        assert!(!forced.is_unreadable_message());
        assert!(!forced.to_string().contains("Likely cause"), "{forced}");
        let unknown = lost(None);
        assert_eq!(
            unknown.to_string(),
            "RabbitMQ connection lost during get from fleet.dead: the connection closed without an error from the client"
        );
        // A frame error the broker sent about this client's frames is not a message's.
        assert!(!lost(Some(closed(FRAME_ERROR, "type 65"))).is_unreadable_message());
    }
}
