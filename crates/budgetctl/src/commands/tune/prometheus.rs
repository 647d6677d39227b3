//! Range queries to Prometheus's HTTP API (`GET /api/v1/query_range`, hyper's HTTP/1 client as
//! `doctor` uses for RabbitMQ's management API): each request within a deadline, the body
//! bounded, the series and their points bounded, credentials in the URL never printed.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use fleet_budget::redact::{redact_text, redact_url};
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::exit::usage;

/// The largest answer read: 14 days at one point a minute is 20,160 points per series, some
/// 40 bytes each as JSON; 64 MiB holds about 80 such series.
const MAX_BODY: usize = 64 << 20;
/// Prometheus refuses a range query of more than 11,000 points per series; so do we, before
/// asking.
pub(crate) const MAX_POINTS: u64 = 11_000;
/// The most series (dependencies) one answer may hold: the `dependency` label is bounded by the
/// workers' configuration, so more means another job's metrics of the same name.
pub(crate) const MAX_SERIES: usize = 2_000;

/// Where Prometheus is, and how to ask it.
#[derive(Debug)]
pub(crate) struct Prometheus {
    host: String,
    port: u16,
    /// The URL's path without a trailing slash (`/prometheus` behind a proxy; usually empty).
    base: String,
    /// `Basic …` from the URL's userinfo; never printed.
    authorization: Option<String>,
    shown: String,
    timeout: Duration,
}

/// One series of a range query: its `dependency` label, and its points (Unix ms → value).
pub(crate) type Series = BTreeMap<String, BTreeMap<u64, f64>>;

impl Prometheus {
    /// Reads `url` (`http://[user:password@]host[:port][/path]`, port 9090 by default).
    ///
    /// # Errors
    /// Not an `http://` URL (a usage error naming the flag, password redacted).
    pub(crate) fn new(url: &str, timeout: Duration) -> anyhow::Result<Self> {
        let shown = redact_url(url);
        let flag = "--prometheus";
        let rest = if let Some(rest) = url.strip_prefix("http://") {
            rest
        } else if url.starts_with("https://") {
            return Err(usage(format!(
                "{flag} {shown}: https is not supported; give Prometheus's http:// listener \
                 (on its host or through a tunnel)"
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
        let authorization = userinfo.map(|u| {
            let token = base64::engine::general_purpose::STANDARD.encode(u.as_bytes());
            format!("Basic {token}")
        });
        Ok(Self {
            host,
            port,
            base: path.trim_end_matches('/').to_owned(),
            authorization,
            shown,
            timeout,
        })
    }

    /// The URL, password redacted.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// `query` over `[start_ms, end_ms]` every `step_ms`, by its `dependency` label (series
    /// without one are skipped). `NaN` and infinite points are left out.
    ///
    /// # Errors
    /// No answer within the deadline, an HTTP or Prometheus error, a body over the bound or not
    /// the documented shape, more than [`MAX_SERIES`] series or [`MAX_POINTS`] points in one.
    pub(crate) async fn range(
        &self,
        query: &str,
        start_ms: u64,
        end_ms: u64,
        step_ms: u64,
    ) -> Result<Series, String> {
        let target = format!(
            "{}/api/v1/query_range?query={}&start={}&end={}&step={}",
            self.base,
            encode(query),
            seconds(start_ms),
            seconds(end_ms),
            seconds(step_ms)
        );
        let body = match tokio::time::timeout(self.timeout, self.get(&target)).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(format!(
                    "{}: query `{query}`: no answer within {:?}",
                    self.shown, self.timeout
                ));
            }
        };
        parse_matrix(&body).map_err(|e| format!("{}: query `{query}`: {e}", self.shown))
    }

    async fn get(&self, target: &str) -> Result<Bytes, String> {
        let shown = &self.shown;
        let fail =
            |what: &str, e: &dyn std::fmt::Display| redact_text(&format!("{shown}: {what}: {e}"));
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
        if let Some(authorization) = &self.authorization {
            request = request.header(hyper::header::AUTHORIZATION, authorization);
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| fail("request", &e))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| fail("send", &e));
        let response = match response {
            Ok(r) => r,
            Err(e) => {
                driver.abort();
                return Err(e);
            }
        };
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .map_err(|e| fail(&format!("answer (at most {} MiB read)", MAX_BODY >> 20), &e));
        driver.abort();
        let body = body?;
        match status {
            // Prometheus answers a bad query with 400 and a JSON error; parse_matrix says it.
            200 | 400 | 422 => Ok(body),
            401 | 403 => Err(format!(
                "{shown}: HTTP {status}: the credentials were refused"
            )),
            code => Err(format!("{shown}: HTTP {code}")),
        }
    }
}

/// The series of a `query_range` answer, by `dependency`.
fn parse_matrix(body: &[u8]) -> Result<Series, String> {
    let doc: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("the answer is not JSON: {e}"))?;
    if doc.get("status").and_then(|s| s.as_str()) != Some("success") {
        let error = doc
            .get("error")
            .and_then(|e| e.as_str())
            .unwrap_or("no error text");
        return Err(format!(
            "Prometheus answered an error: {}",
            fleet_budget::printable::escape_text(error.get(..500).unwrap_or(error))
        ));
    }
    let result = doc
        .pointer("/data/result")
        .and_then(|r| r.as_array())
        .ok_or("the answer has no data.result list")?;
    if result.len() > MAX_SERIES {
        return Err(format!(
            "{} series, more than the {MAX_SERIES} read (the `dependency` label is bounded by \
             the workers' configuration: another job exports metrics of the same name?)",
            result.len()
        ));
    }
    let mut series = Series::new();
    for entry in result {
        let Some(dependency) = entry.pointer("/metric/dependency").and_then(|d| d.as_str()) else {
            continue;
        };
        let values = entry
            .get("values")
            .and_then(|v| v.as_array())
            .ok_or("a series without values")?;
        if values.len() as u64 > MAX_POINTS {
            return Err(format!(
                "a series of {} points, more than {MAX_POINTS}",
                values.len()
            ));
        }
        let points = series.entry(dependency.to_owned()).or_default();
        for point in values {
            let (Some(t), Some(v)) = (
                point.get(0).and_then(serde_json::Value::as_f64),
                point.get(1).and_then(|v| v.as_str()),
            ) else {
                return Err("a point that is not [time, \"value\"]".to_owned());
            };
            let Ok(value) = v.parse::<f64>() else {
                return Err(format!(
                    "a value that is not a number: {}",
                    fleet_budget::printable::escape_text(v.get(..40).unwrap_or(v))
                ));
            };
            if value.is_finite() && t.is_finite() && t >= 0.0 {
                points.insert(fleet_budget_sim::history::whole(t * 1000.0 - 0.5), value);
            }
        }
    }
    Ok(series)
}

