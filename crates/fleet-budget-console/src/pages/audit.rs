//! The audit trail as a table (also on a dependency's page) and as its own page, paged from
//! the newest: who, when, what, which dependency, why, and the details (the state before and
//! after, a run's counts) as fields, not raw JSON.

use fleet_budget::control::AuditEntry;
use maud::{Markup, html};
use serde_json::Value;

use super::{PER_PAGE, layout, path_segment, short_at, t, time};
use crate::access::Visitor;

/// Fields of one entry's details shown; the rest are counted.
const DETAIL_FIELDS: usize = 16;

/// One page of the trail: its entries, newest first, and where the next (older) page starts.
#[derive(Debug, Default)]
pub(crate) struct AuditPage {
    /// The entries shown, newest first (at most [`PER_PAGE`]).
    pub(crate) entries: Vec<AuditEntry>,
    /// Only this dependency's entries.
    pub(crate) dependency: Option<String>,
    /// The id of the newest entry of the next page (older), if there are more.
    pub(crate) older: Option<String>,
    /// Whether this is not the newest page.
    pub(crate) paged: bool,
}

/// The entries as a table, newest first.
pub(crate) fn audit_table(trail: &[AuditEntry]) -> Markup {
    html! {
        table.audit #audit {
            thead { tr { th { "who" } th { "when" } th { "what" } th { "dependency" } th { "reason" } th { "details" } } }
            tbody {
                @for e in trail {
                    tr data-action=(t(&e.action)) {
                        td.who { (t(&e.actor)) }
                        td.when { (time::ago(Some(e.at_ms))) }
                        td.what { (t(&e.action)) }
                        td.dep {
                            @match &e.dependency {
                                Some(d) => { a href={ "/dependency/" (path_segment(d)) } { (t(d)) } }
                                None => { "-" }
                            }
                        }
                        td.cut.reason { (short_at(&e.reason, 2048)) }
                        td.details { (details(e)) }
                    }
                }
            }
        }
    }
}

/// The state before and after (an override's), or what a run did, as `field: value` lines.
fn details(e: &AuditEntry) -> Markup {
    let mut fields = Vec::new();
    if let Some(b) = &e.before {
        flatten("before", b, &mut fields);
    }
    if let Some(a) = &e.after {
        flatten("", a, &mut fields);
    }
    let more = fields.len().saturating_sub(DETAIL_FIELDS);
    html! {
        @if fields.is_empty() { "-" }
        @else {
            dl.details {
                @for (k, v) in fields.iter().take(DETAIL_FIELDS) {
                    dt { (t(k)) } dd { (short_at(v, 512)) }
                }
            }
            @if more > 0 { small { "+" (more) " more fields (" code { "budgetctl audit --json" } ")" } }
        }
    }
}

/// `value` as dotted fields under `at`; nulls are left out (they say "none").
fn flatten(at: &str, value: &Value, out: &mut Vec<(String, String)>) {
    let name = |k: &str| {
        if at.is_empty() {
            k.to_owned()
        } else {
            format!("{at}.{k}")
        }
    };
    match value {
        Value::Null => {}
        Value::Object(map) => {
            for (k, v) in map {
                if out.len() > DETAIL_FIELDS * 4 {
                    return;
                }
                flatten(&name(k), v, out);
            }
        }
        Value::String(s) => out.push((at.to_owned(), s.clone())),
        // A time (Unix ms, after 2001) as its UTC time.
        Value::Number(n)
            if at.ends_with("_ms") && n.as_u64().is_some_and(|ms| ms > 1_000_000_000_000) =>
        {
            out.push((at.to_owned(), time::utc(n.as_u64().unwrap_or_default())));
        }
        other => out.push((at.to_owned(), other.to_string())),
    }
}

/// The audit trail page.
pub(crate) fn audit(v: &Visitor, page: &AuditPage) -> Markup {
    let link = |before: Option<&str>| {
        let q = super::query(&[
            ("dependency", page.dependency.as_deref()),
            ("before", before),
        ]);
        if q.is_empty() {
            "/audit".to_owned()
        } else {
            format!("/audit?{q}")
        }
    };
    layout(
        "Audit trail",
        Some(v),
        html! {
            form.filters method="get" action="/audit" {
                label { "Dependency " input type="text" name="dependency" value=(page.dependency.as_deref().map(t).unwrap_or_default()); }
                button type="submit" { "Filter" }
            }
            p.pager #audit-pager {
                @if page.entries.is_empty() { "No entry" }
                @else { (page.entries.len()) " entries, newest first" }
                @if page.paged { " · " a.newest href=(link(None)) { "← newest" } }
                @if let Some(older) = &page.older { " · " a.next href=(link(Some(older))) { "older →" } }
            }
            (audit_table(&page.entries))
            p.note { "At most " (PER_PAGE) " entries a page. Every override, replay, purge, cancel and migration is recorded with who made it and why; " code { "budgetctl audit" } " reads the same trail." }
        },
    )
}
