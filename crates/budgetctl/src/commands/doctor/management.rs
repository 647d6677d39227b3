//! GET requests to RabbitMQ's management HTTP API (`fleet_budget::http`): JSON, each within a deadline,
//! the body bounded, basic auth from the URL (or the AMQP URL's credentials), the password never
//! printed.

use std::time::Duration;

use fleet_budget::http::{HttpUrl, basic, credentials, percent_decode};
use fleet_budget::redact::redact_text;
use fleet_budget_amqp::WorkerConfig;

use crate::exit::usage;

/// The largest response read (a broker with thousands of queues answers `/api/queues` with
/// megabytes; the requests here name one queue or list policies and nodes).
const MAX_BODY: usize = 8 << 20;

/// Where the management API is, and how to ask it.
#[derive(Debug)]
pub(super) struct Management {
    url: HttpUrl,
    /// `Basic …`; never printed.
    authorization: String,
    timeout: Duration,
}

impl Management {
    /// Reads `url` (`http://[user:password@]host[:port][/path]`); without credentials, those of
    /// the AMQP URL (`guest:guest` when it has none).
    ///
    /// # Errors
    /// Not an `http://` URL (a usage error naming the flag, password redacted).
    pub(super) fn new(url: &str, config: &WorkerConfig) -> anyhow::Result<Self> {
        let url = HttpUrl::parse(url, 15_672)
            .map_err(|e| usage(format!("--rabbitmq-management-url {e}")))?;
        let (user, password) = match url.credentials() {
            Some((u, p)) => (u.to_owned(), p.to_owned()),
            None => amqp_credentials(&config.amqp.url),
        };
        Ok(Self {
            url,
            authorization: basic(&user, &password),
            timeout: config
                .amqp
                .operation_timeout
                .clamp(Duration::from_secs(1), Duration::from_secs(30)),
        })
    }

    /// The URL, password redacted.
    pub(super) fn shown(&self) -> &str {
        self.url.shown()
    }

    /// `GET {base}{path}` as JSON; `Ok(None)` for 404.
    ///
    /// # Errors
    /// No answer within the deadline, a status other than 200 and 404, a body over the bound or
    /// not JSON; the text says which, without the credentials.
    pub(super) async fn get(&self, path: &str) -> Result<Option<serde_json::Value>, String> {
        let target = format!("{}{path}", self.url.base());
        let label = format!("GET {target}");
        let answer = self
            .url
            .get(&label, &target, Some(&self.authorization), MAX_BODY);
        let (status, body) = match tokio::time::timeout(self.timeout, answer).await {
            Ok(result) => result?,
            Err(_) => return Err(format!("{label}: no answer within {:?}", self.timeout)),
        };
        match status {
            200 => serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| redact_text(&format!("{label}: not JSON: {e}"))),
            404 => Ok(None),
            401 => Err(format!(
                "{label}: 401: the management API refused the credentials"
            )),
            code => Err(format!("{label}: HTTP {code}")),
        }
    }
}

/// The AMQP URL's credentials, `guest:guest` when it has none (as the AMQP client assumes).
fn amqp_credentials(url: &str) -> (String, String) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.rsplit_once('@') {
        Some((userinfo, _)) => credentials(userinfo),
        None => ("guest".to_owned(), "guest".to_owned()),
    }
}

/// The virtual host of an AMQP URL (`/` when the path is empty), percent-decoded.
pub(super) fn vhost_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let path = rest.split_once('/').map_or("", |(_, p)| p);
    let path = path.split(['?', '#']).next().unwrap_or("");
    if path.is_empty() {
        "/".to_owned()
    } else {
        percent_decode(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vhosts() {
        assert_eq!(vhost_of("amqp://guest:guest@h:5672/%2f"), "/");
        assert_eq!(vhost_of("amqp://h:5672"), "/");
        assert_eq!(vhost_of("amqp://h:5672/prod"), "prod");
    }

    #[test]
    fn amqp_credentials_are_read_or_guest() {
        assert_eq!(
            amqp_credentials("amqp://u%40x:p%3Aw@h/%2f"),
            ("u@x".to_owned(), "p:w".to_owned())
        );
        assert_eq!(
            amqp_credentials("amqp://h"),
            ("guest".to_owned(), "guest".to_owned())
        );
    }
}
