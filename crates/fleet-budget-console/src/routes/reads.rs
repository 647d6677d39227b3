//! The pages and JSON a viewer reads: the overview, one dependency, the dead letters, the
//! replays, the worker registry and the audit trail. Each handler takes a [`Viewer`].

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Json, Response};
use fleet_budget::control::AuditEntry;
use maud::Markup;
use serde::Deserialize;

use super::error::ConsoleError;
use super::extract::Viewer;
use super::{dependency, redis};
use crate::App;
use crate::access::lock;
use crate::dead_letters::{Group, Sort, Which};
use crate::filters::{FilterForm, some};
use crate::pages::{self, AuditPage};

/// The overview's query: the page.
#[derive(Debug, Default, Deserialize)]
pub(super) struct OverviewQuery {
    #[serde(default)]
    page: Option<String>,
}

/// One page of the overview, read now.
async fn overview_page_of(
    app: &App,
    q: &OverviewQuery,
) -> Result<pages::OverviewPage, ConsoleError> {
    let ov = redis(
        app,
        crate::fleet::overview(&app.settings.config.budget, &app.store, None),
    )
    .await?;
    Ok(pages::OverviewPage::new(
        ov,
        q.page.as_deref(),
        &lock(&app.history),
    ))
}

pub(super) async fn overview_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Query(q): Query<OverviewQuery>,
) -> Result<Markup, ConsoleError> {
    let shown = overview_page_of(&app, &q).await?;
    let dead = app.sample(Which::Dead);
    let parked = app.sample(Which::Parked);
    Ok(pages::overview(&visitor, &shown, [&dead, &parked]))
}

/// The overview's rows, pager and workers' line, rendered as on the page: what its live
/// refresh swaps in.
pub(super) async fn overview_fragment(
    State(app): State<Arc<App>>,
    _: Viewer,
    Query(q): Query<OverviewQuery>,
) -> Result<Markup, ConsoleError> {
    let shown = overview_page_of(&app, &q).await?;
    Ok(pages::overview_fragment(&shown))
}

pub(super) async fn overview_json(
    State(app): State<Arc<App>>,
    _: Viewer,
) -> Result<Response, ConsoleError> {
    let ov = redis(
        &app,
        crate::fleet::overview(&app.settings.config.budget, &app.store, None),
    )
    .await?;
    Ok(Json(ov).into_response())
}

pub(super) async fn dependency_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Path(name): Path<String>,
) -> Result<Markup, ConsoleError> {
    let dep = dependency(&name)?;
    let ov = redis(
        &app,
        crate::fleet::overview(&app.settings.config.budget, &app.store, Some(&dep)),
    )
    .await?;
    let (history, hour) = {
        let kept = lock(&app.history);
        (kept.of(dep.as_str()), kept.hour_of(dep.as_str()))
    };
    let mut trail = redis(
        &app,
        app.audit
            .read(&app.store, None, None, Some(dep.as_str()), 20),
    )
    .await?;
    trail.reverse();
    Ok(pages::dependency(
        &visitor, &dep, &ov, &history, &hour, &trail,
    ))
}

/// A list's query: the filters (with `g`, a group's short key), the page and the sort.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    #[serde(flatten)]
    filter: FilterForm,
    #[serde(default)]
    page: Option<String>,
    #[serde(default)]
    sort: Option<String>,
}

pub(super) async fn dead_letters_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Query(q): Query<ListQuery>,
) -> Result<Markup, ConsoleError> {
    let filter = q.filter.filter().map_err(ConsoleError::BadRequest)?;
    let which = q.filter.which();
    let sort = Sort::parse(q.sort.as_deref());
    let sample = app.sample(which);
    let groups = sample.index_groups(&filter, sort);
    let (offset, page) = pages::page_of(q.page.as_deref(), groups.len());
    let shown: Vec<Group> = groups
        .iter()
        .skip(offset)
        .take(pages::PER_PAGE)
        .cloned()
        .collect();
    Ok(pages::dead_letters(
        &visitor,
        which,
        &q.filter,
        sort,
        page,
        &sample,
        &shown,
        groups.len(),
        app.settings.dead_letter_sample,
    ))
}

pub(super) async fn group_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Query(q): Query<ListQuery>,
) -> Result<Markup, ConsoleError> {
    let which = q.filter.which();
    let sample = app.sample(which);
    // The group by its key (links carry it), or by its fields (older links, typed addresses).
    let group = match some(q.filter.g.as_ref()) {
        Some(key) => {
            let filter = q.filter.filter().map_err(ConsoleError::BadRequest)?;
            sample.group_by_key(&filter, key).ok_or_else(|| {
                ConsoleError::NotFound(
                    "no such group in the queue's index now (replayed or purged since?)".to_owned(),
                )
            })?
        }
        None => Group {
            dependency: q.filter.dependency.clone().unwrap_or_default(),
            reason: q.filter.reason.clone().unwrap_or_default(),
            error_class: q.filter.error_class.clone().unwrap_or_default(),
            count: 0,
            oldest_ms: None,
        },
    };
    let form = FilterForm {
        g: None,
        dependency: Some(group.dependency.clone()).filter(|d| !d.is_empty()),
        reason: Some(group.reason.clone())
            .filter(|r| fleet_budget::DeadLetterReason::parse(r).is_some()),
        error_class: None,
        ..q.filter.clone()
    };
    let filter = form.filter().map_err(ConsoleError::BadRequest)?;
    let group = if q.filter.g.is_none() {
        let counted = sample.group_by_key(&filter, &group.key());
        counted.unwrap_or(group)
    } else {
        group
    };
    let sort = Sort::parse(q.sort.as_deref());
    let (_, total) = sample.members(&filter, &group.error_class, sort, 0, 0);
    let (offset, page) = pages::page_of(q.page.as_deref(), total);
    let (members, total) =
        sample.members(&filter, &group.error_class, sort, offset, pages::PER_PAGE);
    Ok(pages::group(
        &visitor, which, &q.filter, &group, sort, page, &sample, &members, total,
    ))
}

