//! Connecting to the broker, and the deadline of every network step.
//!
//! A broker that accepts TCP and never answers must end in a named timeout, never a hang: the
//! connection (TCP and AMQP handshake) is bounded by [`Timeouts::connect`], and each later step
//! (opening a channel, a declare, a consume, a publisher confirm) by [`Timeouts::operation`].
//! The deadlines and the certificate files travel with the connection's configuration, a
//! [`ConnectionConfig`] (the `[amqp]` settings make one: `AmqpSettings::connection`), handed
//! to [`connect`] and kept by whoever reconnects; what runs on the connection carries its
//! [`Timeouts`] along ([`Timeouts::within`]).
//!
//! A step can also wait on a connection that is already dead: when lapin cannot read what the
//! broker sent (a message whose headers nest tables deeper than the parser's bound, a frame
//! over `frame_max`) it closes the connection and fails the consumers and the replies it waits
//! for, but a `basic.get` whose `get-ok` has arrived goes on waiting for its content. A
//! [`ConnectionWatch`] ends such a step as soon as the connection is lost, with the
//! connection's error ([`AmqpError::ConnectionLost`]) instead of the deadline's.
//!
//! A cluster's nodes ([`ConnectionConfig::other_urls`] besides its `url`) are tried in turn,
//! each within the connect deadline: a node that is down costs one connect timeout (a refused
//! connection, less), not a stalled worker. Each process starts at a random node and the next
//! connect after a success starts at the node after it, so a fleet spreads over the cluster and
//! a reconnect after a lost connection tries another node first.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use fleet_budget::redact::redact_url;
use fleet_budget::tls::{TlsFailure, TlsFiles, install_crypto_provider, is_tls_url};
use futures::{FutureExt, Stream, StreamExt};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::{LongString, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, ConnectionStatus, Event};

use crate::error::AmqpError;
use crate::metrics::{AmqpMetrics, BlockedGauge};

mod blocked;
mod process_wide;

pub use self::blocked::{Blocked, BlockedBy, unless_blocked, until_unblocked};

/// How long each network step may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting: TCP and the AMQP handshake.
    pub connect: Duration,
    /// One step on an open connection: a channel, a declare, a consume, a confirm.
    pub operation: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Timeouts {
    /// 10 s to connect, 30 s per step: longer than a healthy broker ever takes, short enough
    /// that an operator sees the error.
    pub const DEFAULT: Self = Self {
        connect: Duration::from_secs(10),
        operation: Duration::from_secs(30),
    };

    /// Runs one broker step within the operation deadline; `step` names it in the error.
    ///
    /// # Errors
    /// [`AmqpError::Timeout`] after the deadline, or the step's own error.
    pub async fn within<T>(
        self,
        step: impl Into<String>,
        future: impl Future<Output = Result<T, lapin::Error>>,
    ) -> Result<T, AmqpError> {
        let step = step.into();
        let after = self.operation;
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
        self,
        step: impl Into<String>,
        future: impl Future<Output = T>,
    ) -> Result<T, AmqpError> {
        let after = self.operation;
        tokio::time::timeout(after, future)
            .await
            .map_err(|_| AmqpError::Timeout {
                step: step.into(),
                after,
            })
    }

    /// Closes `ch` (reply code 200, `reason`) within the operation deadline: a broker that
    /// stops answering must not hold a shutdown or the end of a run until the heartbeat gives
    /// up. The channel's work is done or already failed by then, so the outcome is only logged.
    pub async fn close_channel(self, ch: &Channel, reason: &str) {
        let closing = ch.close(200, ShortString::from(reason));
        logged(
            "a channel",
            reason,
            self.deadline("close a channel", closing).await,
        );
    }

    /// Closes `conn` as [`Timeouts::close_channel`] closes a channel.
    pub async fn close_connection(self, conn: &Connection, reason: &str) {
        let closing = conn.close(200, ShortString::from(reason));
        logged(
            "a connection",
            reason,
            self.deadline("close a connection", closing).await,
        );
    }
}

