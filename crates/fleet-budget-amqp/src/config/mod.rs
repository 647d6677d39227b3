//! The `[amqp]` section and the configuration of a worker: the budget's sections (read by
//! `fleet-budget`, which names no broker) and this crate's `[amqp]`, from one file.
//!
//! Problems of all sections are reported together in one [`ConfigError`], worded like the
//! core's ([`fleet_budget::config::Checker`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use fleet_budget::Config;
use fleet_budget::config::{Checker, ConfigError, Problem, check_url};
use fleet_budget::dependency::{CodePoint, is_unsafe_char};
use fleet_budget::tls::TlsFiles;
use serde::Deserialize;

use crate::connection::{ConnectionConfig, Timeouts};

mod nodes;
#[cfg(test)]
mod tests;

use nodes::checked_nodes;

/// Environment variable that overrides `amqp.url` (and `amqp.urls`).
pub const ENV_AMQP_URL: &str = "FLEET_BUDGET_AMQP_URL";
/// Environment variable that overrides `amqp.urls` (and `amqp.url`): the nodes of a cluster,
/// separated by commas (a comma inside a password is written `%2C`).
pub const ENV_AMQP_URLS: &str = "FLEET_BUDGET_AMQP_URLS";

/// Most broker nodes one configuration may list (`amqp.urls`): a cluster has a handful, and
/// every one that is down costs a connect timeout on each reconnect.
pub const MAX_BROKER_URLS: usize = 32;
/// Environment variable that overrides `amqp.tls_ca_file`.
pub const ENV_AMQP_CA_FILE: &str = "FLEET_BUDGET_AMQP_CA_FILE";

/// The URL schemes of a broker (`amqps` is TLS).
pub const AMQP_SCHEMES: [&str; 2] = ["amqp", "amqps"];

/// The section of the file this crate reads.
const SECTION: &str = "amqp";

/// RabbitMQ settings, used by the worker, the replayer, the migrations and `budgetctl`.
#[derive(Debug, Clone, PartialEq)]
pub struct AmqpSettings {
    /// Broker URL: the only node, or the first of a cluster's (`amqp.url`, or the first of
    /// `amqp.urls`). Overridden by `FLEET_BUDGET_AMQP_URL` (or `FLEET_BUDGET_AMQP_URLS`).
    pub url: String,
    /// The other nodes of a cluster (the rest of `amqp.urls`; empty for a single broker):
    /// connecting tries every node in turn ([`crate::connect`]).
    pub other_urls: Vec<String>,
    /// Prefix of exchange and queue names (default `fleet`).
    pub prefix: String,
    /// Unacknowledged deliveries per consumer (default 32).
    pub prefetch: u16,
    /// The broker's delivery limit on work queues, a safety net above every ceiling (default 50).
    pub delivery_limit: u32,
    /// Retry delay tiers: queues with one TTL each that a retry waits in, hop after hop, until
    /// its delay has passed (default the powers of two 1, 2, 4, … 1,024 s: any delay within
    /// 1 s, in at most 11 hops up to 34 min).
    pub retry_tiers: Vec<Duration>,
    /// Replays after which a message is parked instead of replayed again (default 3).
    pub max_replays: u32,
    /// How long connecting may take, TCP and AMQP handshake (default 10 s;
    /// `amqp.connect_timeout_ms`).
    pub connect_timeout: Duration,
    /// How long one broker step may take: opening a channel, a declare, a publisher confirm
    /// (default 30 s; `amqp.operation_timeout_ms`).
    pub operation_timeout: Duration,
    /// Certificate files for `amqps://` (`amqp.tls_ca_file`, `tls_cert_file`, `tls_key_file`;
    /// the CA file also from `FLEET_BUDGET_AMQP_CA_FILE`). The CA file is trusted besides the
    /// system's root certificates.
    pub tls: TlsFiles,
}

