//! GET requests to RabbitMQ's management HTTP API (hyper's HTTP/1 client): JSON, each within a
//! deadline, the body bounded, basic auth from the URL (or the AMQP URL's credentials), the
//! password never printed.

use std::time::Duration;

use base64::Engine as _;
use fleet_budget::redact::{redact_text, redact_url};
use fleet_budget_amqp::WorkerConfig;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::exit::usage;

/// The largest response read (a broker with thousands of queues answers `/api/queues` with
/// megabytes; the requests here name one queue or list policies and nodes).
const MAX_BODY: usize = 8 << 20;

/// Where the management API is, and how to ask it.
#[derive(Debug)]
pub(super) struct Management {
    host: String,
    port: u16,
    /// The URL's path, without a trailing slash (`/rabbitmq` behind a proxy; usually empty).
    base: String,
    /// `Basic …`; never printed.
    authorization: String,
    shown: String,
    timeout: Duration,
}

impl Management {
    /// Reads `url` (`http://[user:password@]host[:port][/path]`); without credentials, those of
    /// the AMQP URL (`guest:guest` when it has none).
    ///
    /// # Errors
    /// Not an `http://` URL (a usage error naming the flag, password redacted).
    pub(super) fn new(url: &str, config: &WorkerConfig) -> anyhow::Result<Self> {
        let shown = redact_url(url);
        let flag = "--rabbitmq-management-url";
        let rest = if let Some(rest) = url.strip_prefix("http://") {
            rest
        } else if url.starts_with("https://") {
            return Err(usage(format!(
                "{flag} {shown}: https is not supported by doctor; give the management API's \
                 http:// listener (on the broker's host or through a tunnel)"
            )));
        } else {
            return Err(usage(format!("{flag} {shown}: not an http:// URL")));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (host, port) = split_host_port(hostport).ok_or_else(|| {
            usage(format!(
                "{flag} {shown}: no host, or a port that is not one"
            ))
        })?;
        let (user, password) = match userinfo {
            Some(u) => credentials(u),
            None => amqp_credentials(&config.amqp.url),
        };
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        Ok(Self {
            host,
            port,
            base: path.trim_end_matches('/').to_owned(),
            authorization: format!("Basic {token}"),
            shown,
            timeout: config
                .amqp
                .operation_timeout
                .clamp(Duration::from_secs(1), Duration::from_secs(30)),
        })
    }

    /// The URL, password redacted.
    pub(super) fn shown(&self) -> &str {
        &self.shown
    }

    /// `GET {base}{path}` as JSON; `Ok(None)` for 404.
    ///
    /// # Errors
    /// No answer within the deadline, a status other than 200 and 404, a body over the bound or
    /// not JSON; the text says which, without the credentials.
    pub(super) async fn get(&self, path: &str) -> Result<Option<serde_json::Value>, String> {
        let target = format!("{}{path}", self.base);
        match tokio::time::timeout(self.timeout, self.request(&target)).await {
            Ok(result) => result,
            Err(_) => Err(format!("GET {target}: no answer within {:?}", self.timeout)),
        }
    }

    async fn request(&self, target: &str) -> Result<Option<serde_json::Value>, String> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            redact_text(&format!("GET {target}: {what}: {e}"))
        };
        let stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| fail("connect", &e))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| fail("handshake", &e))?;
        let driver = tokio::spawn(connection);
        let host = if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let request = hyper::Request::get(target)
            .header(hyper::header::HOST, host)
            .header(hyper::header::AUTHORIZATION, &self.authorization)
            .header(hyper::header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|e| fail("request", &e))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| fail("send", &e))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| fail("body", &e))?
            .to_bytes();
        driver.abort();
        match status.as_u16() {
            200 => serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| fail("not JSON", &e)),
            404 => Ok(None),
            401 => Err(format!(
                "GET {target}: 401: the management API refused the credentials"
            )),
            code => Err(format!("GET {target}: HTTP {code}")),
        }
    }
}

fn split_host_port(hostport: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => 15_672,
            None => return None,
        };
        (host.to_owned(), port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse().ok()?),
            None => (hostport.to_owned(), 15_672),
        }
    };
    (!host.is_empty()).then_some((host, port))
}

/// `user:password` of a URL's userinfo, percent-decoded.
fn credentials(userinfo: &str) -> (String, String) {
    match userinfo.split_once(':') {
        Some((u, p)) => (percent_decode(u), percent_decode(p)),
        None => (percent_decode(userinfo), String::new()),
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

/// `text` with every byte but the unreserved ones percent-encoded: a path segment.
pub(super) fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes().peekable();
    let hex = |b: u8| char::from(b).to_digit(16);
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let mut ahead = bytes.clone();
            if let (Some(h), Some(l)) = (ahead.next().and_then(hex), ahead.next().and_then(hex)) {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                bytes = ahead;
                continue;
            }
        }
        out.push(b);
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vhosts_and_segments() {
        assert_eq!(vhost_of("amqp://guest:guest@h:5672/%2f"), "/");
        assert_eq!(vhost_of("amqp://h:5672"), "/");
        assert_eq!(vhost_of("amqp://h:5672/prod"), "prod");
        assert_eq!(segment("/"), "%2F");
        assert_eq!(segment("fleet.dead"), "fleet.dead");
    }

    #[test]
    fn hosts_ports_and_credentials() {
        assert_eq!(
            split_host_port("127.0.0.1:15673"),
            Some(("127.0.0.1".to_owned(), 15_673))
        );
        assert_eq!(split_host_port("[::1]"), Some(("::1".to_owned(), 15_672)));
        assert_eq!(split_host_port("h:notaport"), None);
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
