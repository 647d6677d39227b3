//! The changes an operator makes: overrides, shadow or enforcement, a sample refresh, a replay's dry run and start, a
//! purge, a cancel, a run again. Each handler takes an [`Operator`] (its checks are done before
//! it runs) and validates what the form asks, in `budgetctl`'s words, before anything is sent
//! to Redis or RabbitMQ.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use fleet_budget::control::OverrideAction;
use fleet_budget::control::enforcement;
use fleet_budget::control::overrides::{self, MAX_OVERRIDE_DURATION, MAX_REASON_BYTES};
use fleet_budget::decision::Enforcement;
use fleet_budget_amqp::ReplayFilter;
use fleet_budget_amqp::replay::QueuedMessage;
use serde::Deserialize;

use super::error::ConsoleError;
use super::extract::Operator;
use super::{dependency, rabbitmq, redis};
use crate::App;
use crate::dead_letters::Which;
use crate::filters::{FilterForm, some};
use crate::pages;
use crate::replay::{self, Ask, RunContext};

/// A value of a form that is not what it must be (422), in the CLI's words.
fn invalid(why: impl Into<String>) -> ConsoleError {
    ConsoleError::Invalid(why.into())
}

/// The note or reason an action is recorded with: said, and within what the trail keeps.
fn reason_of(text: &str, what: &str) -> Result<String, ConsoleError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(invalid(format!(
            "say why: the {what} goes into the audit trail"
        )));
    }
    if text.len() > MAX_REASON_BYTES {
        return Err(invalid(format!(
            "the {what} is {} bytes long, at most {MAX_REASON_BYTES} allowed",
            text.len()
        )));
    }
    Ok(text.to_owned())
}

/// An override from the page.
#[derive(Debug, Deserialize)]
pub(super) struct OverrideForm {
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

impl OverrideForm {
    /// The override asked, checked as `budgetctl budget` checks its flags (the same ranges and
    /// words), so that `override.lua` never refuses it.
    fn action(&self) -> Result<OverrideAction, ConsoleError> {
        let duration = || -> Result<Duration, ConsoleError> {
            let text =
                some(self.minutes.as_ref()).ok_or_else(|| invalid("say for how long (minutes)"))?;
            minutes(text)
        };
        Ok(match self.action.as_str() {
            "freeze" => OverrideAction::Freeze {
                duration: duration()?,
            },
            "unfreeze" => OverrideAction::Unfreeze,
            "clear" => OverrideAction::Clear,
            "set" => {
                let ratio = match some(self.ratio.as_ref()) {
                    Some(r) => {
                        let v: f64 = r
                            .parse()
                            .map_err(|_| invalid(format!("the ratio `{r}` is not a number")))?;
                        if !(v.is_finite() && (0.0..=1000.0).contains(&v)) {
                            return Err(invalid(format!("the ratio `{r}` must be from 0 to 1000")));
                        }
                        Some(v)
                    }
                    None => None,
                };
                let min_allowance = match some(self.min_allowance.as_ref()) {
                    Some(m) => Some(
                        m.parse::<u64>()
                            .ok()
                            .filter(|m| *m <= 1_000_000_000)
                            .ok_or_else(|| {
                                invalid(format!(
                                    "the floor `{m}` must be a whole number from 0 to 1000000000"
                                ))
                            })?,
                    ),
                    None => None,
                };
                if ratio.is_none() && min_allowance.is_none() {
                    return Err(invalid(
                        "a set override needs a ratio and/or a floor (min allowance)",
                    ));
                }
                OverrideAction::Set {
                    duration: duration()?,
                    ratio,
                    min_allowance,
                }
            }
            other => {
                return Err(ConsoleError::BadRequest(format!(
                    "the action is freeze, unfreeze, set or clear, not {:?}",
                    pages::t(other)
                )));
            }
        })
    }
}

pub(super) async fn override_action(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    op: Operator<OverrideForm>,
) -> Result<Redirect, ConsoleError> {
    let dep = dependency(&name)?;
    let reason = reason_of(&op.form.reason, "reason")?;
    let action = op.form.action()?;
    redis(
        &app,
        overrides::apply(&app.store, &app.audit, &dep, action, &op.actor(), &reason),
    )
    .await?;
    app.read_again().await;
    Ok(Redirect::to(&format!(
        "/dependency/{}",
        pages::path_segment(dep.as_str())
    )))
}

/// A switch between shadow and enforcement from the page.
#[derive(Debug, Deserialize)]
pub(super) struct EnforcementForm {
    enforcement: String,
    /// For how long; empty: until the next switch.
    #[serde(default)]
    minutes: Option<String>,
    #[serde(default)]
    reason: String,
}

impl EnforcementForm {
    /// The enforcement asked and for how long, checked as `budgetctl budget shadow|enforce`
    /// checks its flags.
    fn asked(&self) -> Result<(Enforcement, Option<Duration>), ConsoleError> {
        let to = Enforcement::parse(&self.enforcement).ok_or_else(|| {
            ConsoleError::BadRequest(format!(
                "the enforcement is shadow or enforce, not {:?}",
                pages::t(&self.enforcement)
            ))
        })?;
        let duration = match some(self.minutes.as_ref()) {
            None => None,
            Some(text) => Some(minutes(text)?),
        };
        Ok((to, duration))
    }
}

/// A number of minutes from a form: more than 0, at most 366 days.
fn minutes(text: &str) -> Result<Duration, ConsoleError> {
    let minutes: f64 = text
        .parse()
        .map_err(|_| invalid(format!("the duration `{text}` is not a number of minutes")))?;
    let d = Duration::try_from_secs_f64(minutes * 60.0)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| invalid(format!("the duration `{text}` must be more than 0 minutes")))?;
    if d > MAX_OVERRIDE_DURATION {
        return Err(invalid(format!(
            "the duration `{text}` minutes must be at most 366d"
        )));
    }
    Ok(d)
}

