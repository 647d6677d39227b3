//! The replays and purges (jobs): one job's page and the list, and the words both show for a
//! job's state.

use maud::{Markup, html};

use super::{count, csrf_input, is_operator, layout, short, short_at, t, time};
use crate::access::Visitor;
use crate::replay::{JobState, Kind};

/// Why a run waits, in words (`-` when it does not): RabbitMQ's block of its connection first
/// (nothing can move then), else what holds it.
pub(crate) fn held_text(j: &JobState) -> String {
    if let Some(reason) = &j.blocked {
        return format!(
            "blocked: a RabbitMQ resource alarm ({}) blocks the replay's connection; nothing is \
             published until the broker unblocks it",
            t(reason)
        );
    }
    let dependency = t(j.paused_on.as_deref().unwrap_or("its dependency"));
    match j.held.as_deref() {
        None => "-".to_owned(),
        Some("breaker_open") => format!("held: the breaker of {dependency} is open"),
        Some("frozen") => format!("held: the budget of {dependency} is frozen by an operator"),
        Some(other) => format!("held: {dependency} ({other})"),
    }
}

/// The rate moves go at now, why it is what it is, and the time left at that rate, in words.
pub(crate) fn rate_text(j: &JobState) -> String {
    if j.kind.is_purge() {
        return "-".to_owned();
    }
    if j.queued {
        return "0/s (waiting for its turn)".to_owned();
    }
    if j.blocked.is_some() && !j.done {
        return "0/s (blocked by RabbitMQ)".to_owned();
    }
    if j.held.is_some() {
        // The last rate decided is not what a held run moves at.
        return "0/s (held)".to_owned();
    }
    let now = match j.rate_now {
        Some(r) if j.done => format!("last {r:.1}/s"),
        Some(r) => format!("{r:.1}/s"),
        None => "-".to_owned(),
    };
    let mut text = now;
    if let Some(why) = &j.pace_text
        && !j.done
    {
        text = format!("{text}, {why}");
    }
    if let Some(eta) = j.eta_secs
        && !j.done
    {
        text = format!("{text}, ETA {eta:.0}s");
    }
    text
}

