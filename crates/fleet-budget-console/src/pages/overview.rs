//! The overview: one row per dependency, its budget, overrides and breaker.

use super::*;

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

/// The fleet overview.
pub(crate) fn overview(v: &Visitor, ov: &Overview, samples: [&Sample; 2]) -> Markup {
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
            (dead_letter_counts(samples))
            @if !ov.unusable.is_empty() {
                h2 { "Unusable keys" }
                ul { @for u in &ov.unusable { li { (short(&u.dependency)) ": " (short_at(&u.error, 1024)) } } }
            }
        },
    )
}
