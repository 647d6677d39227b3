//! The configuration a command runs with: the file of `--config` (or the defaults), then the
//! environment, then the global flags.

use fleet_budget::Config;
use fleet_budget::config::ConfigError;
use fleet_budget::redact::redact_url;

use crate::cli::GlobalArgs;
use crate::exit::usage;

/// Resolves the configuration; every problem is a usage error naming the flag or key.
pub(crate) fn resolve(global: &GlobalArgs) -> anyhow::Result<Config> {
    let mut config = match &global.config {
        Some(path) => Config::from_path(path).map_err(|e| config_error(&e, "--config"))?,
        None => {
            let mut c = Config::default();
            c.apply_env(|name| std::env::var(name).ok());
            c
        }
    };
    if let Some(url) = &global.redis_url {
        if !has_scheme(url, &["redis", "rediss", "redis+unix", "unix"]) {
            return Err(usage(format!(
                "--redis-url (or FLEET_BUDGET_REDIS_URL) {}: must be a URL of the form redis://host:port (or rediss://)",
                redact_url(url)
            )));
        }
        config.redis.url.clone_from(url);
        config.redis.cluster_urls.clear();
    }
    if let Some(url) = &global.amqp_url {
        if !has_scheme(url, &["amqp", "amqps"]) {
            return Err(usage(format!(
                "--amqp-url (or FLEET_BUDGET_AMQP_URL) {}: must be a URL of the form amqp://user:password@host:port/vhost",
                redact_url(url)
            )));
        }
        config.amqp.url.clone_from(url);
    }
    if let Some(prefix) = &global.key_prefix {
        if prefix.is_empty()
            || prefix.len() > 64
            || prefix
                .chars()
                .any(|c| c == '{' || c == '}' || c.is_control() || c.is_whitespace())
        {
            return Err(usage(format!(
                "--key-prefix {prefix:?}: must be 1 to 64 characters without `{{`, `}}`, spaces or control characters"
            )));
        }
        config.redis.key_prefix.clone_from(prefix);
    }
    Ok(config)
}

/// A configuration error as a usage error; `flag` names where the file came from.
pub(crate) fn config_error(e: &ConfigError, flag: &str) -> anyhow::Error {
    match e {
        ConfigError::Read { .. } => usage(format!("{flag}: {e}")),
        _ => usage(format!("invalid configuration ({flag}): {e}")),
    }
}

fn has_scheme(url: &str, schemes: &[&str]) -> bool {
    schemes.iter().any(|s| {
        url.strip_prefix(s)
            .and_then(|r| r.strip_prefix("://"))
            .is_some_and(|r| !r.is_empty())
    })
}
