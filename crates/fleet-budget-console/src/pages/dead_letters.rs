//! The dead letters: the sample's groups, one group's messages, one message, and the pages
//! before and after a replay or purge (dry run, purge confirmation, purged).

use super::*;

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
        input type="hidden" name="error_class" value=(v(&q.error_class));
        input type="hidden" name="malformed" value=(v(&q.malformed));
    }
}

/// What the groups' counts are: the queue's depth and its index, exact or an estimate and why.
pub(super) fn counts_note(sample: &Sample) -> Markup {
    html! {
        p.counts #counts {
            @match &sample.counts {
                None => { "The counts of this queue are being read." }
                Some(c) => {
                    (c.depth) " messages in " code { (t(&c.queue)) } " (its depth); the groups count "
                    (c.indexed()) " of them, from the dead-letter index, reading no message. "
                    @if c.exact() {
                        strong #counts-exact { "Exact." }
                    } @else {
                        strong #counts-estimate { "An estimate" } ": " (t(&c.why_estimate().unwrap_or_default())) "."
                    }
                }
            }
            @if let Some(e) = &sample.counts_error { br; span.error { "The last read of the counts failed: " (t(e)) } }
        }
    }
}

pub(super) fn sample_note(sample: &Sample, bound: u64) -> Markup {
    html! {
        p.sample #sample {
            @if sample.taken_ms == 0 {
                "No messages of this queue have been read: a read puts each message back as a copy, so it happens only when asked (\"Read messages now\")."
            } @else {
                "Sampled " (sample.sampled) " of " (sample.depth) " messages in " code { (t(&sample.queue)) }
                " " (age(Some(sample.taken_ms))) " ago (read in " (format!("{:.1}", sample.took.as_secs_f64())) " s; at most "
                (bound) " per read): the messages shown one by one are of this sample."
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
                                    @let group = FilterForm { queue: Some(which.as_str().to_owned()), dependency: Some(g.dependency.clone()), reason: Some(g.reason.clone()), error_class: Some(g.error_class.clone()), ..q.clone() };
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
            p.note { "A replay or purge from a row selects that row: its dependency, reason and error class (and the filters above), nothing else." }
        },
    )
}

pub(super) fn message_rows(which: Which, members: &[&Sampled]) -> Markup {
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
            p { "Nothing moved, nothing read: predicted from the dead-letter index. Of " (p.total) " messages in the dead-letter queue:" }
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
    count: u64,
    sample: &Sample,
) -> Markup {
    layout(
        "Purge a group",
        Some(v),
        html! {
            p.warning { "A purge removes messages for good. The " (which.name()) " queue's index counts "
                strong #purge-count { (count) } " messages of "
                code { (t(q.dependency.as_deref().unwrap_or("?"))) " × " (t(q.reason.as_deref().unwrap_or("?"))) " × " (t(q.error_class.as_deref().unwrap_or("-"))) }
                " (of " (sample.counts.as_ref().map_or(0, |c| c.depth)) " in the queue); exactly the messages of this row go, nothing else." }
            form #confirm-purge method="post" action="/dead-letters/purge" {
                (csrf_input(v)) (filter_fields(q))
                label { "Type " code { "purge" } " to confirm " input type="text" name="confirm" autocomplete="off" required; }
                label { " why (audited) " input type="text" name="note" maxlength="1000" required; }
                button type="submit" { "Purge for good" }
            }
        },
    )
}

/// A purge still running when the request's deadline came: not cut off, it goes on.
pub(crate) fn purging(v: &Visitor, which: Which) -> Markup {
    layout(
        "Purging",
        Some(v),
        html! {
            p #purging { "The purge of the " (which.name()) " queue is still running: it goes on in the background, it was not cut off. Its intent is in the audit trail, and its end will be when it finishes." }
            p { a href="/audit" { "The audit trail" } " · " a href={ "/dead-letters?queue=" (which.as_str()) } { "Back to the queue" } }
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
