//! Who asks, as axum extractors: a handler that takes a [`Viewer`] is read by viewers and
//! operators, one that takes an [`Operator`] changes things and runs only for an operator's
//! session whose form carries its CSRF token, sent from this console's own pages (`Origin`),
//! within the rate of actions. A refusal is a [`ConsoleError`] before the handler runs.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Form, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, header};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::error::ConsoleError;
use super::security::{MAX_BODY_BYTES, from_this_console};
use crate::App;
use crate::access::{Role, SESSION_COOKIE, Visitor, cookie, lock};

/// The session id of a request (its cookie).
pub(crate) fn session(h: &HeaderMap) -> Option<&str> {
    cookie(
        h.get(header::COOKIE).and_then(|c| c.to_str().ok()),
        SESSION_COOKIE,
    )
}

/// Someone who may read: a viewer's or an operator's session, or anyone on an open console.
#[derive(Debug, Clone)]
pub(crate) struct Viewer(pub(crate) Visitor);

impl FromRequestParts<Arc<App>> for Viewer {
    type Rejection = ConsoleError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ConsoleError> {
        // A browser asking for a page is sent to the login form; a script or a form's post is
        // answered 401.
        let path = parts.uri.path();
        let page = parts.method == Method::GET
            && !path.starts_with("/api/")
            && !path.starts_with("/fragments/");
        let mut visitor = app
            .access
            .reader(session(&parts.headers))
            .await
            .map_err(|denied| ConsoleError::Denied { denied, page })?;
        visitor.risks = lock(&app.risks).clone();
        Ok(Self(visitor))
    }
}

/// An operator's change: who (an operator's session), and the form `F` it posted, whose
/// `csrf` field is the session's CSRF token.
#[derive(Debug)]
pub(crate) struct Operator<F> {
    /// The operator, as the pages and the audit trail name them.
    pub(crate) visitor: Visitor,
    /// The form, read after the checks.
    pub(crate) form: F,
}

impl<F> Operator<F> {
    /// The label the audit trail records.
    pub(crate) fn actor(&self) -> String {
        self.visitor.label.clone()
    }
}

/// The one field every change's form carries.
#[derive(Debug, Deserialize)]
struct Csrf {
    csrf: Option<String>,
}

impl<F: DeserializeOwned + Send> FromRequest<Arc<App>> for Operator<F> {
    type Rejection = ConsoleError;

    async fn from_request(request: Request, app: &Arc<App>) -> Result<Self, ConsoleError> {
        let (parts, body) = request.into_parts();
        if !from_this_console(&app.settings, &parts.headers) {
            return Err(ConsoleError::Status(
                axum::http::StatusCode::FORBIDDEN,
                "the request came from another site".to_owned(),
            ));
        }
        // The guard has read the body whole within its bounds; this cannot wait on a client.
        let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
            .await
            .map_err(|_| ConsoleError::BadRequest("the body could not be read".to_owned()))?;
        let content_type = parts.headers.get(header::CONTENT_TYPE).cloned();
        let form_of = |bytes: axum::body::Bytes| {
            let mut r = Request::new(Body::from(bytes));
            *r.method_mut() = Method::POST;
            if let Some(ct) = &content_type {
                r.headers_mut().insert(header::CONTENT_TYPE, ct.clone());
            }
            r
        };
        // The CSRF token first: a form that fails to read is refused as a forgery would be.
        let csrf = Form::<Csrf>::from_request(form_of(bytes.clone()), &())
            .await
            .ok()
            .and_then(|Form(c)| c.csrf);
        let label = app
            .access
            .changer(session(&parts.headers), csrf.as_deref())
            .await?;
        let Form(form) = Form::<F>::from_request(form_of(bytes), &())
            .await
            .map_err(|e| ConsoleError::BadRequest(e.body_text()))?;
        Ok(Self {
            visitor: Visitor {
                label,
                role: Role::Operator,
                csrf,
                risks: lock(&app.risks).clone(),
            },
            form,
        })
    }
}
