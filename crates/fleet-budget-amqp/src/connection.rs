//! Connecting to the broker, and the deadline of every network step.
//!
//! A broker that accepts TCP and never answers must end in a named timeout, never a hang: the
//! connection (TCP and AMQP handshake) is bounded by [`Timeouts::connect`], and each later step
//! (opening a channel, a declare, a consume, a publisher confirm) by [`Timeouts::operation`].
//! The deadlines are process-wide: [`set_timeouts`] applies the `[amqp]` settings (the worker
//! and `budgetctl` call it once they have read their configuration).

use std::future::Future;
use std::sync::RwLock;
use std::time::Duration;

use fleet_budget::redact::redact_url;
use lapin::types::LongString;
use lapin::{Connection, ConnectionProperties};

use crate::config::AmqpSettings;
use crate::error::AmqpError;

/// How long each network step may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting: TCP and the AMQP handshake.
    pub connect: Duration,
    /// One step on an open connection: a channel, a declare, a consume, a confirm.
    pub operation: Duration,
}

impl Timeouts {
    /// 10 s to connect, 30 s per step: longer than a healthy broker ever takes, short enough
    /// that an operator sees the error.
    pub const DEFAULT: Self = Self {
        connect: Duration::from_secs(10),
        operation: Duration::from_secs(30),
    };

    /// The deadlines of `settings`.
    #[must_use]
    pub fn of(settings: &AmqpSettings) -> Self {
        Self {
            connect: settings.connect_timeout,
            operation: settings.operation_timeout,
        }
    }
}

static TIMEOUTS: RwLock<Timeouts> = RwLock::new(Timeouts::DEFAULT);

/// Sets the deadlines of every later network step of this process.
pub fn set_timeouts(timeouts: Timeouts) {
    *TIMEOUTS
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = timeouts;
}

/// The deadlines in force.
#[must_use]
pub fn timeouts() -> Timeouts {
    *TIMEOUTS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs one broker step within the operation deadline; `step` names it in the error.
///
/// # Errors
/// [`AmqpError::Timeout`] after the deadline, or the step's own error.
pub async fn within<T>(
    step: impl Into<String>,
    future: impl Future<Output = Result<T, lapin::Error>>,
) -> Result<T, AmqpError> {
    let step = step.into();
    let after = timeouts().operation;
    match tokio::time::timeout(after, future).await {
        Ok(result) => result.map_err(|e| AmqpError::broker(step, e)),
        Err(_) => Err(AmqpError::Timeout { step, after }),
    }
}

/// Runs one broker step within the operation deadline, leaving its own error to the caller.
///
/// # Errors
/// [`AmqpError::Timeout`] after the deadline.
pub async fn deadline<T>(
    step: impl Into<String>,
    future: impl Future<Output = T>,
) -> Result<T, AmqpError> {
    let after = timeouts().operation;
    tokio::time::timeout(after, future)
        .await
        .map_err(|_| AmqpError::Timeout {
            step: step.into(),
            after,
        })
}

/// Connects to `url` with `name` as the connection name shown by the broker, within the
/// connect deadline.
///
/// # Errors
/// [`AmqpError::Connect`], with the password redacted from the URL, [`AmqpError::Timeout`], or
/// [`AmqpError::TlsUnavailable`] for an `amqps://` URL.
pub async fn connect(url: &str, name: &str) -> Result<Connection, AmqpError> {
    // Without a TLS backend lapin connects `amqps://` in plaintext: never let that happen.
    if url
        .get(..8)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("amqps://"))
    {
        return Err(AmqpError::TlsUnavailable {
            url: redact_url(url),
        });
    }
    let props = ConnectionProperties::default().with_connection_name(LongString::from(name));
    let after = timeouts().connect;
    match tokio::time::timeout(after, Connection::connect(url, props)).await {
        Ok(result) => result.map_err(|source| AmqpError::Connect {
            url: redact_url(url),
            source,
        }),
        Err(_) => Err(AmqpError::Timeout {
            step: format!("connect to RabbitMQ at {}", redact_url(url)),
            after,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_amqps_url_is_refused_before_any_connection_is_made() {
        // A listener that records whether anything connected: nothing may reach it.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        for url in [
            format!("amqps://u:hunter2@127.0.0.1:{port}/%2f"),
            format!("AMQPS://u:hunter2@127.0.0.1:{port}/%2f"),
        ] {
            let err = connect(&url, "tls test").await.expect_err("refused");
            assert!(matches!(err, AmqpError::TlsUnavailable { .. }), "{err}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
        assert!(
            listener.accept().is_err(),
            "something connected in plaintext"
        );
    }
}
