//! The pages, as maud templates: Rust code, checked when the crate compiles, every value
//! HTML-escaped (nothing here uses `PreEscaped`). Text that comes from a message or from Redis
//! also goes through `fleet_budget::printable::escape_text` ([`t`]): control, bidirectional and
//! invisible characters are shown by code point, so `pay\u{202E}lanoitan` reads as what it is.

use fleet_budget::Dependency;
use fleet_budget::control::AuditEntry;
use fleet_budget::printable::escape_text;
use maud::{DOCTYPE, Markup, html};

use crate::access::{Role, Visitor};
use crate::dead_letters::{Group, HEADERS_PER_GROUP, HeaderList, Sample, Sampled, Which};
use crate::fleet::{DependencyRow, HISTORY_POINTS, Overview, Point};
use crate::replay::{JobState, Prediction, Purged};
use crate::routes::FilterForm;

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

fn overrides_cell(r: &DependencyRow) -> Markup {
    html! {
        @if let Some(f) = &r.frozen {
            span.frozen { "FROZEN by " (f.actor) " (" (f.reason) "), " (format!("{:.0}s", f.expires_in_secs)) " left" } br;
        }
        @if let Some(s) = &r.set {
            span { (s.what) " by " (s.actor) " (" (s.reason) "), " (format!("{:.0}s", s.expires_in_secs)) " left" }
        }
    }
}

fn breaker_cell(r: &DependencyRow) -> String {
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

fn overview_rows(ov: &Overview) -> Markup {
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
                td { (overrides_cell(r)) }
                td.alert { (r.alert) }
            }
        }
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
            table #overview data-source="/api/overview" {
                thead { tr {
                    th { "dependency" } th { "allowance" } th { "spent" } th { "remaining" }
                    th { "denials/s" } th { "amplification" } th { "breaker" } th { "in flight/cap" }
                    th { "overrides" } th { "alert" }
                } }
                tbody { (overview_rows(ov)) }
            }
            @if !ov.unusable.is_empty() {
                h2 { "Unusable keys" }
                ul { @for u in &ov.unusable { li { (u.dependency) ": " (u.error) } } }
            }
            p.note { "Workers in fallback are not reported to Redis: each worker exports "
                code { "fleet_budget_fallback_active" } " on its own /metrics." }
        },
    )
}

/// A small chart of the history: retries granted (line) against the allowance (dashed), and
/// denials (bars), drawn by the server as SVG.
fn chart(points: &[Point]) -> Markup {
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
    let span_secs = points
        .last()
        .map_or(0, |l| l.at_ms)
        .saturating_sub(points.first().map_or(0, |f| f.at_ms))
        / 1000;
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
        p.note { "Last " (points.len()) " readings (up to " (HISTORY_POINTS) ", " (span_secs) " s): "
            span.spent-key { "retries granted" } ", " span.allowance-key { "allowance" } ", "
            span.denied-key { "denials" } "; scale 0 to " (top) "." }
    }
}

fn audit_table(trail: &[AuditEntry]) -> Markup {
    html! {
        table.audit {
            thead { tr { th { "when" } th { "who" } th { "action" } th { "dependency" } th { "why" } th { "after" } } }
            tbody {
                @for e in trail.iter().rev() {
                    tr {
                        td { (when(Some(e.at_ms))) }
                        td { (t(&e.actor)) }
                        td { (t(&e.action)) }
                        td { (t(e.dependency.as_deref().unwrap_or("-"))) }
                        td { (t(&e.reason)) }
                        td.json { (t(&e.after.as_ref().map(ToString::to_string).unwrap_or_default())) }
                    }
                }
            }
        }
    }
}

