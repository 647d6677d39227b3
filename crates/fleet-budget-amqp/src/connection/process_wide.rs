//! The deprecated process-wide connection settings of 0.1 — [`set_timeouts`], [`set_tls`] and
//! the free functions that read them — kept for one minor version as the changelog promises, and
//! removed in 0.3.0. This file is the only process-wide mutable state of the crate: nothing in
//! this workspace calls the setters (the deadlines and certificate files travel with each
//! connection's [`ConnectionConfig`](super::ConnectionConfig)), and until a program calls one,
//! what they hold is the defaults, which is what a connection made from a bare URL gets.

#![allow(deprecated)]

use std::future::Future;
use std::sync::RwLock;

use fleet_budget::tls::TlsFiles;
use lapin::{Channel, Connection};

use super::Timeouts;
use crate::error::AmqpError;

static TLS: RwLock<TlsFiles> = RwLock::new(TlsFiles {
    ca_file: None,
    cert_file: None,
    key_file: None,
});

/// Sets the certificate files of every later `amqps://` connection of this process that is not
/// given its own (a bare URL: [`ConnectionConfig::new`](super::ConnectionConfig::new)).
#[deprecated(
    since = "0.2.0",
    note = "the files travel with the connection: `ConnectionConfig::tls` (`AmqpSettings::connection`)"
)]
pub fn set_tls(files: TlsFiles) {
    *TLS.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = files;
}

/// The certificate files a bare URL gets.
#[deprecated(since = "0.2.0", note = "read `ConnectionConfig::tls`")]
#[must_use]
pub fn tls_files() -> TlsFiles {
    TLS.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// The deadlines and files of the deprecated process-wide setters: what a connection not given
/// its own gets ([`ConnectionConfig::new`](super::ConnectionConfig::new), [`ConnectionWatch::new`](super::ConnectionWatch::new)); the defaults unless a
/// program still calls [`set_timeouts`] or [`set_tls`]. Goes with them in 0.3.0.
pub(crate) fn process_wide() -> (Timeouts, TlsFiles) {
    let timeouts = *TIMEOUTS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let tls = TLS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    (timeouts, tls)
}

static TIMEOUTS: RwLock<Timeouts> = RwLock::new(Timeouts::DEFAULT);

/// Sets the deadlines of every later network step of this process that is not given its own.
#[deprecated(
    since = "0.2.0",
    note = "the deadlines travel with the connection: `ConnectionConfig::timeouts` (`AmqpSettings::connection`)"
)]
pub fn set_timeouts(timeouts: Timeouts) {
    *TIMEOUTS
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = timeouts;
}

/// The deadlines a step not given its own gets.
#[deprecated(since = "0.2.0", note = "read `ConnectionConfig::timeouts`")]
#[must_use]
pub fn timeouts() -> Timeouts {
    process_wide().0
}

/// Runs one broker step within the deadline of the deprecated [`set_timeouts`].
///
/// # Errors
/// As [`Timeouts::within`].
#[deprecated(
    since = "0.2.0",
    note = "use `Timeouts::within` with the connection's deadlines"
)]
pub async fn within<T>(
    step: impl Into<String>,
    future: impl Future<Output = Result<T, lapin::Error>>,
) -> Result<T, AmqpError> {
    process_wide().0.within(step, future).await
}

/// Runs one broker step within the deadline of the deprecated [`set_timeouts`].
///
/// # Errors
/// As [`Timeouts::deadline`].
#[deprecated(
    since = "0.2.0",
    note = "use `Timeouts::deadline` with the connection's deadlines"
)]
pub async fn deadline<T>(
    step: impl Into<String>,
    future: impl Future<Output = T>,
) -> Result<T, AmqpError> {
    process_wide().0.deadline(step, future).await
}

/// Closes `ch` within the deadline of the deprecated [`set_timeouts`].
#[deprecated(
    since = "0.2.0",
    note = "use `Timeouts::close_channel` with the connection's deadlines"
)]
pub async fn close_channel(ch: &Channel, reason: &str) {
    process_wide().0.close_channel(ch, reason).await;
}

/// Closes `conn` within the deadline of the deprecated [`set_timeouts`].
#[deprecated(
    since = "0.2.0",
    note = "use `Timeouts::close_connection` with the connection's deadlines"
)]
pub async fn close_connection(conn: &Connection, reason: &str) {
    process_wide().0.close_connection(conn, reason).await;
}
