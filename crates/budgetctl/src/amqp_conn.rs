//! Errors of the RabbitMQ commands that say which URL failed, and how to start a broker.

use fleet_budget::redact::redact_text;
use fleet_budget_amqp::{AmqpError, WorkerConfig};

/// A broker failure as a runtime error (exit 1) that names the URL (every node of a cluster),
/// passwords redacted, and how to start a broker when it is a connection failure; unusable TLS
/// settings are a configuration error (exit 2).
pub(crate) fn broker_error(config: &WorkerConfig, e: &AmqpError) -> anyhow::Error {
    let text = redact_text(&e.to_string());
    if matches!(e, AmqpError::TlsSettings { .. }) {
        // Certificate files that cannot be used are configuration (exit 2).
        crate::exit::usage(text)
    } else if matches!(e, AmqpError::Tls { .. }) {
        // The error names the URL and the TLS failure: "does not answer" would mislead.
        anyhow::anyhow!("{text}")
    } else if matches!(e, AmqpError::ConnectionLost { .. }) {
        // The broker answered; the connection died during the step (the error says why).
        anyhow::anyhow!("RabbitMQ at {}: {text}", config.amqp.shown_urls())
    } else if e.is_connection_error() {
        anyhow::anyhow!(
            "RabbitMQ at {} does not answer: {text}. Start one with `docker compose up -d` (repository root) or point --amqp-url / FLEET_BUDGET_AMQP_URL at yours",
            config.amqp.shown_urls()
        )
    } else {
        anyhow::anyhow!("RabbitMQ at {}: {text}", config.amqp.shown_urls())
    }
}
