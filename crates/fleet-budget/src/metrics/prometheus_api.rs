//! Range queries to Prometheus's HTTP API (`GET /api/v1/query_range`, over [`crate::http`]):
//! each within a deadline, the body bounded, the series and their points bounded, credentials in
//! the URL sent as `Authorization` and never shown. Read by `budgetctl tune` (the fleet's history)
//! and the console's sparklines (`--prometheus-url`).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::http::{HttpUrl, HttpUrlError, basic, percent_encode};
use crate::printable::escape_text;

/// The largest answer read: 14 days at one point a minute is 20,160 points per series, some
/// 40 bytes each as JSON; 64 MiB holds about 80 such series.
const MAX_BODY: usize = 64 << 20;

/// Where Prometheus is, and how to ask it.
#[derive(Debug, Clone)]
pub struct Prometheus {
    url: HttpUrl,
    /// `Basic …` from the URL's userinfo; never shown.
    authorization: Option<String>,
    timeout: Duration,
}

/// One range query's series by their `dependency` label: Unix ms → value.
pub type Series = BTreeMap<String, BTreeMap<u64, f64>>;

impl Prometheus {
    /// Prometheus refuses a range query of more than 11,000 points per series; so do we, before
    /// asking.
    pub const MAX_POINTS: u64 = 11_000;
    /// The most series (dependencies) one answer may hold: the `dependency` label is bounded by
    /// the workers' configuration, so more means another job's metrics of the same name.
    pub const MAX_SERIES: usize = 5_000;

    /// Reads `url` (`http://[user:password@]host[:port][/path]`, port 9090 by default); each
    /// request is given `timeout`.
    ///
    /// # Errors
    /// Not an `http://` URL, no host, or a port that is not one (the text shows the URL with its
    /// password redacted).
    pub fn parse(url: &str, timeout: Duration) -> Result<Self, HttpUrlError> {
        let url = HttpUrl::parse(url, 9090)?;
        let authorization = url.credentials().map(|(u, p)| basic(u, p));
        Ok(Self {
            url,
            authorization,
            timeout,
        })
    }

    /// The URL, password redacted.
    #[must_use]
    pub fn shown(&self) -> &str {
        self.url.shown()
    }

    /// `query` over `[start_ms, end_ms]` every `step_ms`, by its `dependency` label (series
    /// without one are skipped). `NaN` and infinite points are left out.
    ///
    /// # Errors
    /// No answer within the deadline, an HTTP or Prometheus error, a body over the bound or not
    /// the documented shape, more than [`Self::MAX_SERIES`] series or [`Self::MAX_POINTS`]
    /// points in one; the text names the URL (password redacted) and the query.
    pub async fn range(
        &self,
        query: &str,
        start_ms: u64,
        end_ms: u64,
        step_ms: u64,
    ) -> Result<Series, String> {
        let target = format!(
            "{}/api/v1/query_range?query={}&start={}&end={}&step={}",
            self.url.base(),
            percent_encode(query),
            seconds(start_ms),
            seconds(end_ms),
            seconds(step_ms)
        );
        let shown = self.shown();
        let answer = self
            .url
            .get(shown, &target, self.authorization.as_deref(), MAX_BODY);
        let (status, body) = match tokio::time::timeout(self.timeout, answer).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(format!(
                    "{shown}: query `{query}`: no answer within {:?}",
                    self.timeout
                ));
            }
        };
        match status {
            // Prometheus answers a bad query with 400 and a JSON error; parse_matrix says it.
            200 | 400 | 422 => {}
            401 | 403 => {
                return Err(format!(
                    "{shown}: HTTP {status}: the credentials were refused"
                ));
            }
            code => return Err(format!("{shown}: HTTP {code}")),
        }
        parse_matrix(&body).map_err(|e| format!("{shown}: query `{query}`: {e}"))
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
            escape_text(error.get(..500).unwrap_or(error))
        ));
    }
    let result = doc
        .pointer("/data/result")
        .and_then(|r| r.as_array())
        .ok_or("the answer has no data.result list")?;
    if result.len() > Prometheus::MAX_SERIES {
        return Err(format!(
            "{} series, more than the {} read (the `dependency` label is bounded by the workers' \
             configuration: another job exports metrics of the same name?)",
            result.len(),
            Prometheus::MAX_SERIES
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
        if values.len() as u64 > Prometheus::MAX_POINTS {
            return Err(format!(
                "a series of {} points, more than {}",
                values.len(),
                Prometheus::MAX_POINTS
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
                    escape_text(v.get(..40).unwrap_or(v))
                ));
            };
            if let Some(ms) = unix_ms(t)
                && value.is_finite()
            {
                points.insert(ms, value);
            }
        }
    }
    Ok(series)
}

/// Prometheus's seconds (`1733533200.5`) as whole Unix milliseconds; `None` for a time before
/// the epoch, past the year 9999 or not finite.
fn unix_ms(t: f64) -> Option<u64> {
    const LAST: f64 = 253_402_300_800.0;
    if !t.is_finite() || !(0.0..LAST).contains(&t) {
        return None;
    }
    // In range: at most 2.6e14 ms, well within u64 and f64's exact integers.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Some((t * 1000.0).round() as u64)
}

/// Milliseconds as the seconds Prometheus reads (`1733533200.5`).
fn seconds(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}", ms / 1000)
    } else {
        format!("{}.{:03}", ms / 1000, ms % 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_read_and_refused_with_the_password_hidden() {
        let p = Prometheus::parse(
            "http://u:secret@prom.example:9091/prom/",
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(p.url.base(), "/prom");
        assert!(p.authorization.is_some());
        assert!(!p.shown().contains("secret"));
        let d = Prometheus::parse("http://localhost", Duration::from_secs(1)).unwrap();
        assert!(d.authorization.is_none());
        for bad in [
            "https://u:secret@x",
            "ftp://x",
            "http://:9090",
            "http://x:port",
        ] {
            let e = Prometheus::parse(bad, Duration::from_secs(1))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(!e.is_empty() && !e.contains("secret"), "{bad}: {e}");
        }
    }

    #[test]
    fn answers_are_read_by_dependency_and_hostile_ones_refused() {
        let ok = br#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"dependency":"payments"},"values":[[1700000000,"1.5"],[1700000002.5,"NaN"],[1700000005,"3"],[-5,"1"],[1e300,"1"]]},
            {"metric":{},"values":[[1700000000,"9"]]}]}}"#;
        let series = parse_matrix(ok).unwrap();
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
            vec![r#"{"metric":{"dependency":"a"},"values":[]}"#; Prometheus::MAX_SERIES + 1]
                .join(",")
        );
        assert!(parse_matrix(many.as_bytes()).is_err());
    }

    #[test]
    fn times_are_seconds() {
        assert_eq!(seconds(1_500), "1.500");
        assert_eq!(seconds(2_000), "2");
    }
}
