//! The HTTP routes: who may call each (reads take a [`Viewer`](extract::Viewer), changes an
//! [`Operator`](extract::Operator): an operator's session, its CSRF token, this console's
//! `Origin`), the security headers every response carries, and the bounds (body size,
//! upstream deadlines). Every handler returns `Result<_, ConsoleError>`
//! ([`error::ConsoleError`]), which renders itself as the page an operator reads.

mod actions;
mod bullmq;
mod error;
mod extract;
mod login;
mod reads;
mod security;

use std::fmt::Display;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use fleet_budget::Dependency;

use crate::App;

pub(crate) use error::ConsoleError;
pub(crate) use security::host_part;

pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(reads::overview_page))
        .route("/api/overview", get(reads::overview_json))
        .route("/fragments/overview", get(reads::overview_fragment))
        .route("/dependency/{name}", get(reads::dependency_page))
        .route(
            "/dependency/{name}/override",
            post(actions::override_action),
        )
        .route(
            "/dependency/{name}/enforcement",
            post(actions::enforcement_action),
        )
        .route("/dead-letters", get(reads::dead_letters_page))
        .route("/dead-letters/group", get(reads::group_page))
        .route("/dead-letters/message", get(reads::message_page))
        .route("/dead-letters/refresh", post(actions::refresh_action))
        .route("/dead-letters/purge", post(actions::purge_action))
        .route(
            "/dead-letters/message/replay",
            post(actions::message_replay_action),
        )
        .route(
            "/dead-letters/message/purge",
            post(actions::message_purge_action),
        )
        .route("/replay/dry-run", post(actions::dry_run_action))
        .route("/replay/start", post(actions::replay_action))
        .route("/replays", get(reads::replays_page))
        .route("/replay/{id}", get(reads::replay_page))
        .route("/replay/{id}/cancel", post(actions::cancel_action))
        .route("/replay/{id}/rerun", post(actions::rerun_action))
        .route("/api/replay/{id}", get(reads::replay_json))
        .route("/workers", get(reads::workers_page))
        .route("/api/workers", get(reads::workers_json))
        .route("/bullmq", get(bullmq::queues_page))
        .route("/bullmq/queue", get(bullmq::queue_page))
        .route("/audit", get(reads::audit_page))
        .route(
            "/incident",
            get(
                |axum::extract::State(app): axum::extract::State<Arc<App>>,
                 extract::Viewer(v): extract::Viewer,
                 axum::extract::Query(q): axum::extract::Query<
                    crate::pages::incident::IncidentQuery,
                >| crate::pages::incident::page(app, v, q),
            ),
        )
        .route("/login", get(login::login_page).post(login::login_action))
        .route("/logout", post(login::logout_action))
        .route("/static/console.js", get(security::script))
        .route("/static/console.css", get(security::style))
        .merge(Router::new().route("/metrics", get(security::metrics)))
        .layer(DefaultBodyLimit::max(security::MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            security::guard,
        ))
        .with_state(app)
}

/// `fut`, a call to Redis, within the console's upstream deadline.
async fn redis<T, E: Display + 'static>(
    app: &App,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, ConsoleError> {
    error::within(app.settings.upstream_timeout, "Redis", fut).await
}

/// `fut`, a call to RabbitMQ, within the console's upstream deadline.
async fn rabbitmq<T, E: Display + 'static>(
    app: &App,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, ConsoleError> {
    error::within(app.settings.upstream_timeout, "RabbitMQ", fut).await
}

/// The dependency a path names.
fn dependency(name: &str) -> Result<Dependency, ConsoleError> {
    Dependency::new(name).map_err(|e| {
        ConsoleError::BadRequest(format!(
            "{:?} is not a dependency name: {e}",
            fleet_budget::printable::escape_text(name)
        ))
    })
}
