//! One dependency's page: its figures, their history as a chart, its overrides and its audit
//! trail.

use std::time::Duration;

use fleet_budget::Dependency;
use fleet_budget::control::AuditEntry;
use maud::{Markup, html};

use super::audit::audit_table;
use super::overview::{breaker_cell, enforcement_cell, overrides_cell, sparkline};
use super::time::{ago, span};
use super::{count, csrf_input, is_operator, layout, path_segment, short_at, t};
use crate::access::Visitor;
use crate::fleet::{DependencyRow, HISTORY_POINTS, Point, ShadowCount};

/// The dependency's figures as its page shows them, and where they come from.
#[derive(Debug)]
pub(crate) struct Shown {
    /// Its row; `None`: no budget key (or an unusable one).
    pub(crate) row: Option<DependencyRow>,
    /// Why its key cannot be read, when it cannot.
    pub(crate) unusable: Option<String>,
    /// The console's clock (Unix ms) when it was read.
    pub(crate) read_at_ms: u64,
    /// How often the console reads the fleet, when the row is from that reading (what the
    /// overview shows); `None`: read for this page (a dependency the last reading did not
    /// have).
    pub(crate) read_every: Option<Duration>,
}

/// What the dependency page shows of the console's history: the recent readings, those of the
/// last hour, and what it would have dead-lettered in shadow over that hour.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    pub(crate) history: Vec<Point>,
    pub(crate) hour: Vec<Point>,
    pub(crate) shadow: Option<ShadowCount>,
}

/// A small chart of the history: retries granted (line) against the allowance (dashed), and
/// denials (bars), drawn by the server as SVG.
pub(super) fn chart(points: &[Point]) -> Markup {
    const W: f64 = 600.0;
    const H: f64 = 120.0;
    if points.len() < 2 {
        return html! { p.note { "The chart needs two readings; the console reads every few seconds." } };
    }
    let top = points
        .iter()
        .map(|p| p.allowance.max(p.spent).max(p.denied))
        .max()
        .unwrap_or(1)
        .max(1);
    #[allow(clippy::cast_precision_loss)]
    let (x, y) = (
        |i: usize| i as f64 * W / (points.len() - 1) as f64,
        |v: u64| H - v as f64 * (H - 4.0) / top as f64,
    );
    let line = |f: fn(&Point) -> u64| -> String {
        points
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{:.1},{:.1}", x(i), y(f(p))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let covers = Duration::from_millis(
        points
            .last()
            .map_or(0, |l| l.at_ms)
            .saturating_sub(points.first().map_or(0, |f| f.at_ms)),
    );
    html! {
        svg.chart viewBox={ "0 0 " (W) " " (H) } width="600" height="120" role="img" aria-label="retries granted against the allowance" {
            @for (i, p) in points.iter().enumerate() {
                @if p.denied > 0 {
                    rect.denied x=(format!("{:.1}", x(i) - 2.0)) y=(format!("{:.1}", y(p.denied))) width="4" height=(format!("{:.1}", H - y(p.denied))) {}
                }
            }
            polyline.allowance points=(line(|p| p.allowance)) {}
            polyline.spent points=(line(|p| p.spent)) {}
        }
        p.note.chart-note { "Last " (points.len()) " readings (up to " (HISTORY_POINTS) ", over " (span(covers)) "): "
            span.spent-key { "retries granted" } ", " span.allowance-key { "allowance" } ", "
            span.denied-key { "denials" } "; scale 0 to " (top) "." }
    }
}

