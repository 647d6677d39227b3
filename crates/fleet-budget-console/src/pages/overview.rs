//! The overview: one row per dependency, worst first, a page at a time: its budget, overrides,
//! breaker, calls in flight, a sparkline of its last hour and its worst alert, as the library's
//! read model gives them (`crate::fleet`). The live refresh swaps in the same rows rendered here
//! ([`overview_fragment`]); the browser renders nothing of its own.

use std::sync::Arc;
use std::time::Duration;

use maud::{Markup, html};

use super::time::{ago, ago_at, span};
use super::{PER_PAGE, count, layout, page_of, pager, path_segment, query, short, short_at};
use crate::access::Visitor;
use crate::dead_letters::Sample;
use crate::fleet::{
    DependencyRow, HOUR_POINTS, History, Overview, Point, ShadowCount, Sparks, Unusable,
    WORKERS_READ,
};

/// One page of the overview: the rows shown and each one's last hour.
#[derive(Debug)]
pub(crate) struct OverviewPage {
    /// The console's last reading of the fleet.
    pub(crate) overview: Arc<Overview>,
    /// How often the console reads the fleet.
    pub(crate) read_every: Duration,
    /// The page shown (1-based) and the offset of its first row.
    pub(crate) page: usize,
    pub(crate) offset: usize,
    /// The last hour of each row shown, in the rows' order.
    pub(crate) hours: Vec<Vec<Point>>,
    /// What each row shown would have dead-lettered in the last hour, in shadow.
    pub(crate) shadow: Vec<Option<ShadowCount>>,
    /// Where the sparklines come from.
    pub(crate) spark_source: SparkSource,
}

/// Where the overview's sparklines come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SparkSource {
    /// The console's own readings (no Prometheus configured).
    Own,
    /// Prometheus (its URL, redacted), read at that time.
    Prometheus { from: String, read_at_ms: u64 },
    /// The console's own readings because Prometheus failed (its URL, and why).
    OwnInstead { from: String, error: String },
}

impl OverviewPage {
    /// The page `asked` of `overview` (clamped to the pages there are), with each shown row's
    /// last hour from `history`.
    pub(crate) fn new(
        overview: Arc<Overview>,
        asked: Option<&str>,
        history: &History,
        read_every: Duration,
        sparks: Option<&Sparks>,
    ) -> Self {
        let (offset, page) = page_of(asked, overview.dependencies.len());
        let spark_source = match sparks {
            None => SparkSource::Own,
            Some(s) => match &s.error {
                None => SparkSource::Prometheus {
                    from: s.from.clone(),
                    read_at_ms: s.read_at_ms,
                },
                Some(e) => SparkSource::OwnInstead {
                    from: s.from.clone(),
                    error: e.clone(),
                },
            },
        };
        let hours = overview
            .dependencies
            .iter()
            .skip(offset)
            .take(PER_PAGE)
            .map(|r| match (&spark_source, sparks) {
                (SparkSource::Prometheus { .. }, Some(s)) => {
                    s.hours.get(&r.dependency).cloned().unwrap_or_default()
                }
                _ => history.hour_of(&r.dependency),
            })
            .collect();
        let shadow = overview
            .dependencies
            .iter()
            .skip(offset)
            .take(PER_PAGE)
            .map(|r| history.shadow_hour(&r.dependency, r.now_ms))
            .collect();
        Self {
            shadow,
            spark_source,
            overview,
            read_every,
            page,
            offset,
            hours,
        }
    }

    fn rows(&self) -> impl Iterator<Item = (&DependencyRow, &[Point], Option<ShadowCount>)> {
        self.overview
            .dependencies
            .iter()
            .skip(self.offset)
            .take(PER_PAGE)
            .zip(
                self.hours
                    .iter()
                    .map(Vec::as_slice)
                    .chain(std::iter::repeat(&[][..])),
            )
            .zip(self.shadow.iter().copied().chain(std::iter::repeat(None)))
            .map(|((r, hour), shadow)| (r, hour, shadow))
    }
}

/// Width and height of a sparkline, in px.
const SPARK_W: u32 = 120;
const SPARK_H: u32 = 24;

