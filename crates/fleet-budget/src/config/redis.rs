//! The `[redis]` section: where the fleet store is, its deadline, and what to do without it.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::redact::{redact_text, redact_url};
use crate::tls::TlsFiles;

use super::Problem;
use super::check::{Checker, check_key_prefix, check_url};

/// Environment variable that overrides `redis.url`.
pub const ENV_REDIS_URL: &str = "FLEET_BUDGET_REDIS_URL";
/// Environment variable that overrides `redis.tls_ca_file`.
pub const ENV_REDIS_CA_FILE: &str = "FLEET_BUDGET_REDIS_CA_FILE";

/// The URL schemes of a single Redis server (`rediss` is TLS).
pub const REDIS_SCHEMES: [&str; 4] = ["redis", "rediss", "redis+unix", "unix"];
/// The URL schemes of Redis Cluster seed nodes: no `rediss` yet (TLS to a cluster is not tested
/// here, and the Python client's cluster mode has none), so it is refused by name.
pub const CLUSTER_SCHEMES: [&str; 1] = ["redis"];

/// Checks a Redis URL as [`check_url`] does, then as the Redis client will read it at the first
/// connect: a port out of range, a host it cannot parse, a database that is not a number or a
/// wildcard address (`0.0.0.0`) is named when the file is checked (`budgetctl config check`),
/// not when the worker starts. `key` names the setting; the URL is shown with its password
/// redacted.
///
/// # Errors
/// The problem, when the URL is not one of `schemes` or the Redis client cannot use it.
pub(super) fn check_redis_url(key: &str, url: &str, schemes: &[&str]) -> Result<(), Problem> {
    check_url(key, url, schemes)?;
    redis::IntoConnectionInfo::into_connection_info(url)
        .map(|_| ())
        .map_err(|e| {
            Problem::new(
                key,
                redact_url(url),
                format!(
                    "the Redis client cannot use this URL ({})",
                    redact_text(&e.to_string())
                ),
            )
        })
}

/// `redis.deny_cache_ms` by default: a denial stands in the process at most as long as deposits
/// wait to be flushed (`redis.deposit_flush_ms`), the lag the allowance already has.
const DEFAULT_DENY_CACHE_MS: u64 = 100;

