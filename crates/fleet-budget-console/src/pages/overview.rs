//! The overview: one row per dependency, worst first, a page at a time: its budget, overrides,
//! breaker, calls in flight, a sparkline of its last hour and its worst alert, as the library's
//! read model gives them (`crate::fleet`). The live refresh swaps in the same rows rendered here
//! ([`overview_fragment`]); the browser renders nothing of its own.

use maud::{Markup, html};

use super::{PER_PAGE, count, layout, page_of, pager, path_segment, query, short, short_at};
use crate::access::Visitor;
use crate::dead_letters::Sample;
use crate::fleet::{DependencyRow, HOUR_POINTS, History, Overview, Point, WORKERS_READ};

/// One page of the overview: the rows shown and each one's last hour.
#[derive(Debug)]
pub(crate) struct OverviewPage {
    pub(crate) overview: Overview,
    /// The page shown (1-based) and the offset of its first row.
    pub(crate) page: usize,
    pub(crate) offset: usize,
    /// The last hour of each row shown, in the rows' order.
    pub(crate) hours: Vec<Vec<Point>>,
}

impl OverviewPage {
    /// The page `asked` of `overview` (clamped to the pages there are), with each shown row's
    /// last hour from `history`.
    pub(crate) fn new(overview: Overview, asked: Option<&str>, history: &History) -> Self {
        let (offset, page) = page_of(asked, overview.dependencies.len());
        let hours = overview
            .dependencies
            .iter()
            .skip(offset)
            .take(PER_PAGE)
            .map(|r| history.hour_of(&r.dependency))
            .collect();
        Self {
            overview,
            page,
            offset,
            hours,
        }
    }

    fn rows(&self) -> impl Iterator<Item = (&DependencyRow, &[Point])> {
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
    }
}

/// Width and height of a sparkline, in px.
const SPARK_W: u32 = 120;
const SPARK_H: u32 = 24;

/// The last hour of a dependency as a small inline SVG drawn by the server: amplification (a
/// line, from 1x at the bottom; the alert threshold dashed) and denials (a line on a scale of
/// their own, red), one point a minute.
pub(super) fn sparkline(points: &[Point]) -> Markup {
    if points.len() < 2 {
        return html! { span.note { "collecting" } };
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
    let label = format!(
        "last {minutes} min: amplification up to {worst_amp:.2}x, up to {worst_denied} denied in a window"
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

pub(super) fn overrides_cell(r: &DependencyRow) -> Markup {
    html! {
        @if let Some(f) = &r.frozen {
            span.frozen { "FROZEN by " (short(&f.actor)) " (" (short(&f.reason)) "), " (format!("{:.0}s", f.expires_in_secs)) " left" } br;
        }
        @if let Some(s) = &r.set {
            span { (s.what) " by " (short(&s.actor)) " (" (short(&s.reason)) "), " (format!("{:.0}s", s.expires_in_secs)) " left" }
        }
    }
}

pub(super) fn breaker_cell(r: &DependencyRow) -> String {
    match &r.breaker {
        None => "-".to_owned(),
        Some(b) if b.state == "open" => format!("open, half-opens in {:.0}s", b.half_opens_in_secs),
        Some(b) if b.state == "half_open" => format!(
            "half-open, {} of {} probes ok",
            b.probe_successes, b.probes_issued
        ),
        Some(b) => format!("closed ({:.0}/{:.0} failed)", b.failures, b.calls),
    }
}

fn overview_rows(p: &OverviewPage) -> Markup {
    html! {
        tbody #overview-rows {
            @for (r, hour) in p.rows() {
                tr data-severity=(r.severity) {
                    td { a href={ "/dependency/" (path_segment(&r.dependency)) } { (r.dependency) } }
                    td.num { (r.allowance) }
                    td.num { (r.spent) }
                    td.num { (r.remaining) }
                    td.num { (format!("{:.2}", r.denials_per_sec)) }
                    td.num { (r.amplification.map_or_else(|| "-".to_owned(), |a| format!("{a:.2}x"))) }
                    td.spark { (sparkline(hour)) }
                    td { (breaker_cell(r)) }
                    td.num { (r.concurrency.map_or_else(|| "-".to_owned(), |c| format!("{}/{}", c.in_flight, c.cap))) }
                    td.num.fallback { (r.workers_in_fallback.map_or_else(|| "-".to_owned(), |n| n.to_string())) }
                    td { (overrides_cell(r)) }
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
    }
}

/// The fleet as its workers report it (the worker registry), in one sentence.
pub(crate) fn workers_line(ov: &Overview) -> String {
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
            p { "Every dependency under key prefix " code { (ov.key_prefix) } ", worst first. Refreshed every 2 s; "
                span #refreshed { "read when the page loaded" } "." }
            p { span #workers-line { (workers_line(ov)) } " " a href="/workers" { "Workers" } }
            table #overview data-source=(source) {
                thead { tr {
                    th { "dependency" } th { "allowance" } th { "spent" } th { "remaining" }
                    th { "denials/s" } th { "amplification" }
                    th title={ "amplification (blue, dashed at the alert threshold) and denials (red), one point a minute over the last " (HOUR_POINTS) " minutes" } { "last hour" }
                    th { "breaker" } th { "in flight/cap" }
                    th { "workers in fallback" } th { "overrides" } th { "alert" }
                } }
                (overview_rows(p))
            }
            (overview_pager(p))
            (dead_letter_counts(samples))
            @if !ov.unusable.is_empty() {
                h2 { "Unusable keys" }
                ul { @for u in &ov.unusable { li { (short(&u.dependency)) ": " (short_at(&u.error, 1024)) } } }
            }
        },
    )
}
