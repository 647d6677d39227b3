//! The changes an operator makes: overrides, a sample refresh, a replay's dry run and start, a
//! purge, a cancel.

use super::*;
use fleet_budget_amqp::ReplayFilter;

/// An override from the page.
#[derive(Debug, Deserialize)]
pub(super) struct OverrideForm {
    csrf: Option<String>,
    action: String,
    #[serde(default)]
    minutes: Option<String>,
    #[serde(default)]
    ratio: Option<String>,
    #[serde(default)]
    min_allowance: Option<String>,
    #[serde(default)]
    reason: String,
}

pub(super) async fn override_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<OverrideForm>,
) -> Page {
    let actor = changer(&app, &h, form.csrf.as_deref())?;
    let dep = dependency(&name)?;
    let reason = form.reason.trim();
    if reason.is_empty() {
        return Err(bad("say why: the reason goes into the audit trail"));
    }
    let duration = || -> Result<Duration, Response> {
        let minutes: f64 = some(form.minutes.as_ref())
            .ok_or_else(|| bad("say for how long (minutes)"))?
            .parse()
            .map_err(|_| bad("the duration is a number of minutes"))?;
        let d = Duration::try_from_secs_f64(minutes * 60.0)
            .map_err(|_| bad("the duration is a positive number of minutes"))?;
        if d.is_zero() || d > MAX_OVERRIDE_DURATION {
            return Err(bad("an override lasts more than 0 and at most 366 days"));
        }
        Ok(d)
    };
    let action = match form.action.as_str() {
        "freeze" => OverrideAction::Freeze {
            duration: duration()?,
        },
        "unfreeze" => OverrideAction::Unfreeze,
        "clear" => OverrideAction::Clear,
        "set" => {
            let ratio = match some(form.ratio.as_ref()) {
                Some(r) => Some(
                    r.parse::<f64>()
                        .ok()
                        .filter(|r| r.is_finite() && *r >= 0.0)
                        .ok_or_else(|| bad("the ratio is a number ≥ 0"))?,
                ),
                None => None,
            };
            let min_allowance = match some(form.min_allowance.as_ref()) {
                Some(m) => Some(
                    m.parse::<u64>()
                        .map_err(|_| bad("the floor is a whole number ≥ 0"))?,
                ),
                None => None,
            };
            if ratio.is_none() && min_allowance.is_none() {
                return Err(bad("a set override replaces the ratio, the floor, or both"));
            }
            OverrideAction::Set {
                duration: duration()?,
                ratio,
                min_allowance,
            }
        }
        _ => return Err(bad("the action is freeze, unfreeze, set or clear")),
    };
    within(
        &app,
        "Redis",
        overrides::apply(&app.store, &app.audit, &dep, action, &actor, reason),
    )
    .await?;
    Ok(Redirect::to(&format!(
        "/dependency/{}",
        pages::path_segment(dep.as_str())
    ))
    .into_response())
}
#[derive(Debug, Deserialize)]
pub(super) struct CsrfForm {
    pub(super) csrf: Option<String>,
}

pub(super) async fn refresh_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Page {
    changer(&app, &h, f.csrf.as_deref())?;
    app.sample_wanted
        .store(true, std::sync::atomic::Ordering::Relaxed);
    app.refresh_now.notify_one();
    Ok(Redirect::to("/dead-letters").into_response())
}

/// What a form selects: the library's filter, and the form as the page shows it. A form from a
/// group's row names the group by its short key (`g`): the group's text is never put in a page
/// (an error class may hold a secret, which the page shows redacted), it is read here from the
/// queue's index. An empty error class selects the messages without one.
fn selection(app: &App, form: &FilterForm) -> Result<(FilterForm, ReplayFilter), Response> {
    let Some(key) = some(form.g.as_ref()) else {
        let filter = form.filter().map_err(|e| bad(&e))?;
        return Ok((form.clone(), filter));
    };
    let rest = FilterForm {
        dependency: None,
        reason: None,
        error_class: None,
        g: None,
        ..form.clone()
    };
    let sample = app.sample(form.which());
    let group = sample
        .group_by_key(&rest.filter().map_err(|e| bad(&e))?, key)
        .ok_or_else(|| {
            refused(
                StatusCode::NOT_FOUND,
                "no such group in the queue's index now (replayed or purged since?)",
            )
        })?;
    let shown = FilterForm {
        dependency: Some(group.dependency.clone()),
        reason: Some(group.reason.clone()),
        error_class: Some(group.error_class.clone()),
        ..rest
    };
    let mut filter = FilterForm {
        error_class: None,
        ..shown.clone()
    }
    .filter()
    .map_err(|e| bad(&e))?;
    filter.error_class = Some(group.error_class);
    Ok((shown, filter))
}

fn run_context(app: &App) -> RunContext {
    RunContext {
        config: app.settings.config.clone(),
        store: app.store.clone(),
        audit: app.audit,
        queue_work: app.queue_work.clone(),
        done: app.refresh_now.clone(),
    }
}

