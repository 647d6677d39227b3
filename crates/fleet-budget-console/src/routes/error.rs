//! Why a request was not answered as asked: one type, [`ConsoleError`], that every handler and
//! extractor returns and that renders itself (`IntoResponse`) as the page an operator reads:
//! the status, what was wrong in the CLI's words, and, when Redis or RabbitMQ cannot be
//! reached, a page that says so (not a bare 502).

use std::any::Any;
use std::fmt::Display;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use fleet_budget::error::StoreError;
use fleet_budget_amqp::AmqpError;

use crate::access::Denied;
use crate::pages;

/// Why a request was refused or failed.
#[derive(Debug)]
pub(crate) enum ConsoleError {
    /// Who asks may not; `page`: a browser asked for a page (not logged in is then a
    /// redirect to the login form).
    Denied {
        /// Why.
        denied: Denied,
        /// A page, not a JSON answer or a form's post.
        page: bool,
    },
    /// The request cannot be read (400).
    BadRequest(String),
    /// A value of a form is out of its range (422), said as `budgetctl` says it.
    Invalid(String),
    /// What the request names does not exist (404).
    NotFound(String),
    /// What the request asks cannot be done now (409).
    Conflict(String),
    /// Too much at once (429).
    TooMany(String),
    /// Redis or RabbitMQ failed.
    Upstream {
        /// `Redis` or `RabbitMQ`.
        service: &'static str,
        /// How.
        failure: Upstream,
    },
    /// Any other refusal with its status (the guard's: 408, 413, 414, 421, 431, 403).
    Status(StatusCode, String),
}

/// How Redis or RabbitMQ failed.
#[derive(Debug)]
pub(crate) enum Upstream {
    /// It could not be reached (refused, dropped, unresolvable).
    Unreachable(String),
    /// It answered with an error.
    Failed(String),
    /// It did not answer within the console's deadline.
    TimedOut(Duration),
}

impl ConsoleError {
    /// A failure of `service` (`Redis`, `RabbitMQ`) from its error, redacted, classified as
    /// unreachable when it is one of the known connection errors.
    pub(crate) fn upstream<E: Display + 'static>(service: &'static str, e: &E) -> Self {
        let text = fleet_budget::redact::redact_text(&e.to_string());
        let any = e as &dyn Any;
        let unreachable = if let Some(s) = any.downcast_ref::<StoreError>() {
            matches!(s, StoreError::Redis(r)
                if r.is_io_error() || r.is_connection_refusal() || r.is_connection_dropped())
        } else if let Some(a) = any.downcast_ref::<AmqpError>() {
            a.is_connection_error()
        } else {
            false
        };
        if let Some(StoreError::Timeout(d)) = any.downcast_ref::<StoreError>() {
            return Self::Upstream {
                service,
                failure: Upstream::TimedOut(*d),
            };
        }
        Self::Upstream {
            service,
            failure: if unreachable {
                Upstream::Unreachable(text)
            } else {
                Upstream::Failed(text)
            },
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Self::Denied { denied, .. } => match denied {
                Denied::NotLoggedIn => StatusCode::UNAUTHORIZED,
                Denied::NotOperator | Denied::Csrf => StatusCode::FORBIDDEN,
                Denied::TooMany | Denied::AddressLimited | Denied::LabelLimited => {
                    StatusCode::TOO_MANY_REQUESTS
                }
            },
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Upstream { failure, .. } => match failure {
                Upstream::Unreachable(_) => StatusCode::SERVICE_UNAVAILABLE,
                Upstream::Failed(_) => StatusCode::BAD_GATEWAY,
                Upstream::TimedOut(_) => StatusCode::GATEWAY_TIMEOUT,
            },
            Self::Status(status, _) => *status,
        }
    }

    /// The page's title and what it says.
    fn words(&self) -> (String, String) {
        let status = self.status();
        let plain = |why: &str| (status.as_u16().to_string(), why.to_owned());
        match self {
            Self::Denied { denied, .. } => plain(match denied {
                Denied::NotLoggedIn => "log in first",
                Denied::NotOperator => "changes need an operator's token",
                Denied::Csrf => {
                    "the form's CSRF token is missing or stale: reload the page and try again"
                }
                Denied::TooMany => "too many actions in the last minute",
                Denied::AddressLimited => {
                    "too many failed logins from this address in the last minute: wait a minute"
                }
                Denied::LabelLimited => {
                    "too many logins with this token in the last minute: wait a minute"
                }
            }),
            Self::BadRequest(why)
            | Self::Invalid(why)
            | Self::NotFound(why)
            | Self::Conflict(why)
            | Self::TooMany(why)
            | Self::Status(_, why) => plain(why),
            Self::Upstream { service, failure } => match failure {
                Upstream::Unreachable(e) => (
                    format!("{service} is unreachable"),
                    format!(
                        "{service} is unreachable ({e}). This page reads {service} each time it \
                         is loaded: reload it when {service} is back. Nothing was changed."
                    ),
                ),
                Upstream::Failed(e) => (
                    format!("{service} failed"),
                    format!("{service} answered with an error: {e}"),
                ),
                Upstream::TimedOut(d) => (
                    format!("{service} did not answer"),
                    format!(
                        "{service} did not answer within {}: reload the page to try again",
                        pages::time::span(*d)
                    ),
                ),
            },
        }
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        if let Self::Denied {
            denied: Denied::NotLoggedIn,
            page: true,
        } = self
        {
            return Redirect::to("/login").into_response();
        }
        let status = self.status();
        let (title, why) = self.words();
        // "Log in" is offered only to whom it would help: a request without a session.
        let offer_login = status == StatusCode::UNAUTHORIZED;
        (status, pages::refusal(&title, &why, offer_login)).into_response()
    }
}

impl From<Denied> for ConsoleError {
    fn from(denied: Denied) -> Self {
        Self::Denied {
            denied,
            page: false,
        }
    }
}

/// `fut` within `deadline`, its failure a [`ConsoleError::Upstream`] of `service`.
pub(crate) async fn within<T, E: Display + 'static>(
    deadline: Duration,
    service: &'static str,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, ConsoleError> {
    match tokio::time::timeout(deadline, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(ConsoleError::upstream(service, &e)),
        Err(_) => Err(ConsoleError::Upstream {
            service,
            failure: Upstream::TimedOut(deadline),
        }),
    }
}
