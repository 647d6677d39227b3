//! The BullMQ jobs the budget refused that Node.js workers without `[amqp]` kept in BullMQ's
//! failed set (`fleet_budget::control::bullmq`): the queues with their lists' lengths, and a
//! queue's kept jobs, newest first, 50 a page. Read-only: the replay of a queue's kept jobs is
//! `budgetctl replay --bullmq-queue`, paced and audited like every replay, and the page says so.
//!
//! Every text of an entry is written by whoever can write to Redis: each passes [`short`]
//! (redacted, escaped, cut), and an entry that is no kept job is shown as such, with why.

use fleet_budget::control::bullmq::{
    KeptEntry, KeptQueue, QUEUES_MAX, RECEIVERS_SHOWN, Receivers, replays_of,
};
use maud::{Markup, html};

use super::{count, layout, pager, path_segment, short, time};
use crate::access::Visitor;

/// A length as read: a number, or the key holds something else.
fn length(n: Option<u64>) -> Markup {
    match n {
        Some(n) => html! { (count(n)) },
        None => {
            html! { span.warning title="the key holds something else: not written by fleet-budget" { "not ours" } }
        }
    }
}

fn queue_link(queue: &str) -> String {
    format!("/bullmq/queue?queue={}", path_segment(queue))
}

/// The command that replays `queue`'s kept jobs, for the operator to run.
fn replay_command(queue: &str) -> String {
    format!("budgetctl replay --bullmq-queue {queue} --dry-run")
}

/// A page of the queues with kept jobs.
pub(crate) struct QueuesPage {
    /// This page's queues, by name, with their lengths.
    pub(crate) queues: Vec<KeptQueue>,
    /// Queues found (at most [`QUEUES_MAX`]).
    pub(crate) listed: usize,
    /// Whether more than [`QUEUES_MAX`] were found.
    pub(crate) truncated: bool,
    /// The page (1-based).
    pub(crate) page: usize,
}

/// The queues whose refused jobs Node.js workers kept in BullMQ, a page of them.
pub(crate) fn queues(v: &Visitor, p: &QueuesPage) -> Markup {
    let link = |n: usize| format!("/bullmq?page={n}");
    layout(
        "BullMQ kept jobs",
        Some(v),
        html! {
            p.note { "A Node.js worker without " code { "[amqp]" } " keeps a job the budget refused in "
                "BullMQ's failed set and records it here; " code { "budgetctl replay --bullmq-queue QUEUE" }
                " puts the kept jobs back on their queue, paced by the budget and audited like every replay "
                "(" code { "--dry-run" } " first says what it would move). Read from Redis at each view." }
            @if p.listed == 0 {
                p #bullmq-none { "No BullMQ queue has kept jobs." }
            } @else {
                @if p.truncated {
                    p.note #bullmq-truncated { "More than " (count(QUEUES_MAX as u64)) " queues have lists here: the first "
                        (count(QUEUES_MAX as u64)) " by name are listed." }
                }
                (pager("bullmq-pager", p.page, p.listed, "queues, by name", &link))
                table #bullmq-queues {
                    thead { tr {
                        th { "queue" } th { "kept" } th { "dropped past the bound" }
                        th { "on their way back" } th { "parked" }
                    } }
                    tbody {
                        @for q in &p.queues {
                            tr {
                                td.cut { a href=(queue_link(&q.queue)) { (short(&q.queue)) } }
                                td.num { (length(q.kept)) }
                                td.num { (length(q.dropped)) }
                                td.num { (length(q.replay)) }
                                td.num { (length(q.parked)) }
                            }
                        }
                    }
                }
                p.note { "Dropped: kept past the list's bound of 100,000, still in BullMQ's failed set "
                    "(BullMQ's own " code { "retryJobs" } " can retry them). On their way back: moved by a replay, "
                    "waiting for the queue's " code { "ReplayReceiver" } ". Parked: set aside by a replay "
                    "(unreadable, or replayed too often)." }
            }
        },
    )
}

/// A page of one queue's kept jobs.
pub(crate) struct QueuePage {
    /// The queue's lengths.
    pub(crate) lengths: KeptQueue,
    /// This page's entries, newest first.
    pub(crate) entries: Vec<KeptEntry>,
    /// The page (1-based) and its first entry's offset.
    pub(crate) page: usize,
    pub(crate) from: usize,
    /// The queue's replay receivers, as they last said they were alive.
    pub(crate) receivers: Receivers,
}