/// Where and how to connect: the broker's URL (or a cluster's nodes), the deadlines of every
/// step and the certificate files of an `amqps://` URL. Handed to [`connect`] and kept by
/// whoever connects again (the worker, the replayer, the exporter's queue source). Its `Debug`
/// shows the URLs with the passwords redacted.
#[derive(Clone, PartialEq)]
pub struct ConnectionConfig {
    /// Broker URL (`amqp://` or `amqps://`): the only node, or the first of a cluster's.
    pub url: String,
    /// The other nodes of a cluster, tried in turn with `url` (empty: a single broker).
    pub other_urls: Vec<String>,
    /// The deadlines of connecting and of each step on the connection.
    pub timeouts: Timeouts,
    /// Certificate files for `amqps://`: the CA file is trusted besides the system's roots.
    pub tls: TlsFiles,
}

impl fmt::Debug for ConnectionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionConfig")
            .field("url", &redact_url(&self.url))
            .field(
                "other_urls",
                &self
                    .other_urls
                    .iter()
                    .map(|u| redact_url(u))
                    .collect::<Vec<_>>(),
            )
            .field("timeouts", &self.timeouts)
            .field("tls", &self.tls)
            .finish()
    }
}

impl ConnectionConfig {
    /// `url` with the default deadlines and no certificate files of its own (the system's
    /// roots). Until 0.3.0 the deadlines and files set by the deprecated [`set_timeouts`] and
    /// [`set_tls`], when a program still calls them.
    #[must_use]
    pub fn new(url: impl Into<String>) -> Self {
        let (timeouts, tls) = process_wide();
        Self {
            url: url.into(),
            other_urls: Vec::new(),
            timeouts,
            tls,
        }
    }

    /// Every node: [`ConnectionConfig::url`], then [`ConnectionConfig::other_urls`].
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.url.as_str()).chain(self.other_urls.iter().map(String::as_str))
    }

    /// Every node, passwords redacted, separated by commas.
    #[must_use]
    pub fn shown_urls(&self) -> String {
        shown(self.urls())
    }
}

/// URLs as errors and logs show them: passwords redacted, separated by commas. Here rather than
/// in `config` (which shows its node list with it too): a connection needs nothing of the
/// configuration's parsing.
pub(crate) fn shown<'a>(urls: impl Iterator<Item = &'a str>) -> String {
    urls.map(fleet_budget::redact::redact_url)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A bare URL, as the functions that connect took before 0.2.0: [`ConnectionConfig::new`].
impl From<&str> for ConnectionConfig {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

/// A bare URL: [`ConnectionConfig::new`].
impl From<String> for ConnectionConfig {
    fn from(url: String) -> Self {
        Self::new(url)
    }
}

/// A bare URL: [`ConnectionConfig::new`].
impl From<&String> for ConnectionConfig {
    fn from(url: &String) -> Self {
        Self::new(url.as_str())
    }
}

impl From<&ConnectionConfig> for ConnectionConfig {
    fn from(config: &ConnectionConfig) -> Self {
        config.clone()
    }
}

/// Logs how the close of `what` ended.
fn logged(what: &str, reason: &str, closed: Result<Result<(), lapin::Error>, AmqpError>) {
    match closed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, reason, "closing {what}"),
        Err(e) => tracing::warn!(error = %e, reason, "RabbitMQ did not answer; {what} dropped"),
    }
}

/// How often a [`ConnectionWatch`] reads the connection's state: a step on a lost connection
/// ends within this (and the moment lapin takes to report the error).
const LOSS_POLL: Duration = Duration::from_millis(100);

/// How long [`ConnectionWatch::lost`] waits, once the connection is closing, for lapin to say
/// why: the broker's reason comes once the client's `close-ok` is written, which a loaded
/// machine can put off well past one poll. A hang check: lapin ends the closing state itself.
pub(crate) const LOSS_REASON_WAIT: Duration = Duration::from_secs(5);

/// A block in force and its place in the gauge of blocked connections (left when dropped).
type BlockedNow = (Blocked, Option<BlockedGauge>);

