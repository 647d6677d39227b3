//! The worker registry as a page: every worker that reports (or did), its fallback
//! dependencies with for how long, and which went silent.

use std::time::Duration;

use fleet_budget::control::{FleetWorkers, WorkerEntry};
use maud::{Markup, html};

use super::{layout, short, time};
use crate::access::Visitor;

fn duration(ms: u64) -> String {
    time::span(Duration::from_millis(ms))
}

fn state(w: &WorkerEntry) -> &'static str {
    if w.unreadable.is_some() {
        "unreadable"
    } else if w.silent {
        "silent"
    } else if w.in_fallback() {
        "in fallback"
    } else {
        "reporting"
    }
}

fn fallback_cell(w: &WorkerEntry) -> Markup {
    html! {
        @if w.fallback.is_empty() && w.fallback_more == 0 { "-" }
        @for (i, f) in w.fallback.iter().enumerate() {
            @if i > 0 { ", " }
            (short(&f.dependency)) " (" (duration(f.for_ms)) ")"
        }
        @if w.fallback_more > 0 { " +" (w.fallback_more) " more" }
    }
}

/// The worker registry. Every text in it was escaped by the library when read
/// (`fleet_budget::control::workers`); maud escapes the HTML.
pub(crate) fn workers(v: &Visitor, read: &FleetWorkers) -> Markup {
    let opt = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    let text = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".to_owned());
    let now = fleet_budget::clock::now_ms();
    layout(
        "Workers",
        Some(v),
        html! {
            p { (read.reporting()) " workers reporting, " (read.in_fallback()) " in fallback, "
                (read.silent()) " silent, of " (read.total) " entries in the worker registry"
                @if read.truncated { " (the " (read.workers.len()) " seen last are listed)" } "." }
            p.note { "A worker reports every few seconds which dependencies it decides from its "
                "fallback (Redis failed for them). A silent worker has not reported for three of its "
                "intervals: it stopped, or it is cut off from Redis and decides everything from its "
                "fallback, which it cannot report; its own " code { "fleet_budget_fallback_active" }
                " metric says which." }
            table #workers data-source="/api/workers" {
                thead { tr {
                    th { "worker" } th { "state" } th { "host" } th { "pid" } th { "lang" }
                    th { "version" } th { "last seen" } th { "fallback (for how long)" }
                } }
                tbody {
                    @for w in &read.workers {
                        tr data-state=(state(w)) {
                            td.cut { (short(&w.id)) }
                            td { (state(w)) @if let Some(why) = &w.unreadable { br; small { (short(why)) } } }
                            td.cut { (short(&text(&w.host))) }
                            td.num { (opt(w.pid)) }
                            td.cut { (short(&text(&w.lang))) }
                            td.cut { (short(&text(&w.version))) }
                            td { (time::ago(w.age_ms.map(|a| now.saturating_sub(a)))) }
                            td.fallback { (fallback_cell(w)) }
                        }
                    }
                }
            }
        },
    )
}