/// A receiver not heard from for longer than this is taken for gone by the others (the Node.js
/// client's default `staleAfterMs`).
const STALE_MS: u64 = 60_000;

/// The queue's replay receivers: when each was last heard, and what it holds.
fn receivers(r: &Receivers) -> Markup {
    let now = fleet_budget::clock::now_ms();
    html! {
        h2 { "Replay receivers" }
        @match r.known {
            None => p.warning #bullmq-receivers-odd { "The receivers' key holds something else than a sorted set: not written by fleet-budget." },
            Some(0) => p #bullmq-receivers-none { "No replay receiver of this queue has said it is alive: kept jobs moved by a replay wait in the replay list until one runs ("
                code { "npx fleet-budget-bullmq receive --queue QUEUE" } ")." },
            Some(known) => {
                p.note { "Each receiver says every few seconds that it is alive. One not heard from for a minute (its "
                    code { "staleAfterMs" } ", by default) is taken for gone: another receiver moves the request it had in hand back to the replay list."
                    @if known > RECEIVERS_SHOWN as u64 { " The " (RECEIVERS_SHOWN) " heard from most recently of " (count(known)) " are shown." } }
                table #bullmq-receivers {
                    thead { tr { th { "receiver" } th { "last heard" } th { "in hand" } th { "state" } } }
                    tbody {
                        @for x in &r.shown {
                            tr {
                                td.cut { (short(&x.id)) }
                                td { (time::ago(Some(x.heard_ms))) }
                                td.num { (length(x.in_hand)) }
                                td { @if now.saturating_sub(x.heard_ms) > STALE_MS { span.warning { "not heard from: taken for gone" } } @else { "alive" } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One queue's kept jobs, newest first.
pub(crate) fn queue(v: &Visitor, p: &QueuePage) -> Markup {
    let q = &p.lengths;
    let total = usize::try_from(q.kept.unwrap_or(0)).unwrap_or(usize::MAX);
    let name = path_segment(&q.queue);
    let link = |n: usize| format!("/bullmq/queue?queue={name}&page={n}");
    layout(
        "BullMQ kept jobs of a queue",
        Some(v),
        html! {
            p #bullmq-queue { "Queue " strong.cut { (short(&q.queue)) } ": " (length(q.kept)) " kept, "
                (length(q.dropped)) " dropped past the bound, " (length(q.replay)) " on their way back, "
                (length(q.parked)) " parked." }
            p.note { "To put them back on their queue, paced and audited: "
                code #bullmq-command { (replay_command(&q.queue)) } ", then without " code { "--dry-run" }
                " (with " code { "--dependency" } ", " code { "--reason" } " and the other filters of "
                code { "budgetctl replay" } " to choose)." }
            @if q.kept.is_none() {
                p.warning { "The queue's kept list holds something else than a list: it was not written by fleet-budget." }
            } @else if total == 0 {
                p { "No kept job." }
            } @else {
                (pager("bullmq-jobs-pager", p.page, total, "kept jobs, newest first", &link))
                table #bullmq-jobs {
                    thead { tr {
                        th { "#" } th { "job id" } th { "task" } th { "dependency" } th { "reason" }
                        th { "error class" } th { "error" } th { "kept" } th { "replays" }
                    } }
                    tbody {
                        @for (i, e) in p.entries.iter().enumerate() {
                            @match e {
                                Ok(job) => tr {
                                    td.num { (count((p.from + i + 1) as u64)) }
                                    td.cut { (short(&job.id)) }
                                    td.cut { (short(&job.task)) }
                                    td.cut { (short(&job.dependency)) }
                                    td.cut { (short(&job.reason)) }
                                    td.cut { (short(&job.error_class)) }
                                    td.cut { (short(&job.error)) }
                                    td { (time::ago((job.at_ms > 0).then_some(job.at_ms))) }
                                    td.num { (replays_of(&job.id)) }
                                },
                                Err(why) => tr.unreadable {
                                    td.num { (count((p.from + i + 1) as u64)) }
                                    td colspan="8" { "not a kept job: " (short(why)) }
                                },
                            }
                        }
                    }
                }
            }
            (receivers(&p.receivers))
            p { a href="/bullmq" { "All queues" } }
        },
    )
}
