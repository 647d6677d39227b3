//! The incident console: budgets, breakers, dead letters and replay in the browser, safe to
//! expose.
//!
//! Why a console when `budgetctl` has every command: during an incident the questions are
//! "which dependency is hurting, is the budget holding, what was dead-lettered and why, and
//! when can I put it back", and the answers are spread over `status`, `dlq stats`, `dlq peek`,
//! `replay --dry-run` and `budget freeze`. Here they are on one page each, refreshed live, with
//! the actions beside the numbers that justify them.
//!
//! How it is built:
//! - [`access`]: operator and viewer tokens (compared in constant time, never printed),
//!   sessions, the CSRF token every form carries, and the rate of actions;
//! - `fleet`: the overview, read from Redis through `fleet_budget::control` (the reads
//!   `budgetctl status` makes), worst first, and each dependency's recent history;
//! - `dead_letters`: the dead-letter and parked queues grouped by dependency × reason × error
//!   class, from a sample refreshed in the background (a page view never reads the queue);
//! - `replay`: the one file that calls the replay library (dry run, run, purge);
//! - `pages` and `routes`: the HTML (maud: templates are Rust, every value escaped unless
//!   marked otherwise, and nothing here marks one) and the HTTP routes (axum's router), behind
//!   one guard (the bounds of a request's head, the `Host` allow-list, the `Origin` of a change,
//!   the body read within its deadline and size) that also puts the security headers on every
//!   answer, refusals included;
//! - `pages::risks`: the settings of Redis and RabbitMQ that lose budgets or messages without
//!   an error, read in the background and shown on every page;
//! - `server`: hyper's HTTP/1 connections under the router, with the network's bounds
//!   ([`NetLimits`]: the head and write deadlines, connections per address and in all).
//!   Every response carries a Content-Security-Policy without inline scripts; the one script is
//!   vendored in the crate (`crates/fleet-budget-console/static/console.js`, no build step) and writes text only
//!   (`textContent`), never HTML.
//!
//! `budgetctl console` starts it; [`start`] embeds it.

pub mod access;
mod dead_letters;
mod filters;
mod fleet;
mod pages;
mod prometheus;
mod replay;
mod routes;
mod server;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_budget::control::AuditLog;
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget_amqp::{Topology, WorkerConfig};
use tokio::sync::Notify;

pub use access::{LoginLimits, MIN_TOKEN_BYTES, Token, TokenError, Viewers};
pub use fleet_budget::metrics::Prometheus;

use crate::access::{Access, Counters, lock};
use crate::dead_letters::{Sample, Which};
use crate::fleet::History;
use crate::replay::Jobs;

/// How the console runs.
#[derive(Debug, Clone)]
pub struct ConsoleSettings {
    /// Where it listens (`127.0.0.1:8089` unless told otherwise).
    pub bind: SocketAddr,
    /// Who may change things (at least one).
    pub operators: Vec<Token>,
    /// Who may look.
    pub viewers: Viewers,
    /// The fleet's configuration (Redis, RabbitMQ, policies).
    pub config: WorkerConfig,
    /// Messages of each queue read per refresh of the dead-letter sample.
    pub dead_letter_sample: u64,
    /// How often the dead-letter sample is refreshed.
    pub dead_letter_refresh: Duration,
    /// How often every dependency is read for the history.
    pub history_every: Duration,
    /// The longest any page waits for Redis or RabbitMQ.
    pub upstream_timeout: Duration,
    /// Actions (overrides, replays, purges, refreshes) accepted per minute, all operators
    /// together.
    pub actions_per_minute: u32,
    /// The address browsers use when it is not the bind address (`https://console.example`
    /// behind a TLS proxy): its host is allowed in the `Host` header beside the bind address's,
    /// and an `https://` URL marks the cookies `Secure`.
    pub public_url: Option<PublicUrl>,
    /// Proxies whose `X-Forwarded-For` names the client (its last address): the login limits
    /// and the connection limits count that client, not the proxy.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// The network's bounds (deadlines, connections).
    pub limits: NetLimits,
    /// The login limits (per client address, per token label).
    pub login_limits: LoginLimits,
    /// Where the overview's sparklines come from when set (`--prometheus-url`): Prometheus's
    /// range queries over the counters the workers export; else, and whenever Prometheus
    /// fails, the console's own readings.
    pub prometheus: Option<Prometheus>,
    /// The step of the sparklines read from Prometheus (one point per step over the last
    /// hour; each point counts over its step).
    pub prometheus_step: Duration,
}

