//! The TOML configuration: policies per dependency, the task → dependency map, ceilings, and the
//! Redis and AMQP settings. Reference: README.md, "Configuration".
//!
//! Parsing never panics. Every problem names the key, the value and what is allowed, and all
//! problems of a file are reported together.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use crate::ceiling::{Backoff, Ceilings, JobClass, TaskCeiling};
use crate::dependency::{Dependency, DependencyMap, validate_name};
use crate::policy::{BudgetPolicy, DepositBasis, WindowMode};
use crate::redact::redact_url;

/// Environment variable that overrides `redis.url`.
pub const ENV_REDIS_URL: &str = "FLEET_BUDGET_REDIS_URL";
/// Environment variable that overrides `amqp.url`.
pub const ENV_AMQP_URL: &str = "FLEET_BUDGET_AMQP_URL";

/// Longest window accepted: one day.
pub const MAX_WINDOW_SECS: i64 = 86_400;
/// Largest ratio accepted: more than 10 retries per deposit is no budget at all.
pub const MAX_RATIO: f64 = 10.0;

/// What to do when the fleet store (Redis) cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FallbackMode {
    /// A per-process budget with the same policy (the default).
    #[default]
    Local,
    /// No retries while the fleet budget is unknown.
    Deny,
    /// Every retry is granted while the fleet budget is unknown.
    Allow,
}

impl FallbackMode {
    /// The configuration name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Deny => "deny",
            Self::Allow => "allow",
        }
    }
}

/// Redis settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisSettings {
    /// A single server, e.g. `redis://127.0.0.1:6379`. Overridden by `FLEET_BUDGET_REDIS_URL`.
    pub url: String,
    /// Redis Cluster seed nodes; when non-empty they are used instead of `url`.
    pub cluster_urls: Vec<String>,
    /// Deadline of every store call (default 50 ms).
    pub timeout: Duration,
    /// Prefix of every key (default `fb`): keys are `<prefix>:v1:{<dependency>}`.
    pub key_prefix: String,
    /// What to do when Redis cannot answer in time.
    pub fallback: FallbackMode,
    /// Successes and first attempts are flushed to Redis at least this often (default 100 ms;
    /// 0 records each deposit with its own round trip).
    pub deposit_flush: Duration,
    /// ... or as soon as this many deposits are pending for one dependency (default 1000).
    pub deposit_flush_count: u64,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".to_owned(),
            cluster_urls: Vec::new(),
            timeout: Duration::from_millis(50),
            key_prefix: "fb".to_owned(),
            fallback: FallbackMode::Local,
            deposit_flush: Duration::from_millis(100),
            deposit_flush_count: 1000,
        }
    }
}

/// RabbitMQ settings, used by `fleet-budget-amqp` and `budgetctl`.
#[derive(Debug, Clone, PartialEq)]
pub struct AmqpSettings {
    /// Broker URL. Overridden by `FLEET_BUDGET_AMQP_URL`.
    pub url: String,
    /// Prefix of exchange and queue names (default `fleet`).
    pub prefix: String,
    /// Unacknowledged deliveries per consumer (default 32).
    pub prefetch: u16,
    /// The broker's delivery limit on work queues, a safety net above every ceiling (default 50).
    pub delivery_limit: u32,
    /// Retry delay tiers (default 1 s, 5 s, 30 s, 2 min, 10 min).
    pub retry_tiers: Vec<Duration>,
    /// Replays after which a message is parked instead of replayed again (default 3).
    pub max_replays: u32,
}

impl Default for AmqpSettings {
    fn default() -> Self {
        Self {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned(),
            prefix: "fleet".to_owned(),
            prefetch: 32,
            delivery_limit: 50,
            retry_tiers: [1, 5, 30, 120, 600]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
            max_replays: 3,
        }
    }
}

/// A validated configuration.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Redis settings.
    pub redis: RedisSettings,
    /// RabbitMQ settings.
    pub amqp: AmqpSettings,
    /// The policy of dependencies without their own section.
    pub defaults: BudgetPolicy,
    /// Policies of the dependencies that have a section.
    pub policies: BTreeMap<Dependency, BudgetPolicy>,
    /// Task → dependency.
    pub map: DependencyMap,
    /// Attempt ceilings and backoff per task.
    pub ceilings: Ceilings,
}

