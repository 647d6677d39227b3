//! The worker registry as a page: the workers that report (or did), worst first and 50 a page
//! (a registry holds up to 10,000 entries: listed whole it weighed 3 MB), their fallback
//! dependencies with for how long, and which went silent, from the console's last reading.

use std::time::Duration;

use fleet_budget::control::{FleetWorkers, WorkerEntry};
use maud::{Markup, html};

use super::{PER_PAGE, count, layout, pager, short, time};
use crate::access::Visitor;
use crate::fleet::WorkersLine;

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

/// A page of the registry as the console's last reading read it.
pub(crate) struct WorkersPage<'a> {
    /// The registry, its entries worst first (`crate::fleet::worst_first`).
    pub(crate) registry: &'a FleetWorkers,
    /// Its counts (of every entry read, not of the page).
    pub(crate) line: WorkersLine,
    /// The page (1-based) and its first entry's offset (`pages::page_of`).
    pub(crate) page: usize,
    pub(crate) from: usize,
    /// When the reading ended (the console's clock, Unix ms).
    pub(crate) read_at_ms: u64,
}

/// The worker registry, a page of it. Every text in it was escaped by the library when read
/// (`fleet_budget::control::workers`); maud escapes the HTML.
pub(crate) fn workers(v: &Visitor, p: &WorkersPage<'_>) -> Markup {
    let opt = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    let text = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".to_owned());
    let (read, line) = (p.registry, &p.line);
    let listed = read.workers.len();
    let rows = read
        .workers
        .get(p.from..(p.from + PER_PAGE).min(listed))
        .unwrap_or_default();
    let link = |n: usize| format!("/workers?page={n}");
    layout(
        "Workers",
        Some(v),
        html! {
            p #workers-counts {
                (count(line.reporting)) " workers reporting, " (count(line.in_fallback)) " in fallback, "
                (count(line.silent)) " silent, " (count(line.unreadable)) " unreadable, of "
                (count(line.total)) " entries in the worker registry"
                @if line.truncated { " (counted among the " (count(listed as u64)) " seen last, which are listed)" }
                "; as the console read it " (time::ago(Some(p.read_at_ms))) " (it reads the registry every few seconds)."
            }
            p.note { "A worker reports every few seconds which dependencies it decides from its "
                "fallback (Redis failed for them). A silent worker has not reported for three of its "
                "intervals: it stopped, or it is cut off from Redis and decides everything from its "
                "fallback, which it cannot report; its own " code { "fleet_budget_fallback_active" }
                " metric says which." }
            (pager("workers-pager", p.page, listed, "entries, worst first (in fallback, unreadable, silent, then reporting; each last seen first)", &link))
            table #workers data-source="/api/workers" {
                thead { tr {
                    th { "worker" } th { "state" } th { "host" } th { "pid" } th { "lang" }
                    th { "version" } th { "last seen" } th { "fallback (for how long)" }
                } }
                tbody {
                    @for w in rows {
                        tr data-state=(state(w)) {
                            td.cut { (short(&w.id)) }
                            td { (state(w)) @if let Some(why) = &w.unreadable { br; small { (short(why)) } } }
                            td.cut { (short(&text(&w.host))) }
                            td.num { (opt(w.pid)) }
                            td.cut { (short(&text(&w.lang))) }
                            td.cut { (short(&text(&w.version))) }
                            td { (time::ago(w.age_ms.map(|a| p.read_at_ms.saturating_sub(a)))) }
                            td.fallback { (fallback_cell(w)) }
                        }
                    }
                }
            }
        },
    )
}
