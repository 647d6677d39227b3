//! The configuration a command runs with: the file of `--config` (or the defaults), then the
//! environment, then the global flags.

use fleet_budget::config::ConfigError;
use fleet_budget_amqp::WorkerConfig;

use crate::cli::GlobalArgs;
use crate::exit::usage;

/// Resolves the configuration; every problem is a usage error naming the flag or key.
pub(crate) fn resolve(global: &GlobalArgs) -> anyhow::Result<WorkerConfig> {
    let mut config = match &global.config {
        Some(path) => WorkerConfig::from_path(path).map_err(|e| config_error(&e, "--config"))?,
        None => {
            let mut c = WorkerConfig::default();
            c.apply_env(|name| std::env::var(name).ok())
                .map_err(|p| usage(p.to_string()))?;
            c
        }
    };
    if let Some(url) = &global.redis_url {
        config.budget.set_redis_url(url).map_err(|p| {
            usage(format!(
                "--redis-url (or FLEET_BUDGET_REDIS_URL) {}: {}",
                p.value, p.allowed
            ))
        })?;
    }
    if !global.amqp_url.is_empty() {
        // One URL or a cluster's nodes (the flag repeated, or separated by commas).
        config
            .amqp
            .set_urls("--amqp-url", &global.amqp_url)
            .map_err(|p| {
                usage(format!(
                    "{} (or FLEET_BUDGET_AMQP_URL) {}: {}",
                    p.key, p.value, p.allowed
                ))
            })?;
    }
    if let Some(prefix) = &global.key_prefix {
        config
            .budget
            .set_key_prefix(prefix)
            .map_err(|p| usage(format!("--key-prefix {}: {}", p.value, p.allowed)))?;
    }
    // The `[amqp]` deadlines (every AMQP step ends in a named timeout error, never a hang) and
    // certificate files travel with the configuration: the commands connect with
    // `config.amqp.connection()`.
    if let Some(p) = config.amqp.tls_problem() {
        return Err(usage(format!("{}: {}", p.key, p.allowed)));
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