impl Default for AmqpSettings {
    fn default() -> Self {
        Self {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned(),
            other_urls: Vec::new(),
            prefix: "fleet".to_owned(),
            prefetch: 32,
            delivery_limit: 50,
            retry_tiers: fleet_budget::ceiling::hops::powers_of_two(Duration::from_secs(1), 11),
            max_replays: 3,
            connect_timeout: Timeouts::DEFAULT.connect,
            operation_timeout: Timeouts::DEFAULT.operation,
            tls: TlsFiles::default(),
        }
    }
}

impl AmqpSettings {
    /// How to connect to the broker of these settings: its URL, deadlines and certificate
    /// files, for [`crate::connect`] and everything that connects.
    #[must_use]
    pub fn connection(&self) -> ConnectionConfig {
        ConnectionConfig {
            url: self.url.clone(),
            other_urls: self.other_urls.clone(),
            timeouts: Timeouts::of(self),
            tls: self.tls.clone(),
        }
    }

    /// Points at the broker `url`, as a command-line override does.
    ///
    /// # Errors
    /// Not an `amqp://` or `amqps://` URL (the problem shows it with its password redacted);
    /// nothing changes then.
    pub fn set_url(&mut self, url: &str) -> Result<(), Problem> {
        check_url("amqp.url", url, &AMQP_SCHEMES)?;
        url.clone_into(&mut self.url);
        self.other_urls.clear();
        Ok(())
    }

    /// Points at the nodes `urls` of a cluster (one URL is a single broker), as a command-line
    /// override does; `key` names them in a problem (`--amqp-url`).
    ///
    /// # Errors
    /// No URL, more than [`MAX_BROKER_URLS`], one that is not an `amqp://` or `amqps://` URL
    /// or listed twice (the problem shows it with its password redacted); nothing changes then.
    pub fn set_urls(&mut self, key: &str, urls: &[String]) -> Result<(), Problem> {
        let (url, others) = checked_nodes(key, urls)?;
        self.url = url;
        self.other_urls = others;
        Ok(())
    }

    /// Every node: [`AmqpSettings::url`], then [`AmqpSettings::other_urls`].
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.url.as_str()).chain(self.other_urls.iter().map(String::as_str))
    }

    /// Every node, passwords redacted, separated by commas: how errors and logs name the broker.
    #[must_use]
    pub fn shown_urls(&self) -> String {
        crate::connection::shown(self.urls())
    }

    /// The problem of certificate files set (`amqp.tls_*`) for a URL that is not `amqps://`:
    /// nothing would be encrypted, so the files are not silently ignored.
    ///
    /// Also the problem of a cluster whose nodes mix `amqps://` and `amqp://`: failing over
    /// would silently drop the encryption.
    #[must_use]
    pub fn tls_problem(&self) -> Option<Problem> {
        let is_tls = |url: &str| fleet_budget::tls::is_tls_url(url);
        if self.urls().any(is_tls) && !self.urls().all(is_tls) {
            return Some(Problem::new(
                "amqp.urls",
                self.shown_urls(),
                "mixes amqps:// and amqp:// nodes: a failover to a plaintext node would drop the encryption",
            ));
        }
        (self.tls.is_set() && !self.urls().all(is_tls)).then(|| {
            Problem::new(
                "amqp.tls_ca_file",
                self.shown_urls(),
                "amqp.tls_* files are set but amqp.url is not amqps://, so the connection would not be encrypted",
            )
        })
    }

    /// The `[amqp]` section of `text`, every other section left to its owner.
    fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let file: AmqpFile = toml::from_str(text).map_err(|e| ConfigError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        let mut c = Checker::new();
        let settings = file.amqp.resolve(&mut c);
        let problems = c.into_problems();
        if problems.is_empty() {
            Ok(settings)
        } else {
            Err(ConfigError::invalid(origin, problems))
        }
    }
}