/// One dependency's page.
pub(crate) fn dependency(
    v: &Visitor,
    dep: &Dependency,
    ov: &Overview,
    history: &[Point],
    trail: &[AuditEntry],
) -> Markup {
    let name = t(dep.as_str());
    layout(
        &name,
        Some(v),
        html! {
            @if let Some(r) = ov.dependencies.first() {
                table.facts {
                    tr { th { "alert" } td #alert { (r.alert) } }
                    tr { th { "allowance / spent / remaining" } td { (r.allowance) " / " (r.spent) " / " (r.remaining) } }
                    tr { th { "denied in the window" } td { (r.denied) " (" (format!("{:.2}", r.denials_per_sec)) "/s)" } }
                    tr { th { "amplification" } td { (r.amplification.map_or_else(|| "-".to_owned(), |a| format!("{a:.2}x"))) } }
                    tr { th { "policy in force" } td { (r.policy) } }
                    tr { th { "conflict" } td { (r.conflict.clone().unwrap_or_else(|| "none".to_owned())) } }
                    tr { th { "overrides" } td #overrides { (overrides_cell(r)) @if r.frozen.is_none() && r.set.is_none() { "none" } } }
                    tr { th { "breaker" } td { (breaker_cell(r)) @if let Some(b) = &r.breaker { ", opened " (b.times_opened) " times" } } }
                    tr { th { "in flight / cap" } td { (r.concurrency.map_or_else(|| "no concurrency budget".to_owned(), |c| format!("{}/{}", c.in_flight, c.cap))) } }
                }
                h2 { "Recent history" }
                (chart(history))
                h3 { "The two windows Redis holds" }
                table {
                    thead { tr { th { "window" } th { "retries granted" } th { "denied" } th { "first attempts" } } }
                    tbody {
                        tr { td { "previous" } @for n in r.windows[0] { td.num { (n) } } }
                        tr { td { "current" } @for n in r.windows[1] { td.num { (n) } } }
                    }
                }
            } @else {
                p { "No budget key for this dependency yet." }
            }
            @if is_operator(v) {
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
            h2 { "Audit trail of " (name) }
            (audit_table(trail))
        },
    )
}

fn filter_fields(q: &FilterForm) -> Markup {
    let v = |o: &Option<String>| o.clone().unwrap_or_default();
    html! {
        input type="hidden" name="queue" value=(v(&q.queue));
        input type="hidden" name="dependency" value=(v(&q.dependency));
        input type="hidden" name="reason" value=(v(&q.reason));
        input type="hidden" name="task" value=(v(&q.task));
        input type="hidden" name="since" value=(v(&q.since));
        input type="hidden" name="until" value=(v(&q.until));
        input type="hidden" name="error_contains" value=(v(&q.error_contains));
    }
}

fn sample_note(sample: &Sample, bound: u64) -> Markup {
    html! {
        p.sample #sample {
            @if sample.taken_ms == 0 {
                "The first sample of this queue is being read."
            } @else {
                "Sampled " (sample.sampled) " of " (sample.depth) " messages in " code { (t(&sample.queue)) }
                " " (age(Some(sample.taken_ms))) " ago (read in " (format!("{:.1}", sample.took.as_secs_f64())) " s; at most "
                (bound) " per read). Counts are of the sample; the depth is the queue's."
            }
            @if let Some(e) = &sample.error { br; span.error { "The last read failed: " (t(e)) } }
        }
    }
}

/// The groups of a queue.
pub(crate) fn dead_letters(
    v: &Visitor,
    which: Which,
    q: &FilterForm,
    sample: &Sample,
    groups: &[Group],
    bound: u64,
) -> Markup {
    let o = |s: &Option<String>| s.clone().unwrap_or_default();
    layout(
        &format!("The {} queue", which.name()),
        Some(v),
        html! {
            (sample_note(sample, bound))
            @if is_operator(v) {
                form.inline method="post" action="/dead-letters/refresh" { (csrf_input(v)) button type="submit" { "Read a new sample now" } }
            }
            form.filters method="get" action="/dead-letters" {
                input type="hidden" name="queue" value=(which.as_str());
                label { "dependency " input type="text" name="dependency" value=(o(&q.dependency)); }
                label { " reason " input type="text" name="reason" value=(o(&q.reason)); }
                label { " task " input type="text" name="task" value=(o(&q.task)); }
                label { " since " input type="text" name="since" placeholder="30m" value=(o(&q.since)); }
                label { " until " input type="text" name="until" value=(o(&q.until)); }
                label { " error contains " input type="text" name="error_contains" value=(o(&q.error_contains)); }
                button type="submit" { "Filter" }
            }
            table #groups {
                thead { tr { th { "dependency" } th { "reason" } th { "error class" } th { "messages" } th { "oldest" } @if is_operator(v) { th { "act" } } } }
                tbody {
                    @for g in groups {
                        tr {
                            td { (t(&g.dependency)) }
                            td { (t(&g.reason)) }
                            td { a href={ "/dead-letters/group?" (query(&[("queue", Some(which.as_str())), ("dependency", Some(&g.dependency)), ("reason", Some(&g.reason)), ("error_class", Some(&g.error_class)), ("task", q.task.as_deref()), ("since", q.since.as_deref()), ("until", q.until.as_deref()), ("error_contains", q.error_contains.as_deref())])) } { (t(&g.error_class)) } }
                            td.num { (g.count) }
                            td { (age(g.oldest_ms)) }
                            @if is_operator(v) {
                                td {
                                    @let group = FilterForm { queue: Some(which.as_str().to_owned()), dependency: Some(g.dependency.clone()), reason: Some(g.reason.clone()), ..q.clone() };
                                    @if which == Which::Dead {
                                        form.inline.replay method="post" action="/replay/dry-run" {
                                            (csrf_input(v)) (filter_fields(&group))
                                            button type="submit" { "Replay…" }
                                        }
                                    }
                                    form.inline.purge method="post" action="/dead-letters/purge" {
                                        (csrf_input(v)) (filter_fields(&group))
                                        button type="submit" { "Purge…" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if groups.is_empty() { p { "No message in the sample matches." } }
            p.note { "A replay or purge selects by dependency and reason (and the filters above); the error class groups what you see, it is not a filter of the replay library." }
        },
    )
}

fn message_rows(which: Which, members: &[&Sampled]) -> Markup {
    html! {
        @for s in members {
            @let m = &s.message;
            tr {
                td { @if let Some(id) = &m.message_id { a href={ "/dead-letters/message?" (query(&[("queue", Some(which.as_str())), ("id", Some(id))])) } { (t(id)) } } @else { "-" } }
                td { (t(m.task.as_deref().unwrap_or("-"))) }
                td.num { (m.attempts.map_or_else(|| "-".to_owned(), |a| a.to_string())) }
                td { (when(s.first_failure_ms)) }
                td { (when(m.dead_lettered_ms)) }
                td.num { (m.replays) }
                td.error { (t(m.error.as_deref().unwrap_or("-"))) }
            }
        }
    }
}

/// The messages of a group.
pub(crate) fn group(
    v: &Visitor,
    which: Which,
    q: &FilterForm,
    sample: &Sample,
    members: &[&Sampled],
) -> Markup {
    let o = |s: &Option<String>| t(s.as_deref().unwrap_or("?"));
    layout(
        &format!(
            "{} × {} × {}",
            o(&q.dependency),
            o(&q.reason),
            o(&q.error_class)
        ),
        Some(v),
        html! {
            (sample_note(sample, sample.sampled))
            table #messages {
                thead { tr { th { "message id" } th { "task" } th { "attempts" } th { "first failure" } th { "dead-lettered" } th { "replays" } th { "error (redacted)" } } }
                tbody { (message_rows(which, members)) }
            }
            p.note { "Headers are kept for the first " (HEADERS_PER_GROUP) " messages of each group in the sample." }
        },
    )
}

/// One message's headers.
pub(crate) fn message(
    v: &Visitor,
    which: Which,
    s: &Sampled,
    headers: Option<&HeaderList>,
) -> Markup {
    let id = t(s.message.message_id.as_deref().unwrap_or("-"));
    layout(
        &format!("Message {id}"),
        Some(v),
        html! {
            p { "In the " (which.name()) " queue (as of the last sample)." }
            table #headers {
                thead { tr { th { "field" } th { "value" } } }
                tbody {
                    @match headers {
                        Some(list) => { @for (k, val) in list { tr { td { (t(k)) } td.value { (t(val)) } } } }
                        None => { tr { td colspan="2" { "Headers not kept for this message (beyond the first " (HEADERS_PER_GROUP) " of its group)." } } }
                    }
                }
            }
            @if let Some(u) = &s.message.unreadable { p.error { "Unreadable dead-letter headers: " (t(u)) } }
        },
    )
}

/// A dry run's prediction, and the form that confirms the replay.
pub(crate) fn dry_run(
    v: &Visitor,
    q: &FilterForm,
    p: &Prediction,
    rate: f64,
    limit: Option<u64>,
    note: &str,
) -> Markup {
    layout(
        "Replay: dry run",
        Some(v),
        html! {
            p { "Nothing moved. Of " (p.total) " messages in the dead-letter queue:" }
            table #prediction {
                tr { th { "matched" } td #p-matched { (p.matched) } }
                tr { th { "would be moved back" } td #p-moved { (p.moved) } }
                tr { th { "would be parked (looping or malformed)" } td #p-parked { (p.parked) } }
                tr { th { "skipped (filter)" } td #p-skipped { (p.skipped) } }
                tr { th { "would fail (exchange missing)" } td #p-failed { (p.failed) } }
            }
            form #confirm-replay method="post" action="/replay/start" {
                (csrf_input(v)) (filter_fields(q))
                input type="hidden" name="confirm" value="replay";
                label { "Rate (messages/s) " input type="number" name="rate" min="1" value=(rate); }
                label { " limit " input type="number" name="limit" min="1" value=(limit.map(|l| l.to_string()).unwrap_or_default()); }
                label { " why (audited) " input type="text" name="note" maxlength="1000" value=(note) required; }
                button type="submit" { "Replay these" }
            }
            p.note { "The replay is paced by the live budget: it pauses while the dependency's budget is exhausted." }
        },
    )
}

/// The confirmation of a purge.
pub(crate) fn purge_confirm(
    v: &Visitor,
    which: Which,
    q: &FilterForm,
    count: u64,
    sample: &Sample,
) -> Markup {
    layout(
        "Purge a group",
        Some(v),
        html! {
            p.warning { "A purge removes messages for good. In the last sample of the " (which.name()) " queue, "
                strong #purge-count { (count) } " of " (sample.sampled) " sampled messages (" (sample.depth) " in the queue) match "
                code { (t(q.dependency.as_deref().unwrap_or("?"))) " × " (t(q.reason.as_deref().unwrap_or("?"))) } "; every matching message in the queue goes." }
            form #confirm-purge method="post" action="/dead-letters/purge" {
                (csrf_input(v)) (filter_fields(q))
                label { "Type " code { "purge" } " to confirm " input type="text" name="confirm" autocomplete="off" required; }
                label { " why (audited) " input type="text" name="note" maxlength="1000" required; }
                button type="submit" { "Purge for good" }
            }
        },
    )
}

/// What a purge did.
pub(crate) fn purged(v: &Visitor, which: Which, p: &Purged) -> Markup {
    layout(
        "Purged",
        Some(v),
        html! {
            p #purged { (p.removed) " messages removed from the " (which.name()) " queue; " (p.kept) " kept." }
            p { a href={ "/dead-letters?queue=" (which.as_str()) } { "Back to the queue" } }
        },
    )
}

/// Why a run waits, in words (`-` when it does not).
pub(crate) fn held_text(j: &JobState) -> String {
    let dependency = t(j.paused_on.as_deref().unwrap_or("its dependency"));
    match j.held.as_deref() {
        None => "-".to_owned(),
        Some("breaker_open") => format!("held: the breaker of {dependency} is open"),
        Some("budget_exhausted") => format!("held: the budget of {dependency} is exhausted"),
        Some(other) => format!("held: {dependency} ({other})"),
    }
}

/// The rate moves go at now, and what holds it down, in words.
pub(crate) fn rate_text(j: &JobState) -> String {
    if j.held.is_some() {
        // The last rate decided is not what a held run moves at.
        return "0/s (held)".to_owned();
    }
    let now = match j.rate_now {
        Some(r) if j.done => format!("last {r:.1}/s"),
        Some(r) => format!("{r:.1}/s"),
        None => "-".to_owned(),
    };
    match j.slowed.as_deref() {
        Some("failures") => format!("{now}, slowed: the dependency's failures rose"),
        Some("budget_pace") => format!("{now}, slowed: the budget's headroom is small"),
        Some("probe_pace") => format!("{now}, slowed: the half-open breaker's probes"),
        Some(other) => format!("{now}, slowed ({other})"),
        None => now,
    }
}

fn job_table(j: &JobState) -> Markup {
    html! {
        table #progress data-source={ "/api/replay/" (j.id) } {
            tr { th { "selected" } td { (t(&j.selected)) } }
            tr { th { "by" } td { (t(&j.actor)) } }
            tr { th { "state" } td #j-state { (j.state()) } }
            tr { th { "held" } td #j-held { (held_text(j)) } }
            tr { th { "rate now" } td #j-rate { (rate_text(j)) } }
            tr { th { "rate at most" } td { (j.rate) " messages/s" } }
            tr { th { "rate cuts" } td #j-slowdowns { (j.slowdowns) } }
            tr { th { "read" } td #j-seen { (j.seen) " of " (j.total) } }
            tr { th { "moved" } td #j-moved { (j.moved) } }
            tr { th { "parked" } td #j-parked { (j.parked) } }
            tr { th { "skipped" } td #j-skipped { (j.skipped) } }
            tr { th { "failed" } td #j-failed { (j.failed) } }
            tr { th { "cancelled by" } td #j-cancelled-by { (t(j.cancel_requested_by.as_deref().unwrap_or("-"))) } }
            tr { th { "error" } td #j-error { (t(j.error.as_deref().unwrap_or("-"))) } }
        }
    }
}

/// A replay's progress; an operator may cancel it while it runs.
pub(crate) fn replay(v: &Visitor, j: &JobState) -> Markup {
    layout(
        "Replay",
        Some(v),
        html! {
            (job_table(j))
            @if is_operator(v) && !j.done {
                form.inline #cancel-replay method="post" action={ "/replay/" (j.id) "/cancel" } {
                    (csrf_input(v))
                    button type="submit" { "Cancel" }
                }
            }
            p.note { "The replay is paced by the live budget: held while its dependency's breaker is open or its budget exhausted, slowed when the replayed jobs fail again, climbing back when they stop. Cancel stops it at its next step; what it has not moved stays in the dead-letter queue." }
        },
    )
}

/// The replays of this console.
pub(crate) fn replays(v: &Visitor, jobs: &[JobState]) -> Markup {
    layout(
        "Replays",
        Some(v),
        html! {
            @if jobs.is_empty() { p { "No replay since the console started." } }
            ul { @for j in jobs { li { a href={ "/replay/" (j.id) } { (t(&j.selected)) } " by " (t(&j.actor)) ": moved " (j.moved) ", " (j.state()) } } }
        },
    )
}

/// The audit trail.
pub(crate) fn audit(v: &Visitor, trail: &[AuditEntry]) -> Markup {
    layout("Audit trail", Some(v), audit_table(trail))
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
