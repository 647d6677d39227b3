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
//!   marked otherwise, and nothing here marks one) and the HTTP routes (axum's HTTP/1 server).
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
mod replay;
mod routes;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_budget::control::AuditLog;
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget_amqp::{Topology, WorkerConfig};
use tokio::sync::Notify;

pub use access::{MIN_TOKEN_BYTES, Token, TokenError, Viewers};

use crate::access::{Access, lock};
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
        }
    }
}

/// Why the console could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsoleError {
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
    pub(crate) jobs: Jobs,
}

impl App {
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
    pub async fn wait(mut self) -> Result<(), ConsoleError> {
        let server = std::mem::replace(&mut self.server, tokio::spawn(async { Ok(()) }));
        let r = server.await;
        self.stop_background();
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ConsoleError::Serve(e)),
            Err(e) => Err(ConsoleError::Serve(std::io::Error::other(e))),
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
pub async fn start(settings: ConsoleSettings) -> Result<RunningConsole, ConsoleError> {
    if settings.operators.is_empty() {
        return Err(ConsoleError::NoOperator);
    }
    let budget = &settings.config.budget;
    let timeout = budget.redis.timeout.max(Duration::from_secs(1));
    let store = RedisStore::new_with_tls(
        RedisTarget::from_settings(&budget.redis),
        &budget.redis.key_prefix,
        timeout,
        &budget.redis.tls,
    )
    .map_err(|e| ConsoleError::Redis(fleet_budget::redact::redact_text(&e.to_string())))?;
    let listener = tokio::net::TcpListener::bind(settings.bind)
        .await
        .map_err(|source| ConsoleError::Bind {
            addr: settings.bind,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ConsoleError::Bind {
        addr: settings.bind,
        source,
    })?;
    let app = Arc::new(App {
        access: Access::new(
            settings.operators.clone(),
            settings.viewers.clone(),
            settings.actions_per_minute,
        ),
        store: Arc::new(store),
        audit: budget.audit.log(),
        topology: Topology::new(&settings.config.amqp),
        history: Mutex::new(History::default()),
        samples: Mutex::new([Sample::default(), Sample::default()]),
        refresh_now: Arc::new(Notify::new()),
        sample_wanted: Arc::default(),
        queue_work: Arc::new(tokio::sync::Mutex::new(())),
        jobs: Jobs::default(),
        settings,
    });
    let background = vec![
        tokio::spawn(keep_history(app.clone())),
        tokio::spawn(dead_letters::keep_samples(app.clone())),
    ];
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let router = routes::router(app);
    let server = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    Ok(RunningConsole {
        addr,
        stop: Some(stop),
        server,
        background,
    })
}

/// Reads every dependency every `history_every`, for the charts.
async fn keep_history(app: Arc<App>) {
    loop {
        let read = tokio::time::timeout(
            app.settings.upstream_timeout,
            fleet::overview(&app.settings.config.budget, &app.store, None),
        )
        .await;
        match read {
            Ok(Ok(overview)) => lock(&app.history).record(&overview),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "console: reading the budgets for the history failed");
            }
            Err(_) => tracing::warn!("console: reading the budgets for the history timed out"),
        }
        tokio::time::sleep(app.settings.history_every).await;
    }
}
