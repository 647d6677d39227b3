//! The HTTP routes: who may call each (reads need a viewer, changes an operator's session and
//! its CSRF token), the security headers every response carries, and the bounds (body size,
//! upstream deadlines).
//!
//! Helpers return axum's `Response` as their error: it is what a refused request becomes, built
//! once where the refusal is decided (clippy's size lint does not weigh that).
#![allow(clippy::result_large_err)]

mod actions;
mod login;
mod reads;
mod security;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Form, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Redirect, Response};
use axum::routing::{get, post};
use fleet_budget::Dependency;
use fleet_budget::control::OverrideAction;
use fleet_budget::control::overrides::{self, MAX_OVERRIDE_DURATION};
use serde::Deserialize;

use crate::App;
use crate::access::{
    Counters, Denied, LOGIN_COOKIE, SESSION_COOKIE, Visitor, cookie, lock, random_hex,
};
use crate::dead_letters::Which;
use crate::filters::{FilterForm, some};
use crate::pages;
use crate::replay::{self, RunContext};

use actions::*;
use login::*;
use reads::*;
pub(crate) use security::host_part;
use security::*;

pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(overview_page))
        .route("/api/overview", get(overview_json))
        .route("/fragments/overview", get(overview_fragment))
        .route("/dependency/{name}", get(dependency_page))
        .route("/dependency/{name}/override", post(override_action))
        .route("/dead-letters", get(dead_letters_page))
        .route("/dead-letters/group", get(group_page))
        .route("/dead-letters/message", get(message_page))
        .route("/dead-letters/refresh", post(refresh_action))
        .route("/dead-letters/purge", post(purge_action))
        .route("/dead-letters/message/replay", post(message_replay_action))
        .route("/dead-letters/message/purge", post(message_purge_action))
        .route("/replay/dry-run", post(dry_run_action))
        .route("/replay/start", post(replay_action))
        .route("/replays", get(replays_page))
        .route("/replay/{id}", get(replay_page))
        .route("/replay/{id}/cancel", post(cancel_action))
        .route("/api/replay/{id}", get(replay_json))
        .route("/workers", get(workers_page))
        .route("/api/workers", get(workers_json))
        .route("/audit", get(audit_page))
        .route("/login", get(login_page).post(login_action))
        .route("/logout", post(logout_action))
        .route("/static/console.js", get(script))
        .route("/static/console.css", get(style))
        .merge(Router::new().route("/metrics", get(metrics)))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), guard))
        .with_state(app)
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
        Denied::AddressLimited => refused(
            StatusCode::TOO_MANY_REQUESTS,
            "too many failed logins from this address in the last minute: wait a minute",
        ),
        Denied::LabelLimited => refused(
            StatusCode::TOO_MANY_REQUESTS,
            "too many logins with this token in the last minute: wait a minute",
        ),
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
fn bad(why: &str) -> Response {
    refused(StatusCode::BAD_REQUEST, why)
}
