//! The TOML configuration: policies per dependency, the task → dependency map, ceilings, and the
//! Redis settings. Reference: docs/guides/configuration.md.
//!
//! Parsing never panics. Every problem names the key, the value and what is allowed, and all
//! problems of a file are reported together. Each section is resolved in its own file
//! (`redis.rs`, `defaults.rs`, `dependencies.rs`, `tasks.rs`, `metrics.rs`, `audit.rs`); `check.rs` holds the
//! checks they share ([`Checker`], [`check_url`], [`check_key_prefix`]).
//!
//! The file may hold sections of other crates: `fleet-budget-amqp` reads `[amqp]` from the same
//! file and loads both through its `WorkerConfig` ([`Config::from_toml_ignoring`]). This crate
//! names no broker: [`Config::from_toml`] refuses a section it does not know.

mod audit;
mod breaker;
mod check;
mod concurrency;
mod defaults;
mod dependencies;
mod enforcement;
mod error;
mod metrics;
mod redis;
mod tasks;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

pub use self::audit::{AuditSettings, DEFAULT_AUDIT_MAX_AGE_DAYS, DEFAULT_AUDIT_MAX_ENTRIES};
pub use self::check::{Checker, MAX_KEY_PREFIX_LEN, check_key_prefix, check_url};
pub use self::defaults::{MAX_DELAY_SECS, MAX_RATIO, MAX_WINDOW_SECS};
pub use self::dependencies::MAX_OWN_BUDGETS;
pub use self::enforcement::Enforcements;
pub use self::error::{ConfigError, Problem};
pub use self::metrics::MetricsSettings;
pub use self::redis::{
    CLUSTER_SCHEMES, ENV_REDIS_CA_FILE, ENV_REDIS_URL, FallbackMode, REDIS_SCHEMES, RedisSettings,
};
use crate::breaker::BreakerPolicy;
use crate::ceiling::Ceilings;
use crate::concurrency::ConcurrencyPolicy;
use crate::dependency::{Dependency, DependencyMap};
use crate::policy::BudgetPolicy;
use crate::redact::redact_url;

