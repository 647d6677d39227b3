//! The overview: one row per dependency, its budget, overrides and breaker.

use super::*;

pub(super) fn overrides_cell(r: &DependencyRow) -> Markup {
    html! {
        @if let Some(f) = &r.frozen {
            span.frozen { "FROZEN by " (f.actor) " (" (f.reason) "), " (format!("{:.0}s", f.expires_in_secs)) " left" } br;
        }
        @if let Some(s) = &r.set {
            span { (s.what) " by " (s.actor) " (" (s.reason) "), " (format!("{:.0}s", s.expires_in_secs)) " left" }
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

pub(super) fn overview_rows(ov: &Overview) -> Markup {
    html! {
        @for r in &ov.dependencies {
            tr data-severity=(r.severity) {
                td { a href={ "/dependency/" (path_segment(&r.dependency)) } { (r.dependency) } }
                td.num { (r.allowance) }
                td.num { (r.spent) }
                td.num { (r.remaining) }
                td.num { (format!("{:.2}", r.denials_per_sec)) }
                td.num { (r.amplification.map_or_else(|| "-".to_owned(), |a| format!("{a:.2}x"))) }
                td { (breaker_cell(r)) }
                td.num { (r.concurrency.map_or_else(|| "-".to_owned(), |c| format!("{}/{}", c.in_flight, c.cap))) }
                td.num.fallback { (r.workers_in_fallback.map_or_else(|| "-".to_owned(), |n| n.to_string())) }
                td { (overrides_cell(r)) }
                td.alert { (r.alert) }
            }
        }
    }
}

/// The fleet as its workers report it (the worker registry), in one sentence; the console's
/// script writes the same sentence from `/api/overview`.
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

/// The fleet overview.
pub(crate) fn overview(v: &Visitor, ov: &Overview) -> Markup {
    layout(
        "Overview",
        Some(v),
        html! {
            p { "Every dependency under key prefix " code { (ov.key_prefix) } ", worst first. Refreshed every 2 s; "
                span #refreshed { "read when the page loaded" } "." }
            p { span #workers-line { (workers_line(ov)) } " " a href="/workers" { "Workers" } }
            table #overview data-source="/api/overview" {
                thead { tr {
                    th { "dependency" } th { "allowance" } th { "spent" } th { "remaining" }
                    th { "denials/s" } th { "amplification" } th { "breaker" } th { "in flight/cap" }
                    th { "workers in fallback" } th { "overrides" } th { "alert" }
                } }
                tbody { (overview_rows(ov)) }
            }
            @if !ov.unusable.is_empty() {
                h2 { "Unusable keys" }
                ul { @for u in &ov.unusable { li { (u.dependency) ": " (u.error) } } }
            }
        },
    )
}