pub(super) fn job_table(j: &JobState) -> Markup {
    html! {
        table #progress data-source={ "/api/replay/" (j.id) } {
            tr { th { "what" } td #j-kind { (j.kind.words()) " (" (j.queue) " queue)" } }
            tr { th { "selected" } td.value { (short_at(&j.selected, 2048)) } }
            tr { th { "by" } td { (t(&j.actor)) } }
            tr { th { "asked" } td #j-started { (time::ago(Some(j.started_ms).filter(|ms| *ms > 0))) } }
            @if let Some(of) = &j.rerun_of {
                tr { th { "runs again" } td { a href={ "/replay/" (of) } { (of) } } }
            }
            tr { th { "state" } td #j-state { (j.state()) } }
            @if j.kind.is_purge() {
                tr { th { "expected (index)" } td #j-expected { (j.expected.map_or_else(|| "-".to_owned(), count)) } }
                tr { th { "read" } td #j-seen { (j.seen) " of " (j.total) } }
                tr { th { "removed" } td #j-removed { (j.removed) } }
                tr { th { "kept" } td #j-skipped { (j.skipped) } }
            } @else {
                tr { th { "held" } td #j-held { (held_text(j)) } }
                tr { th { "rate now" } td #j-rate { (rate_text(j)) } }
                tr { th { "rate at most" } td { (j.rate) " messages/s" } }
                tr { th { "rate cuts" } td #j-slowdowns { (j.slowdowns) } }
                tr { th { "read" } td #j-seen { (j.seen) " of " (j.total) } }
                tr { th { "moved" } td #j-moved { (j.moved) } }
                tr { th { "parked" } td #j-parked { (j.parked) } }
                tr { th { "skipped" } td #j-skipped { (j.skipped) } }
                tr { th { "failed" } td #j-failed { (j.failed) } }
            }
            tr { th { "elapsed" } td #j-elapsed { (format!("{:.1}", j.elapsed_secs)) " s" } }
            tr { th { "cancelled by" } td #j-cancelled-by { (t(j.cancel_requested_by.as_deref().unwrap_or("-"))) } }
            tr { th { "error" } td #j-error { (t(j.error.as_deref().unwrap_or("-"))) } }
        }
    }
}

/// A replay's progress; an operator may cancel it while it runs.
pub(crate) fn replay(v: &Visitor, j: &JobState) -> Markup {
    let title = match j.kind {
        Kind::Replay => "Replay".to_owned(),
        Kind::Purge => "Purge".to_owned(),
        Kind::MessageReplay | Kind::MessagePurge => {
            let what = if j.kind.is_purge() { "Purge" } else { "Replay" };
            format!(
                "{what} of message {}",
                fleet_budget::redact::truncate(&t(j.message_id.as_deref().unwrap_or("?")), 80)
            )
        }
    };
    layout(
        &title,
        Some(v),
        html! {
            @if j.interrupted {
                p.interrupted #interrupted {
                    "The console running this " (j.kind.words()) " stopped before it ended: the counts above are where its last record (every 2 s) says it stood. "
                    @if j.kind.is_purge() {
                        "Running it again removes what is left of its selection."
                    } @else {
                        "Running it again is safe: a message the first run moved is not moved twice (the replay's claims in Redis), and one whose copy it had sent without an answer is parked for an operator to decide."
                    }
                }
            }
            (job_table(j))
            @if is_operator(v) && j.done && (j.interrupted || j.error.is_some()) {
                form.inline #rerun method="post" action={ "/replay/" (j.id) "/rerun" } {
                    (csrf_input(v))
                    button type="submit" { "Run again" }
                }
            }
            @if is_operator(v) && !j.done {
                form.inline #cancel-replay method="post" action={ "/replay/" (j.id) "/cancel" } {
                    (csrf_input(v))
                    button type="submit" { "Cancel" }
                }
            }
            @if j.kind.is_purge() {
                p.note { "A purge reads the queue once: it removes the messages of its selection present at its start and puts every other one back. Cancel stops it at its next message; what it has not removed stays. Its intent is in the audit trail before the first message goes, its end when it ends." }
            } @else {
            p.note { "The replay is paced by its dependency's health: it starts slow and doubles while the replayed jobs succeed, up to the rate asked; it is halved when they fail again and climbs back when they stop; it is held while the dependency's breaker is open or an operator froze its budget, and blocked while a RabbitMQ resource alarm (memory or disk) stops every publish, going on by itself once the alarm clears. Cancel stops it at its next step; what it has not moved stays in the dead-letter queue." }
            }
        },
    )
}

/// The replays and purges of this console.
pub(crate) fn replays(v: &Visitor, jobs: &[JobState]) -> Markup {
    layout(
        "Replays and purges",
        Some(v),
        html! {
            @if jobs.is_empty() { p { "No replay or purge recorded." } }
            p.note { "Every job that has not ended is listed, this console's and those of the consoles before it (kept in Redis); of those that ended, the last ones. A job whose console stopped before it ended is interrupted, and may be run again." }
            table #jobs {
                thead { tr { th { "what" } th { "asked" } th { "selected" } th { "by" } th { "state" } th { "moved or removed" } } }
                tbody {
                    @for j in jobs {
                        tr data-state=(j.state()) {
                            td { a href={ "/replay/" (j.id) } { (j.kind.words()) } }
                            td { (time::ago(Some(j.started_ms).filter(|ms| *ms > 0))) }
                            td.cut { (short(&j.selected)) }
                            td { (t(&j.actor)) }
                            td { (j.state()) }
                            td.num { (if j.kind.is_purge() { j.removed } else { j.moved }) }
                        }
                    }
                }
            }
        },
    )
}