/// A validated configuration.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Redis settings.
    pub redis: RedisSettings,
    /// The policy of dependencies without their own section.
    pub defaults: BudgetPolicy,
    /// Policies of the dependencies that have a section.
    pub policies: BTreeMap<Dependency, BudgetPolicy>,
    /// Task → dependency.
    pub map: DependencyMap,
    /// Attempt ceilings and backoff per task.
    pub ceilings: Ceilings,
    /// Where to serve `/metrics`, if anywhere.
    pub metrics: MetricsSettings,
    /// How much of the audit trail Redis keeps.
    pub audit: AuditSettings,
    /// The concurrency budgets of the dependencies with a `[dependencies.X.concurrency]`
    /// section (no entry: calls in flight are not counted).
    pub concurrency: BTreeMap<Dependency, ConcurrencyPolicy>,
    /// The circuit breakers of the dependencies with a `[dependencies.X.breaker]` section.
    pub breakers: BTreeMap<Dependency, BreakerPolicy>,
    /// Whether each dependency's rate budget dead-letters what it refuses or only counts it
    /// (`enforcement`; operators switch it with `budgetctl budget shadow|enforce`).
    pub enforcement: Enforcements,
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
        let text = read_file(path)?;
        let origin = path.display().to_string();
        let mut config = Self::from_toml(&text, &origin)?;
        config
            .apply_env(|name| std::env::var(name).ok())
            .map_err(|problem| ConfigError::invalid(&origin, vec![problem]))?;
        Ok(config)
    }

    /// Parses and validates TOML text; `origin` names it in errors (a path, or `<inline>`).
    ///
    /// # Errors
    /// Not TOML of this shape (an unknown section or key included), or invalid values.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        Self::from_toml_ignoring(text, origin, &[])
    }

    /// Parses and validates TOML text in which the top-level sections named in `others` belong
    /// to another crate (`["amqp"]` for `fleet-budget-amqp`): they are left to it, while any
    /// other unknown section is still an error. Errors name the line and column in `text`.
    ///
    /// # Errors
    /// Not TOML of this shape, or invalid values.
    pub fn from_toml_ignoring(
        text: &str,
        origin: &str,
        others: &[&str],
    ) -> Result<Self, ConfigError> {
        let parse_error = |mut e: toml::de::Error| {
            e.set_input(Some(text));
            ConfigError::Parse {
                origin: origin.to_owned(),
                message: e.to_string(),
            }
        };
        let mut root = toml::de::DeTable::parse(text).map_err(parse_error)?;
        for section in others {
            root.get_mut().remove(*section);
        }
        let raw =
            RawConfig::deserialize(toml::de::Deserializer::from(root)).map_err(parse_error)?;
        raw.resolve(origin)
    }

    /// Validates a configuration already parsed as a TOML table (for example one section of a
    /// larger file of the embedding application); `origin` names it in errors.
    ///
    /// # Errors
    /// Not of this shape (an unknown section or key included), or invalid values.
    pub fn from_table(table: toml::Table, origin: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = table
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse {
                origin: origin.to_owned(),
                message: e.to_string(),
            })?;
        raw.resolve(origin)
    }

    /// Applies `FLEET_BUDGET_REDIS_URL` and `FLEET_BUDGET_REDIS_CA_FILE` as found by `lookup` (an
    /// empty value is no override). The URL is checked as `redis.url` is: the environment is
    /// edited at 3 a.m. too, and `rediss://h/#insecure` would turn certificate checks off.
    ///
    /// # Errors
    /// `FLEET_BUDGET_REDIS_URL` is not a Redis URL (the problem names the variable and shows the
    /// URL with its password redacted); nothing changes then.
    pub fn apply_env(&mut self, lookup: impl Fn(&str) -> Option<String>) -> Result<(), Problem> {
        let url = lookup(ENV_REDIS_URL).filter(|u| !u.is_empty());
        if let Some(url) = &url {
            redis::check_redis_url(ENV_REDIS_URL, url, &REDIS_SCHEMES)?;
        }
        if let Some(url) = url {
            self.redis.url = url;
            self.redis.cluster_urls.clear();
        }
        if let Some(file) = lookup(ENV_REDIS_CA_FILE).filter(|f| !f.is_empty()) {
            self.redis.tls.ca_file = Some(file.into());
        }
        Ok(())
    }

    /// Points the store at the single server `url` (instead of any cluster), as a command-line
    /// override does.
    ///
    /// # Errors
    /// The URL is not a Redis URL (the problem shows it with its password redacted); nothing
    /// changes then.
    pub fn set_redis_url(&mut self, url: &str) -> Result<(), Problem> {
        redis::check_redis_url("redis.url", url, &REDIS_SCHEMES)?;
        url.clone_into(&mut self.redis.url);
        self.redis.cluster_urls.clear();
        Ok(())
    }

    /// Sets the prefix of every budget key, as a command-line override does.
    ///
    /// # Errors
    /// The prefix is not allowed (see [`check_key_prefix`]); nothing changes then.
    pub fn set_key_prefix(&mut self, prefix: &str) -> Result<(), Problem> {
        check_key_prefix("redis.key_prefix", prefix)?;
        prefix.clone_into(&mut self.redis.key_prefix);
        Ok(())
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

/// Reads a configuration file; the error names the path.
///
/// # Errors
/// The file cannot be read.
pub fn read_file(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// The file as written: each section in its own file's raw form.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    redis: redis::RawRedis,
    #[serde(default)]
    defaults: defaults::RawDefaults,
    #[serde(default)]
    dependencies: BTreeMap<String, dependencies::RawDependency>,
    #[serde(default)]
    tasks: BTreeMap<String, tasks::RawTask>,
    #[serde(default)]
    metrics: metrics::RawMetrics,
    #[serde(default)]
    audit: audit::RawAudit,
    #[serde(default)]
    unmapped_tasks: dependencies::RawUnmapped,
}

impl RawConfig {
    /// Resolves every section, collecting the problems of all of them.
    fn resolve(mut self, origin: &str) -> Result<Config, ConfigError> {
        let mut c = Checker::new();
        let redis = self.redis.resolve(&mut c);
        let default_enforcement = self.defaults.enforcement.unwrap_or_default();
        let (defaults, default_ceiling) = self.defaults.resolve(&mut c);
        let mut concurrency = BTreeMap::new();
        let mut breakers = Vec::new();
        for (name, dep) in &mut self.dependencies {
            let at = format!("dependencies.{}.concurrency", check::toml_key(name));
            if let Some(raw) = dep.concurrency.take()
                && let Some(policy) = raw.resolve(&mut c, &at)
                && let Ok(dependency) = Dependency::new(name)
            {
                concurrency.insert(dependency, policy);
            }
            if let Some(raw) = dep.breaker.take() {
                breakers.push((name.clone(), raw));
            }
        }
        let (policies, mut map, enforcement) =
            dependencies::resolve(&mut c, self.dependencies, &defaults);
        map.set_unmapped(self.unmapped_tasks.resolve(&mut c, &policies));
        // Resolved once the policies are known: half-open probes are spent from the floor.
        let mut breaker_policies = BTreeMap::new();
        for (name, raw) in breakers {
            let at = format!("dependencies.{}.breaker", check::toml_key(&name));
            let Ok(dependency) = Dependency::new(&name) else {
                continue;
            };
            let floor = policies
                .get(&dependency)
                .map_or(defaults.min_allowance, |p: &BudgetPolicy| p.min_allowance);
            if let Some(policy) = raw.resolve(&mut c, &at, floor) {
                breaker_policies.insert(dependency, policy);
            }
        }
        let tasks = tasks::resolve(&mut c, self.tasks, &map, default_ceiling);
        let metrics = self.metrics.resolve(&mut c);
        let audit = self.audit.resolve(&mut c);
        let problems = c.into_problems();
        if !problems.is_empty() {
            return Err(ConfigError::invalid(origin, problems));
        }
        Ok(Config {
            redis,
            defaults,
            policies,
            map,
            ceilings: Ceilings {
                default: default_ceiling,
                tasks,
                ..Ceilings::default()
            },
            metrics,
            audit,
            concurrency,
            breakers: breaker_policies,
            enforcement: Enforcements {
                default: default_enforcement,
                by_dependency: enforcement,
            },
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The problems of `text`, which must parse but hold invalid values.
    pub(in crate::config) fn problems(text: &str) -> Vec<Problem> {
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
        let bulk = c.ceilings.for_task("bulk_import");
        assert_eq!(
            bulk.max_attempts, 10,
            "derived from the window, for planning"
        );
        assert_eq!(
            bulk.recovery_window,
            Some(std::time::Duration::from_secs(900))
        );
        assert_eq!(c.ceilings.for_task("other").max_attempts, 5);
    }

    #[test]
    fn unknown_keys_list_the_known_ones() {
        let e = parse_error("[defaults]\nratoi = 0.2\n");
        assert!(e.contains("ratoi") && e.contains("line 2"), "{e}");
        assert!(
            e.contains("window_secs") && e.contains("min_allowance"),
            "{e}"
        );
        let e = parse_error("[redsi]\nurl = \"x\"\n");
        assert!(e.contains("redsi") && e.contains("dependencies"), "{e}");
    }

    #[test]
    fn the_core_names_no_broker_section() {
        let text = "[amqp]\nprefetch = 4\n[defaults]\nratio = 0.5\n";
        let e = parse_error(text);
        assert!(e.contains("amqp") && e.contains("redis"), "{e}");
        let c = Config::from_toml_ignoring(text, "t", &["amqp"]).unwrap();
        assert!((c.defaults.ratio - 0.5).abs() < f64::EPSILON);
        let e = Config::from_toml_ignoring("[amqpp]\n", "t", &["amqp"]).unwrap_err();
        assert!(e.to_string().contains("amqpp"), "{e}");
    }

    #[test]
    fn a_table_resolves_like_the_text_it_came_from() {
        let text = "[redis]\nkey_prefix = \"p\"\n[dependencies.search]\ntasks = [\"t\"]\n";
        let table: toml::Table = toml::from_str(text).unwrap();
        let c = Config::from_table(table, "t").unwrap();
        assert_eq!(c.redis.key_prefix, "p");
        assert_eq!(c.map.resolve("t").unwrap().as_str(), "search");
        let table: toml::Table = toml::from_str("[defaults]\nratio = -1.0\n[x]\n").unwrap();
        assert!(matches!(
            Config::from_table(table, "t"),
            Err(ConfigError::Parse { .. })
        ));
        let table: toml::Table = toml::from_str("[defaults]\nratio = -1.0\n").unwrap();
        let e = Config::from_table(table, "t").unwrap_err();
        assert_eq!(e.problems()[0].key, "defaults.ratio");
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
    fn environment_overrides_the_redis_url() {
        let mut c = Config::from_toml(
            "[redis]\nurl = \"redis://file:6379\"\ncluster_urls = [\"redis://c:1\"]\n",
            "t",
        )
        .unwrap();
        c.apply_env(|k| (k == ENV_REDIS_URL).then(String::new))
            .unwrap();
        assert_eq!(c.redis.url, "redis://file:6379");
        c.apply_env(|k| (k == ENV_REDIS_URL).then(|| "redis://env:1".to_owned()))
            .unwrap();
        assert_eq!(c.redis.url, "redis://env:1");
        assert!(c.redis.cluster_urls.is_empty());
    }

    /// `FLEET_BUDGET_REDIS_URL` used to replace a checked `redis.url` unchecked: `config check`
    /// called `rediss://h/#insecure` (certificate checks off) or `http://h` valid, and a worker
    /// connected with it. It is checked as the file's URL is; nothing changes when it is refused.
    #[test]
    fn the_environments_redis_url_is_checked_like_the_files() {
        let file = "[redis]\nurl = \"rediss://file:6380\"\n";
        for bad in [
            "rediss://u:hunter2@h:6380/#insecure",
            "http://u:hunter2@h",
            "redis://",
        ] {
            let mut c = Config::from_toml(file, "t").unwrap();
            let p = c
                .apply_env(|k| match k {
                    ENV_REDIS_URL => Some(bad.to_owned()),
                    ENV_REDIS_CA_FILE => Some("ca.pem".to_owned()),
                    _ => None,
                })
                .unwrap_err();
            assert_eq!(p.key, ENV_REDIS_URL, "{p}");
            assert!(!p.to_string().contains("hunter2"), "{p}");
            assert_eq!(c.redis.url, "rediss://file:6380", "nothing changes");
            assert_eq!(c.redis.tls.ca_file, None, "nothing changes");
        }
    }

    #[test]
    fn overrides_are_checked_like_the_file() {
        let mut c = Config::default();
        let p = c.set_redis_url("http://u:hunter2@h").unwrap_err();
        assert_eq!(p.key, "redis.url");
        assert!(!p.value.contains("hunter2"), "{p}");
        assert_eq!(c.redis.url, RedisSettings::default().url);
        c.redis.cluster_urls.push("redis://c:1".to_owned());
        assert!(
            c.set_redis_url("rediss://h:1/#insecure").is_err(),
            "certificate checks cannot be turned off"
        );
        assert_eq!(c.redis.url, RedisSettings::default().url);
        c.set_redis_url("rediss://h:1").unwrap();
        c.set_redis_url("redis://h:1").unwrap();
        assert_eq!(c.redis.url, "redis://h:1");
        assert!(c.redis.cluster_urls.is_empty());
        let p = c.set_key_prefix("a{b}").unwrap_err();
        assert_eq!(p.key, "redis.key_prefix");
        assert_eq!(c.redis.key_prefix, "fb");
        c.set_key_prefix("tenant-7").unwrap();
        assert_eq!(c.redis.key_prefix, "tenant-7");
    }
}
