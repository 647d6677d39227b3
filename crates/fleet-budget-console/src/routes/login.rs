//! Logging in and out: the login form's own CSRF cookie, the session cookie.

use super::actions::CsrfForm;
use super::*;

pub(super) async fn login_page(State(app): State<Arc<App>>, h: HeaderMap) -> Response {
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
pub(super) struct LoginForm {
    token: String,
    #[serde(default)]
    login_csrf: String,
}

pub(super) async fn login_action(
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

pub(super) async fn logout_action(
    State(app): State<Arc<App>>,
    h: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Page {
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