impl Config {
    /// The policy of `dependency`.
    #[must_use]
    pub fn policy(&self, dependency: &Dependency) -> BudgetPolicy {
        self.policies
            .get(dependency)
            .copied()
            .unwrap_or(self.defaults)
    }

    /// Reads and validates a file, then applies the environment overrides.
    ///
    /// # Errors
    /// The file cannot be read, is not TOML of this shape, or holds invalid values.
    pub fn from_path(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut config = Self::from_toml(&text, &path.display().to_string())?;
        config.apply_env(|name| std::env::var(name).ok());
        Ok(config)
    }

    /// Parses and validates TOML text; `origin` names it in errors (a path, or `<inline>`).
    ///
    /// # Errors
    /// Not TOML of this shape, or invalid values.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        let mut problems = Vec::new();
        let config = resolve(raw, &mut problems);
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid {
                origin: origin.to_owned(),
                problems,
            })
        }
    }

    /// Applies `FLEET_BUDGET_REDIS_URL` and `FLEET_BUDGET_AMQP_URL` as found by `lookup`.
    pub fn apply_env(&mut self, lookup: impl Fn(&str) -> Option<String>) {
        if let Some(url) = lookup(ENV_REDIS_URL).filter(|u| !u.is_empty()) {
            self.redis.url = url;
            self.redis.cluster_urls.clear();
        }
        if let Some(url) = lookup(ENV_AMQP_URL).filter(|u| !u.is_empty()) {
            self.amqp.url = url;
        }
    }

    /// The Redis endpoint(s) with passwords redacted, for printing.
    #[must_use]
    pub fn redis_display(&self) -> String {
        if self.redis.cluster_urls.is_empty() {
            redact_url(&self.redis.url)
        } else {
            let urls: Vec<_> = self
                .redis
                .cluster_urls
                .iter()
                .map(|u| redact_url(u))
                .collect();
            format!("cluster [{}]", urls.join(", "))
        }
    }
}

/// A configuration that cannot be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The text is not TOML, has unknown keys or values of the wrong type.
    #[error("{origin}: {message}")]
    Parse {
        /// The file.
        origin: String,
        /// The parser's message (it names the line, the key, and the known keys).
        message: String,
    },
    /// Values out of range or contradicting each other.
    #[error("{origin}: invalid configuration:\n{}", ProblemList(problems))]
    Invalid {
        /// The file.
        origin: String,
        /// Each problem.
        problems: Vec<Problem>,
    },
}

impl ConfigError {
    /// The problems, when the error is about values.
    #[must_use]
    pub fn problems(&self) -> &[Problem] {
        match self {
            Self::Invalid { problems, .. } => problems,
            _ => &[],
        }
    }
}

/// One invalid value: the key, the value found, and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted key, e.g. `dependencies.mail.ratio`.
    pub key: String,
    /// The value found, as written.
    pub value: String,
    /// What is allowed.
    pub allowed: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}: {}", self.key, self.value, self.allowed)
    }
}

struct ProblemList<'a>(&'a [Problem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  - {p}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    redis: RawRedis,
    #[serde(default)]
    amqp: RawAmqp,
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default)]
    dependencies: BTreeMap<String, RawDependency>,
    #[serde(default)]
    tasks: BTreeMap<String, RawTask>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    url: Option<String>,
    cluster_urls: Option<Vec<String>>,
    timeout_ms: Option<i64>,
    key_prefix: Option<String>,
    fallback: Option<FallbackMode>,
    deposit_flush_ms: Option<i64>,
    deposit_flush_count: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAmqp {
    url: Option<String>,
    prefix: Option<String>,
    prefetch: Option<i64>,
    delivery_limit: Option<i64>,
    retry_tiers_secs: Option<Vec<f64>>,
    max_replays: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    window_secs: Option<i64>,
    ratio: Option<f64>,
    min_allowance: Option<i64>,
    deposit: Option<DepositBasis>,
    mode: Option<WindowMode>,
    max_attempts: Option<i64>,
    backoff_base_ms: Option<i64>,
    backoff_cap_ms: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDependency {
    #[serde(default)]
    tasks: Vec<String>,
    window_secs: Option<i64>,
    ratio: Option<f64>,
    min_allowance: Option<i64>,
    deposit: Option<DepositBasis>,
    mode: Option<WindowMode>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    class: Option<JobClass>,
    max_attempts: Option<i64>,
    recovery_window_secs: Option<i64>,
    backoff_base_ms: Option<i64>,
    backoff_cap_ms: Option<i64>,
}

struct Checker<'a> {
    problems: &'a mut Vec<Problem>,
}

