//! The BullMQ kept jobs' pages (`/bullmq`, `/bullmq/queue?queue=Q`): read from Redis at each
//! view (a `SCAN` of the lists' keys and one read-only script call per queue shown; a page of
//! one queue, its lengths, one `LRANGE` of 50 and two for its replay receivers), since no
//! background reading keeps them.

use std::sync::Arc;

use axum::extract::{Query, State};
use fleet_budget::control::bullmq::{self, queue_problem};
use maud::Markup;
use serde::Deserialize;

use super::error::ConsoleError;
use super::extract::Viewer;
use super::redis;
use crate::App;
use crate::filters::some;
use crate::pages::{self, PER_PAGE, page_of};

/// The queues' page's query: the page.
#[derive(Debug, Default, Deserialize)]
pub(super) struct QueuesQuery {
    #[serde(default)]
    page: Option<String>,
}

pub(super) async fn queues_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Query(q): Query<QueuesQuery>,
) -> Result<Markup, ConsoleError> {
    let found = redis(&app, bullmq::kept_queues(&app.store)).await?;
    let listed = found.queues.len();
    let (from, page) = page_of(q.page.as_deref(), listed);
    let shown = found
        .queues
        .get(from..(from + PER_PAGE).min(listed))
        .unwrap_or_default();
    let queues = redis(&app, bullmq::kept_lengths(&app.store, shown)).await?;
    Ok(pages::bullmq::queues(
        &visitor,
        &pages::bullmq::QueuesPage {
            queues,
            listed,
            truncated: found.truncated,
            page,
        },
    ))
}

/// A queue's page's query: the queue and the page.
#[derive(Debug, Default, Deserialize)]
pub(super) struct QueueQuery {
    #[serde(default)]
    queue: Option<String>,
    #[serde(default)]
    page: Option<String>,
}

pub(super) async fn queue_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Query(q): Query<QueueQuery>,
) -> Result<Markup, ConsoleError> {
    let queue = some(q.queue.as_ref())
        .ok_or_else(|| ConsoleError::BadRequest("`queue` names no BullMQ queue".to_owned()))?;
    if let Some(problem) = queue_problem(queue) {
        return Err(ConsoleError::BadRequest(format!(
            "the queue's name {}",
            pages::t(&problem)
        )));
    }
    let lengths = redis(&app, bullmq::queue_lengths(&app.store, queue)).await?;
    let total = usize::try_from(lengths.kept.unwrap_or(0)).unwrap_or(usize::MAX);
    let (from, page) = page_of(q.page.as_deref(), total);
    let entries = if total == 0 {
        Vec::new()
    } else {
        redis(
            &app,
            bullmq::kept_jobs(&app.store, queue, from as u64, PER_PAGE as u64),
        )
        .await?
    };
    let receivers = redis(&app, bullmq::receivers(&app.store, queue)).await?;
    Ok(pages::bullmq::queue(
        &visitor,
        &pages::bullmq::QueuePage {
            lengths,
            entries,
            page,
            from,
            receivers,
        },
    ))
}