/// The last hour of a dependency as a small inline SVG drawn by the server: amplification (a
/// line, from 1x at the bottom; the alert threshold dashed) and denials (a line on a scale of
/// their own, red), one point a minute.
pub(super) fn sparkline(points: &[Point], from_prometheus: bool) -> Markup {
    if points.len() < 2 {
        return html! { span.note { @if from_prometheus { "no series" } @else { "collecting" } } };
    }
    let threshold = fleet_budget::view::AMPLIFICATION_ALERT;
    let top_amp = points
        .iter()
        .filter_map(|p| p.amplification)
        .fold(threshold + 0.5, f64::max);
    let top_denied = points.iter().map(|p| p.denied).max().unwrap_or(0).max(1);
    let (w, h) = (f64::from(SPARK_W), f64::from(SPARK_H) - 2.0);
    #[allow(clippy::cast_precision_loss)]
    let x = |i: usize| i as f64 * w / (points.len() - 1) as f64;
    let y_amp = |a: f64| 1.0 + h - (a - 1.0).clamp(0.0, top_amp - 1.0) * h / (top_amp - 1.0);
    #[allow(clippy::cast_precision_loss)]
    let y_denied = |d: u64| 1.0 + h - d as f64 * h / top_denied as f64;
    let line = |y: &dyn Fn(&Point) -> f64| -> String {
        points
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{:.0},{:.0}", x(i), y(p)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let amps = line(&|p| y_amp(p.amplification.unwrap_or(1.0)));
    let denials = line(&|p| y_denied(p.denied));
    let worst_amp = points
        .iter()
        .filter_map(|p| p.amplification)
        .fold(1.0, f64::max);
    let worst_denied = points.iter().map(|p| p.denied).max().unwrap_or(0);
    let minutes = points
        .last()
        .map_or(0, |l| l.at_ms)
        .saturating_sub(points.first().map_or(0, |f| f.at_ms))
        / 60_000;
    let per = if from_prometheus {
        "a step (Prometheus)"
    } else {
        "a window"
    };
    let label = format!(
        "last {minutes} min: amplification up to {worst_amp:.2}x, up to {worst_denied} denied in {per}"
    );
    html! {
        svg.spark viewBox={ "0 0 " (SPARK_W) " " (SPARK_H) } width=(SPARK_W) height=(SPARK_H) role="img" aria-label=(label) {
            title { (label) }
            line x1="0" x2=(SPARK_W) y1=(format!("{:.0}", y_amp(threshold))) y2=(format!("{:.0}", y_amp(threshold))) stroke="#8c959f" stroke-dasharray="2 2" stroke-width="1" {}
            polyline.denied points=(denials) fill="none" stroke="#cf222e" stroke-width="1" {}
            polyline.amplification points=(amps) fill="none" stroke="#0969da" stroke-width="1.5" {}
        }
    }
}

/// A time `secs` from the reading of `r` (server time), as "in 3 min" with the exact UTC time
/// on hover.
fn from_reading(r: &DependencyRow, secs: f64) -> Markup {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let ms = (secs.max(0.0) * 1000.0) as u64;
    ago_at(Some(r.now_ms.saturating_add(ms)), r.now_ms)
}

pub(super) fn overrides_cell(r: &DependencyRow) -> Markup {
    html! {
        @if let Some(f) = &r.frozen {
            span.frozen { "FROZEN by " (short(&f.actor)) " (" (short(&f.reason)) "), ends " (ago_at(Some(f.until_ms), r.now_ms)) } br;
        }
        @if let Some(s) = &r.set {
            span { (s.what) " by " (short(&s.actor)) " (" (short(&s.reason)) "), ends " (ago_at(Some(s.until_ms), r.now_ms)) }
        }
    }
}

pub(super) fn breaker_cell(r: &DependencyRow) -> Markup {
    match &r.breaker {
        None => html! { "-" },
        Some(b) if b.state == "open" => {
            html! { "open, half-opens " (from_reading(r, b.half_opens_in_secs)) }
        }
        Some(b) if b.state == "half_open" => html! {
            "half-open, " (b.probe_successes) " of " (b.probes_issued) " probes ok"
        },
        Some(b) => html! { (format!("closed ({:.0}/{:.0} failed)", b.failures, b.calls)) },
    }
}

/// Shadow or enforcement, for a cell: "shadow" with what enforcement would have
/// dead-lettered (counted by the console over the last hour when it can, else the budget's
/// window), and who switched it until when.
pub(super) fn enforcement_cell(r: &DependencyRow, hour: Option<ShadowCount>) -> Markup {
    html! {
        @if r.enforcement == "shadow" {
            span.shadow data-enforcement="shadow" { "shadow" } ": " span.would-deny { (would_deny_text(r, hour)) }
        } @else {
            span data-enforcement="enforce" { "enforce" }
        }
        @if let Some(s) = &r.enforcement_switch {
            br; small.switch { "switched by " (short(&s.actor)) " (" (short(&s.reason)) ") " (ago_at(Some(s.since_ms), r.now_ms))
                @if let Some(secs) = s.expires_in_secs { ", ends " (from_reading(r, secs)) } @else { ", until switched back" } }
        }
    }
}

/// "would have dead-lettered N jobs in the last hour": from the console's own count over the
/// windows it read in the last hour ([`ShadowCount`]), saying how far back that reaches when it
/// is less than an hour; without one, the library's `would_deny`, over the budget's window.
pub(super) fn would_deny_text(r: &DependencyRow, hour: Option<ShadowCount>) -> String {
    let jobs = |n: u64| {
        if n == 1 {
            "1 job".to_owned()
        } else {
            format!("{} jobs", count(n))
        }
    };
    match hour {
        Some(h) if h.covers_ms >= 3_600_000 - h.window_ms => format!(
            "would have dead-lettered {} in the last hour",
            jobs(h.denied)
        ),
        Some(h) => format!(
            "would have dead-lettered {} in the last {} (counted by the console since it saw the switch)",
            jobs(h.denied),
            span(Duration::from_millis(h.covers_ms.max(1000)))
        ),
        None => format!(
            "would have dead-lettered {} in the last {} (the budget's window)",
            jobs(r.would_deny),
            span(Duration::from_secs_f64(r.window_secs.max(0.0)))
        ),
    }
}

fn overview_rows(p: &OverviewPage) -> Markup {
    let from_prometheus = matches!(p.spark_source, SparkSource::Prometheus { .. });
    html! {
        tbody #overview-rows {
            @for (r, hour, shadow) in p.rows() {
                tr data-severity=(r.severity) {
                    td { a href={ "/dependency/" (path_segment(&r.dependency)) } { (r.dependency) } }
                    td.num { (r.allowance) }
                    td.num { (r.spent) }
                    td.num { (r.remaining) }
                    td.num { (format!("{:.2}", r.denials_per_sec)) }
                    td.num { (r.amplification.map_or_else(|| "-".to_owned(), |a| format!("{a:.2}x"))) }
                    td.spark { (sparkline(hour, from_prometheus)) }
                    td { (breaker_cell(r)) }
                    td.num { (r.concurrency.map_or_else(|| "-".to_owned(), |c| format!("{}/{}", c.in_flight, c.cap))) }
                    td.num.fallback { (r.workers_in_fallback.map_or_else(|| "-".to_owned(), |n| n.to_string())) }
                    td { (overrides_cell(r)) }
                    td.enforcement { (enforcement_cell(r, shadow)) }
                    td.alert { (r.alert) }
                }
            }
        }
    }
}