impl Checker<'_> {
    fn problem(&mut self, key: &str, value: impl fmt::Display, allowed: impl Into<String>) {
        self.problems.push(Problem {
            key: key.to_owned(),
            value: value.to_string(),
            allowed: allowed.into(),
        });
    }

    fn int_in(&mut self, key: &str, value: Option<i64>, lo: i64, hi: i64, default: i64) -> i64 {
        match value {
            None => default,
            Some(v) if (lo..=hi).contains(&v) => v,
            Some(v) => {
                self.problem(key, v, format!("must be an integer from {lo} to {hi}"));
                default
            }
        }
    }

    fn ratio(&mut self, key: &str, value: Option<f64>, default: f64) -> f64 {
        match value {
            None => default,
            Some(v) if v.is_finite() && (0.0..=MAX_RATIO).contains(&v) => v,
            Some(v) => {
                self.problem(
                    key,
                    v,
                    format!("must be a finite number from 0 to {MAX_RATIO} (retries per deposit)"),
                );
                default
            }
        }
    }

    fn name(&mut self, key: &str, name: &str) -> bool {
        match validate_name(name) {
            Ok(()) => true,
            Err(e) => {
                self.problem(key, format!("{name:?}"), format!("dependency name {e}"));
                false
            }
        }
    }

    fn url(&mut self, key: &str, url: &str, schemes: &[&str]) {
        let ok = schemes.iter().any(|s| {
            url.strip_prefix(s)
                .and_then(|r| r.strip_prefix("://"))
                .is_some_and(|r| !r.is_empty())
        });
        if !ok {
            let allowed: Vec<String> = schemes.iter().map(|s| format!("{s}://...")).collect();
            self.problem(
                key,
                redact_url(url),
                format!("must be a URL of the form {}", allowed.join(" or ")),
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn policy(
        &mut self,
        at: &str,
        base: &BudgetPolicy,
        window_secs: Option<i64>,
        ratio: Option<f64>,
        min_allowance: Option<i64>,
        deposit: Option<DepositBasis>,
        mode: Option<WindowMode>,
    ) -> BudgetPolicy {
        let base_window = i64::try_from(base.window.as_secs()).unwrap_or(60);
        let window = self.int_in(
            &format!("{at}.window_secs"),
            window_secs,
            1,
            MAX_WINDOW_SECS,
            base_window,
        );
        let base_min = i64::try_from(base.min_allowance).unwrap_or(10);
        let min = self.int_in(
            &format!("{at}.min_allowance"),
            min_allowance,
            0,
            1_000_000_000,
            base_min,
        );
        BudgetPolicy {
            window: Duration::from_secs(u64::try_from(window).unwrap_or(60)),
            ratio: self.ratio(&format!("{at}.ratio"), ratio, base.ratio),
            min_allowance: u64::try_from(min).unwrap_or(10),
            deposit: deposit.unwrap_or(base.deposit),
            mode: mode.unwrap_or(base.mode),
        }
    }

    fn backoff(
        &mut self,
        at: &str,
        base_ms: Option<i64>,
        cap_ms: Option<i64>,
        default: Backoff,
    ) -> Backoff {
        let day = 86_400_000;
        let default_base = i64::try_from(default.base.as_millis()).unwrap_or(2000);
        let default_cap = i64::try_from(default.cap.as_millis()).unwrap_or(600_000);
        let base = self.int_in(
            &format!("{at}.backoff_base_ms"),
            base_ms,
            1,
            day,
            default_base,
        );
        let cap = self.int_in(&format!("{at}.backoff_cap_ms"), cap_ms, 1, day, default_cap);
        if cap < base {
            self.problem(
                &format!("{at}.backoff_cap_ms"),
                cap,
                format!("must be at least backoff_base_ms ({base})"),
            );
        }
        Backoff {
            base: Duration::from_millis(u64::try_from(base).unwrap_or(2000)),
            factor: default.factor,
            cap: Duration::from_millis(u64::try_from(cap).unwrap_or(600_000)),
        }
    }
}

#[allow(clippy::too_many_lines)]
fn resolve(raw: RawConfig, problems: &mut Vec<Problem>) -> Config {
    let mut c = Checker { problems };
    let mut config = Config::default();

    // [redis]
    let r = raw.redis;
    if let Some(url) = r.url {
        c.url(
            "redis.url",
            &url,
            &["redis", "rediss", "redis+unix", "unix"],
        );
        config.redis.url = url;
    }
    if let Some(urls) = r.cluster_urls {
        for (i, url) in urls.iter().enumerate() {
            c.url(
                &format!("redis.cluster_urls[{i}]"),
                url,
                &["redis", "rediss"],
            );
        }
        config.redis.cluster_urls = urls;
    }
    let timeout = c.int_in("redis.timeout_ms", r.timeout_ms, 1, 60_000, 50);
    config.redis.timeout = Duration::from_millis(u64::try_from(timeout).unwrap_or(50));
    if let Some(prefix) = r.key_prefix {
        if prefix.is_empty()
            || prefix.len() > 64
            || prefix
                .chars()
                .any(|ch| ch == '{' || ch == '}' || ch.is_control() || ch.is_whitespace())
        {
            c.problem(
                "redis.key_prefix",
                format!("{prefix:?}"),
                "must be 1 to 64 characters without `{`, `}`, spaces or control characters",
            );
        } else {
            config.redis.key_prefix = prefix;
        }
    }
    config.redis.fallback = r.fallback.unwrap_or_default();
    let flush = c.int_in("redis.deposit_flush_ms", r.deposit_flush_ms, 0, 10_000, 100);
    config.redis.deposit_flush = Duration::from_millis(u64::try_from(flush).unwrap_or(100));
    let count = c.int_in(
        "redis.deposit_flush_count",
        r.deposit_flush_count,
        1,
        1_000_000_000,
        1000,
    );
    config.redis.deposit_flush_count = u64::try_from(count).unwrap_or(1000);

    // [amqp]
    let a = raw.amqp;
    if let Some(url) = a.url {
        c.url("amqp.url", &url, &["amqp", "amqps"]);
        config.amqp.url = url;
    }
    if let Some(prefix) = a.prefix {
        if prefix.is_empty()
            || prefix.len() > 100
            || prefix.starts_with("amq.")
            || prefix
                .chars()
                .any(|ch| ch.is_control() || ch.is_whitespace())
        {
            c.problem("amqp.prefix", format!("{prefix:?}"), "must be 1 to 100 characters, no spaces or control characters, not starting with `amq.`");
        } else {
            config.amqp.prefix = prefix;
        }
    }
    let prefetch = c.int_in("amqp.prefetch", a.prefetch, 1, 65_535, 32);
    config.amqp.prefetch = u16::try_from(prefetch).unwrap_or(32);
    let limit = c.int_in("amqp.delivery_limit", a.delivery_limit, 1, 1_000_000, 50);
    config.amqp.delivery_limit = u32::try_from(limit).unwrap_or(50);
    if let Some(tiers) = a.retry_tiers_secs {
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
        } else if ok.windows(2).any(|w| w.first() >= w.get(1)) {
            c.problem(
                "amqp.retry_tiers_secs",
                format!("{tiers:?}"),
                "must be strictly increasing",
            );
        } else {
            config.amqp.retry_tiers = ok;
        }
    }
    let replays = c.int_in("amqp.max_replays", a.max_replays, 0, 1000, 3);
    config.amqp.max_replays = u32::try_from(replays).unwrap_or(3);

    // [defaults]
    let d = raw.defaults;
    config.defaults = c.policy(
        "defaults",
        &BudgetPolicy::default(),
        d.window_secs,
        d.ratio,
        d.min_allowance,
        d.deposit,
        d.mode,
    );
    let max_attempts = c.int_in("defaults.max_attempts", d.max_attempts, 1, 1000, 5);
    config.ceilings.default = TaskCeiling {
        max_attempts: u32::try_from(max_attempts).unwrap_or(5),
        backoff: c.backoff(
            "defaults",
            d.backoff_base_ms,
            d.backoff_cap_ms,
            Backoff::default(),
        ),
    };

    // [dependencies.*]
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for (name, dep) in raw.dependencies {
        let at = format!("dependencies.{}", toml_key(&name));
        let valid = c.name(&at, &name);
        let policy = c.policy(
            &at,
            &config.defaults,
            dep.window_secs,
            dep.ratio,
            dep.min_allowance,
            dep.deposit,
            dep.mode,
        );
        let Ok(dependency) = Dependency::new(&name) else {
            continue;
        };
        if !valid {
            continue;
        }
        config.policies.insert(dependency.clone(), policy);
        for (i, task) in dep.tasks.iter().enumerate() {
            if task.is_empty() || task.chars().any(char::is_control) {
                c.problem(
                    &format!("{at}.tasks[{i}]"),
                    format!("{task:?}"),
                    "a task name must be non-empty and hold no control characters",
                );
                continue;
            }
            if let Some(first) = owner.get(task) {
                if *first == name {
                    c.problem(
                        &format!("{at}.tasks[{i}]"),
                        format!("{task:?}"),
                        "is listed twice in this dependency",
                    );
                } else {
                    c.problem(&format!("{at}.tasks[{i}]"), format!("{task:?}"), format!("is already mapped to dependency {first:?}; a task spends exactly one dependency's budget"));
                }
                continue;
            }
            owner.insert(task.clone(), name.clone());
            config.map.insert(task.clone(), dependency.clone());
        }
    }

    // [tasks.*]
    for (task, t) in raw.tasks {
        let at = format!("tasks.{}", toml_key(&task));
        if !config.map.is_mapped(&task) {
            // An unmapped task is its own dependency, so its name must be a valid one.
            c.name(&at, &task);
        }
        let given = [
            t.class.is_some(),
            t.max_attempts.is_some(),
            t.recovery_window_secs.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            c.problem(
                &at,
                "class, max_attempts and recovery_window_secs",
                "set at most one of them",
            );
        }
        let backoff = c.backoff(
            &at,
            t.backoff_base_ms,
            t.backoff_cap_ms,
            config.ceilings.default.backoff,
        );
        let max_attempts = if let Some(class) = t.class {
            class.max_attempts()
        } else if let Some(n) = t.max_attempts {
            u32::try_from(c.int_in(&format!("{at}.max_attempts"), Some(n), 1, 1000, 5)).unwrap_or(5)
        } else if let Some(secs) = t.recovery_window_secs {
            let secs = c.int_in(
                &format!("{at}.recovery_window_secs"),
                Some(secs),
                1,
                7 * 86_400,
                60,
            );
            backoff.attempts_for_recovery_window(Duration::from_secs(
                u64::try_from(secs).unwrap_or(60),
            ))
        } else {
            config.ceilings.default.max_attempts
        };
        config.ceilings.tasks.insert(
            task,
            TaskCeiling {
                max_attempts,
                backoff,
            },
        );
    }
    config
}

/// A key as TOML would need it written in a dotted path.
fn toml_key(name: &str) -> String {
    if !name.is_empty()
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
    {
        name.to_owned()
    } else {
        format!("{name:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<Problem> {
        match Config::from_toml(text, "test.toml") {
            Err(ConfigError::Invalid { problems, .. }) => problems,
            other => panic!("expected invalid values, got {other:?}"),
        }
    }

    fn parse_error(text: &str) -> String {
        match Config::from_toml(text, "test.toml") {
            Err(e @ ConfigError::Parse { .. }) => e.to_string(),
            other => panic!("expected a parse error, got {other:?}"),
        }
    }

    #[test]
    fn the_readme_example_parses() {
        let c = Config::from_toml(
            r#"
            [defaults]
            window_secs = 60
            ratio = 0.2
            min_allowance = 10
            [dependencies.search]
            tasks = ["index_document", "reindex_tenant", "bulk_import"]
            [dependencies.mail]
            tasks = ["send_receipt"]
            ratio = 0.1
            [tasks.index_document]
            class = "idempotent"
            [tasks.send_receipt]
            max_attempts = 3
            [tasks.bulk_import]
            recovery_window_secs = 900
            "#,
            "x",
        )
        .unwrap();
        let search = Dependency::new("search").unwrap();
        let mail = Dependency::new("mail").unwrap();
        assert_eq!(c.map.resolve("reindex_tenant").unwrap(), search);
        assert_eq!(c.map.resolve("unlisted").unwrap().as_str(), "unlisted");
        assert!((c.policy(&mail).ratio - 0.1).abs() < f64::EPSILON);
        assert!((c.policy(&search).ratio - 0.2).abs() < f64::EPSILON);
        assert_eq!(c.ceilings.for_task("index_document").max_attempts, 8);
        assert_eq!(c.ceilings.for_task("send_receipt").max_attempts, 3);
        assert_eq!(c.ceilings.for_task("bulk_import").max_attempts, 9);
        assert_eq!(c.ceilings.for_task("other").max_attempts, 5);
    }

    #[test]
    fn invalid_ratio_nan_negative_absurd() {
        for value in ["nan", "-0.1", "11.0", "inf"] {
            let p = problems(&format!("[defaults]\nratio = {value}\n"));
            assert_eq!(p.len(), 1, "{value}");
            assert_eq!(p[0].key, "defaults.ratio");
            assert!(p[0].allowed.contains("from 0 to 10"), "{}", p[0]);
        }
        let p = problems("[dependencies.mail]\nratio = -1.0\n");
        assert_eq!(p[0].key, "dependencies.mail.ratio");
        assert_eq!(p[0].value, "-1");
    }

    #[test]
    fn invalid_window_zero_or_over_a_day() {
        for value in ["0", "86401", "-5"] {
            let p = problems(&format!("[defaults]\nwindow_secs = {value}\n"));
            assert_eq!(p[0].key, "defaults.window_secs");
            assert_eq!(p[0].value, value);
            assert!(p[0].allowed.contains("1 to 86400"));
        }
    }

    #[test]
    fn invalid_negative_floor() {
        let p = problems("[dependencies.search]\nmin_allowance = -1\n");
        assert_eq!(p[0].key, "dependencies.search.min_allowance");
        assert_eq!(p[0].value, "-1");
    }

    #[test]
    fn invalid_dependency_names() {
        let long = "d".repeat(201);
        for (name, needle) in [
            ("", "empty"),
            (long.as_str(), "201 bytes"),
            ("a{b", "'{'"),
            ("a}b", "'}'"),
            ("a\\tb", "'\\t'"),
        ] {
            let p = problems(&format!("[dependencies.\"{name}\"]\ntasks = []\n"));
            assert_eq!(p.len(), 1, "{name}");
            assert!(p[0].key.starts_with("dependencies."), "{}", p[0]);
            assert!(p[0].allowed.contains(needle), "{name}: {}", p[0]);
        }
    }

    #[test]
    fn task_mapped_to_two_dependencies() {
        let p = problems(
            "[dependencies.search]\ntasks = [\"t\"]\n[dependencies.mail]\ntasks = [\"t\"]\n",
        );
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].key, "dependencies.search.tasks[0]");
        assert!(
            p[0].allowed
                .contains("already mapped to dependency \"mail\""),
            "{}",
            p[0]
        );
    }

    #[test]
    fn unknown_keys_list_the_known_ones() {
        let e = parse_error("[defaults]\nratoi = 0.2\n");
        assert!(e.contains("ratoi"), "{e}");
        assert!(
            e.contains("window_secs") && e.contains("min_allowance"),
            "{e}"
        );
        let e = parse_error("[redsi]\nurl = \"x\"\n");
        assert!(e.contains("redsi") && e.contains("dependencies"), "{e}");
    }

    #[test]
    fn wrong_types_and_garbage_do_not_panic() {
        for text in [
            "[defaults]\nratio = \"high\"\n",
            "[[[",
            "\u{0}",
            "dependencies = 3",
            "[tasks.x]\nclass = \"cheap\"\n",
        ] {
            assert!(Config::from_toml(text, "t").is_err(), "{text:?}");
        }
        let e = parse_error("[tasks.x]\nclass = \"cheap\"\n");
        assert!(e.contains("idempotent"), "{e}");
    }

    #[test]
    fn all_problems_are_reported_together() {
        let p = problems("[defaults]\nratio = -1.0\nwindow_secs = 0\nmin_allowance = -3\n");
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn environment_overrides_urls() {
        let mut c = Config::from_toml("[redis]\nurl = \"redis://file:6379\"\n", "t").unwrap();
        c.apply_env(|k| match k {
            ENV_REDIS_URL => Some("redis://env:1".to_owned()),
            ENV_AMQP_URL => Some("amqp://u:secret@env:5672/%2f".to_owned()),
            _ => None,
        });
        assert_eq!(c.redis.url, "redis://env:1");
        assert_eq!(c.amqp.url, "amqp://u:secret@env:5672/%2f");
    }

    #[test]
    fn bad_urls_are_named_with_passwords_redacted() {
        let p = problems("[redis]\nurl = \"http://u:hunter2@h\"\n");
        assert_eq!(p[0].key, "redis.url");
        assert!(!p[0].value.contains("hunter2"), "{}", p[0]);
    }
}
