//! The incident report of one dependency (`/incident?dependency=D&since=2h[&until=...][&step=60s]`):
//! the same model, accounting, sections and charts as `budgetctl incident report`
//! ([`fleet_budget_amqp::incident`]), read from what the console reads: the audit trail, the
//! dead-letter index and ledger in Redis, and, when the console is given Prometheus
//! (`--prometheus-url`), the per-minute figures and their charts (the same queries and the same
//! SVG as the command's); without it the page says the charts need it.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleet_budget::Dependency;
use fleet_budget::metrics::Prometheus;
use fleet_budget_amqp::incident::{Report, default_step_ms};
use maud::{Markup, PreEscaped, html};
use serde::Deserialize;

use super::{layout, path_segment, query, t};
use crate::App;
use crate::access::Visitor;
use crate::routes::ConsoleError;

/// The longest range a page reads: the dead-letter ledger's 14 days.
const RANGE_MAX: Duration = Duration::from_secs(14 * 24 * 3600);

/// The page's query.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct IncidentQuery {
    #[serde(default)]
    dependency: Option<String>,
    /// A duration ago (`2h`) or an RFC 3339 time.
    #[serde(default)]
    since: Option<String>,
    /// Likewise; now when absent.
    #[serde(default)]
    until: Option<String>,
    /// The step of the per-minute figures (`60s`; by default a minute, or longer to keep a long
    /// range within Prometheus's points per series).
    #[serde(default)]
    step: Option<String>,
    /// Which [`ROWS_SHOWN`] rows of each long section are shown (0, the first, by default).
    #[serde(default)]
    part: Option<String>,
}

/// Rows a section shows at most: a long one (a thousand overrides in a day) is shown in parts,
/// each labelled, with links to the others; `budgetctl incident report` prints every row.
pub(crate) const ROWS_SHOWN: usize = 100;