impl Timeouts {
    /// The deadlines of `settings` (`amqp.connect_timeout_ms`, `amqp.operation_timeout_ms`).
    #[must_use]
    pub fn of(settings: &AmqpSettings) -> Self {
        Self {
            connect: settings.connect_timeout,
            operation: settings.operation_timeout,
        }
    }
}

/// The configuration of a worker: the budget and the broker.
#[derive(Debug, Clone, Default)]
pub struct WorkerConfig {
    /// The budget's sections (`[redis]`, `[defaults]`, `[dependencies.*]`, `[tasks.*]`).
    pub budget: Config,
    /// The `[amqp]` section.
    pub amqp: AmqpSettings,
}

impl WorkerConfig {
    /// Reads and validates a file, then applies the environment overrides.
    ///
    /// # Errors
    /// The file cannot be read, is not TOML of this shape, or holds invalid values (certificate
    /// files for a plaintext broker URL included).
    pub fn from_path(path: &Path) -> Result<Self, ConfigError> {
        let text = fleet_budget::config::read_file(path)?;
        let origin = path.display().to_string();
        let mut config = Self::from_toml(&text, &origin)?;
        config
            .apply_env(|name| std::env::var(name).ok())
            .map_err(|problem| ConfigError::invalid(&origin, vec![problem]))?;
        // Checked once the environment has had its say on the URL.
        if let Some(problem) = config.amqp.tls_problem() {
            return Err(ConfigError::invalid(&origin, vec![problem]));
        }
        Ok(config)
    }

    /// Parses and validates TOML text; `origin` names it in errors (a path, or `<inline>`).
    ///
    /// # Errors
    /// Not TOML of this shape (an unknown section or key included), or invalid values: the
    /// problems of every section together.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let budget = Config::from_toml_ignoring(text, origin, &[SECTION]);
        let amqp = AmqpSettings::from_toml(text, origin);
        match (budget, amqp) {
            (Ok(mut budget), Ok(amqp)) => {
                // A task without its own max_delay may wait as long as the longest tier.
                if let Some(longest) = amqp.retry_tiers.last() {
                    budget.ceilings.default_max_delay = *longest;
                }
                Ok(Self { budget, amqp })
            }
            (budget, amqp) => {
                // A file that does not parse says so first; otherwise all problems together.
                let mut problems = Vec::new();
                for error in [budget.err(), amqp.err()].into_iter().flatten() {
                    problems.extend(error.into_problems()?);
                }
                Err(ConfigError::invalid(origin, problems))
            }
        }
    }
}