/// Switches a dependency to shadow or back to enforcement, through the library call
/// `budgetctl budget shadow|enforce` makes (audited, expiring with its key).
pub(super) async fn enforcement_action(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    op: Operator<EnforcementForm>,
) -> Result<Redirect, ConsoleError> {
    let dep = dependency(&name)?;
    let reason = reason_of(&op.form.reason, "reason")?;
    let (to, duration) = op.form.asked()?;
    redis(
        &app,
        enforcement::switch(
            &app.store,
            &app.audit,
            &dep,
            to,
            duration,
            &op.actor(),
            &reason,
        ),
    )
    .await?;
    app.read_again().await;
    Ok(Redirect::to(&format!(
        "/dependency/{}",
        pages::path_segment(dep.as_str())
    )))
}

/// A form with nothing but its CSRF token (which the extractor reads).
#[derive(Debug, Deserialize)]
pub(super) struct Empty {}

pub(super) async fn refresh_action(State(app): State<Arc<App>>, _op: Operator<Empty>) -> Redirect {
    app.sample_wanted
        .store(true, std::sync::atomic::Ordering::Relaxed);
    app.refresh_now.notify_one();
    Redirect::to("/dead-letters")
}

/// What a form selects: the library's filter, and the form as the page shows it. A form from a
/// group's row names the group by its short key (`g`): the group's text is never put in a page
/// (an error class may hold a secret, which the page shows redacted), it is read here from the
/// queue's index. An empty error class selects the messages without one.
fn selection(app: &App, form: &FilterForm) -> Result<(FilterForm, ReplayFilter), ConsoleError> {
    let bad = ConsoleError::BadRequest;
    let Some(key) = some(form.g.as_ref()) else {
        let filter = form.filter().map_err(bad)?;
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
        .group_by_key(&rest.filter().map_err(bad)?, key)
        .ok_or_else(|| {
            ConsoleError::NotFound(
                "no such group in the queue's index now (replayed or purged since?)".to_owned(),
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
    .map_err(bad)?;
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
    fn rate(&self) -> Result<f64, ConsoleError> {
        match some(self.rate.as_ref()) {
            None => Ok(50.0),
            Some(r) => r
                .parse::<f64>()
                .ok()
                .filter(|r| r.is_finite() && *r >= 1.0 && *r <= 1_000_000.0)
                .ok_or_else(|| {
                    invalid(format!(
                        "the rate `{r}` must be from 1 to 1000000 messages per second"
                    ))
                }),
        }
    }

    fn limit(&self) -> Result<Option<u64>, ConsoleError> {
        match some(self.limit.as_ref()) {
            None => Ok(None),
            Some(l) => l
                .parse::<u64>()
                .ok()
                .filter(|l| *l >= 1)
                .map(Some)
                .ok_or_else(|| {
                    invalid(format!(
                        "the limit `{l}` must be a whole number of at least 1"
                    ))
                }),
        }
    }
}

pub(super) async fn dry_run_action(
    State(app): State<Arc<App>>,
    op: Operator<ActionForm>,
) -> Result<Response, ConsoleError> {
    let f = &op.form;
    let (shown, filter) = selection(&app, &f.filter)?;
    if filter.dependency.is_none() {
        return Err(invalid(
            "a replay names its dependency (as `budgetctl replay --dependency`)",
        ));
    }
    let rate = f.rate()?;
    let limit = f.limit()?;
    // A dry run reads no message (the index and the depth): it never waits for a replay, a
    // purge or a sample that moves messages.
    let prediction = rabbitmq(
        &app,
        replay::dry_run(&app.settings.config, &app.store, &filter, limit),
    )
    .await?;
    Ok(pages::dry_run(
        &op.visitor,
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
    op: Operator<ActionForm>,
) -> Result<Redirect, ConsoleError> {
    let f = &op.form;
    let (_, filter) = selection(&app, &f.filter)?;
    if filter.dependency.is_none() {
        return Err(invalid("a replay names its dependency"));
    }
    if f.confirm.as_deref() != Some("replay") {
        return Err(invalid("confirm the replay on its dry run's page"));
    }
    let ask = Ask {
        filter,
        rate: f.rate()?,
        limit: f.limit()?,
        actor: op.actor(),
        note: reason_of(&f.note, "note")?,
        rerun_of: None,
    };
    let id = replay::start(&app.jobs, run_context(&app), ask).map_err(ConsoleError::TooMany)?;
    Ok(Redirect::to(&format!("/replay/{id}")))
}

pub(super) async fn purge_action(
    State(app): State<Arc<App>>,
    op: Operator<ActionForm>,
) -> Result<Response, ConsoleError> {
    let f = &op.form;
    let (shown, filter) = selection(&app, &f.filter)?;
    let which = f.filter.which();
    if filter.dependency.is_none() || filter.reason.is_none() {
        return Err(invalid("a purge names a group: its dependency and reason"));
    }
    if f.confirm.as_deref() != Some("purge") || f.note.trim().is_empty() {
        // The confirmation: what would go, from the index, and a form that needs the word.
        let sample = app.sample(which);
        let count = sample.counts.as_ref().map_or(0, |c| {
            c.matching(|row| filter.selects_row(row) != Some(false))
        });
        return Ok(
            pages::purge_confirm(&op.visitor, which, &f.filter, &shown, count, &sample)
                .into_response(),
        );
    }
    let ask = Ask {
        filter,
        rate: 0.0,
        limit: None,
        actor: op.actor(),
        note: reason_of(&f.note, "note")?,
        rerun_of: None,
    };
    // A job of its own: a purge is never cut off half-way by the request's deadline (a read
    // dropped there would leave copies beside their originals). One that ends within the
    // deadline answers what it did; a longer one answers with its page, which follows it.
    let id = replay::start_purge(&app.jobs, run_context(&app), which == Which::Parked, ask)
        .map_err(ConsoleError::TooMany)?;
    match wait_for_job(&app, &id).await {
        Some(job) if job.error.is_none() => {
            Ok(pages::purged(&op.visitor, which, &job).into_response())
        }
        Some(job) => Err(ConsoleError::upstream(
            "RabbitMQ",
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
    fn message(&self, app: &App) -> Result<(Which, QueuedMessage, String), ConsoleError> {
        let which = Which::parse(self.queue.as_deref());
        let note = reason_of(&self.note, "note")?;
        let sample = app.sample(which);
        let Some((s, _)) = sample.message(&self.id) else {
            return Err(ConsoleError::NotFound(
                "no such message in the last sample (it may have been replayed or purged)"
                    .to_owned(),
            ));
        };
        Ok((which, s.message.clone(), note))
    }
}

/// Replays one message of the dead-letter queue, selected by its id (and its dependency, which
/// paces the replay), in the background; answers with the job's page.
pub(super) async fn message_replay_action(
    State(app): State<Arc<App>>,
    op: Operator<MessageForm>,
) -> Result<Redirect, ConsoleError> {
    let f = &op.form;
    if f.confirm.as_deref() != Some("replay") {
        return Err(invalid("confirm the replay on the message's page"));
    }
    let (which, m, note) = f.message(&app)?;
    if which != Which::Dead {
        return Err(invalid(
            "only a dead letter is replayed from here (`budgetctl parked replay` replays parked messages)",
        ));
    }
    let Some(dependency) = m.dependency.clone().filter(|_| m.unreadable.is_none()) else {
        return Err(invalid(
            "this message's dead-letter headers cannot be read: a replay would park it; purge it instead",
        ));
    };
    let ask = Ask {
        filter: ReplayFilter {
            dependency: Some(dependency),
            message_id: Some(f.id.clone()),
            ..ReplayFilter::default()
        },
        rate: 50.0,
        limit: Some(1),
        actor: op.actor(),
        note,
        rerun_of: None,
    };
    let id = replay::start(&app.jobs, run_context(&app), ask).map_err(ConsoleError::TooMany)?;
    Ok(Redirect::to(&format!("/replay/{id}")))
}

/// Purges one message of the dead-letter or parked queue, selected by its id, in the
/// background; answers with the job's page.
pub(super) async fn message_purge_action(
    State(app): State<Arc<App>>,
    op: Operator<MessageForm>,
) -> Result<Redirect, ConsoleError> {
    let f = &op.form;
    if f.confirm.as_deref().map(str::trim) != Some("purge") {
        return Err(invalid("type `purge` to confirm"));
    }
    let (which, m, note) = f.message(&app)?;
    let ask = Ask {
        filter: ReplayFilter {
            dependency: m.dependency.clone().filter(|_| m.unreadable.is_none()),
            message_id: Some(f.id.clone()),
            // A message whose headers cannot be read is selected only with `malformed`.
            malformed: m.unreadable.is_some(),
            ..ReplayFilter::default()
        },
        rate: 0.0,
        limit: Some(1),
        actor: op.actor(),
        note,
        rerun_of: None,
    };
    let id = replay::start_purge(&app.jobs, run_context(&app), which == Which::Parked, ask)
        .map_err(ConsoleError::TooMany)?;
    Ok(Redirect::to(&format!("/replay/{id}")))
}

/// Cancels a running replay: recorded in the audit trail first (who, which run), then asked of
/// the run, which puts back what it has not moved and records its own entry, marked cancelled.
pub(super) async fn cancel_action(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    op: Operator<Empty>,
) -> Result<Redirect, ConsoleError> {
    let actor = op.actor();
    let Some(job) = app.jobs.get(&id) else {
        return Err(match app.jobs.lookup(&id).await {
            Some(j) if !j.done => ConsoleError::Conflict(
                "this job runs in another console: cancel it there".to_owned(),
            ),
            Some(_) => ConsoleError::Conflict("it has ended already".to_owned()),
            None => ConsoleError::NotFound("no such replay or purge".to_owned()),
        });
    };
    if job.done {
        return Err(ConsoleError::Conflict("it has ended already".to_owned()));
    }
    let cx = run_context(&app);
    redis(&app, replay::audit_cancel(&cx, &job, &actor)).await?;
    match app.jobs.cancel(&id, &actor) {
        (replay::Cancel::Unknown, _) => Err(ConsoleError::NotFound("no such replay".to_owned())),
        // Ended between the look and the ask: the trail says it was asked, the page how it ended.
        (replay::Cancel::Asked | replay::Cancel::Ended, _) => {
            Ok(Redirect::to(&format!("/replay/{id}")))
        }
    }
}

/// Runs an interrupted or failed job again, as it was asked (its filter, rate and limit), by
/// this operator: a replay's claims make each message move once however often it is run.
pub(super) async fn rerun_action(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    op: Operator<Empty>,
) -> Result<Redirect, ConsoleError> {
    let record = app
        .jobs
        .find_record(&id)
        .await
        .ok_or_else(|| ConsoleError::NotFound("no such replay or purge".to_owned()))?;
    if !record.state.done {
        return Err(ConsoleError::Conflict(
            "it has not ended: cancel it first".to_owned(),
        ));
    }
    if !(record.state.interrupted || record.state.error.is_some()) {
        return Err(ConsoleError::Conflict(
            "only an interrupted or failed job is run again".to_owned(),
        ));
    }
    let ask = Ask::again(&record, op.actor()).ok_or_else(|| {
        ConsoleError::Conflict("its filter names a reason this console does not know".to_owned())
    })?;
    let cx = run_context(&app);
    let new = if record.state.kind.is_purge() {
        replay::start_purge(&app.jobs, cx, record.plan.parked, ask)
    } else {
        replay::start(&app.jobs, cx, ask)
    }
    .map_err(ConsoleError::TooMany)?;
    Ok(Redirect::to(&format!("/replay/{new}")))
}
