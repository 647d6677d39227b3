//! Connecting to the broker.

use fleet_budget::redact::redact_url;
use lapin::types::LongString;
use lapin::{Connection, ConnectionProperties};

use crate::error::AmqpError;

/// Connects to `url` with `name` as the connection name shown by the broker.
///
/// # Errors
/// [`AmqpError::Connect`], with the password redacted from the URL.
pub async fn connect(url: &str, name: &str) -> Result<Connection, AmqpError> {
    let props = ConnectionProperties::default().with_connection_name(LongString::from(name));
    Connection::connect(url, props)
        .await
        .map_err(|source| AmqpError::Connect {
            url: redact_url(url),
            source,
        })
}