/// Milliseconds as the seconds Prometheus reads (`1733533200.5`).
fn seconds(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}", ms / 1000)
    } else {
        format!("{}.{:03}", ms / 1000, ms % 1000)
    }
}

/// `text` percent-encoded for a query string.
fn encode(text: &str) -> String {
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

fn split_host_port(hostport: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => 9090,
            None => return None,
        };
        (host.to_owned(), port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse().ok()?),
            None => (hostport.to_owned(), 9090),
        }
    };
    (!host.is_empty()).then_some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_read_and_refused_with_the_password_hidden() {
        let p = Prometheus::new(
            "http://u:secret@prom.example:9091/prom/",
            Duration::from_secs(1),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (p.host.as_str(), p.port, p.base.as_str()),
            ("prom.example", 9091, "/prom")
        );
        assert!(!p.shown().contains("secret"));
        let d = Prometheus::new("http://localhost", Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.port, 9090);
        for bad in [
            "https://u:secret@x",
            "ftp://x",
            "http://:9090",
            "http://x:port",
        ] {
            let e = Prometheus::new(bad, Duration::from_secs(1))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                e.contains("--prometheus") && !e.contains("secret"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn answers_are_read_by_dependency_and_hostile_ones_refused() {
        let ok = br#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"dependency":"payments"},"values":[[1700000000,"1.5"],[1700000002.5,"NaN"],[1700000005,"3"]]},
            {"metric":{},"values":[[1700000000,"9"]]}]}}"#;
        let series = parse_matrix(ok).unwrap_or_else(|e| panic!("{e}"));
        let points: Vec<(u64, f64)> = series
            .get("payments")
            .map(|p| p.iter().map(|(t, v)| (*t, *v)).collect())
            .unwrap_or_default();
        assert_eq!(points, [(1_700_000_000_000, 1.5), (1_700_000_005_000, 3.0)]);
        assert_eq!(series.len(), 1);
        for bad in [
            &b"<html>"[..],
            br#"{"status":"error","error":"parse error at char 3"}"#,
            br#"{"status":"success","data":{}}"#,
            br#"{"status":"success","data":{"result":[{"metric":{"dependency":"a"},"values":[["x"]]}]}}"#,
            br#"{"status":"success","data":{"result":[{"metric":{"dependency":"a"},"values":[[1,"1e"]]}]}}"#,
        ] {
            assert!(parse_matrix(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let many = format!(
            r#"{{"status":"success","data":{{"result":[{}]}}}}"#,
            vec![r#"{"metric":{"dependency":"a"},"values":[]}"#; MAX_SERIES + 1].join(",")
        );
        assert!(parse_matrix(many.as_bytes()).is_err());
    }

    #[test]
    fn queries_are_encoded() {
        assert_eq!(
            encode("sum by (a)(x[2s])"),
            "sum%20by%20%28a%29%28x%5B2s%5D%29"
        );
        assert_eq!(seconds(1_500), "1.500");
        assert_eq!(seconds(2_000), "2");
    }
}
