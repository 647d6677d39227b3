//! The dead letters: the sample's groups, one group's messages, one message, and the pages
//! before and after a replay or purge (dry run, purge confirmation, purged).

use maud::{Markup, html};

use super::{
    LIST_TEXT_MAX, count, csrf_input, is_operator, layout, pager, query, short, short_at, t, time,
};
use crate::access::Visitor;
use crate::dead_letters::{Detail, Group, Sample, Sampled, Sort, Which};
use crate::filters::FilterForm;
use crate::replay::{JobState, Prediction};

pub(super) fn filter_fields(q: &FilterForm) -> Markup {
    let v = |o: &Option<String>| o.clone().unwrap_or_default();
    html! {
        input type="hidden" name="queue" value=(v(&q.queue));
        input type="hidden" name="dependency" value=(v(&q.dependency));
        input type="hidden" name="reason" value=(v(&q.reason));
        input type="hidden" name="task" value=(v(&q.task));
        input type="hidden" name="since" value=(v(&q.since));
        input type="hidden" name="until" value=(v(&q.until));
        input type="hidden" name="error_contains" value=(v(&q.error_contains));
        @if q.g.is_some() {
            input type="hidden" name="g" value=(v(&q.g));
        } @else {
            input type="hidden" name="error_class" value=(v(&q.error_class));
        }
        input type="hidden" name="malformed" value=(v(&q.malformed));
    }
}

/// What the groups' counts are: the queue's depth and its index, exact or an estimate and why.
pub(super) fn counts_note(sample: &Sample) -> Markup {
    html! {
        p.counts #counts {
            @match &sample.counts {
                None => { @if sample.counts_error.is_none() { "The counts of this queue are being read." } @else { "No counts of this queue." } }
                Some(c) => {
                    (count(c.depth)) " messages in " code { (t(&c.queue)) } " (its depth, exact); the groups count "
                    (count(c.indexed())) " of them, from the dead-letter index, reading no message (read " (time::ago(Some(sample.counts_ms))) "). "
                    @if c.exact() {
                        strong #counts-exact { "Exact." }
                    } @else {
                        strong #counts-estimate { "An estimate" } ": " (t(&c.why_estimate().unwrap_or_default())) "."
                    }
                }
            }
            @if let Some(e) = &sample.counts_error {
                br; span.error { "The last read of the counts failed: " (short_at(e, 1024)) }
                @if sample.counts.is_none() { br; span #migrate-first { "A new fleet: run " code { "budgetctl migrate" } " first (it declares the queues and builds their dead-letter index)." } }
            }
        }
    }
}

pub(super) fn sample_note(sample: &Sample, bound: u64) -> Markup {
    html! {
        p.sample #sample {
            @if sample.taken_ms == 0 {
                "No messages of this queue have been read: a read puts each message back as a copy, so it happens only when asked (\"Read messages now\")."
            } @else {
                "Sampled " (count(sample.sampled)) " of " (count(sample.depth)) " messages in " code { (t(&sample.queue)) }
                " " (time::ago(Some(sample.taken_ms))) " (read in " (format!("{:.1}", sample.took.as_secs_f64())) " s; at most "
                (count(bound)) " per read): the messages shown one by one are of this sample."
                @if sample.details_dropped > 0 { " The headers and bodies of " (count(sample.details_dropped)) " of them were not kept (the sample keeps " (count(crate::dead_letters::DETAIL_BUDGET as u64 / 1024 / 1024)) " MB of them)." }
            }
            @if let Some(e) = &sample.error { br; span.error { "The last read failed: " (t(e)) } }
            @if let Some(w) = &sample.waiting { br; span.warning #sample-waiting { (t(w)) } }
        }
    }
}

/// The address of a group's page: by its short key, with the page's filters.
pub(crate) fn group_link(
    which: Which,
    key: &str,
    q: &FilterForm,
    extra: &[(&str, Option<&str>)],
) -> String {
    let mut pairs = vec![
        ("queue", Some(which.as_str())),
        ("g", Some(key)),
        ("task", q.task.as_deref()),
        ("since", q.since.as_deref()),
        ("until", q.until.as_deref()),
        ("error_contains", q.error_contains.as_deref()),
    ];
    pairs.extend_from_slice(extra);
    format!("/dead-letters/group?{}", query(&pairs))
}

