//! The pages and JSON a viewer reads: the overview, one dependency, the dead letters, the
//! replays, the worker registry and the audit trail.

use super::*;
use crate::dead_letters::{Group, Sort};

/// The overview's query: the page.
#[derive(Debug, Default, Deserialize)]
pub(super) struct OverviewQuery {
    #[serde(default)]
    page: Option<String>,
}

/// One page of the overview, read now.
async fn overview_page_of(app: &App, q: &OverviewQuery) -> Result<pages::OverviewPage, Response> {
    let ov = within(
        app,
        "Redis",
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
    h: HeaderMap,
    Query(q): Query<OverviewQuery>,
) -> Page {
    let visitor = reader(&app, &h, true)?;
    let shown = overview_page_of(&app, &q).await?;
    let dead = app.sample(Which::Dead);
    let parked = app.sample(Which::Parked);
    Ok(pages::overview(&visitor, &shown, [&dead, &parked]).into_response())
}

/// The overview's rows, pager and workers' line, rendered as on the page: what its live
/// refresh swaps in.
pub(super) async fn overview_fragment(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Query(q): Query<OverviewQuery>,
) -> Page {
    reader(&app, &h, false)?;
    let shown = overview_page_of(&app, &q).await?;
    Ok(pages::overview_fragment(&shown).into_response())
}

pub(super) async fn overview_json(State(app): State<Arc<App>>, h: HeaderMap) -> Page {
    reader(&app, &h, false)?;
    let ov = within(
        &app,
        "Redis",
        crate::fleet::overview(&app.settings.config.budget, &app.store, None),
    )
    .await?;
    Ok(Json(ov).into_response())
}

pub(super) async fn dependency_page(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Path(name): Path<String>,
) -> Page {
    let visitor = reader(&app, &h, true)?;
    let dep = dependency(&name)?;
    let ov = within(
        &app,
        "Redis",
        crate::fleet::overview(&app.settings.config.budget, &app.store, Some(&dep)),
    )
    .await?;
    let (history, hour) = {
        let kept = lock(&app.history);
        (kept.of(dep.as_str()), kept.hour_of(dep.as_str()))
    };
    let trail = within(
        &app,
        "Redis",
        app.audit
            .read(&app.store, None, None, Some(dep.as_str()), 20),
    )
    .await?;
    Ok(pages::dependency(&visitor, &dep, &ov, &history, &hour, &trail).into_response())
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
    h: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Page {
    let visitor = reader(&app, &h, true)?;
    let filter = q.filter.filter().map_err(|e| bad(&e))?;
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
    )
    .into_response())
}

pub(super) async fn group_page(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Page {
    let visitor = reader(&app, &h, true)?;
    let which = q.filter.which();
    let sample = app.sample(which);
    // The group by its key (links carry it), or by its fields (older links, typed addresses).
    let group = match some(q.filter.g.as_ref()) {
        Some(key) => {
            let filter = q.filter.filter().map_err(|e| bad(&e))?;
            sample.group_by_key(&filter, key).ok_or_else(|| {
                refused(
                    StatusCode::NOT_FOUND,
                    "no such group in the queue's index now (replayed or purged since?)",
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
    let filter = form.filter().map_err(|e| bad(&e))?;
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
    )
    .into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct MessageQuery {
    #[serde(default)]
    queue: Option<String>,
    id: String,
}

pub(super) async fn message_page(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Query(q): Query<MessageQuery>,
) -> Page {
    let visitor = reader(&app, &h, true)?;
    let which = Which::parse(q.queue.as_deref());
    let sample = app.sample(which);
    let Some((message, detail)) = sample.message(&q.id) else {
        return Err(refused(
            StatusCode::NOT_FOUND,
            "no such message in the last sample (it may have been replayed, or not sampled)",
        ));
    };
    Ok(pages::message(&visitor, which, sample.taken_ms, message, detail).into_response())
}

pub(super) async fn replays_page(State(app): State<Arc<App>>, h: HeaderMap) -> Page {
    let visitor = reader(&app, &h, true)?;
    Ok(pages::replays(&visitor, &app.jobs.all()).into_response())
}

pub(super) async fn replay_page(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Page {
    let visitor = reader(&app, &h, true)?;
    let job = app
        .jobs
        .get(&id)
        .ok_or_else(|| refused(StatusCode::NOT_FOUND, "no such replay"))?;
    Ok(pages::replay(&visitor, &job).into_response())
}

pub(super) async fn replay_json(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Page {
    reader(&app, &h, false)?;
    let job = app
        .jobs
        .get(&id)
        .ok_or_else(|| refused(StatusCode::NOT_FOUND, "no such replay"))?;
    // The run's fields, and the words its page shows for them (one wording, the server's).
    // Its texts through the one door for outside text, as on its page.
    let mut job = job;
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

pub(super) async fn audit_page(State(app): State<Arc<App>>, h: HeaderMap) -> Page {
    let visitor = reader(&app, &h, true)?;
    let trail = within(
        &app,
        "Redis",
        app.audit.read(&app.store, None, None, None, 200),
    )
    .await?;
    Ok(pages::audit(&visitor, &trail).into_response())
}

pub(super) async fn workers_page(State(app): State<Arc<App>>, h: HeaderMap) -> Page {
    let visitor = reader(&app, &h, true)?;
    let read = within(&app, "Redis", crate::fleet::workers(&app.store)).await?;
    Ok(pages::workers(&visitor, &crate::fleet::workers_shown(read)).into_response())
}

pub(super) async fn workers_json(State(app): State<Arc<App>>, h: HeaderMap) -> Page {
    reader(&app, &h, false)?;
    let read = within(&app, "Redis", crate::fleet::workers(&app.store)).await?;
    Ok(Json(crate::fleet::workers_shown(read)).into_response())
}