/// The public address of the console, as given to `--public-url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicUrl {
    https: bool,
    host: String,
}

/// A `--public-url` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the public URL must be http://HOST[:PORT][/...] or https://HOST[:PORT][/...]: {0}")]
pub struct PublicUrlError(String);

impl PublicUrl {
    /// Reads `http://HOST[:PORT][/PATH]` or `https://...` (no user, no password).
    ///
    /// # Errors
    /// Another scheme, no host, or credentials in the URL.
    pub fn parse(url: &str) -> Result<Self, PublicUrlError> {
        let why = |w: &str| PublicUrlError(w.to_owned());
        let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(why("the scheme is not http:// or https://"));
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            return Err(why("a user or password in the URL"));
        }
        let host = routes::host_part(authority).to_ascii_lowercase();
        if host.is_empty()
            || !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-.:[]".contains(c))
        {
            return Err(why("no host, or a host with characters a host cannot have"));
        }
        Ok(Self { https, host })
    }

    /// Whether browsers reach the console over TLS.
    #[must_use]
    pub fn https(&self) -> bool {
        self.https
    }

    /// The host (lower case, without the port).
    #[must_use]
    pub fn host(&self) -> &str {
        &self.host
    }
}

/// The network's bounds. Why each: a request that never finishes its head or body, or a
/// client that never reads its answer, would hold a connection (a file descriptor) for ever;
/// 1,100 of them stopped `/login` answering under a 1,024-file limit (issue 32).
#[derive(Debug, Clone)]
pub struct NetLimits {
    /// A request's head must arrive within this (an idle keep-alive connection waiting for
    /// its next request is closed after it too). On expiry the connection is closed, without
    /// an answer.
    pub header_timeout: Duration,
    /// A request's body must arrive within this after its head; else 408 and the connection
    /// closed.
    pub body_timeout: Duration,
    /// A write the client does not read for this long ends the connection.
    pub write_idle_timeout: Duration,
    /// Connections open at once. When full, a new connection closes the one that has waited
    /// longest for a request head (a half-sent request or an idle keep-alive); if every one is
    /// in a request, the new one is closed.
    pub max_connections: usize,
    /// Connections open at once from one client address (IPv6 by /64); more are closed on
    /// arrival. Trusted proxies are exempt.
    pub max_connections_per_address: usize,
}

impl Default for NetLimits {
    /// 10 s for a head, 10 s for a body, 30 s for a stalled write, 512 connections, 64 from
    /// one address.
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            write_idle_timeout: Duration::from_secs(30),
            max_connections: 512,
            max_connections_per_address: 64,
        }
    }
}

impl ConsoleSettings {
    /// The defaults: `127.0.0.1:8089`, samples of 10,000 messages every 30 s, a history point
    /// every 5 s, 10 s for any upstream call, 30 actions a minute.
    #[must_use]
    pub fn new(config: WorkerConfig, operators: Vec<Token>, viewers: Viewers) -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 8089)),
            operators,
            viewers,
            config,
            dead_letter_sample: 10_000,
            dead_letter_refresh: Duration::from_secs(30),
            history_every: Duration::from_secs(5),
            upstream_timeout: Duration::from_secs(10),
            actions_per_minute: 30,
            public_url: None,
            trusted_proxies: Vec::new(),
            limits: NetLimits::default(),
            login_limits: LoginLimits::default(),
            prometheus: None,
            prometheus_step: Duration::from_secs(60),
        }
    }
}