/// Where the page's charts come from, and what became of them.
enum Charts {
    /// The console reads no Prometheus.
    NoPrometheus,
    /// Read (the charts may still be empty: no minute in the range).
    Read,
    /// Prometheus failed: why, redacted.
    Failed(String),
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `2h` (that long before `now_ms`) or an RFC 3339 time, as Unix ms.
fn when(name: &str, text: &str, now_ms: u64) -> Result<u64, ConsoleError> {
    let text = text.trim();
    if let Ok(ago) = humantime::parse_duration(text) {
        let ago = u64::try_from(ago.as_millis()).unwrap_or(u64::MAX);
        return now_ms.checked_sub(ago).ok_or_else(|| {
            ConsoleError::Invalid(format!("`{name}`: {} is before the epoch", t(text)))
        });
    }
    humantime::parse_rfc3339_weak(text)
        .ok()
        .and_then(|at| at.duration_since(UNIX_EPOCH).ok())
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .ok_or_else(|| {
            ConsoleError::Invalid(format!(
                "`{name}` is a duration ago (`2h`) or an RFC 3339 time, not {:?}",
                t(text)
            ))
        })
}

/// What a query asks for, checked.
struct Asked {
    dependency: Dependency,
    since_ms: u64,
    until_ms: u64,
    step_ms: u64,
}

impl IncidentQuery {
    /// The dependency, the range (`since` by default 24 hours before `now_ms`, `until` by
    /// default `now_ms`, at most [`RANGE_MAX`] apart) and the step, or why not.
    fn asked(&self, now_ms: u64) -> Result<Asked, ConsoleError> {
        let given = |v: &Option<String>| {
            v.as_deref()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        let name = given(&self.dependency)
            .ok_or_else(|| ConsoleError::BadRequest("`dependency` is required".to_owned()))?;
        let dependency = Dependency::new(&name)
            .map_err(|e| ConsoleError::Invalid(format!("`dependency`: {}", t(&e.to_string()))))?;
        let since_ms = when("since", &given(&self.since).unwrap_or("24h".into()), now_ms)?;
        let until_ms = match given(&self.until) {
            Some(u) => when("until", &u, now_ms)?,
            None => now_ms,
        };
        if since_ms >= until_ms {
            return Err(ConsoleError::Invalid(
                "`since` must be before `until`".to_owned(),
            ));
        }
        let span = until_ms - since_ms;
        if span > u64::try_from(RANGE_MAX.as_millis()).unwrap_or(u64::MAX) {
            return Err(ConsoleError::Invalid(
                "the range is at most 14 days (what the dead-letter ledger keeps)".to_owned(),
            ));
        }
        let step_ms = match given(&self.step) {
            Some(text) => step(&text, span)?,
            None => default_step_ms(span),
        };
        Ok(Asked {
            dependency,
            since_ms,
            until_ms,
            step_ms,
        })
    }
}

/// `GET /incident`: reads the report (Prometheus when the console has one, then Redis) and
/// renders it.
pub(crate) async fn page(
    app: Arc<App>,
    v: Visitor,
    q: IncidentQuery,
) -> Result<Markup, ConsoleError> {
    let asked = q.asked(now_ms())?;
    let part = match q.part.as_deref().map(str::trim).filter(|p| !p.is_empty()) {
        None => 0,
        Some(p) => p.parse::<usize>().map_err(|_| {
            ConsoleError::Invalid(format!("`part` is a whole number, not {:?}", t(p)))
        })?,
    };
    let policy = app.settings.config.budget.policy(&asked.dependency);
    let mut report = Report::new(asked.dependency.as_str(), asked.since_ms, asked.until_ms);
    report.step_ms = asked.step_ms;
    report.ratio = policy.ratio;
    report.min_allowance = policy.min_allowance;
    let charts = match &app.settings.prometheus {
        None => Charts::NoPrometheus,
        Some(prometheus) => match report.read_prometheus(prometheus, policy.deposit).await {
            Ok(()) => Charts::Read,
            Err(e) => {
                let e = fleet_budget::redact::redact_text(&e);
                report
                    .sources
                    .push(format!("Prometheus could not be read: {e}"));
                Charts::Failed(e)
            }
        },
    };
    // Each read has the store's deadline; the whole within a few of the console's.
    let shown = app.settings.config.budget.redis_display();
    let read = report.read_redis(&app.store, &app.audit, &app.topology, &shown);
    let deadline = app.settings.upstream_timeout.saturating_mul(8);
    if tokio::time::timeout(deadline, read).await.is_err() {
        return Err(ConsoleError::upstream(
            "Redis",
            &format!("the incident report was not read within {deadline:?}"),
        ));
    }
    report.finish();
    Ok(render(&v, &report, &charts, &Parts { query: &q, part }))
}

/// Which part of each long section a page shows, and the links to the others.
struct Parts<'a> {
    query: &'a IncidentQuery,
    part: usize,
}

impl Parts<'_> {
    /// The rows shown of a section of `len` rows (its header apart): all of them when they fit
    /// in [`ROWS_SHOWN`]; else the asked part, or the last when it asks past the end.
    fn of(&self, len: usize) -> std::ops::Range<usize> {
        if len <= ROWS_SHOWN {
            return 0..len;
        }
        let last = (len - 1) / ROWS_SHOWN;
        let start = self.part.min(last) * ROWS_SHOWN;
        start..(start + ROWS_SHOWN).min(len)
    }

    /// The page's address with part `part` (the query's other fields as given).
    fn href(&self, part: usize) -> String {
        let q = self.query;
        let part = part.to_string();
        let pairs = [
            ("dependency", q.dependency.as_deref().map(str::trim)),
            ("since", q.since.as_deref().map(str::trim)),
            ("until", q.until.as_deref().map(str::trim)),
            ("step", q.step.as_deref().map(str::trim)),
            ("part", Some(part.as_str())),
        ];
        format!("/incident?{}", query(&pairs))
    }
}

/// The `step` of the query: a duration of whole seconds, at least one, that keeps `span_ms`
/// within Prometheus's points per series.
fn step(text: &str, span_ms: u64) -> Result<u64, ConsoleError> {
    let step = humantime::parse_duration(text)
        .ok()
        .and_then(|d| u64::try_from(d.as_millis()).ok())
        .filter(|ms| *ms >= 1000 && ms.is_multiple_of(1000))
        .ok_or_else(|| {
            ConsoleError::Invalid(format!(
                "`step` is a duration of whole seconds (`60s`), not {:?}",
                t(text)
            ))
        })?;
    if span_ms / step + 1 > Prometheus::MAX_POINTS {
        return Err(ConsoleError::Invalid(format!(
            "`step` {}s over this range is more than {} points per series (Prometheus's limit): \
             a longer step or a shorter range",
            step / 1000,
            Prometheus::MAX_POINTS
        )));
    }
    Ok(step)
}