/// The groups of a queue: one page of them, sorted.
#[allow(clippy::too_many_arguments)] // a page: each argument is a part of it
pub(crate) fn dead_letters(
    v: &Visitor,
    which: Which,
    q: &FilterForm,
    sort: Sort,
    page: usize,
    sample: &Sample,
    groups: &[Group],
    total: usize,
    bound: u64,
) -> Markup {
    let o = |s: &Option<String>| s.clone().unwrap_or_default();
    let list_link = |sort: Sort, page: usize| {
        let page = page.to_string();
        format!(
            "/dead-letters?{}",
            query(&[
                ("queue", Some(which.as_str())),
                ("dependency", q.dependency.as_deref()),
                ("reason", q.reason.as_deref()),
                ("task", q.task.as_deref()),
                ("since", q.since.as_deref()),
                ("until", q.until.as_deref()),
                ("error_contains", q.error_contains.as_deref()),
                ("sort", Some(sort.as_str())),
                ("page", Some(page.as_str()).filter(|p| *p != "1")),
            ])
        )
    };
    layout(
        &format!("The {} queue", which.name()),
        Some(v),
        html! {
            (counts_note(sample))
            (sample_note(sample, bound))
            @if is_operator(v) {
                form.inline method="post" action="/dead-letters/refresh" { (csrf_input(v)) button type="submit" { "Read messages now" } }
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
            p.sort { "Sort: "
                @for (s, words) in [(Sort::Default, "most messages"), (Sort::Oldest, "oldest first"), (Sort::Name, "by name")] {
                    @if s == sort { strong { (words) } } @else { a href=(list_link(s, 1)) { (words) } } " "
                }
            }
            (pager("groups-shown", page, total, "groups", &|n| list_link(sort, n)))
            table #groups {
                thead { tr { th { "dependency" } th { "reason" } th { "error class" } th { "messages" } th { "oldest" } @if is_operator(v) { th { "act" } } } }
                tbody {
                    @for g in groups {
                        tr {
                            td.cut { (short(&g.dependency)) }
                            td.cut { (short(&g.reason)) }
                            td.cut { a href=(group_link(which, &g.key(), q, &[])) { @if g.error_class.is_empty() { "(none)" } @else { (short(&g.error_class)) } } }
                            td.num { (count(g.count)) }
                            td { (time::ago(g.oldest_ms)) }
                            @if is_operator(v) {
                                td.act {
                                    @let group = FilterForm { queue: Some(which.as_str().to_owned()), dependency: None, reason: None, error_class: None, g: Some(g.key()), ..q.clone() };
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
            @if groups.is_empty() { p { "No counted message matches." } }
            p.note { "A replay or purge from a row selects that row: its dependency, reason and error class (and the filters above), nothing else. Texts longer than " (LIST_TEXT_MAX) " bytes are cut here; a message's page shows them whole." }
        },
    )
}

pub(super) fn message_rows(which: Which, members: &[&Sampled]) -> Markup {
    html! {
        @for s in members {
            @let m = &s.message;
            tr {
                td.cut { @if let Some(id) = &m.message_id { a href={ "/dead-letters/message?" (query(&[("queue", Some(which.as_str())), ("id", Some(id))])) } { (short_at(id, 64)) } } @else { "-" } }
                td.cut { (short(m.task.as_deref().unwrap_or("-"))) }
                td.num { (m.attempts.map_or_else(|| "-".to_owned(), |a| a.to_string())) }
                td { (time::ago(s.first_failure_ms)) }
                td { (time::ago(m.dead_lettered_ms)) }
                td.num { (m.replays) }
                td.error { (short(m.error.as_deref().unwrap_or("-"))) }
            }
        }
    }
}

/// The sampled messages of a group, a page of them.
#[allow(clippy::too_many_arguments)] // a page: each argument is a part of it
pub(crate) fn group(
    v: &Visitor,
    which: Which,
    q: &FilterForm,
    g: &Group,
    sort: Sort,
    page: usize,
    sample: &Sample,
    members: &[&Sampled],
    total: usize,
) -> Markup {
    let key = g.key();
    let link = |sort: Sort, n: usize| {
        let n = n.to_string();
        group_link(
            which,
            &key,
            q,
            &[
                ("sort", Some(sort.as_str())),
                ("page", Some(n.as_str()).filter(|p| *p != "1")),
            ],
        )
    };
    let title = format!(
        "{} × {} × {}",
        fleet_budget::redact::truncate(&t(&g.dependency), 60),
        fleet_budget::redact::truncate(&t(&g.reason), 60),
        fleet_budget::redact::truncate(
            &t(if g.error_class.is_empty() {
                "(none)"
            } else {
                &g.error_class
            }),
            60
        ),
    );
    layout(
        &title,
        Some(v),
        html! {
            table #group {
                tr { th { "dependency" } td.value { (t(&g.dependency)) } }
                tr { th { "reason" } td.value { (t(&g.reason)) } }
                tr { th { "error class" } td.value { (t(&g.error_class)) } }
                tr { th { "messages (dead-letter index)" } td #group-count { (count(g.count)) " " (exact_word(sample)) } }
            }
            (sample_note(sample, sample.sampled))
            p.sort { "Sort: "
                @for (s, words) in [(Sort::Default, "newest first"), (Sort::Oldest, "oldest first"), (Sort::Name, "by task")] {
                    @if s == sort { strong { (words) } } @else { a href=(link(s, 1)) { (words) } } " "
                }
            }
            (pager("messages-shown", page, total, "sampled messages of this group", &|n| link(sort, n)))
            table #messages {
                thead { tr { th { "message id" } th { "task" } th { "attempts" } th { "first failure" } th { "dead-lettered" } th { "replays" } th { "error (redacted)" } } }
                tbody { (message_rows(which, members)) }
            }
            @if sample.taken_ms > 0 && (total as u64) < g.count {
                p.note #messages-not-sampled { "The index counts " (count(g.count)) " messages in this group; " (count(total as u64)) " of them are in the last sample. \"Read messages now\" on the queue's page reads another (at most " (count(sample.sampled.max(1))) " messages of the queue per read)." }
            }
        },
    )
}

/// "(exact)" or "(estimate)", as the queue's counts are.
pub(super) fn exact_word(sample: &Sample) -> &'static str {
    match &sample.counts {
        Some(c) if c.exact() => "(exact)",
        Some(_) => "(estimate)",
        None => "(not read yet)",
    }
}

/// Raw header text shown on the message page, at most this many bytes in all (each value at
/// most [`crate::dead_letters::HEADER_VALUE_MAX`]): with the body, the page stays under 1 MB
/// however the text escapes.
const MESSAGE_PAGE_HEADERS_MAX: usize = 96 * 1024;
/// Bytes of the body shown on the message page.
const MESSAGE_PAGE_BODY_MAX: usize = 32 * 1024;

/// Each header with the part of its value the page shows: [`MESSAGE_PAGE_HEADERS_MAX`] bytes
/// in all, in order.
fn fields_shown(d: &Detail) -> Vec<(&crate::dead_letters::Field, String)> {
    let mut left = MESSAGE_PAGE_HEADERS_MAX;
    d.headers
        .iter()
        .map(|f| {
            let shown = fleet_budget::redact::truncate(&f.value, left.min(f.value.len()).max(16));
            left = left.saturating_sub(shown.len());
            (f, shown)
        })
        .collect()
}

/// One message: what it is, every error its headers carry, its body and its headers; an
/// operator replays or purges it (that message only, by its id).
pub(crate) fn message(
    v: &Visitor,
    which: Which,
    taken_ms: u64,
    s: &Sampled,
    detail: Option<&Detail>,
) -> Markup {
    let m = &s.message;
    let id = m.message_id.clone().unwrap_or_default();
    let field = |name: &str, value: Option<&str>| html! { tr { th { (name) } td.value { (short_at(value.unwrap_or("-"), 2048)) } } };
    layout(
        &format!("Message {}", fleet_budget::redact::truncate(&t(&id), 80)),
        Some(v),
        html! {
            p { "In the " (which.name()) " queue, as of the last sample (" (time::ago(Some(taken_ms))) ")." }
            table #summary {
                (field("message id", m.message_id.as_deref()))
                (field("task", m.task.as_deref()))
                (field("dependency", m.dependency.as_deref()))
                (field("reason", m.reason.as_deref()))
                (field("error class", m.error_class.as_deref()))
                tr { th { "attempts" } td #m-attempts { (m.attempts.map_or_else(|| "-".to_owned(), |a| a.to_string())) } }
                tr { th { "first failure" } td { (time::ago(s.first_failure_ms)) } }
                tr { th { "dead-lettered" } td { (time::ago(m.dead_lettered_ms)) } }
                tr { th { "replays" } td { (m.replays) } }
                @if let Some(r) = &m.park_reason { (field("parked because", Some(r))) tr { th { "parked" } td { (time::ago(m.parked_ms)) } } }
            }
            @if let Some(u) = &m.unreadable { p.error { "Unreadable dead-letter headers: " (short_at(u, 2048)) } }
            h2 { "Errors" }
            table #errors {
                thead { tr { th { "when" } th { "where" } th { "what" } th { "error (redacted)" } } }
                tbody {
                    tr {
                        td { (time::ago(m.dead_lettered_ms)) }
                        td { "the worker, attempt " (m.attempts.map_or_else(|| "?".to_owned(), |a| a.to_string())) " (the last)" }
                        td.cut { (short_at(m.error_class.as_deref().unwrap_or("-"), 2048)) }
                        td.error { (short_at(m.error.as_deref().unwrap_or("-"), 4096)) }
                    }
                    @if let Some(d) = detail {
                        @for death in &d.deaths {
                            tr.death {
                                td { (time::ago(death.time_ms)) }
                                td { "the broker, queue " (short(&death.queue)) @if !death.exchange.is_empty() { " (exchange " (short(&death.exchange)) ")" } }
                                td { (short(&death.reason)) }
                                td { @if let Some(n) = death.count { (count(n)) " times" } @else { "-" } }
                            }
                        }
                    }
                }
            }
            p.note { "A worker writes the error of the attempt that dead-lettered the job (" code { "fb-error-class" } ", " code { "fb-error" } "); earlier attempts' errors are not carried by the message. The broker's own dead-letterings (" code { "x-death" } ") are listed when there are." }
            @if is_operator(v) && !id.is_empty() {
                h2 { "Act on this message" }
                @if which == Which::Dead && m.dependency.is_some() && m.unreadable.is_none() {
                    form.action #replay-message method="post" action="/dead-letters/message/replay" {
                        (csrf_input(v))
                        input type="hidden" name="queue" value=(which.as_str());
                        input type="hidden" name="id" value=(id);
                        input type="hidden" name="confirm" value="replay";
                        label { "why (audited) " input type="text" name="note" maxlength="1000" required; }
                        button type="submit" { "Replay this message" }
                    }
                }
                form.action #purge-message method="post" action="/dead-letters/message/purge" {
                    (csrf_input(v))
                    input type="hidden" name="queue" value=(which.as_str());
                    input type="hidden" name="id" value=(id);
                    label { "Type " code { "purge" } " to confirm " input type="text" name="confirm" autocomplete="off" required; }
                    label { " why (audited) " input type="text" name="note" maxlength="1000" required; }
                    button type="submit" { "Purge this message" }
                }
                p.note { "Each acts on this message only (selected by its id), in the background, with a page of its own; the audit trail records it as any replay or purge." }
            }
            h2 { "Body" }
            @match detail {
                Some(d) => {
                    @let (body, json) = d.body_shown();
                    @let shown = fleet_budget::redact::truncate(&body, MESSAGE_PAGE_BODY_MAX);
                    p.note #body-note {
                        (count(d.body_bytes as u64)) " bytes"
                        @if let Some(ct) = &d.content_type { ", " (short(ct)) }
                        @if json { ", JSON (pretty-printed)" }
                        @if shown.len() < body.len() || d.body.len() < d.body_bytes { "; the first " (count(shown.len().min(d.body.len()) as u64)) " bytes are shown" }
                        ". Redacted, escaped."
                    }
                    pre #body { (t(&shown)) }
                }
                None => { p.note #body-note { "Not kept: the sample keeps the details of messages up to " (count(crate::dead_letters::DETAIL_BUDGET as u64 / 1024 / 1024)) " MB in all." } }
            }
            h2 { "Properties and headers" }
            table #headers {
                thead { tr { th { "field" } th { "type" } th { "value (redacted)" } } }
                tbody {
                    @match detail {
                        Some(d) => {
                            @for (f, shown) in fields_shown(d) {
                                tr {
                                    td.cut { (short_at(&f.name, 256)) }
                                    td { (f.kind) }
                                    td.value { (t(&shown)) @if f.whole_bytes > shown.len() { small.cut { " (" (count(f.whole_bytes as u64)) " bytes in all; the first " (count(shown.len() as u64)) " shown)" } } }
                                }
                            }
                        }
                        None => { tr { td colspan="3" { "Headers not kept for this message: the sample keeps the details of messages up to " (count(crate::dead_letters::DETAIL_BUDGET as u64 / 1024 / 1024)) " MB in all." } } }
                    }
                }
            }
        },
    )
}

