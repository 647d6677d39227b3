//! Logging in and out: the login form's own CSRF cookie, the session cookie.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::error::ConsoleError;
use super::extract::{Viewer, session};
use super::security::{Client, cookie_attributes, login_failed};
use crate::App;
use crate::access::{Counters, Denied, LOGIN_COOKIE, SESSION_COOKIE, cookie, random_hex};
use crate::pages;

pub(super) async fn login_page(State(app): State<Arc<App>>, h: HeaderMap) -> Response {
    let visitor = app.access.reader(session(&h)).await.ok();
    let nonce = random_hex();
    let cookie = format!(
        "{LOGIN_COOKIE}={nonce}; Path=/login; {}; Max-Age=600",
        cookie_attributes(&app)
    );
    (
        [(header::SET_COOKIE, cookie)],
        pages::login(visitor.as_ref(), &nonce, None),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
pub(super) struct LoginForm {
    token: String,
    #[serde(default)]
    login_csrf: String,
}

pub(super) async fn login_action(
    State(app): State<Arc<App>>,
    Extension(client): Extension<Client>,
    h: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let expected = cookie(
        h.get(header::COOKIE).and_then(|c| c.to_str().ok()),
        LOGIN_COOKIE,
    )
    .unwrap_or_default();
    if expected.is_empty() || expected != f.login_csrf {
        Counters::add(&app.counters.login_stale_form);
        tracing::warn!(client = %client.0, reason = "stale_form", via = "login", "console: login refused");
        return ConsoleError::Status(
            StatusCode::FORBIDDEN,
            "the login form is stale: open /login again".to_owned(),
        )
        .into_response();
    }
    let attributes = cookie_attributes(&app);
    match app.access.login(client.0, &f.token).await {
        Ok((id, role, label)) => {
            Counters::add(&app.counters.logins);
            tracing::info!(role = ?role, label = %label, client = %client.0, "console: login");
            let cookie = format!("{SESSION_COOKIE}={id}; Path=/; {attributes}; Max-Age=43200");
            ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
        }
        Err(Denied::NotLoggedIn) => {
            login_failed(&app, client.0, &Denied::NotLoggedIn, "login");
            let nonce = random_hex();
            let cookie = format!("{LOGIN_COOKIE}={nonce}; Path=/login; {attributes}; Max-Age=600");
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
        Err(d) => {
            login_failed(&app, client.0, &d, "login");
            ConsoleError::from(d).into_response()
        }
    }
}

/// The logout form: its CSRF token (any session may log out, a viewer's too).
#[derive(Debug, Deserialize)]
pub(super) struct LogoutForm {
    csrf: Option<String>,
}

pub(super) async fn logout_action(
    State(app): State<Arc<App>>,
    Viewer(visitor): Viewer,
    h: HeaderMap,
    Form(f): Form<LogoutForm>,
) -> Result<Response, ConsoleError> {
    if visitor.csrf.is_none() || visitor.csrf.as_deref() != f.csrf.as_deref() {
        return Err(Denied::Csrf.into());
    }
    if let Some(id) = session(&h) {
        app.access.logout(id).await;
    }
    let cookie = format!(
        "{SESSION_COOKIE}=; Path=/; {}; Max-Age=0",
        cookie_attributes(&app)
    );
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/login")).into_response())
}