/// The page's pager (`id` `overview-pager`).
fn overview_pager(p: &OverviewPage) -> Markup {
    let total = p.overview.dependencies.len();
    pager("overview-pager", p.page, total, "dependencies", &|n| {
        format!("/?{}", query(&[("page", Some(&n.to_string()))]))
    })
}

/// What the live refresh swaps in, each part by its id: the rows, the pager and the workers'
/// line, rendered as on the page.
pub(crate) fn overview_fragment(p: &OverviewPage) -> Markup {
    html! {
        table { (overview_rows(p)) }
        (overview_pager(p))
        span #workers-line { (workers_line(&p.overview)) }
        (reading_age(p))
    }
}

/// Where the sparklines come from (`id` `spark-source`, `data-source` `own` or `prometheus`).
fn spark_note(p: &OverviewPage) -> Markup {
    html! {
        @match &p.spark_source {
            SparkSource::Own => p.note #spark-source data-source="own" { "The last hour: the console's own readings, one point a minute since it started (no Prometheus configured)." },
            SparkSource::Prometheus { from, read_at_ms } => p.note #spark-source data-source="prometheus" {
                "The last hour: from Prometheus at " code { (from) } ", one point a step, read " (ago(Some(*read_at_ms))) "."
            },
            SparkSource::OwnInstead { from, error } => p.note #spark-source data-source="own" {
                "The last hour: the console's own readings, because Prometheus at " code { (from) } " failed: " (short_at(error, 1024))
            },
        }
    }
}

/// How old the reading shown is (`id` `reading-age`): "read 3 s ago in 120 ms", the exact
/// time on hover, and how often the console reads.
fn reading_age(p: &OverviewPage) -> Markup {
    let ov = &p.overview;
    html! {
        span #reading-age data-read-at-ms=(ov.read_at_ms) {
            "Read " (ago(Some(ov.read_at_ms))) " (in " (count(ov.read_took_ms)) " ms); the console reads every dependency every " (span(p.read_every)) " and the page shows its last reading."
        }
    }
}