/// A replay's or purge's form: the filter, and how.
#[derive(Debug, Deserialize)]
pub(super) struct ActionForm {
    csrf: Option<String>,
    #[serde(flatten)]
    filter: FilterForm,
    #[serde(default)]
    rate: Option<String>,
    #[serde(default)]
    limit: Option<String>,
    #[serde(default)]
    note: String,
    #[serde(default)]
    confirm: Option<String>,
}

impl ActionForm {
    fn rate(&self) -> Result<f64, Response> {
        match some(self.rate.as_ref()) {
            None => Ok(50.0),
            Some(r) => r
                .parse::<f64>()
                .ok()
                .filter(|r| r.is_finite() && *r >= 1.0 && *r <= 1_000_000.0)
                .ok_or_else(|| bad("the rate is 1 to 1,000,000 messages per second")),
        }
    }

    fn limit(&self) -> Result<Option<u64>, Response> {
        match some(self.limit.as_ref()) {
            None => Ok(None),
            Some(l) => l
                .parse::<u64>()
                .ok()
                .filter(|l| *l >= 1)
                .map(Some)
                .ok_or_else(|| bad("the limit is a whole number ≥ 1")),
        }
    }
}

pub(super) async fn dry_run_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Page {
    let visitor = reader(&app, &h, false)?;
    changer(&app, &h, f.csrf.as_deref())?;
    let (shown, filter) = selection(&app, &f.filter)?;
    if filter.dependency.is_none() {
        return Err(bad(
            "a replay names its dependency (as `budgetctl replay --dependency`)",
        ));
    }
    let rate = f.rate()?;
    let limit = f.limit()?;
    // A dry run reads no message (the index and the depth): it never waits for a replay, a
    // purge or a sample that moves messages.
    let prediction = within(
        &app,
        "RabbitMQ",
        replay::dry_run(&app.settings.config, &app.store, &filter, limit),
    )
    .await;
    let prediction = prediction?;
    Ok(pages::dry_run(
        &visitor,
        &f.filter,
        &shown,
        &prediction,
        rate,
        limit,
        &f.note,
    )
    .into_response())
}

pub(super) async fn replay_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Page {
    let actor = changer(&app, &h, f.csrf.as_deref())?;
    let (_, filter) = selection(&app, &f.filter)?;
    if filter.dependency.is_none() {
        return Err(bad("a replay names its dependency"));
    }
    if f.confirm.as_deref() != Some("replay") {
        return Err(bad("confirm the replay on its dry run's page"));
    }
    let note = f.note.trim();
    if note.is_empty() {
        return Err(bad("say why: the note goes into the audit trail"));
    }
    let id = replay::start(
        &app.jobs,
        run_context(&app),
        filter,
        f.rate()?,
        f.limit()?,
        actor,
        note.to_owned(),
    )
    .map_err(|e| refused(StatusCode::TOO_MANY_REQUESTS, &e))?;
    Ok(Redirect::to(&format!("/replay/{id}")).into_response())
}

pub(super) async fn purge_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Page {
    let visitor = reader(&app, &h, false)?;
    let actor = changer(&app, &h, f.csrf.as_deref())?;
    let (shown, filter) = selection(&app, &f.filter)?;
    let which = f.filter.which();
    if filter.dependency.is_none() || filter.reason.is_none() {
        return Err(bad("a purge names a group: its dependency and reason"));
    }
    let note = f.note.trim();
    if f.confirm.as_deref() != Some("purge") || note.is_empty() {
        // The confirmation: what would go, from the index, and a form that needs the word.
        let sample = app.sample(which);
        let count = sample.counts.as_ref().map_or(0, |c| {
            c.matching(|row| filter.selects_row(row) != Some(false))
        });
        return Ok(
            pages::purge_confirm(&visitor, which, &f.filter, &shown, count, &sample)
                .into_response(),
        );
    }
    // A job of its own: a purge is never cut off half-way by the request's deadline (a read
    // dropped there would leave copies beside their originals). One that ends within the
    // deadline answers what it did; a longer one answers with its page, which follows it.
    let id = replay::start_purge(
        &app.jobs,
        run_context(&app),
        which == Which::Parked,
        filter,
        None,
        actor,
        note.to_owned(),
    )
    .map_err(|e| refused(StatusCode::TOO_MANY_REQUESTS, &e))?;
    match wait_for_job(&app, &id).await {
        Some(job) if job.error.is_none() => {
            Ok(pages::purged(&visitor, which, &job).into_response())
        }
        Some(job) => Err(refused(
            StatusCode::BAD_GATEWAY,
            &format!("the purge failed: {}", job.error.unwrap_or_default()),
        )),
        None => Ok(Redirect::to(&format!("/replay/{id}")).into_response()),
    }
}