/// One dependency's page.
pub(crate) fn dependency(
    v: &Visitor,
    dep: &Dependency,
    shown: &Shown,
    kept: &Kept,
    trail: &[AuditEntry],
    searched: Option<usize>,
) -> Markup {
    let (history, hour) = (kept.history.as_slice(), kept.hour.as_slice());
    let name = t(dep.as_str());
    let action = format!("/dependency/{}", path_segment(dep.as_str()));
    layout(
        &name,
        Some(v),
        html! {
            p.note #read-at data-read-at-ms=(shown.read_at_ms) {
                "Read " (ago(Some(shown.read_at_ms)))
                @match shown.read_every {
                    Some(every) => { ": the console's reading of the fleet, every " (span(every)) " and after each operator's change (as the overview); reload for the next." }
                    None => { " for this page (the console's last reading of the fleet did not have it)." }
                }
            }
            @if let Some(r) = &shown.row {
                table.facts {
                    tr { th { "alert" } td #alert { (r.alert) } }
                    @if r.alerts.len() > 1 {
                        tr { th { "also" } td #more-alerts { @for a in r.alerts.iter().skip(1) { (a.text) br; } } }
                    }
                    tr { th { "allowance / spent / remaining" } td { (r.allowance) " / " (r.spent) " / " (r.remaining) } }
                    tr { th { "denied in the window" } td { (r.denied) " (" (format!("{:.2}", r.denials_per_sec)) "/s)" } }
                    tr { th { "amplification" } td { (r.amplification.map_or_else(|| "-".to_owned(), |a| format!("{a:.2}x"))) } }
                    tr { th { "policy in force" } td { (r.policy) } }
                    tr { th { "conflict" } td { (short_at(r.conflict.as_deref().unwrap_or("none"), 1024)) } }
                    tr { th { "overrides" } td #overrides { (overrides_cell(r)) @if r.frozen.is_none() && r.set.is_none() { "none" } } }
                    tr { th { "breaker" } td { (breaker_cell(r)) @if let Some(b) = &r.breaker { ", opened " (b.times_opened) " times" } } }
                    tr { th { "in flight / cap" } td { (r.concurrency.map_or_else(|| "no concurrency budget".to_owned(), |c| format!("{}/{}", c.in_flight, c.cap))) } }
                    tr { th { "enforcement" } td #enforcement data-enforcement=(r.enforcement) { (enforcement_cell(r, kept.shadow)) } }
                    tr { th { "workers in fallback" } td #workers-in-fallback {
                        (r.workers_in_fallback.map_or_else(|| "unknown (the worker registry could not be read)".to_owned(), |n| n.to_string()))
                        " (" a href="/workers" { "every worker" } ")"
                    } }
                }
                h2 { "Recent history" }
                (chart(history))
                h3 { "The last hour" }
                p { (sparkline(hour, false)) " amplification (blue; dashed: the alert threshold) and denials (red), one point a minute" }
                h3 { "The two windows Redis holds" }
                table {
                    thead { tr { th { "window" } th { "retries granted" } th { "denied" } th { "first attempts" } } }
                    tbody {
                        tr { td { "previous" } @for n in r.windows[0] { td.num { (n) } } }
                        tr { td { "current" } @for n in r.windows[1] { td.num { (n) } } }
                    }
                }
            } @else if let Some(e) = &shown.unusable {
                p.error #unusable { "Its budget key cannot be used: " (short_at(e, 1024)) }
            } @else {
                p { "No budget key for this dependency yet." }
            }
            @if is_operator(v) {
                h2 { "Shadow or enforcement" }
                @let shadow_now = shown.row.as_ref().is_some_and(|r| r.enforcement == "shadow");
                form.action #enforcement-form method="post" action={ (action) "/enforcement" } {
                    (csrf_input(v))
                    @if shadow_now {
                        input type="hidden" name="enforcement" value="enforce";
                    } @else {
                        input type="hidden" name="enforcement" value="shadow";
                    }
                    label { "For (minutes, empty: until switched back) " input type="number" name="minutes" min="1"; }
                    label { " because " input type="text" name="reason" maxlength="1000" required; }
                    @if shadow_now {
                        button type="submit" #switch-enforce { "Enforce again" }
                    } @else {
                        button type="submit" #switch-shadow { "Switch to shadow" }
                    }
                }
                p.note { "In shadow the budget decides as always and counts what it refuses, but a refused retry is retried anyway (marked " code { "fb-shadow-denied" } "); the workers follow a switch within their deny cache's staleness. The same as " code { "budgetctl budget shadow|enforce" } ", recorded in the audit trail." }
                h2 { "Overrides" }
                form.action #freeze-form method="post" action={ "/dependency/" (path_segment(dep.as_str())) "/override" } {
                    (csrf_input(v))
                    input type="hidden" name="action" value="freeze";
                    label { "Freeze for (minutes) " input type="number" name="minutes" min="1" value="30" required; }
                    label { " because " input type="text" name="reason" maxlength="1000" required; }
                    button type="submit" { "Freeze retries" }
                }
                form.action #set-form method="post" action={ "/dependency/" (path_segment(dep.as_str())) "/override" } {
                    (csrf_input(v))
                    input type="hidden" name="action" value="set";
                    label { "Ratio " input type="text" name="ratio" size="5"; }
                    label { " floor " input type="number" name="min_allowance" min="0"; }
                    label { " for (minutes) " input type="number" name="minutes" min="1" value="30" required; }
                    label { " because " input type="text" name="reason" maxlength="1000" required; }
                    button type="submit" { "Set" }
                }
                form.action #unfreeze-form method="post" action={ "/dependency/" (path_segment(dep.as_str())) "/override" } {
                    (csrf_input(v))
                    select name="action" { option value="unfreeze" { "Unfreeze" } option value="clear" { "Clear every override" } }
                    label { " because " input type="text" name="reason" maxlength="1000" required; }
                    button type="submit" { "Apply" }
                }
            }
            p { a #incident-report href={ "/incident?dependency=" (path_segment(dep.as_str())) "&since=24h" } { "Incident report of the last 24 hours (dead letters accounted for)" } }
            h2 { "Audit trail of " (name) }
            (audit_table(trail))
            @if let Some(n) = searched {
                p.note #audit-searched { "Its entries among the newest " (count(n as u64)) " of the whole trail; "
                    a href={ "/audit?dependency=" (path_segment(dep.as_str())) } { "older ones" } "." }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::{Point, chart};

    #[test]
    fn the_chart_says_how_far_back_it_reaches_in_words() {
        let point = |at_ms| Point {
            at_ms,
            spent: 1,
            allowance: 10,
            denied: 0,
            amplification: None,
        };
        let shown = chart(&[point(0), point(65_000), point(185_000)]).into_string();
        assert!(
            shown.contains("Last 3 readings (up to 120, over 3 min)"),
            "{shown}"
        );
    }
}