/// Watches one connection for its loss, for the steps that lapin would leave waiting on it (see
/// the module documentation). Cheap to clone; the clones share what they saw.
///
/// Make it right after [`connect`]: lapin hands its connection errors only to the listeners
/// that exist when the error happens. A connection lost before the watch was made is seen lost
/// all the same, without its error.
#[derive(Clone)]
pub struct ConnectionWatch {
    status: ConnectionStatus,
    events: Arc<Mutex<Pin<Box<dyn Stream<Item = Event> + Send>>>>,
    error: Arc<Mutex<Option<lapin::Error>>>,
    /// The broker's block in force, with its place in the metrics (released when it is lifted
    /// or the last clone of the watch goes).
    blocked: Arc<Mutex<Option<BlockedNow>>>,
    /// Where a block is counted (the worker's metrics), if anywhere; shared with the clone that
    /// reads the events ([`ConnectionWatch::new`]), which is made before the metrics are given.
    metrics: Arc<Mutex<Option<AmqpMetrics>>>,
    /// The deadlines of the watched connection's steps ([`ConnectionWatch::within`]).
    timeouts: Timeouts,
}

impl fmt::Debug for ConnectionWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionWatch")
            .field("status", &self.status)
            .field("error", &self.last_error())
            .field("blocked", &self.blocked())
            .finish_non_exhaustive()
    }
}

impl ConnectionWatch {
    /// Starts watching `conn`, whose steps take the default deadlines (until 0.3.0, those of the
    /// deprecated [`set_timeouts`] when a program still calls it); see
    /// [`ConnectionWatch::with_timeouts`].
    ///
    /// Inside a tokio runtime the watch also reads the connection's events on its own, every
    /// 200 ms (`BLOCK_POLL`), so that a block is said when the broker sends it, with its reason,
    /// even while the watch's owner only waits (a replay whose copies wait out an alarm asks the
    /// watch nothing). That reader ends within 200 ms of the connection's loss or of the last
    /// other clone of the watch going.
    #[must_use]
    pub fn new(conn: &Connection) -> Self {
        let watch = Self {
            status: conn.status().clone(),
            events: Arc::new(Mutex::new(Box::pin(conn.events_listener()))),
            error: Arc::new(Mutex::new(None)),
            blocked: Arc::new(Mutex::new(None)),
            metrics: Arc::new(Mutex::new(None)),
            timeouts: process_wide().0,
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let reader = watch.clone();
            runtime.spawn(async move {
                loop {
                    tokio::time::sleep(blocked::BLOCK_POLL).await;
                    reader.read_events();
                    if reader.is_lost() || Arc::strong_count(&reader.events) == 1 {
                        break;
                    }
                }
            });
        }
        watch
    }

    /// The watch, counting the broker's blocks of the connection in `metrics`
    /// (`fleet_budget_amqp_connection_blocked`, `fleet_budget_amqp_connection_blocks_total`).
    #[must_use]
    pub fn with_metrics(self, metrics: Option<AmqpMetrics>) -> Self {
        *self
            .metrics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = metrics;
        self
    }

