//! The pages and JSON a viewer reads: the overview, one dependency, the dead letters, the
//! replays, the worker registry and the audit trail.

use super::*;

pub(super) async fn overview_page(State(app): State<Arc<App>>, h: HeaderMap) -> Page {
    let visitor = reader(&app, &h, true)?;
    let ov = within(
        &app,
        "Redis",
        crate::fleet::overview(&app.settings.config.budget, &app.store, None),
    )
    .await?;
    Ok(pages::overview(&visitor, &ov).into_response())
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
    let history = lock(&app.history).of(dep.as_str());
    let trail = within(
        &app,
        "Redis",
        app.audit
            .read(&app.store, None, None, Some(dep.as_str()), 20),
    )
    .await?;
    Ok(pages::dependency(&visitor, &dep, &ov, &history, &trail).into_response())
}

pub(super) async fn dead_letters_page(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Query(q): Query<FilterForm>,
) -> Page {
    let visitor = reader(&app, &h, true)?;
    let filter = q.filter().map_err(|e| bad(&e))?;
    let which = q.which();
    let sample = app.sample(which);
    let groups = sample.index_groups(&filter);
    Ok(pages::dead_letters(
        &visitor,
        which,
        &q,
        &sample,
        &groups,
        app.settings.dead_letter_sample,
    )
    .into_response())
}

pub(super) async fn group_page(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Query(q): Query<FilterForm>,
) -> Page {
    let visitor = reader(&app, &h, true)?;
    let filter = q.filter().map_err(|e| bad(&e))?;
    let which = q.which();
    let sample = app.sample(which);
    let class = q.error_class.clone().unwrap_or_default();
    let members = sample.members(&filter, &class, 500);
    Ok(pages::group(&visitor, which, &q, &sample, &members).into_response())
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
    let Some((message, headers)) = sample.message(&q.id) else {
        return Err(refused(
            StatusCode::NOT_FOUND,
            "no such message in the last sample (it may have been replayed, or not sampled)",
        ));
    };
    Ok(pages::message(&visitor, which, message, headers).into_response())
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
    Ok(pages::workers(&visitor, &read).into_response())
}

pub(super) async fn workers_json(State(app): State<Arc<App>>, h: HeaderMap) -> Page {
    reader(&app, &h, false)?;
    let read = within(&app, "Redis", crate::fleet::workers(&app.store)).await?;
    Ok(Json(read).into_response())
}
