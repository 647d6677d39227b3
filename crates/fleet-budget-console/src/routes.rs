//! The HTTP routes: who may call each (reads need a viewer, changes an operator's session and
//! its CSRF token), the security headers every response carries, and the bounds (body size,
//! upstream deadlines).
//!
//! Helpers return axum's `Response` as their error: it is what a refused request becomes, built
//! once where the refusal is decided (clippy's size lint does not weigh that).
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Form, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Redirect, Response};
use axum::routing::{get, post};
use fleet_budget::control::OverrideAction;
use fleet_budget::control::overrides::{self, MAX_OVERRIDE_DURATION};
use fleet_budget::{DeadLetterReason, Dependency};
use fleet_budget_amqp::ReplayFilter;
use serde::Deserialize;

use crate::App;
use crate::access::{Denied, LOGIN_COOKIE, SESSION_COOKIE, Visitor, cookie, lock, random_hex};
use crate::dead_letters::Which;
use crate::pages;
use crate::replay::{self, RunContext};

/// The largest request body accepted (forms are a few hundred bytes).
pub(crate) const MAX_BODY_BYTES: usize = 16 * 1024;

/// The Content-Security-Policy: the console's own script and style only, no inline script, no
/// framing, forms posting only to the console.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const SCRIPT: &str = include_str!("../static/console.js");
const STYLE: &str = include_str!("../static/console.css");

pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(overview_page))
        .route("/api/overview", get(overview_json))
        .route("/dependency/{name}", get(dependency_page))
        .route("/dependency/{name}/override", post(override_action))
        .route("/dead-letters", get(dead_letters_page))
        .route("/dead-letters/group", get(group_page))
        .route("/dead-letters/message", get(message_page))
        .route("/dead-letters/refresh", post(refresh_action))
        .route("/dead-letters/purge", post(purge_action))
        .route("/replay/dry-run", post(dry_run_action))
        .route("/replay/start", post(replay_action))
        .route("/replays", get(replays_page))
        .route("/replay/{id}", get(replay_page))
        .route("/replay/{id}/cancel", post(cancel_action))
        .route("/api/replay/{id}", get(replay_json))
        .route("/audit", get(audit_page))
        .route("/login", get(login_page).post(login_action))
        .route("/logout", post(logout_action))
        .route("/static/console.js", get(script))
        .route("/static/console.css", get(style))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(guard))
        .with_state(app)
}

/// Security headers on every response; a change whose `Origin` is not this console refused
/// before any handler runs.
async fn guard(request: Request, next: Next) -> Response {
    if request.method() == Method::POST && !same_origin(request.headers()) {
        let mut r = refused(StatusCode::FORBIDDEN, "the request came from another site");
        secure(r.headers_mut());
        return r;
    }
    let mut response = next.run(request).await;
    secure(response.headers_mut());
    response
}

fn secure(h: &mut HeaderMap) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// Whether the `Origin` (when the browser sends one) names the host the request was sent to.
fn same_origin(h: &HeaderMap) -> bool {
    let Some(origin) = h.get(header::ORIGIN).and_then(|o| o.to_str().ok()) else {
        return true;
    };
    let host = h
        .get(header::HOST)
        .and_then(|o| o.to_str().ok())
        .unwrap_or_default();
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or_default();
    !host.is_empty() && origin_host == host
}

fn refused(status: StatusCode, why: &str) -> Response {
    (status, pages::refusal(status, why)).into_response()
}

fn denied(d: &Denied, page: bool) -> Response {
    match d {
        Denied::NotLoggedIn if page => Redirect::to("/login").into_response(),
        Denied::NotLoggedIn => refused(StatusCode::UNAUTHORIZED, "log in first"),
        Denied::NotOperator => refused(StatusCode::FORBIDDEN, "changes need an operator's token"),
        Denied::Csrf => refused(
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or stale: reload the page and try again",
        ),
        Denied::TooMany => refused(
            StatusCode::TOO_MANY_REQUESTS,
            "too many actions in the last minute",
        ),
        Denied::Full => refused(StatusCode::SERVICE_UNAVAILABLE, "too many sessions"),
    }
}

fn session(h: &HeaderMap) -> Option<&str> {
    cookie(
        h.get(header::COOKIE).and_then(|c| c.to_str().ok()),
        SESSION_COOKIE,
    )
}

