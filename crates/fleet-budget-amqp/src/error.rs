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
            Self::Connect { .. } | Self::Timeout { .. } | Self::Tls { .. } => true,
            Self::Broker { source, .. } => is_connection_error(source),
            _ => false,
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
