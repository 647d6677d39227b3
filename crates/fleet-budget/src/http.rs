//! GET requests to the plain-HTTP APIs the tools read (Prometheus's in `budgetctl tune` and the
//! console's sparklines, [`crate::metrics::Prometheus`]; RabbitMQ's management API in `budgetctl
//! doctor`), over hyper's HTTP/1 client: the URL read once
//! (`http://[user:password@]host[:port][/path]`, the password never shown), the body bounded,
//! errors redacted. Each caller puts its own deadline around [`HttpUrl::get`].

use base64::Engine as _;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::redact::{redact_text, redact_url};

/// A URL [`HttpUrl::parse`] cannot use; the text shows it with its password redacted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HttpUrlError(String);

/// Where an HTTP API is: host, port, base path and the URL's credentials.
#[derive(Debug, Clone)]
pub struct HttpUrl {
    host: String,
    port: u16,
    /// The URL's path without a trailing slash (`/prometheus` behind a proxy; usually empty).
    base: String,
    /// The URL's `user:password`, percent-decoded; never printed.
    credentials: Option<(String, String)>,
    shown: String,
}

impl HttpUrl {
    /// Reads `url`, with `default_port` when it names none.
    ///
    /// # Errors
    /// Not an `http://` URL (`https://` is not supported: the APIs read are given by their
    /// http:// listener, on their host or through a tunnel), no host, or a port that is not one;
    /// the text starts with the URL, its password redacted.
    pub fn parse(url: &str, default_port: u16) -> Result<Self, HttpUrlError> {
        let shown = redact_url(url);
        let rest = if let Some(rest) = url.strip_prefix("http://") {
            rest
        } else if url.starts_with("https://") {
            return Err(HttpUrlError(format!(
                "{shown}: https is not supported; give the http:// listener (on its host or through a tunnel)"
            )));
        } else {
            return Err(HttpUrlError(format!("{shown}: not an http:// URL")));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (host, port) = split_host_port(hostport, default_port)
            .ok_or_else(|| HttpUrlError(format!("{shown}: no host, or a port that is not one")))?;
        Ok(Self {
            host,
            port,
            base: path.trim_end_matches('/').to_owned(),
            credentials: userinfo.map(credentials),
            shown,
        })
    }

    /// The URL, password redacted.
    #[must_use]
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The URL's path without a trailing slash, to put before a request's path.
    #[must_use]
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The URL's `user:password` (percent-decoded), if it has any.
    #[must_use]
    pub fn credentials(&self) -> Option<(&str, &str)> {
        self.credentials
            .as_ref()
            .map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// `GET target` (a path and query, the base included) with `authorization` if given:
    /// the status and at most `max_body` bytes of the body. No deadline of its own.
    ///
    /// # Errors
    /// The connection, the request or the body failed, or the body is over `max_body`; the text
    /// starts with `label` and says which step, redacted.
    pub async fn get(
        &self,
        label: &str,
        target: &str,
        authorization: Option<&str>,
        max_body: usize,
    ) -> Result<(u16, Bytes), String> {
        let fail =
            |what: &str, e: &dyn std::fmt::Display| redact_text(&format!("{label}: {what}: {e}"));
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
        let mut request = hyper::Request::get(target)
            .header(hyper::header::HOST, host)
            .header(hyper::header::ACCEPT, "application/json");
        if let Some(authorization) = authorization {
            request = request.header(hyper::header::AUTHORIZATION, authorization);
        }
        let result = async {
            let request = request
                .body(Empty::<Bytes>::new())
                .map_err(|e| fail("request", &e))?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| fail("send", &e))?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), max_body)
                .collect()
                .await
                .map(http_body_util::Collected::to_bytes)
                .map_err(|e| fail(&format!("answer (at most {} KiB read)", max_body >> 10), &e))?;
            Ok((status, body))
        }
        .await;
        driver.abort();
        result
    }
}

/// `Basic …` for `user` and `password`.
#[must_use]
pub fn basic(user: &str, password: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {token}")
}

/// `text` with every byte but the unreserved ones percent-encoded (a path segment, or a value
/// of a query string).
#[must_use]
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `text` percent-decoded; a `%` not followed by two hex digits is kept as it is.
#[must_use]
pub fn percent_decode(text: &str) -> String {
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

/// `user:password` of a URL's userinfo, percent-decoded.
#[must_use]
pub fn credentials(userinfo: &str) -> (String, String) {
    match userinfo.split_once(':') {
        Some((u, p)) => (percent_decode(u), percent_decode(p)),
        None => (percent_decode(userinfo), String::new()),
    }
}

fn split_host_port(hostport: &str, default_port: u16) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        (host.to_owned(), port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse().ok()?),
            None => (hostport.to_owned(), default_port),
        }
    };
    (!host.is_empty()).then_some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_read_and_refused_with_the_password_hidden() {
        let u = HttpUrl::parse("http://u%40x:p%3Aw@h.example:9091/prom/", 80)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (u.host.as_str(), u.port, u.base()),
            ("h.example", 9091, "/prom")
        );
        assert_eq!(u.credentials(), Some(("u@x", "p:w")));
        assert!(!u.shown().contains("p%3Aw"), "{}", u.shown());
        let d = HttpUrl::parse("http://[::1]", 15_672).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (d.host.as_str(), d.port, d.credentials()),
            ("::1", 15_672, None)
        );
        for bad in [
            "https://u:secret@x",
            "ftp://x",
            "http://:9090",
            "http://x:port",
            "http://[::1]x",
        ] {
            let e = HttpUrl::parse(bad, 80)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(!e.is_empty() && !e.contains("secret"), "{bad}: {e}");
        }
    }

    #[test]
    fn text_is_encoded_and_decoded() {
        assert_eq!(percent_encode("/"), "%2F");
        assert_eq!(percent_encode("fleet.dead"), "fleet.dead");
        assert_eq!(
            percent_encode("sum by (a)(x[2s])"),
            "sum%20by%20%28a%29%28x%5B2s%5D%29"
        );
        assert_eq!(percent_decode("a%2Fb%zz%4"), "a/b%zz%4");
        assert_eq!(basic("guest", "guest"), "Basic Z3Vlc3Q6Z3Vlc3Q=");
    }
}
