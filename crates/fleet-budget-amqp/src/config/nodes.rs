//! The broker nodes: a list checked node by node, the environment naming one broker or a
//! cluster (never both), and how errors and logs show them.

use fleet_budget::config::{Problem, check_url};

use super::{
    AMQP_SCHEMES, ENV_AMQP_CA_FILE, ENV_AMQP_URL, ENV_AMQP_URLS, MAX_BROKER_URLS, WorkerConfig,
};

impl WorkerConfig {
    /// Applies `FLEET_BUDGET_REDIS_URL`, `FLEET_BUDGET_AMQP_URL` (or `FLEET_BUDGET_AMQP_URLS`,
    /// the nodes of a cluster separated by commas) and the CA files
    /// (`FLEET_BUDGET_REDIS_CA_FILE`, `FLEET_BUDGET_AMQP_CA_FILE`) as found by `lookup` (an empty
    /// value is no override). Each URL is checked as the file's is.
    ///
    /// # Errors
    /// A URL of the environment is not a Redis or AMQP URL (the problem names the variable,
    /// password redacted), or both AMQP variables are set; nothing changes then.
    pub fn apply_env(&mut self, lookup: impl Fn(&str) -> Option<String>) -> Result<(), Problem> {
        let amqp_url = lookup(ENV_AMQP_URL).filter(|u| !u.is_empty());
        let amqp_urls = lookup(ENV_AMQP_URLS).filter(|u| !u.is_empty());
        let nodes = match (&amqp_url, &amqp_urls) {
            (Some(_), Some(_)) => {
                return Err(Problem::new(
                    ENV_AMQP_URLS,
                    format!("{ENV_AMQP_URL} and {ENV_AMQP_URLS}"),
                    format!(
                        "set one of {ENV_AMQP_URL} (one broker) or {ENV_AMQP_URLS} (a cluster's nodes, comma-separated), not both"
                    ),
                ));
            }
            (Some(url), None) => {
                check_url(ENV_AMQP_URL, url, &AMQP_SCHEMES)?;
                Some((url.clone(), Vec::new()))
            }
            (None, Some(urls)) => {
                let urls: Vec<String> = urls.split(',').map(|u| u.trim().to_owned()).collect();
                Some(checked_nodes(ENV_AMQP_URLS, &urls)?)
            }
            (None, None) => None,
        };
        self.budget.apply_env(&lookup)?;
        if let Some((url, others)) = nodes {
            self.amqp.url = url;
            self.amqp.other_urls = others;
        }
        if let Some(file) = lookup(ENV_AMQP_CA_FILE).filter(|f| !f.is_empty()) {
            self.amqp.tls.ca_file = Some(file.into());
        }
        Ok(())
    }
}

/// The nodes `urls` as the first and the others, each checked as `amqp.url` is; `key` names
/// the list in a problem, `key[i]` one of its URLs.
pub(super) fn checked_nodes(key: &str, urls: &[String]) -> Result<(String, Vec<String>), Problem> {
    if urls.len() > MAX_BROKER_URLS {
        return Err(Problem::new(
            key,
            format!("{} URLs", urls.len()),
            format!("must list at most {MAX_BROKER_URLS} broker nodes"),
        ));
    }
    for (i, url) in urls.iter().enumerate() {
        let at = format!("{key}[{i}]");
        check_url(&at, url, &AMQP_SCHEMES)?;
        if urls.iter().take(i).any(|earlier| earlier == url) {
            return Err(Problem::new(
                &at,
                fleet_budget::redact::redact_url(url),
                "lists the same node twice",
            ));
        }
    }
    match urls.split_first() {
        Some((url, others)) => Ok((url.clone(), others.to_vec())),
        None => Err(Problem::new(key, "[]", "must list at least one broker URL")),
    }
}