/// Why the console could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// No operator token.
    #[error("no operator token: a console without one could not change anything safely")]
    NoOperator,
    /// The address is taken or not ours.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The Redis settings cannot be used.
    #[error("redis: {0}")]
    Redis(String),
    /// The server failed.
    #[error("the console's server failed: {0}")]
    Serve(std::io::Error),
}

/// Everything the routes share.
pub(crate) struct App {
    pub(crate) settings: ConsoleSettings,
    pub(crate) access: Access,
    pub(crate) store: Arc<RedisStore>,
    pub(crate) audit: AuditLog,
    pub(crate) topology: Topology,
    pub(crate) history: Mutex<History>,
    pub(crate) samples: Mutex<[Sample; 2]>,
    /// Wakes the dead-letter refresher before its time (after an action, or on request).
    pub(crate) refresh_now: Arc<Notify>,
    /// Set when an operator asked for a sample of messages: the refresher reads one (a read
    /// that puts each message back as a copy), else it reads only the counts.
    pub(crate) sample_wanted: Arc<std::sync::atomic::AtomicBool>,
    /// One reader or mover of the queues at a time: a sample read beside a replay would
    /// move messages under it.
    pub(crate) queue_work: Arc<tokio::sync::Mutex<()>>,
    pub(crate) jobs: Arc<Jobs>,
    /// The fleet's risky settings, read in the background ([`pages::risks::read`]).
    pub(crate) risks: Mutex<Arc<Vec<pages::risks::Risk>>>,
    /// The counters of `/metrics`.
    pub(crate) counters: Arc<Counters>,
    /// The last reading of the fleet ([`fleet::Reading`]), which the overview renders.
    pub(crate) reading: tokio::sync::watch::Sender<fleet::Reading>,
    /// Reads started (each reading carries its number).
    pub(crate) reads_started: std::sync::atomic::AtomicU64,
    /// Wakes the fleet's reader before its time (after an operator's change).
    pub(crate) read_now: Notify,
    /// The last hour of each dependency as Prometheus has it, when configured.
    pub(crate) sparks: Mutex<Option<Arc<fleet::Sparks>>>,
}

impl App {
    /// The last reading of the fleet, waiting for the first (within the upstream deadline).
    ///
    /// # Errors
    /// The last read failed, or none succeeded in time (a page that says so).
    pub(crate) async fn overview(&self) -> Result<Arc<fleet::Overview>, routes::ConsoleError> {
        let mut rx = self.reading.subscribe();
        let waited = tokio::time::timeout(self.settings.upstream_timeout, async {
            loop {
                {
                    let r = rx.borrow_and_update();
                    if let Some(e) = &r.failure {
                        return Err(routes::ConsoleError::upstream("Redis", &**e));
                    }
                    if let Some(ov) = &r.overview {
                        return Ok(Arc::clone(ov));
                    }
                }
                if rx.changed().await.is_err() {
                    return Err(routes::ConsoleError::upstream(
                        "Redis",
                        &fleet_budget::StoreError::Timeout(self.settings.upstream_timeout),
                    ));
                }
            }
        })
        .await;
        waited.unwrap_or_else(|_| {
            Err(routes::ConsoleError::upstream(
                "Redis",
                &fleet_budget::StoreError::Timeout(self.settings.upstream_timeout),
            ))
        })
    }