/// Job `id` once it ended, within the upstream deadline; `None` if it has not.
async fn wait_for_job(app: &App, id: &str) -> Option<replay::JobState> {
    let deadline = tokio::time::Instant::now() + app.settings.upstream_timeout;
    loop {
        match app.jobs.get(id) {
            Some(job) if job.done => return Some(job),
            None => return None,
            Some(_) => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A replay or purge of one message, from its page.
#[derive(Debug, Deserialize)]
pub(super) struct MessageForm {
    csrf: Option<String>,
    #[serde(default)]
    queue: Option<String>,
    id: String,
    #[serde(default)]
    note: String,
    #[serde(default)]
    confirm: Option<String>,
}

impl MessageForm {
    /// The message, as the last sample read it, and the note; refused without them.
    fn message(
        &self,
        app: &App,
    ) -> Result<(Which, fleet_budget_amqp::replay::QueuedMessage, String), Response> {
        let which = Which::parse(self.queue.as_deref());
        let note = self.note.trim();
        if note.is_empty() {
            return Err(bad("say why: the note goes into the audit trail"));
        }
        let sample = app.sample(which);
        let Some((s, _)) = sample.message(&self.id) else {
            return Err(refused(
                StatusCode::NOT_FOUND,
                "no such message in the last sample (it may have been replayed or purged)",
            ));
        };
        Ok((which, s.message.clone(), note.to_owned()))
    }
}

/// Replays one message of the dead-letter queue, selected by its id (and its dependency, which
/// paces the replay), in the background; answers with the job's page.
pub(super) async fn message_replay_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Form(f): Form<MessageForm>,
) -> Page {
    let actor = changer(&app, &h, f.csrf.as_deref())?;
    if f.confirm.as_deref() != Some("replay") {
        return Err(bad("confirm the replay on the message's page"));
    }
    let (which, m, note) = f.message(&app)?;
    if which != Which::Dead {
        return Err(bad(
            "only a dead letter is replayed from here (`budgetctl parked replay` replays parked messages)",
        ));
    }
    let Some(dependency) = m.dependency.clone().filter(|_| m.unreadable.is_none()) else {
        return Err(bad(
            "this message's dead-letter headers cannot be read: a replay would park it; purge it instead",
        ));
    };
    let filter = fleet_budget_amqp::ReplayFilter {
        dependency: Some(dependency),
        message_id: Some(f.id),
        ..fleet_budget_amqp::ReplayFilter::default()
    };
    let id = replay::start(
        &app.jobs,
        run_context(&app),
        filter,
        50.0,
        Some(1),
        actor,
        note,
    )
    .map_err(|e| refused(StatusCode::TOO_MANY_REQUESTS, &e))?;
    Ok(Redirect::to(&format!("/replay/{id}")).into_response())
}

/// Purges one message of the dead-letter or parked queue, selected by its id, in the
/// background; answers with the job's page.
pub(super) async fn message_purge_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Form(f): Form<MessageForm>,
) -> Page {
    let actor = changer(&app, &h, f.csrf.as_deref())?;
    if f.confirm.as_deref().map(str::trim) != Some("purge") {
        return Err(bad("type `purge` to confirm"));
    }
    let (which, m, note) = f.message(&app)?;
    let filter = fleet_budget_amqp::ReplayFilter {
        dependency: m.dependency.clone().filter(|_| m.unreadable.is_none()),
        message_id: Some(f.id),
        // A message whose headers cannot be read is selected only with `malformed`.
        malformed: m.unreadable.is_some(),
        ..fleet_budget_amqp::ReplayFilter::default()
    };
    let id = replay::start_purge(
        &app.jobs,
        run_context(&app),
        which == Which::Parked,
        filter,
        Some(1),
        actor,
        note,
    )
    .map_err(|e| refused(StatusCode::TOO_MANY_REQUESTS, &e))?;
    Ok(Redirect::to(&format!("/replay/{id}")).into_response())
}

/// A cancel from a replay's page: only the CSRF token.
#[derive(Debug, Deserialize)]
pub(super) struct CancelForm {
    csrf: Option<String>,
}

/// Cancels a running replay: recorded in the audit trail first (who, which run), then asked of
/// the run, which puts back what it has not moved and records its own entry, marked cancelled.
pub(super) async fn cancel_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<CancelForm>,
) -> Page {
    let actor = changer(&app, &h, f.csrf.as_deref())?;
    let job = app
        .jobs
        .get(&id)
        .ok_or_else(|| refused(StatusCode::NOT_FOUND, "no such replay or purge"))?;
    if job.done {
        return Err(refused(StatusCode::CONFLICT, "it has ended already"));
    }
    let cx = run_context(&app);
    within(&app, "Redis", replay::audit_cancel(&cx, &job, &actor)).await?;
    match app.jobs.cancel(&id, &actor) {
        (replay::Cancel::Unknown, _) => Err(refused(StatusCode::NOT_FOUND, "no such replay")),
        // Ended between the look and the ask: the trail says it was asked, the page how it ended.
        (replay::Cancel::Asked | replay::Cancel::Ended, _) => {
            Ok(Redirect::to(&format!("/replay/{id}")).into_response())
        }
    }
}