/// The report as a page: the summary, the charts (the command's SVG), the sections as tables,
/// and the accounting's lines.
fn render(v: &Visitor, r: &Report, charts: &Charts, parts: &Parts<'_>) -> Markup {
    let title = format!("Incident report: {}", t(&r.dependency));
    layout(
        &title,
        Some(v),
        html! {
            p {
                a href={ "/dependency/" (path_segment(&r.dependency)) } { "the dependency's page" }
                " · "
                a href={ "/audit?dependency=" (path_segment(&r.dependency)) } { "its audit trail" }
            }
            ul #summary {
                @for line in r.summary() {
                    li { (t(&line)) }
                }
            }
            @match charts {
                Charts::NoPrometheus => p #charts-need-prometheus {
                    "The per-minute charts need Prometheus: start the console with "
                    code { "--prometheus-url" } "."
                },
                Charts::Failed(e) => p #charts-failed {
                    "The per-minute charts could not be read from Prometheus: " (t(e))
                },
                Charts::Read => @for (name, chart) in r.charts() {
                    // The library's SVG: every text in it escaped there.
                    figure id={ "chart-" (name) } { (PreEscaped(chart.svg())) }
                },
            }
            @for (i, (heading, rows)) in r.sections().into_iter().enumerate() {
                h2 { (heading) }
                @if rows.len() <= 1 {
                    p { "(none)" }
                } @else {
                    @let (header, body) = rows.split_at(1);
                    @let shown = parts.of(body.len());
                    @if shown.len() < body.len() {
                        p.note id={ "section-" (i) "-part" } {
                            "Rows " (shown.start + 1) "–" (shown.end) " of " (body.len())
                            " (" (ROWS_SHOWN) " a part; "
                            code { "budgetctl incident report" } " prints them all): "
                            @if parts.part > 0 {
                                a href=(parts.href(parts.part - 1)) { "‹ the previous part" }
                                " "
                            }
                            @if shown.end < body.len() {
                                a href=(parts.href(parts.part + 1)) { "the next part ›" }
                            }
                        }
                    }
                    table id={ "section-" (i) } {
                        @for row in header {
                            tr { @for c in row { th { (t(c)) } } }
                        }
                        @for row in body.get(shown).unwrap_or_default() {
                            tr { @for c in row { td { (t(c)) } } }
                        }
                    }
                }
            }
            h3 { "The accounting, line by line" }
            ul #accounting-lines {
                @for line in r.accounting.lines() {
                    li { (t(&line)) }
                }
            }
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_a_duration_ago_or_a_time_and_anything_else_is_refused() {
        let now = 1_796_604_919_000;
        assert_eq!(when("since", "2h", now).unwrap(), now - 7_200_000);
        assert_eq!(
            when("since", "2026-12-07T00:55:19Z", now).unwrap(),
            1_796_604_919_000
        );
        assert!(matches!(
            when("since", "yesterday<b>", now),
            Err(ConsoleError::Invalid(_))
        ));
    }

    #[test]
    fn a_query_needs_a_dependency_and_a_range_of_at_most_14_days_before_its_end() {
        let now = 1_796_604_919_000;
        let q = |dependency: &str, since: &str, until: &str| IncidentQuery {
            dependency: Some(dependency.to_owned()),
            since: Some(since.to_owned()),
            until: Some(until.to_owned()),
            step: None,
            part: None,
        };
        let asked = q(" search ", "2h", "").asked(now).unwrap();
        assert_eq!(asked.dependency.as_str(), "search");
        assert_eq!((asked.since_ms, asked.until_ms), (now - 7_200_000, now));
        assert_eq!(asked.step_ms, 60_000);
        assert!(matches!(
            q("", "2h", "").asked(now),
            Err(ConsoleError::BadRequest(_))
        ));
        assert!(matches!(
            q("search", "1h", "2h").asked(now),
            Err(ConsoleError::Invalid(_))
        ));
        assert!(matches!(
            q("search", "15d", "").asked(now),
            Err(ConsoleError::Invalid(_))
        ));
    }

    #[test]
    fn a_step_is_whole_seconds_within_prometheus_points_per_series() {
        assert_eq!(step("2s", 3_600_000).unwrap(), 2000);
        for bad in ["0s", "1500ms", "soon", "1s"] {
            assert!(
                matches!(
                    step(bad, 14 * 24 * 3_600_000),
                    Err(ConsoleError::Invalid(_))
                ),
                "{bad}"
            );
        }
    }
}
