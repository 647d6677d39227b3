//! The pages, as maud templates: Rust code, checked when the crate compiles, every value
//! HTML-escaped (nothing here uses `PreEscaped`). Every text that comes from a message, from
//! Redis (an override, the worker registry, the audit trail) or from a request goes through
//! [`t`], the console's one door for outside text, on every page and in every JSON answer:
//! redacted (`fleet_budget::redact::redact_text`: a `redis://admin:hunter2@host` error class
//! shows as `redis://admin:***@host`), and with control, bidirectional and invisible characters
//! shown by code point (`fleet_budget::printable::escape_text`), so `pay\u{202E}lanoitan` reads
//! as what it is. Lists show at most [`LIST_TEXT_MAX`] bytes of each ([`short`]); the message
//! page shows what the sample kept.

mod audit;
pub(crate) mod bullmq;
mod dead_letters;
mod dependency;
pub(crate) mod incident;
mod overview;
mod replay;
pub(crate) mod risks;
pub(crate) mod time;
mod workers;

use fleet_budget::printable::escape_text;
use maud::{DOCTYPE, Markup, html};

use crate::access::{Role, Visitor};

pub(crate) use audit::{AuditPage, audit};
pub(crate) use dead_letters::{dead_letters, dry_run, group, message, purge_confirm, purged};
pub(crate) use dependency::{Kept, Shown, dependency};
pub(crate) use overview::{OverviewPage, overview, overview_fragment};
pub(crate) use replay::{held_text, rate_text, replay, replays};
pub(crate) use workers::{WorkersPage, workers};

/// Text from outside, redacted, with unsafe characters by code point (maud escapes the HTML):
/// the one door every such text passes, on the pages and in the JSON answers.
pub(crate) fn t(s: &str) -> String {
    let redacted = fleet_budget::redact::redact_text(s);
    escape_text(&redacted).into_owned()
}

/// Bytes of one outside text a list shows (the message page shows more).
pub(crate) const LIST_TEXT_MAX: usize = 160;

/// Text from outside for a list cell: [`t`], cut at [`LIST_TEXT_MAX`] bytes, the cut said.
pub(crate) fn short(s: &str) -> Markup {
    short_at(s, LIST_TEXT_MAX)
}

/// [`short`] at `max` bytes.
pub(crate) fn short_at(s: &str, max: usize) -> Markup {
    let shown = t(s);
    if shown.len() <= max {
        return html! { (shown) };
    }
    let cut = fleet_budget::redact::truncate(&shown, max);
    html! { (cut) small.cut { " (" (count(shown.len() as u64)) " bytes)" } }
}

/// A count with thousands separators: `2,931`.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Rows of a long list per page.
pub(crate) const PER_PAGE: usize = 50;

/// The page `asked` (1-based, clamped to the pages there are) of `total` rows: its first row's
/// offset and its number.
pub(crate) fn page_of(asked: Option<&str>, total: usize) -> (usize, usize) {
    let pages = total.div_ceil(PER_PAGE).max(1);
    let n = asked
        .and_then(|p| p.trim().parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, pages);
    ((n - 1) * PER_PAGE, n)
}

/// What a page of a list shows ("1–50 of 2,931") and links to the pages before and after;
/// `link(n)` is the address of page `n`.
pub(crate) fn pager(
    id: &str,
    page: usize,
    total: usize,
    what: &str,
    link: &dyn Fn(usize) -> String,
) -> Markup {
    let pages = total.div_ceil(PER_PAGE).max(1);
    let first = (page - 1) * PER_PAGE + 1;
    let last = (page * PER_PAGE).min(total);
    html! {
        p.pager id=(id) {
            @if total == 0 { "none of " (what) }
            @else { span.shown { (count(first as u64)) "–" (count(last as u64)) " of " (count(total as u64)) " " (what) } }
            @if page > 1 { " · " a.prev href=(link(page - 1)) { "← previous" } }
            @if page < pages { " · " a.next href=(link(page + 1)) { "next →" } }
            @if pages > 2 { " · page " (page) " of " (pages) }
        }
    }
}

/// `s` as one path segment (percent-encoded).
pub(crate) fn path_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A query string from pairs (values percent-encoded).
pub(crate) fn query(pairs: &[(&str, Option<&str>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| {
            v.filter(|v| !v.is_empty())
                .map(|v| format!("{k}={}", path_segment(v)))
        })
        .collect();
    parts.join("&")
}

/// A page of the console for `visitor` (`None`: not logged in; the navigation offers "Log in").
fn layout(title: &str, visitor: Option<&Visitor>, body: Markup) -> Markup {
    let who = html! {
        @match visitor {
            Some(v) => {
                (v.label) " (" (if v.role == Role::Operator { "operator" } else { "viewer" }) ")"
                @if let Some(csrf) = &v.csrf {
                    form.inline method="post" action="/logout" {
                        input type="hidden" name="csrf" value=(csrf);
                        button type="submit" { "Log out" }
                    }
                } @else {
                    " " a href="/login" { "Log in" }
                }
            }
            None => { a href="/login" { "Log in" } }
        }
    };
    let risks = visitor.map(|v| risks::banner(&v.risks));
    page(title, who, risks, body)
}

#[allow(clippy::needless_pass_by_value)] // each page hands its parts over; none keeps them
fn page(title: &str, who: Markup, risks: Option<Markup>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · fleet-budget console" }
                link rel="stylesheet" href="/static/console.css";
                script src="/static/console.js" defer {}
            }
            body {
                header {
                    nav {
                        strong { "fleet-budget" }
                        a href="/" { "Overview" }
                        a href="/dead-letters" { "Dead letters" }
                        a href="/dead-letters?queue=parked" { "Parked" }
                        a href="/replays" { "Replays" }
                        a href="/workers" { "Workers" }
                        a href="/bullmq" { "BullMQ" }
                        a href="/audit" { "Audit" }
                        span.who { (who) }
                    }
                }
                @if let Some(r) = risks { (r) }
                main { h1 { (title) } (body) }
            }
        }
    }
}

fn csrf_input(v: &Visitor) -> Markup {
    html! { input type="hidden" name="csrf" value=(v.csrf.as_deref().unwrap_or_default()); }
}

fn is_operator(v: &Visitor) -> bool {
    v.role == Role::Operator && v.csrf.is_some()
}

/// A refusal, as a page: its title (`403`, `Redis is unreachable`) and why. The navigation
/// offers "Log in" only when `offer_login` (the request had no session): never to someone
/// logged in.
pub(crate) fn refusal(title: &str, why: &str, offer_login: bool) -> Markup {
    let who = html! { @if offer_login { a href="/login" { "Log in" } } };
    page(
        title,
        who,
        None,
        html! { p.refusal #refusal { (t(why)) } p { a href="/" { "Back to the overview" } } },
    )
}

/// The login form.
pub(crate) fn login(v: Option<&Visitor>, nonce: &str, error: Option<&str>) -> Markup {
    layout(
        "Log in",
        v,
        html! {
            @if let Some(e) = error { p.error #login-error { (e) } }
            form #login method="post" action="/login" {
                input type="hidden" name="login_csrf" value=(nonce);
                label { "Token " input type="password" name="token" autocomplete="off" required; }
                button type="submit" { "Log in" }
            }
            p.note { "An operator's token changes things; a viewer's only reads. The token is exchanged for a session; it is never stored in the page." }
        },
    )
}