fn reader(app: &App, h: &HeaderMap, page: bool) -> Result<Visitor, Response> {
    app.access.reader(session(h)).map_err(|d| denied(&d, page))
}

fn changer(app: &App, h: &HeaderMap, csrf: Option<&str>) -> Result<String, Response> {
    app.access
        .changer(session(h), csrf)
        .map_err(|d| denied(&d, false))
}

/// `fut` within the upstream deadline.
async fn within<T, E: std::fmt::Display>(
    app: &App,
    what: &str,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, Response> {
    match tokio::time::timeout(app.settings.upstream_timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(refused(
            StatusCode::BAD_GATEWAY,
            &format!(
                "{what}: {}",
                fleet_budget::redact::redact_text(&e.to_string())
            ),
        )),
        Err(_) => Err(refused(
            StatusCode::GATEWAY_TIMEOUT,
            &format!(
                "{what}: no answer within {:?}",
                app.settings.upstream_timeout
            ),
        )),
    }
}

type Page = Result<Response, Response>;

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

async fn overview_page(State(app): State<Arc<App>>, h: HeaderMap) -> Page {
    let visitor = reader(&app, &h, true)?;
    let ov = within(
        &app,
        "Redis",
        crate::fleet::overview(&app.settings.config.budget, &app.store, None),
    )
    .await?;
    Ok(pages::overview(&visitor, &ov).into_response())
}

async fn overview_json(State(app): State<Arc<App>>, h: HeaderMap) -> Page {
    reader(&app, &h, false)?;
    let ov = within(
        &app,
        "Redis",
        crate::fleet::overview(&app.settings.config.budget, &app.store, None),
    )
    .await?;
    Ok(Json(ov).into_response())
}

fn dependency(name: &str) -> Result<Dependency, Response> {
    Dependency::new(name).map_err(|e| {
        refused(
            StatusCode::BAD_REQUEST,
            &format!(
                "{:?} is not a dependency name: {e}",
                fleet_budget::printable::escape_text(name)
            ),
        )
    })
}

async fn dependency_page(
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

/// An override from the page.
#[derive(Debug, Deserialize)]
struct OverrideForm {
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

fn bad(why: &str) -> Response {
    refused(StatusCode::BAD_REQUEST, why)
}

fn some(v: Option<&String>) -> Option<&str> {
    v.map(|s| s.trim()).filter(|s| !s.is_empty())
}

async fn override_action(
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

/// The CLI's filters (`--dependency`, `--reason`, `--task`, `--since`, `--until`,
/// `--error-contains`), as a query or a form.
#[derive(Debug, Default, Clone, Deserialize)]
pub(crate) struct FilterForm {
    #[serde(default)]
    pub(crate) queue: Option<String>,
    #[serde(default)]
    pub(crate) dependency: Option<String>,
    #[serde(default)]
    pub(crate) reason: Option<String>,
    #[serde(default)]
    pub(crate) task: Option<String>,
    #[serde(default)]
    pub(crate) since: Option<String>,
    #[serde(default)]
    pub(crate) until: Option<String>,
    #[serde(default)]
    pub(crate) error_contains: Option<String>,
    #[serde(default)]
    pub(crate) error_class: Option<String>,
}

impl FilterForm {
    pub(crate) fn which(&self) -> Which {
        Which::parse(self.queue.as_deref())
    }

    /// The library's filter; a bad value is said.
    pub(crate) fn filter(&self) -> Result<ReplayFilter, Response> {
        let now = fleet_budget::clock::now_ms();
        let time = |v: Option<&String>, flag: &str| match some(v) {
            Some(t) => parse_time(t, now)
                .map(Some)
                .map_err(|e| bad(&format!("{flag}: {e}"))),
            None => Ok(None),
        };
        let reason = match some(self.reason.as_ref()) {
            Some(r) => Some(DeadLetterReason::parse(r).ok_or_else(|| {
                bad("the reason is budget_exhausted, budget_frozen, attempts_exhausted or non_retryable (or another the library names)")
            })?),
            None => None,
        };
        Ok(ReplayFilter {
            dependency: some(self.dependency.as_ref()).map(str::to_owned),
            reason,
            since_ms: time(self.since.as_ref(), "since")?,
            until_ms: time(self.until.as_ref(), "until")?,
            task: some(self.task.as_ref()).map(str::to_owned),
            message_id: None,
            error_contains: some(self.error_contains.as_ref()).map(str::to_owned),
        })
    }
}

/// Unix seconds, an RFC 3339 time, or an age (`30m`, `1h30m`, `1d`): Unix ms (as the CLI's
/// `--since`).
fn parse_time(text: &str, now_ms: u64) -> Result<u64, String> {
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(secs.saturating_mul(1000));
    }
    if let Ok(at) = humantime::parse_rfc3339_weak(text) {
        return at
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .map_err(|_| "a time before 1970".to_owned());
    }
    humantime::parse_duration(text)
        .map(|ago| now_ms.saturating_sub(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX)))
        .map_err(|_| {
            format!(
                "`{}` is neither Unix seconds, an RFC 3339 time nor an age like 30m",
                fleet_budget::printable::escape_text(text)
            )
        })
}

async fn dead_letters_page(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Query(q): Query<FilterForm>,
) -> Page {
    let visitor = reader(&app, &h, true)?;
    let filter = q.filter()?;
    let which = q.which();
    let sample = app.sample(which);
    let groups = sample.groups(&filter);
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

async fn group_page(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Query(q): Query<FilterForm>,
) -> Page {
    let visitor = reader(&app, &h, true)?;
    let filter = q.filter()?;
    let which = q.which();
    let sample = app.sample(which);
    let class = q.error_class.clone().unwrap_or_default();
    let members = sample.members(&filter, &class, 500);
    Ok(pages::group(&visitor, which, &q, &sample, &members).into_response())
}

#[derive(Debug, Deserialize)]
struct MessageQuery {
    #[serde(default)]
    queue: Option<String>,
    id: String,
}

async fn message_page(
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

#[derive(Debug, Deserialize)]
struct CsrfForm {
    csrf: Option<String>,
}

async fn refresh_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Page {
    changer(&app, &h, f.csrf.as_deref())?;
    app.refresh_now.notify_one();
    Ok(Redirect::to("/dead-letters").into_response())
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
struct ActionForm {
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

async fn dry_run_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Page {
    let visitor = reader(&app, &h, false)?;
    changer(&app, &h, f.csrf.as_deref())?;
    let filter = f.filter.filter()?;
    if filter.dependency.is_none() {
        return Err(bad(
            "a replay names its dependency (as `budgetctl replay --dependency`)",
        ));
    }
    let rate = f.rate()?;
    let limit = f.limit()?;
    // One reader or mover of the queues at a time: a replay or a sample under way is waited
    // for, within the upstream deadline.
    let guard = tokio::time::timeout(app.settings.upstream_timeout, app.queue_work.lock())
        .await
        .map_err(|_| {
            refused(
                StatusCode::CONFLICT,
                "a replay, purge or sample of the queue is under way: try again when it ends",
            )
        })?;
    let prediction = within(
        &app,
        "RabbitMQ",
        replay::dry_run(&app.settings.config, &filter, limit),
    )
    .await;
    drop(guard);
    let prediction = prediction?;
    Ok(pages::dry_run(&visitor, &f.filter, &prediction, rate, limit, &f.note).into_response())
}

async fn replay_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Page {
    let actor = changer(&app, &h, f.csrf.as_deref())?;
    let filter = f.filter.filter()?;
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
    );
    Ok(Redirect::to(&format!("/replay/{id}")).into_response())
}

async fn purge_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Page {
    let visitor = reader(&app, &h, false)?;
    let actor = changer(&app, &h, f.csrf.as_deref())?;
    let filter = f.filter.filter()?;
    let which = f.filter.which();
    if filter.dependency.is_none() || filter.reason.is_none() {
        return Err(bad("a purge names a group: its dependency and reason"));
    }
    let note = f.note.trim();
    if f.confirm.as_deref() != Some("purge") || note.is_empty() {
        // The confirmation: what would go, from the sample, and a form that needs the word.
        let sample = app.sample(which);
        let count = sample
            .messages
            .iter()
            .filter(|s| s.message.selected_by(&filter))
            .count();
        return Ok(
            pages::purge_confirm(&visitor, which, &f.filter, count as u64, &sample).into_response(),
        );
    }
    let cx = run_context(&app);
    let purged = within(
        &app,
        "RabbitMQ",
        replay::purge(&cx, which == Which::Parked, &filter, &actor, note),
    )
    .await?;
    app.refresh_now.notify_one();
    Ok(pages::purged(&visitor, which, &purged).into_response())
}

/// A cancel from a replay's page: only the CSRF token.
#[derive(Debug, Deserialize)]
struct CancelForm {
    csrf: Option<String>,
}

/// Cancels a running replay: recorded in the audit trail first (who, which run), then asked of
/// the run, which puts back what it has not moved and records its own entry, marked cancelled.
async fn cancel_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<CancelForm>,
) -> Page {
    let actor = changer(&app, &h, f.csrf.as_deref())?;
    let job = app
        .jobs
        .get(&id)
        .ok_or_else(|| refused(StatusCode::NOT_FOUND, "no such replay"))?;
    if job.done {
        return Err(refused(
            StatusCode::CONFLICT,
            "the replay has ended already",
        ));
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

async fn replays_page(State(app): State<Arc<App>>, h: HeaderMap) -> Page {
    let visitor = reader(&app, &h, true)?;
    Ok(pages::replays(&visitor, &app.jobs.all()).into_response())
}

async fn replay_page(State(app): State<Arc<App>>, h: HeaderMap, Path(id): Path<String>) -> Page {
    let visitor = reader(&app, &h, true)?;
    let job = app
        .jobs
        .get(&id)
        .ok_or_else(|| refused(StatusCode::NOT_FOUND, "no such replay"))?;
    Ok(pages::replay(&visitor, &job).into_response())
}

async fn replay_json(State(app): State<Arc<App>>, h: HeaderMap, Path(id): Path<String>) -> Page {
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

async fn audit_page(State(app): State<Arc<App>>, h: HeaderMap) -> Page {
    let visitor = reader(&app, &h, true)?;
    let trail = within(
        &app,
        "Redis",
        app.audit.read(&app.store, None, None, None, 200),
    )
    .await?;
    Ok(pages::audit(&visitor, &trail).into_response())
}

async fn login_page(State(app): State<Arc<App>>, h: HeaderMap) -> Response {
    let visitor = app.access.reader(session(&h)).ok();
    let nonce = random_hex();
    let cookie =
        format!("{LOGIN_COOKIE}={nonce}; Path=/login; HttpOnly; SameSite=Strict; Max-Age=600");
    (
        [(header::SET_COOKIE, cookie)],
        pages::login(visitor.as_ref(), &nonce, None),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: String,
    #[serde(default)]
    login_csrf: String,
}

async fn login_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let expected = cookie(
        h.get(header::COOKIE).and_then(|c| c.to_str().ok()),
        LOGIN_COOKIE,
    )
    .unwrap_or_default();
    if expected.is_empty() || expected != f.login_csrf {
        return refused(
            StatusCode::FORBIDDEN,
            "the login form is stale: open /login again",
        );
    }
    match app.access.login(&f.token) {
        Ok((id, role)) => {
            tracing::info!(role = ?role, "console: login");
            let cookie =
                format!("{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age=43200");
            ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
        }
        Err(Denied::NotLoggedIn) => {
            let nonce = random_hex();
            let cookie = format!(
                "{LOGIN_COOKIE}={nonce}; Path=/login; HttpOnly; SameSite=Strict; Max-Age=600"
            );
            (
                StatusCode::UNAUTHORIZED,
                [(header::SET_COOKIE, cookie)],
                pages::login(
                    None,
                    &nonce,
                    Some("that token is not one of this console's"),
                ),
            )
                .into_response()
        }
        Err(d) => denied(&d, false),
    }
}

async fn logout_action(State(app): State<Arc<App>>, h: HeaderMap, Form(f): Form<CsrfForm>) -> Page {
    let visitor = reader(&app, &h, false)?;
    if visitor.csrf.as_deref() != f.csrf.as_deref() || visitor.csrf.is_none() {
        return Err(denied(&Denied::Csrf, false));
    }
    if let Some(id) = session(&h) {
        app.access.logout(id);
    }
    let cookie = format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/login")).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_the_cli_reads_them() {
        let now = 10_000_000;
        assert_eq!(parse_time("90s", now), Ok(now - 90_000));
        assert_eq!(parse_time("1700000000", now), Ok(1_700_000_000_000));
        assert_eq!(
            parse_time("2026-11-30T04:00:00Z", now),
            Ok(1_796_011_200_000)
        );
        assert!(parse_time("yesterday", now).is_err());
    }

    #[test]
    fn a_post_from_another_site_is_not_same_origin() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8089"));
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8089"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&h));
    }
}