/// A file as this crate reads it: `[amqp]` only (no `deny_unknown_fields` here, the other
/// sections belong to `fleet-budget`, which refuses unknown ones).
#[derive(Debug, Default, Deserialize)]
struct AmqpFile {
    #[serde(default)]
    amqp: RawAmqp,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAmqp {
    url: Option<String>,
    urls: Option<Vec<String>>,
    prefix: Option<String>,
    prefetch: Option<i64>,
    delivery_limit: Option<i64>,
    retry_tiers_secs: Option<Vec<f64>>,
    max_replays: Option<i64>,
    connect_timeout_ms: Option<i64>,
    operation_timeout_ms: Option<i64>,
    tls_ca_file: Option<PathBuf>,
    tls_cert_file: Option<PathBuf>,
    tls_key_file: Option<PathBuf>,
}

impl RawAmqp {
    /// The settings, every invalid value recorded in `c` and replaced by its default.
    fn resolve(self, c: &mut Checker) -> AmqpSettings {
        let mut amqp = AmqpSettings::default();
        match (self.url, self.urls) {
            (Some(_), Some(_)) => c.problem(
                "amqp.urls",
                "amqp.url and amqp.urls",
                "set one of amqp.url (one broker) or amqp.urls (a cluster's nodes), not both",
            ),
            (Some(url), None) => {
                c.passed(check_url("amqp.url", &url, &AMQP_SCHEMES));
                amqp.url = url;
            }
            (None, Some(urls)) => match checked_nodes("amqp.urls", &urls) {
                Ok((url, others)) => {
                    amqp.url = url;
                    amqp.other_urls = others;
                }
                Err(problem) => {
                    c.passed(Err(problem));
                }
            },
            (None, None) => {}
        }
        if let Some(prefix) = self.prefix {
            // The prefix starts every queue and exchange name, which the broker's tools and
            // `budgetctl` print: nothing in it may print as something it is not (the rule of
            // dependency names and the key prefix).
            const RULE: &str = "must be 1 to 100 bytes without spaces, control, bidirectional \
                                control or invisible characters, not starting with `amq.`";
            let bad = prefix
                .chars()
                .find(|ch| ch.is_whitespace() || is_unsafe_char(*ch));
            if let Some(ch) = bad {
                c.problem(
                    "amqp.prefix",
                    format!("{prefix:?}"),
                    format!("contains {}; {RULE}", CodePoint(ch)),
                );
            } else if prefix.is_empty() || prefix.len() > 100 || prefix.starts_with("amq.") {
                c.problem("amqp.prefix", format!("{prefix:?}"), RULE);
            } else {
                amqp.prefix = prefix;
            }
        }
        let prefetch = c.int_in("amqp.prefetch", self.prefetch, 1, 65_535, 32);
        amqp.prefetch = u16::try_from(prefetch).unwrap_or(32);
        let limit = c.int_in("amqp.delivery_limit", self.delivery_limit, 1, 1_000_000, 50);
        amqp.delivery_limit = u32::try_from(limit).unwrap_or(50);
        if let Some(tiers) = self.retry_tiers_secs.and_then(|t| retry_tiers(c, &t)) {
            amqp.retry_tiers = tiers;
        }
        let replays = c.int_in("amqp.max_replays", self.max_replays, 0, 1000, 3);
        amqp.max_replays = u32::try_from(replays).unwrap_or(3);
        amqp.connect_timeout = c.duration_in(
            "amqp.connect_timeout_ms",
            self.connect_timeout_ms,
            1,
            3_600_000,
            amqp.connect_timeout,
            Duration::from_millis,
        );
        amqp.operation_timeout = c.duration_in(
            "amqp.operation_timeout_ms",
            self.operation_timeout_ms,
            1,
            3_600_000,
            amqp.operation_timeout,
            Duration::from_millis,
        );
        amqp.tls = c.tls_files(
            "amqp",
            self.tls_ca_file,
            self.tls_cert_file,
            self.tls_key_file,
        );
        amqp
    }
}

/// Most tiers accepted: each is an exchange and a queue on the broker.
pub const MAX_RETRY_TIERS: usize = 32;

/// The delay tiers, when each is from 1 ms to a day, they strictly increase and there are at
/// most [`MAX_RETRY_TIERS`].
fn retry_tiers(c: &mut Checker, tiers: &[f64]) -> Option<Vec<Duration>> {
    if tiers.len() > MAX_RETRY_TIERS {
        c.problem(
            "amqp.retry_tiers_secs",
            format!("{} tiers", tiers.len()),
            format!("must list at most {MAX_RETRY_TIERS} delays"),
        );
        return None;
    }
    let mut ok = Vec::new();
    for (i, t) in tiers.iter().enumerate() {
        if t.is_finite() && *t >= 0.001 && *t <= 86_400.0 {
            ok.push(Duration::from_secs_f64(*t));
        } else {
            c.problem(
                &format!("amqp.retry_tiers_secs[{i}]"),
                t,
                "must be a number of seconds from 0.001 to 86400",
            );
        }
    }
    if ok.is_empty() {
        c.problem(
            "amqp.retry_tiers_secs",
            "[]",
            "must list at least one delay",
        );
        None
    } else if ok.windows(2).any(|w| w.first() >= w.get(1)) {
        c.problem(
            "amqp.retry_tiers_secs",
            format!("{tiers:?}"),
            "must be strictly increasing",
        );
        None
    } else {
        Some(ok)
    }
}