    /// The broker's block of the connection in force (a resource alarm), as of the events read
    /// so far; `None` when it is not blocked. The watch logs each block once, with the broker's
    /// reason, and its end (see [`unless_blocked`] for what a block does to the steps).
    #[must_use]
    pub fn blocked(&self) -> Option<Blocked> {
        self.read_events();
        self.blocked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|(b, _)| b.clone())
    }

    /// The connection's state as lapin keeps it (blocked or not, at once: [`unless_blocked`]).
    #[must_use]
    pub fn status(&self) -> &ConnectionStatus {
        &self.status
    }

    /// The watch with the deadlines of the connection's configuration
    /// ([`ConnectionConfig::timeouts`]) for its [`ConnectionWatch::within`].
    #[must_use]
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// The deadlines of the watched connection's steps.
    #[must_use]
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Whether the connection is closing, closed or failed.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.status.errored() || self.status.closed() || self.status.closing()
    }

    /// The last error lapin reported on the connection that says why it ended, if any
    /// (see `names_a_loss`). A channel's error (a soft one: a queue not found, a precondition
    /// failed) is not the connection's and is not kept: a connection the broker closes later (an
    /// operator, a restart) hands out no error of its own, and must not be named by a 404 from
    /// an hour before. Nor is lapin's report that a channel was closed on a connection already
    /// closing: that is what the loss did, not why.
    #[must_use]
    pub fn last_error(&self) -> Option<lapin::Error> {
        self.read_events();
        self.error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Takes the events lapin has reported so far, keeping the last error.
    fn read_events(&self) {
        let mut events = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while let Some(Some(event)) = events.next().now_or_never() {
            match event {
                Event::Error(e) if names_a_loss(&e) => {
                    *self
                        .error
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
                }
                Event::ConnectionBlocked(reason) => self.block(&reason),
                Event::ConnectionUnblocked => self.unblock(),
                _ => {}
            }
        }
    }

    /// The broker blocked the connection: said once, with its reason, and counted.
    fn block(&self, reason: &str) {
        let reason = fleet_budget::printable::escape_text(reason).into_owned();
        let resource = BlockedBy::of(&reason);
        tracing::warn!(
            reason = %reason,
            resource = resource.as_str(),
            "RabbitMQ blocked the connection (a resource alarm): nothing is published, acked or \
             nacked until it is unblocked; the jobs in flight wait unacked, no new job starts"
        );
        let gauge = self
            .metrics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|m| m.connection_blocked(resource));
        let blocked = Blocked {
            reason,
            resource,
            since: std::time::Instant::now(),
        };
        *self
            .blocked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((blocked, gauge));
    }

    /// The broker unblocked the connection: said once.
    fn unblock(&self) {
        let was = self
            .blocked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let (reason, blocked_for) = was
            .as_ref()
            .map(|(b, _)| (b.reason.as_str(), b.since.elapsed()))
            .unwrap_or_default();
        tracing::info!(
            reason,
            ?blocked_for,
            "RabbitMQ unblocked the connection; the jobs in flight go on"
        );
    }

    /// Resolves once the connection is lost, with the error that ended it when lapin reported
    /// one. Its state turns to closing before the error is handed out (the broker's
    /// `connection.close` arrives, the error follows once the client's `close-ok` is written):
    /// while it is closing, the watch waits for the error, up to 5 s (`LOSS_REASON_WAIT`).
    ///
    /// `None` when lapin ended the connection without a reason: a channel closed (dropped) just
    /// as the broker closed the connection becomes lapin's connection error, `invalid channel
    /// state`, and lapin keeps only the first, so the broker's reason is never reported. The
    /// watch does not name the loss by that (see `names_a_loss`).
    pub async fn lost(&self) -> Option<lapin::Error> {
        while !self.is_lost() {
            // Read as it goes: lapin's listener queue is unbounded, and a worker's connection
            // lives for days.
            self.read_events();
            tokio::time::sleep(LOSS_POLL).await;
        }
        let waited = tokio::time::Instant::now();
        loop {
            let closing = self.status.closing();
            if let Some(e) = self.last_error() {
                return Some(e);
            }
            if !closing && waited.elapsed() >= LOSS_POLL {
                // Errored or closed, and one poll given to lapin's hand-over of its error.
                return None;
            }
            if waited.elapsed() >= LOSS_REASON_WAIT {
                return None;
            }
            tokio::time::sleep(LOSS_POLL / 4).await;
        }
    }

    /// The error that ended the connection, once it is lost ([`ConnectionWatch::lost`]);
    /// `None` when it is not lost within `within` (a channel of it failed, the connection did
    /// not), or ended without a reason.
    pub(crate) async fn reason_within(&self, within: Duration) -> Option<lapin::Error> {
        tokio::time::timeout(within, self.lost())
            .await
            .ok()
            .flatten()
    }

    /// [`Timeouts::within`] with the watch's deadlines, ended early when the connection is
    /// lost: then the error is [`AmqpError::ConnectionLost`], naming the step and the
    /// connection's error.
    ///
    /// # Errors
    /// As [`Timeouts::within`], or [`AmqpError::ConnectionLost`].
    pub async fn within<T>(
        &self,
        step: impl Into<String>,
        future: impl Future<Output = Result<T, lapin::Error>>,
    ) -> Result<T, AmqpError> {
        let step = step.into();
        tokio::select! {
            biased;
            result = self.timeouts.within(step.clone(), future) => result,
            source = self.lost() => Err(AmqpError::ConnectionLost { step, source }),
        }
    }
}