/// The fleet as its workers report it (the worker registry), in one sentence.
pub(super) fn workers_line(ov: &Overview) -> String {
    match (&ov.workers, &ov.workers_error) {
        (Some(w), _) => {
            let mut line = format!(
                "{} workers reporting, {} in fallback, {} silent: a silent worker may be cut off \
                 from Redis and deciding from its fallback, or stopped.",
                w.reporting, w.in_fallback, w.silent
            );
            if w.unreadable > 0 {
                line.push_str(&format!(" {} registry entries unreadable.", w.unreadable));
            }
            if w.truncated {
                line.push_str(&format!(
                    " Counted over the {WORKERS_READ} seen last of {} entries.",
                    w.total
                ));
            }
            line
        }
        (None, Some(e)) => format!("Worker registry unreadable: {e}."),
        (None, None) => "Worker registry not read.".to_owned(),
    }
}

/// Dead letters and parked messages per dependency, from each queue's dead-letter index (read
/// in the background every refresh, no message read), each linked to its queue's page filtered
/// to it, and labelled exact or an estimate as the queue's counts are.
pub(super) fn dead_letter_counts(samples: [&Sample; 2]) -> Markup {
    let [dead, parked] = samples;
    let mut by: std::collections::BTreeMap<String, (u64, u64)> = std::collections::BTreeMap::new();
    for (d, n) in dead.per_dependency() {
        by.entry(d).or_default().0 += n;
    }
    for (d, n) in parked.per_dependency() {
        by.entry(d).or_default().1 += n;
    }
    let mut rows: Vec<(String, u64, u64)> = by.into_iter().map(|(d, (a, b))| (d, a, b)).collect();
    rows.sort_by(|a, b| (b.1 + b.2).cmp(&(a.1 + a.2)).then_with(|| a.0.cmp(&b.0)));
    let total = rows.len();
    let label = |s: &Sample| -> (&'static str, String) {
        match &s.counts {
            None => ("unknown", "not read yet".to_owned()),
            Some(c) if c.exact() => ("exact", format!("exact: {} in the queue", count(c.depth))),
            Some(c) => (
                "estimate",
                format!(
                    "estimate: {} in the queue, {} counted",
                    count(c.depth),
                    count(c.indexed())
                ),
            ),
        }
    };
    let (dead_kind, dead_words) = label(dead);
    let (parked_kind, parked_words) = label(parked);
    let link = |which: &str, d: &str| {
        format!(
            "/dead-letters?{}",
            query(&[("queue", Some(which)), ("dependency", Some(d))])
        )
    };
    html! {
        h2 { "Dead letters per dependency" }
        table #dead-letter-counts {
            thead { tr {
                th { "dependency" }
                th { "dead letters " small data-kind=(dead_kind) #dead-counts-kind { "(" (dead_words) ")" } }
                th { "parked " small data-kind=(parked_kind) #parked-counts-kind { "(" (parked_words) ")" } }
            } }
            tbody {
                @for (d, n, p) in rows.iter().take(PER_PAGE) {
                    tr {
                        td.cut { (short(if d.is_empty() { "(unknown)" } else { d })) }
                        td.num { a href=(link("dead", d)) { (count(*n)) } }
                        td.num { a href=(link("parked", d)) { (count(*p)) } }
                    }
                }
            }
        }
        @if total > PER_PAGE { p.note { "The " (PER_PAGE) " dependencies with most messages of " (count(total as u64)) "; " a href="/dead-letters?sort=name" { "all groups" } "." } }
        @if total == 0 && dead.counts.is_some() { p.note #no-dead-letters { "No dead letter and no parked message counted." } }
        @if dead.counts.is_none() { p.note { "The dead-letter counts are being read (a new console reads them within seconds; with no dead-letter queue, run " code { "budgetctl migrate" } " first)." } }
    }
}

/// The keys that cannot be used, the first [`PER_PAGE`] (each linked to its dependency's page),
/// and how many more: a Redis holding thousands of keys of another type under the prefix would
/// otherwise make the overview as long.
fn unusable_list(unusable: &[Unusable]) -> Markup {
    html! {
        @if !unusable.is_empty() {
            h2 { "Unusable keys" }
            ul #unusable {
                @for u in unusable.iter().take(PER_PAGE) {
                    li { a href={ "/dependency/" (path_segment(&u.dependency)) } { (short(&u.dependency)) } ": " (short_at(&u.error, 1024)) }
                }
            }
            @if unusable.len() > PER_PAGE {
                p.note #unusable-more { "The first " (PER_PAGE) " of " (count(unusable.len() as u64)) " unusable keys; " code { "budgetctl status --json" } " lists them all." }
            }
        }
    }
}

/// The fleet overview, one page of it.
pub(crate) fn overview(v: &Visitor, p: &OverviewPage, samples: [&Sample; 2]) -> Markup {
    let ov = &p.overview;
    let source = format!(
        "/fragments/overview?{}",
        query(&[("page", Some(&p.page.to_string()))])
    );
    layout(
        "Overview",
        Some(v),
        html! {
            p { "Every dependency under key prefix " code { (ov.key_prefix) } ", worst first. "
                (reading_age(p)) " " span #refreshed { "This page refreshes every 2 s." } }
            p { span #workers-line { (workers_line(ov)) } " " a href="/workers" { "Workers" } }
            table #overview data-source=(source) {
                thead { tr {
                    th { "dependency" } th { "allowance" } th { "spent" } th { "remaining" }
                    th { "denials/s" } th { "amplification" }
                    th title={ "amplification (blue, dashed at the alert threshold) and denials (red), one point a minute over the last " (HOUR_POINTS) " minutes" } { "last hour" }
                    th { "breaker" } th { "in flight/cap" }
                    th { "workers in fallback" } th { "overrides" } th { "enforcement" } th { "alert" }
                } }
                (overview_rows(p))
            }
            (overview_pager(p))
            (spark_note(p))
            (dead_letter_counts(samples))
            (unusable_list(&ov.unusable))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::{breaker_cell, enforcement_cell, overrides_cell, unusable_list};
    use crate::fleet::Unusable;
    use crate::fleet::tests::reading;
    use crate::fleet::{BreakerView, OverrideView, SwitchView};

    #[test]
    fn times_on_a_row_read_as_words_with_the_exact_time_on_hover() {
        let mut r = reading("search", true, 100, 0, [0, 0]);
        let now = r.now_ms;
        r.enforcement_switch = Some(SwitchView {
            enforcement: "shadow",
            actor: "ann".to_owned(),
            reason: "INC-12".to_owned(),
            expires_in_secs: Some(2_700.0),
            since_ms: now - 180_000,
        });
        r.frozen = Some(OverrideView {
            what: "freeze".to_owned(),
            actor: "bob".to_owned(),
            reason: "INC-13".to_owned(),
            expires_in_secs: 1_500.0,
            until_ms: now + 1_500_000,
        });
        r.breaker = Some(BreakerView {
            state: "open",
            half_opens_in_secs: 40.0,
            probes_issued: 0,
            probe_successes: 0,
            times_opened: 1,
            failures: 0.0,
            calls: 0.0,
        });
        let switch = enforcement_cell(&r, None).into_string();
        assert!(
            switch.contains("switched by ann (INC-12) <time"),
            "{switch}"
        );
        assert!(switch.contains(">3 min ago</time>"), "{switch}");
        assert!(switch.contains(", ends <time"), "{switch}");
        assert!(switch.contains(">in 45 min</time>"), "{switch}");
        let frozen = overrides_cell(&r).into_string();
        assert!(frozen.contains(">in 25 min</time>"), "{frozen}");
        let breaker = breaker_cell(&r).into_string();
        assert!(breaker.contains("half-opens <time"), "{breaker}");
        assert!(breaker.contains(">in 40 s</time>"), "{breaker}");
        for cell in [switch, frozen, breaker] {
            assert!(cell.contains(" UTC\">"), "the exact time on hover: {cell}");
            assert!(!cell.contains("secs"), "no raw seconds: {cell}");
        }
    }

    #[test]
    fn a_long_list_of_unusable_keys_shows_the_first_page_and_counts_the_rest() {
        let keys: Vec<Unusable> = (0..60)
            .map(|i| Unusable {
                dependency: format!("d{i}"),
                error: format!("key p:v1:{{d{i}}}: is not a budget hash"),
            })
            .collect();
        let shown = unusable_list(&keys).into_string();
        assert_eq!(shown.matches("<li>").count(), 50, "{shown}");
        assert!(shown.contains("href=\"/dependency/d49\""), "{shown}");
        assert!(!shown.contains("href=\"/dependency/d50\""), "{shown}");
        assert!(
            shown.contains("The first 50 of 60 unusable keys"),
            "{shown}"
        );
        let few = unusable_list(&keys[..2]).into_string();
        assert_eq!(few.matches("<li>").count(), 2);
        assert!(!few.contains("unusable-more"));
        assert_eq!(unusable_list(&[]).into_string(), "");
    }
}