/// A dry run's prediction, and the form that confirms the replay.
pub(crate) fn dry_run(
    v: &Visitor,
    q: &FilterForm,
    shown: &FilterForm,
    p: &Prediction,
    rate: f64,
    limit: Option<u64>,
    note: &str,
) -> Markup {
    layout(
        "Replay: dry run",
        Some(v),
        html! {
            p #selection { "Selected: " code { (short(shown.dependency.as_deref().unwrap_or("any dependency"))) " × " (short(shown.reason.as_deref().unwrap_or("any reason"))) " × " (short(shown.error_class.as_deref().map_or("any error class", |c| if c.is_empty() { "(none)" } else { c }))) } }
            p { "Nothing moved, nothing read: predicted from the dead-letter index. Of " (count(p.total)) " messages in the dead-letter queue:" }
            @if shown.error_class.as_deref().is_some_and(|c| c.len() > crate::dead_letters::ROW_FIELD_MAX - 4) {
                p.warning #class-cut { "This error class is as long as the dead-letter index keeps one (256 bytes): if these messages' class is longer, the replay library, which compares the class whole, moves none of them (a purge of the row does remove them)." }
            }
            @if let Some(why) = &p.estimate {
                p.warning #p-estimate { "An estimate, not exact: " (why) " (" (p.uncertain) " messages could not be placed; each is either moved or skipped)." }
            } @else {
                p #p-exact { "Exact: the index agrees with the queue." }
            }
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
    shown: &FilterForm,
    n: u64,
    sample: &Sample,
) -> Markup {
    layout(
        "Purge a group",
        Some(v),
        html! {
            p.warning { "A purge removes messages for good. The " (which.name()) " queue's index counts "
                strong #purge-count { (n) } " messages of "
                code { (short(shown.dependency.as_deref().unwrap_or("?"))) " × " (short(shown.reason.as_deref().unwrap_or("?"))) " × " (short(shown.error_class.as_deref().unwrap_or("-"))) }
                " (of " (sample.counts.as_ref().map_or(0, |c| c.depth)) " in the queue; " (exact_word(sample)) "); exactly the messages of this row go, nothing else. It runs in the background with a page of its own." }
            form #confirm-purge method="post" action="/dead-letters/purge" {
                (csrf_input(v)) (filter_fields(q))
                label { "Type " code { "purge" } " to confirm " input type="text" name="confirm" autocomplete="off" required; }
                label { " why (audited) " input type="text" name="note" maxlength="1000" required; }
                button type="submit" { "Purge for good" }
            }
        },
    )
}

/// A purge that ended within the request's deadline: what it did, and its page.
pub(crate) fn purged(v: &Visitor, which: Which, j: &JobState) -> Markup {
    layout(
        "Purged",
        Some(v),
        html! {
            p #purged { (j.removed) " messages removed from the " (which.name()) " queue; " (j.skipped) " kept." }
            p { a href={ "/replay/" (j.id) } { "The purge's page" } " · " a href={ "/dead-letters?queue=" (which.as_str()) } { "Back to the queue" } }
        },
    )
}