/// Whether `e`, reported on the connection's events, says why the connection ended. Not:
/// - a channel's own error (a soft error of the protocol: a 404, a precondition failed);
/// - lapin's report that a channel or the connection was not in a state for a step
///   (`invalid channel state: Closing (channel.close)`): a channel dropped while the broker
///   closes the connection. Lapin makes that the connection's error when it comes first, and
///   then drops the broker's own reason: the loss is better left unnamed than named by it.
fn names_a_loss(e: &lapin::Error) -> bool {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => {
            !matches!(amqp.kind(), lapin::protocol::AMQPErrorKind::Soft(_))
        }
        _ => !is_state_error(e),
    }
}

/// Whether `e` is lapin's report that a channel or the connection was not in a state for a step
/// (`invalid channel state: Closing (channel.close)`): what a loss did, never why. When it came
/// first, lapin handed it to the consumers too, in place of the broker's reason.
pub(crate) fn is_state_error(e: &lapin::Error) -> bool {
    matches!(
        e.kind(),
        lapin::ErrorKind::InvalidChannelState(..)
            | lapin::ErrorKind::InvalidConnectionState(_)
            | lapin::ErrorKind::InvalidChannel(_)
    )
}

/// Where the next [`connect`] of this process starts in a node list: random at first, so that a
/// fleet's processes spread over a cluster; the node after the last one connected to after.
static NEXT_NODE: LazyLock<AtomicUsize> =
    LazyLock::new(|| AtomicUsize::new(usize::try_from(rand::random::<u32>()).unwrap_or_default()));

/// The order in which [`connect`] tries `nodes` nodes, starting at `start`: each once.
fn node_order(start: usize, nodes: usize) -> impl Iterator<Item = usize> {
    let nodes = nodes.max(1);
    let first = start % nodes;
    (0..nodes).map(move |i| (first + i) % nodes)
}

/// Connects to the broker of `to` (a [`ConnectionConfig`], or a bare URL) with `name` as the
/// connection name shown by the broker, within its connect deadline. An `amqps://` URL is
/// connected with TLS (rustls; the CA file of its configuration, else the system's root
/// certificates; certificate and host name verified) and never in plaintext.
///
/// A cluster's nodes are tried in turn (see the module documentation), each within the connect
/// deadline, until one answers; each node that does not is logged (password redacted).
///
/// # Errors
/// [`AmqpError::Connect`], with the password redacted from the URL, [`AmqpError::Timeout`],
/// [`AmqpError::Tls`] when the TLS handshake fails, or [`AmqpError::TlsSettings`]: of the last
/// node tried when none answered.
pub async fn connect(to: impl Into<ConnectionConfig>, name: &str) -> Result<Connection, AmqpError> {
    let config = to.into();
    let nodes: Vec<&str> = config.urls().collect();
    if nodes.len() == 1 {
        return connect_node(&config, &config.url, name).await;
    }
    let start = NEXT_NODE.load(Ordering::Relaxed);
    let mut last = None;
    for i in node_order(start, nodes.len()) {
        let Some(url) = nodes.get(i) else { continue };
        match connect_node(&config, url, name).await {
            Ok(connection) => {
                NEXT_NODE.store(i + 1, Ordering::Relaxed);
                tracing::info!(node = %redact_url(url), "connected to RabbitMQ");
                return Ok(connection);
            }
            Err(e) => {
                tracing::warn!(node = %redact_url(url), error = %e, "RabbitMQ node did not answer; trying the next");
                last = Some(e);
            }
        }
    }
    // The next attempt starts past the nodes that failed this time.
    NEXT_NODE.store(start % nodes.len() + 1, Ordering::Relaxed);
    Err(last.unwrap_or_else(|| AmqpError::Timeout {
        step: format!("connect to RabbitMQ at {}", config.shown_urls()),
        after: config.timeouts.connect,
    }))
}