#[derive(Debug, Deserialize)]
pub(super) struct MessageQuery {
    #[serde(default)]
    queue: Option<String>,
    id: String,
}

pub(super) async fn message_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Query(q): Query<MessageQuery>,
) -> Result<Markup, ConsoleError> {
    let which = Which::parse(q.queue.as_deref());
    let sample = app.sample(which);
    let Some((message, detail)) = sample.message(&q.id) else {
        return Err(ConsoleError::NotFound(
            "no such message in the last sample (it may have been replayed, or not sampled)"
                .to_owned(),
        ));
    };
    Ok(pages::message(
        &visitor,
        which,
        sample.taken_ms,
        message,
        detail,
    ))
}

pub(super) async fn replays_page(State(app): State<Arc<App>>, Viewer(visitor): Viewer) -> Markup {
    pages::replays(&visitor, &app.jobs.list().await)
}

pub(super) async fn replay_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Path(id): Path<String>,
) -> Result<Markup, ConsoleError> {
    let job = app
        .jobs
        .lookup(&id)
        .await
        .ok_or_else(|| ConsoleError::NotFound("no such replay".to_owned()))?;
    Ok(pages::replay(&visitor, &job))
}

pub(super) async fn replay_json(
    State(app): State<Arc<App>>,
    _: Viewer,
    Path(id): Path<String>,
) -> Result<Response, ConsoleError> {
    let mut job = app
        .jobs
        .lookup(&id)
        .await
        .ok_or_else(|| ConsoleError::NotFound("no such replay".to_owned()))?;
    // The run's fields, and the words its page shows for them (one wording, the server's).
    // Its texts through the one door for outside text, as on its page.
    job.selected = pages::t(&job.selected);
    job.actor = pages::t(&job.actor);
    job.error = job.error.as_deref().map(pages::t);
    job.message_id = job.message_id.as_deref().map(pages::t);
    let mut body = serde_json::to_value(&job).unwrap_or_default();
    if let Some(o) = body.as_object_mut() {
        o.insert("state".to_owned(), job.state().into());
        o.insert("held_text".to_owned(), pages::held_text(&job).into());
        o.insert("rate_text".to_owned(), pages::rate_text(&job).into());
    }
    Ok(Json(body).into_response())
}

/// The audit page's query: a dependency, and the page (the id of its newest entry).
#[derive(Debug, Default, Deserialize)]
pub(super) struct AuditQuery {
    #[serde(default)]
    dependency: Option<String>,
    #[serde(default)]
    before: Option<String>,
}

/// A stream id (`ms-seq`) as a pair that orders as the stream does.
fn stream_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

pub(super) async fn audit_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    Query(q): Query<AuditQuery>,
) -> Result<Markup, ConsoleError> {
    let dependency = some(q.dependency.as_ref()).map(str::to_owned);
    if let Some(d) = &dependency {
        super::dependency(d)?;
    }
    let before = match some(q.before.as_ref()) {
        Some(b) => Some(stream_id(b).ok_or_else(|| {
            ConsoleError::BadRequest("`before` is an entry's id (MS-SEQ)".to_owned())
        })?),
        None => None,
    };
    // The page's entries and one more (is there an older page?), and room for the entries
    // of the cursor's own millisecond that were shown already.
    let per = pages::PER_PAGE;
    let read = redis(
        &app,
        app.audit.read(
            &app.store,
            None,
            before.map(|(ms, _)| ms),
            dependency.as_deref(),
            per + 64,
        ),
    )
    .await?;
    let mut entries: Vec<AuditEntry> = read
        .into_iter()
        .rev()
        .filter(|e| before.is_none_or(|b| stream_id(&e.id).is_some_and(|id| id <= b)))
        .take(per + 1)
        .collect();
    let older = if entries.len() > per {
        entries.pop().map(|e| e.id)
    } else {
        None
    };
    Ok(pages::audit(
        &visitor,
        &AuditPage {
            entries,
            dependency,
            older,
            paged: before.is_some(),
        },
    ))
}

pub(super) async fn workers_page(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
) -> Result<Markup, ConsoleError> {
    let read = redis(&app, crate::fleet::workers(&app.store)).await?;
    Ok(pages::workers(&visitor, &crate::fleet::workers_shown(read)))
}

pub(super) async fn workers_json(
    State(app): State<Arc<App>>,
    _: Viewer,
) -> Result<Response, ConsoleError> {
    let read = redis(&app, crate::fleet::workers(&app.store)).await?;
    Ok(Json(crate::fleet::workers_shown(read)).into_response())
}