/// `redis.heartbeat_ms` by default: a console that reads every 2 s sees a worker's fallback
/// within one beat, at one small script call per worker every 5 s.
const DEFAULT_HEARTBEAT_MS: u64 = 5000;
/// The shortest `redis.heartbeat_ms` (other than 0, off): faster beats cost Redis calls and
/// show nothing a person would act on sooner.
pub(crate) const MIN_HEARTBEAT_MS: u64 = 100;
/// The longest `redis.heartbeat_ms`: a worker is silent after three missed beats, and a
/// registry that takes a quarter of an hour to notice is no use in an incident.
pub(crate) const MAX_HEARTBEAT_MS: u64 = 300_000;

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
    /// A denial of the fleet store is answered in the process, without a call, while it stands
    /// and for at most this long (default 100 ms, the deposits' own lag; 0 turns it off): see
    /// `budget/deny_cache.rs`.
    pub deny_cache: Duration,
    /// Whether a group-commit batch on a single URL may hold several dependencies (default
    /// `true`). `false` for a URL that is a proxy spreading keys over several servers, where a
    /// script's keys must live on one; on Redis Cluster batches are per dependency anyway.
    pub batch_across_dependencies: bool,
    /// How often the worker writes its report to the worker registry (default 5 s; 0 turns the
    /// registry off): which dependencies it decides from its fallback, for the console. See
    /// `budget/heartbeat.rs`.
    pub heartbeat: Duration,
    /// Certificate files for `rediss://` (`redis.tls_ca_file`, `tls_cert_file`,
    /// `tls_key_file`; the CA file also from `FLEET_BUDGET_REDIS_CA_FILE`).
    pub tls: TlsFiles,
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
            deny_cache: Duration::from_millis(DEFAULT_DENY_CACHE_MS),
            batch_across_dependencies: true,
            heartbeat: Duration::from_millis(DEFAULT_HEARTBEAT_MS),
            tls: TlsFiles::default(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRedis {
    url: Option<String>,
    cluster_urls: Option<Vec<String>>,
    timeout_ms: Option<i64>,
    key_prefix: Option<String>,
    fallback: Option<FallbackMode>,
    deposit_flush_ms: Option<i64>,
    deposit_flush_count: Option<i64>,
    deny_cache_ms: Option<i64>,
    batch_across_dependencies: Option<bool>,
    heartbeat_ms: Option<i64>,
    tls_ca_file: Option<PathBuf>,
    tls_cert_file: Option<PathBuf>,
    tls_key_file: Option<PathBuf>,
}

impl RawRedis {
    /// The settings, every invalid value recorded in `c` and replaced by its default.
    pub(super) fn resolve(self, c: &mut Checker) -> RedisSettings {
        let mut redis = RedisSettings::default();
        if let Some(url) = self.url {
            c.passed(check_redis_url("redis.url", &url, &REDIS_SCHEMES));
            redis.url = url;
        }
        if let Some(urls) = self.cluster_urls {
            for (i, url) in urls.iter().enumerate() {
                let key = format!("redis.cluster_urls[{i}]");
                c.passed(check_redis_url(&key, url, &CLUSTER_SCHEMES));
            }
            redis.cluster_urls = urls;
        }
        let timeout = c.int_in("redis.timeout_ms", self.timeout_ms, 1, 60_000, 50);
        redis.timeout = Duration::from_millis(u64::try_from(timeout).unwrap_or(50));
        if let Some(prefix) = self.key_prefix
            && c.passed(check_key_prefix("redis.key_prefix", &prefix))
        {
            redis.key_prefix = prefix;
        }
        redis.fallback = self.fallback.unwrap_or_default();
        let flush = c.int_in(
            "redis.deposit_flush_ms",
            self.deposit_flush_ms,
            0,
            10_000,
            100,
        );
        redis.deposit_flush = Duration::from_millis(u64::try_from(flush).unwrap_or(100));
        let count = c.int_in(
            "redis.deposit_flush_count",
            self.deposit_flush_count,
            1,
            1_000_000_000,
            1000,
        );
        redis.deposit_flush_count = u64::try_from(count).unwrap_or(1000);
        let deny = c.int_in(
            "redis.deny_cache_ms",
            self.deny_cache_ms,
            0,
            10_000,
            i64::try_from(DEFAULT_DENY_CACHE_MS).unwrap_or(0),
        );
        redis.deny_cache =
            Duration::from_millis(u64::try_from(deny).unwrap_or(DEFAULT_DENY_CACHE_MS));
        redis.batch_across_dependencies = self.batch_across_dependencies.unwrap_or(true);
        redis.heartbeat = Duration::from_millis(heartbeat_ms(c, self.heartbeat_ms));
        redis.tls = c.tls_files(
            "redis",
            self.tls_ca_file,
            self.tls_cert_file,
            self.tls_key_file,
        );
        redis
    }
}

/// `redis.heartbeat_ms`: 0 (off) or [`MIN_HEARTBEAT_MS`] to [`MAX_HEARTBEAT_MS`]; a bad value
/// is recorded in `c` and the default kept.
fn heartbeat_ms(c: &mut Checker, raw: Option<i64>) -> u64 {
    let Some(ms) = raw else {
        return DEFAULT_HEARTBEAT_MS;
    };
    match u64::try_from(ms) {
        Ok(0) => 0,
        Ok(ms) if (MIN_HEARTBEAT_MS..=MAX_HEARTBEAT_MS).contains(&ms) => ms,
        _ => {
            c.problem(
                "redis.heartbeat_ms",
                ms,
                format!("must be 0 (off) or from {MIN_HEARTBEAT_MS} to {MAX_HEARTBEAT_MS}"),
            );
            DEFAULT_HEARTBEAT_MS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::problems;

    #[test]
    fn bad_urls_are_named_with_passwords_redacted() {
        let p = problems("[redis]\nurl = \"http://u:hunter2@h\"\n");
        assert_eq!(p[0].key, "redis.url");
        assert!(!p[0].value.contains("hunter2"), "{}", p[0]);
    }

    /// `config check` called these valid; the worker then stopped at its first connect with
    /// "Redis URL did not parse". Named with the key now, the password not shown.
    #[test]
    fn urls_the_redis_client_cannot_use_are_named() {
        for (url, why) in [
            ("redis://u:hunter2@h:99999", "did not parse"),
            ("redis://u:hunter2@h ost:1", "did not parse"),
            ("redis://u:hunter2@[::1:1", "did not parse"),
            ("redis://u:hunter2@h:1/zero", "Invalid database number"),
            ("redis://u:hunter2@0.0.0.0:6379", "wildcard"),
        ] {
            let p = problems(&format!("[redis]\nurl = \"{url}\"\n"));
            assert_eq!(p.len(), 1, "{url}: {p:?}");
            assert_eq!(p[0].key, "redis.url");
            assert!(p[0].allowed.contains(why), "{url}: {}", p[0]);
            assert!(!p[0].to_string().contains("hunter2"), "{}", p[0]);
            let p = problems(&format!("[redis]\ncluster_urls = [\"{url}\"]\n"));
            assert_eq!(p[0].key, "redis.cluster_urls[0]");
        }
        for good in [
            "redis://127.0.0.1:6379/0",
            "redis://u:p@[::1]:6379",
            "rediss://h:6380",
            "redis+unix:///tmp/redis.sock",
            "unix:///tmp/redis.sock?db=1",
        ] {
            assert!(
                crate::Config::from_toml(&format!("[redis]\nurl = \"{good}\"\n"), "t").is_ok(),
                "{good}"
            );
        }
    }

    /// Input review, session 6: the error names the file, the field and the character by its
    /// code point, and does not print the character itself.
    #[test]
    fn a_key_prefix_with_a_bidi_control_is_refused_naming_file_field_and_code_point() {
        let text = "[redis]\nkey_prefix = \"fb\\u202Eevil\"\n";
        let e = crate::Config::from_toml(text, "/etc/fleet-budget/worker.toml").unwrap_err();
        let shown = e.to_string();
        assert!(
            shown.starts_with("/etc/fleet-budget/worker.toml: invalid configuration:"),
            "{shown}"
        );
        assert!(
            shown.contains(
                "redis.key_prefix = \"fb\\u{202e}evil\": contains U+202E (a bidirectional control)"
            ),
            "{shown}"
        );
        assert!(!shown.contains('\u{202E}'), "{shown:?}");
        let p = problems("[redis]\nkey_prefix = \"fb\\u200B\"\n");
        assert_eq!(p.len(), 1);
        assert!(
            p[0].allowed.contains("U+200B (an invisible character)"),
            "{}",
            p[0]
        );
    }

    #[test]
    fn the_deny_cache_is_on_by_default_off_at_0_and_bounded() {
        use crate::Config;
        use std::time::Duration;
        assert_eq!(
            Config::default().redis.deny_cache,
            Duration::from_millis(100)
        );
        let c = Config::from_toml("[redis]\ndeny_cache_ms = 0\n", "t").unwrap();
        assert!(c.redis.deny_cache.is_zero());
        for bad in ["-1", "10001", "\"fast\""] {
            let e = Config::from_toml(&format!("[redis]\ndeny_cache_ms = {bad}\n"), "t")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("redis.deny_cache_ms") || e.contains("deny_cache_ms"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_heartbeat_is_on_by_default_off_at_0_and_bounded() {
        use crate::Config;
        use std::time::Duration;
        assert_eq!(
            Config::default().redis.heartbeat,
            Duration::from_millis(5000)
        );
        let c = Config::from_toml("[redis]\nheartbeat_ms = 0\n", "t").unwrap();
        assert!(c.redis.heartbeat.is_zero());
        let c = Config::from_toml("[redis]\nheartbeat_ms = 100\n", "t").unwrap();
        assert_eq!(c.redis.heartbeat, Duration::from_millis(100));
        for bad in ["-1", "1", "99", "300001", "\"5s\"", "1.5"] {
            let e = Config::from_toml(&format!("[redis]\nheartbeat_ms = {bad}\n"), "t")
                .unwrap_err()
                .to_string();
            assert!(e.contains("heartbeat_ms"), "{bad}: {e}");
        }
        let p = problems("[redis]\nheartbeat_ms = 50\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].allowed.contains("0 (off) or from 100"), "{}", p[0]);
    }

    #[test]
    fn batches_across_dependencies_unless_told_not_to() {
        use crate::Config;
        assert!(Config::default().redis.batch_across_dependencies);
        let c = Config::from_toml("[redis]\nbatch_across_dependencies = false\n", "t").unwrap();
        assert!(!c.redis.batch_across_dependencies);
        let e = Config::from_toml("[redis]\nbatch_across_dependencies = \"no\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch_across_dependencies"), "{e}");
    }
}