    /// Asks the fleet's reader for a new reading, started after this call, and waits for it
    /// (within the upstream deadline): what an operator's change does before answering, so the
    /// overview it goes back to shows the change.
    pub(crate) async fn read_again(&self) {
        let mut rx = self.reading.subscribe();
        let wanted = self
            .reads_started
            .load(std::sync::atomic::Ordering::SeqCst)
            .saturating_add(1);
        self.read_now.notify_one();
        let waited = tokio::time::timeout(self.settings.upstream_timeout, async {
            while rx.borrow_and_update().read < wanted {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        if waited.is_err() {
            tracing::warn!("console: no new reading of the fleet within the deadline");
        }
    }

    pub(crate) fn sample(&self, which: Which) -> Sample {
        let i = match which {
            Which::Dead => 0,
            Which::Parked => 1,
        };
        lock(&self.samples).get(i).cloned().unwrap_or_default()
    }
}

/// A console serving.
#[derive(Debug)]
pub struct RunningConsole {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<Result<(), std::io::Error>>,
    background: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningConsole {
    /// Where it listens (the port chosen when the settings asked for port 0).
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until the server fails (or [`RunningConsole::stop`]).
    ///
    /// # Errors
    /// The server failed.
    pub async fn wait(mut self) -> Result<(), StartError> {
        let server = std::mem::replace(&mut self.server, tokio::spawn(async { Ok(()) }));
        let r = server.await;
        self.stop_background();
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StartError::Serve(e)),
            Err(e) => Err(StartError::Serve(std::io::Error::other(e))),
        }
    }

    /// Stops serving (requests under way finish).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let server = std::mem::replace(&mut self.server, tokio::spawn(async { Ok(()) }));
        let _ = server.await;
        self.stop_background();
    }

    fn stop_background(&mut self) {
        for task in self.background.drain(..) {
            task.abort();
        }
    }
}

impl Drop for RunningConsole {
    fn drop(&mut self) {
        self.stop_background();
    }
}

/// Binds `settings.bind` and serves the console in tasks of the current runtime.
///
/// # Errors
/// No operator token, unusable Redis settings, or the address cannot be bound.
pub async fn start(settings: ConsoleSettings) -> Result<RunningConsole, StartError> {
    if settings.operators.is_empty() {
        return Err(StartError::NoOperator);
    }
    let budget = &settings.config.budget;
    let timeout = budget.redis.timeout.max(Duration::from_secs(1));
    let store = RedisStore::new_with_tls(
        RedisTarget::from_settings(&budget.redis),
        &budget.redis.key_prefix,
        timeout,
        &budget.redis.tls,
    )
    .map_err(|e| StartError::Redis(fleet_budget::redact::redact_text(&e.to_string())))?;
    let listener = tokio::net::TcpListener::bind(settings.bind)
        .await
        .map_err(|source| StartError::Bind {
            addr: settings.bind,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: settings.bind,
        source,
    })?;
    let store = Arc::new(store);
    let app = Arc::new(App {
        access: Access::new(
            settings.operators.clone(),
            settings.viewers.clone(),
            settings.actions_per_minute,
            settings.login_limits,
            Some(Arc::clone(&store)),
        ),
        jobs: Arc::new(Jobs::new(Some(Arc::clone(&store)))),
        risks: Mutex::default(),
        store,
        audit: budget.audit.log(),
        topology: Topology::new(&settings.config.amqp),
        history: Mutex::new(History::default()),
        samples: Mutex::new([Sample::default(), Sample::default()]),
        refresh_now: Arc::new(Notify::new()),
        sample_wanted: Arc::default(),
        queue_work: Arc::new(tokio::sync::Mutex::new(())),
        counters: Arc::new(Counters::default()),
        reading: tokio::sync::watch::Sender::new(fleet::Reading::default()),
        reads_started: std::sync::atomic::AtomicU64::new(0),
        read_now: Notify::new(),
        sparks: Mutex::new(None),
        settings,
    });
    let jobs = Arc::clone(&app.jobs);
    let mut background = vec![
        tokio::spawn(keep_reading(app.clone())),
        tokio::spawn(dead_letters::keep_samples(app.clone())),
        tokio::spawn(async move { jobs.keep_alive().await }),
        tokio::spawn(keep_risks(app.clone())),
    ];
    // A copy of the operators' overrides, put back when Redis loses one before its end.
    background.extend(fleet_budget::control::keep_overrides(
        Arc::clone(&app.store),
        &app.settings.config.budget,
        "console",
        None,
    ));
    if app.settings.prometheus.is_some() {
        background.push(tokio::spawn(keep_sparks(app.clone())));
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let limits = app.settings.limits.clone();
    let trusted = app.settings.trusted_proxies.clone();
    let counters = Arc::clone(&app.counters);
    let router = routes::router(app);
    let server = tokio::spawn(server::serve(
        listener, router, limits, trusted, counters, stopped,
    ));
    Ok(RunningConsole {
        addr,
        stop: Some(stop),
        server,
        background,
    })
}

/// How often the fleet's risky settings are read again.
const RISKS_EVERY: Duration = Duration::from_secs(300);

/// Reads the risks of Redis and RabbitMQ every [`RISKS_EVERY`], for the banner of every page.
async fn keep_risks(app: Arc<App>) {
    loop {
        let read = tokio::time::timeout(
            app.settings.upstream_timeout,
            pages::risks::read(&app.store, &app.settings.config),
        )
        .await;
        match read {
            Ok(risks) => *lock(&app.risks) = Arc::new(risks),
            Err(_) => tracing::warn!("console: reading the risks of Redis and RabbitMQ timed out"),
        }
        tokio::time::sleep(RISKS_EVERY).await;
    }
}

/// Reads every dependency every `history_every` (or at once when an operator's change asks):
/// the reading every overview renders, and a point of the history.
async fn keep_reading(app: Arc<App>) {
    loop {
        read_fleet(&app).await;
        tokio::select! {
            () = tokio::time::sleep(app.settings.history_every) => {}
            () = app.read_now.notified() => {}
        }
    }
}

/// One reading of the fleet, published.
async fn read_fleet(app: &App) {
    let number = app
        .reads_started
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        .saturating_add(1);
    let started = std::time::Instant::now();
    let timeout = app.settings.upstream_timeout;
    let read = tokio::time::timeout(
        timeout,
        fleet::overview(&app.settings.config.budget, &app.store, None),
    )
    .await
    .unwrap_or(Err(fleet_budget::StoreError::Timeout(timeout)));
    match read {
        Ok(mut overview) => {
            overview.read_at_ms = fleet_budget::clock::now_ms();
            overview.read_took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(0);
            lock(&app.history).record(&overview);
            let overview = Arc::new(overview);
            app.reading.send_modify(|r| {
                r.overview = Some(overview);
                r.failure = None;
                r.read = number;
            });
        }
        Err(e) => {
            tracing::warn!(error = %e, "console: reading the fleet failed");
            app.reading.send_modify(|r| {
                r.failure = Some(Arc::new(e));
                r.read = number;
            });
        }
    }
}

/// Reads the last hour of every dependency from Prometheus, when configured, a few times a
/// step (at least every 30 s): the overview's sparklines, which fall back to the console's own
/// readings while this fails.
async fn keep_sparks(app: Arc<App>) {
    let Some(prometheus) = app.settings.prometheus.clone() else {
        return;
    };
    let step = app.settings.prometheus_step;
    let every = (step / 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        let now_ms = fleet_budget::clock::now_ms();
        let read = prometheus::hour(&prometheus, now_ms, step).await;
        let sparks = match read {
            Ok(hours) => fleet::Sparks {
                from: prometheus.shown().to_owned(),
                hours,
                read_at_ms: now_ms,
                error: None,
            },
            Err(e) => {
                tracing::warn!(error = %e, "console: reading the sparklines from Prometheus failed");
                fleet::Sparks {
                    from: prometheus.shown().to_owned(),
                    hours: std::collections::BTreeMap::new(),
                    read_at_ms: now_ms,
                    error: Some(e),
                }
            }
        };
        *lock(&app.sparks) = Some(Arc::new(sparks));
        tokio::time::sleep(every).await;
    }
}