/// Connects to one node, `url`, as [`connect`] does.
async fn connect_node(
    config: &ConnectionConfig,
    url: &str,
    name: &str,
) -> Result<Connection, AmqpError> {
    let shown = redact_url(url);
    let files = &config.tls;
    let tls = if is_tls_url(url) {
        install_crypto_provider();
        let material = files.load("amqp").map_err(|e| AmqpError::TlsSettings {
            url: shown.clone(),
            detail: e.to_string(),
        })?;
        OwnedTLSConfig {
            cert_chain: material
                .ca_pem
                .map(|pem| String::from_utf8_lossy(&pem).into_owned()),
            identity: material
                .client
                .map(|(pem, key)| OwnedIdentity::PKCS8 { pem, key }),
        }
    } else {
        // Files set for a plaintext URL are a configuration problem
        // (`AmqpSettings::tls_problem`), reported where the configuration is read: the files
        // are the whole configuration's, and the same settings may serve an `amqps://` URL.
        OwnedTLSConfig::default()
    };
    let props = ConnectionProperties::default().with_connection_name(LongString::from(name));
    let after = config.timeouts.connect;
    let uri = url
        .parse::<lapin::uri::AMQPUri>()
        .map_err(|e| AmqpError::Connect {
            url: shown.clone(),
            source: lapin::Error::from(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "not a valid AMQP URL: {}",
                    fleet_budget::redact::redact_text(&e)
                ),
            )),
        })?;
    // Every byte lapin reads passes the frame guard (headers its parser cannot survive).
    let connecting = crate::frame_guard::runtime::open(uri, props, tls);
    match tokio::time::timeout(after, connecting).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(source)) => Err(match TlsFailure::of(&source) {
            Some(failure) => AmqpError::Tls {
                url: shown,
                failure,
                source,
            },
            None => AmqpError::Connect { url: shown, source },
        }),
        Err(_) => Err(AmqpError::Timeout {
            step: format!("connect to RabbitMQ at {shown}"),
            after,
        }),
    }
}

pub(crate) use self::process_wide::process_wide;
#[allow(deprecated)]
pub use self::process_wide::{
    close_channel, close_connection, deadline, set_timeouts, set_tls, timeouts, tls_files, within,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_is_tried_once_from_any_start() {
        for start in [0, 1, 2, 5, usize::MAX] {
            let mut order: Vec<usize> = node_order(start, 3).collect();
            assert_eq!(order.len(), 3);
            order.sort_unstable();
            assert_eq!(order, [0, 1, 2], "start {start}");
        }
        assert_eq!(node_order(1, 3).collect::<Vec<_>>(), [1, 2, 0]);
    }

    #[test]
    fn a_loss_is_named_by_its_cause_not_by_a_state_or_a_channel_error() {
        use lapin::protocol::AMQPError;
        let amqp = |code: u16| -> lapin::Error {
            lapin::ErrorKind::ProtocolError(
                AMQPError::from_id(code, "reply".into()).expect("a known reply code"),
            )
            .into()
        };
        // CONNECTION_FORCED (320) names the loss; NOT_FOUND (404) is one channel's.
        assert!(names_a_loss(&amqp(320)));
        assert!(!names_a_loss(&amqp(404)));
        let io: lapin::Error = lapin::ErrorKind::IOError(std::sync::Arc::new(
            std::io::ErrorKind::ConnectionReset.into(),
        ))
        .into();
        assert!(names_a_loss(&io));
        assert!(names_a_loss(
            &lapin::ErrorKind::MissingHeartbeatError.into()
        ));
        let closing: lapin::Error =
            lapin::ErrorKind::InvalidChannelState(lapin::ChannelState::Closing, "channel.close")
                .into();
        assert!(!names_a_loss(&closing), "{closing}");
        assert!(is_state_error(&closing));
        assert!(!is_state_error(&io));
        assert!(!names_a_loss(
            &lapin::ErrorKind::InvalidConnectionState(lapin::ConnectionState::Closed).into()
        ));
    }
}
