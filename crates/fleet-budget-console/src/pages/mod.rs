//! The pages, as maud templates: Rust code, checked when the crate compiles, every value
//! HTML-escaped (nothing here uses `PreEscaped`). Text that comes from a message or from Redis
//! also goes through `fleet_budget::printable::escape_text` ([`t`]): control, bidirectional and
//! invisible characters are shown by code point, so `pay\u{202E}lanoitan` reads as what it is.

mod audit;
mod dead_letters;
mod dependency;
mod overview;
mod replay;
mod workers;

use fleet_budget::Dependency;
use fleet_budget::control::AuditEntry;
use fleet_budget::printable::escape_text;
use maud::{DOCTYPE, Markup, html};

use crate::access::{Role, Visitor};
use crate::dead_letters::{Group, HEADERS_PER_GROUP, HeaderList, Sample, Sampled, Which};
use crate::filters::FilterForm;
use crate::fleet::{DependencyRow, HISTORY_POINTS, Overview, Point, WORKERS_READ};
use crate::replay::{JobState, Prediction, Purged};

pub(crate) use audit::*;
pub(crate) use dead_letters::*;
pub(crate) use dependency::*;
pub(crate) use overview::*;
pub(crate) use replay::*;
pub(crate) use workers::*;

/// Text from outside, with unsafe characters by code point (maud escapes the HTML).
pub(crate) fn t(s: &str) -> String {
    escape_text(s).into_owned()
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
fn query(pairs: &[(&str, Option<&str>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| {
            v.filter(|v| !v.is_empty())
                .map(|v| format!("{k}={}", path_segment(v)))
        })
        .collect();
    parts.join("&")
}

fn when(ms: Option<u64>) -> String {
    match ms {
        Some(ms) => {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
            humantime::format_rfc3339_seconds(at).to_string()
        }
        None => "-".to_owned(),
    }
}

fn age(ms: Option<u64>) -> String {
    match ms {
        Some(ms) => {
            let secs = fleet_budget::clock::now_ms().saturating_sub(ms) / 1000;
            if secs >= 3600 {
                format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
            } else if secs >= 60 {
                format!("{}m{:02}s", secs / 60, secs % 60)
            } else {
                format!("{secs}s")
            }
        }
        None => "-".to_owned(),
    }
}

#[allow(clippy::needless_pass_by_value)] // each page hands its body over; none keeps it
fn layout(title: &str, visitor: Option<&Visitor>, body: Markup) -> Markup {
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
                        a href="/audit" { "Audit" }
                        span.who {
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
                        }
                    }
                }
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

/// A refusal, as a page.
pub(crate) fn refusal(status: axum::http::StatusCode, why: &str) -> Markup {
    layout(
        &format!("{}", status.as_u16()),
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
