//! tower middleware that draws every retry from [`fleet_budget`]'s fleet-wide budget.
//!
//! A tower service (a plain `Service`, a tonic or hyper client wrapped in tower) retries a failed
//! request only when the dependency's budget, shared by every worker of the fleet in Redis,
//! grants it, after the backoff the budget computes; otherwise the caller gets
//! [`RetryRefused`]. Attempts and successes are deposits, counted as the queue workers count
//! them. One line:
//!
//! ```no_run
//! # async fn demo(budget: fleet_budget::FleetBudget) -> Result<(), tower::BoxError> {
//! use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
//!
//! let client = tower::service_fn(|q: String| async move { Ok::<_, BoxError>(q.len()) });
//! let mut search = ServiceBuilder::new()
//!     .layer(fleet_budget_tower::FleetRetryLayer::new(budget, "search_query")?)
//!     .service(client);
//! let hits = search.ready().await?.call("fleet budget".to_owned()).await?;
//! # let _ = hits; Ok(()) }
//! ```
//!
//! The pieces, for a stack that composes tower's own [`tower::retry::Retry`]:
//! [`FleetPolicy`] is a [`tower::retry::Policy`]; tower's policies answer "retry?" at once, and
//! the budget answers over the network, so the policy asks while the retry waits and
//! [`FleetPolicy::gate`] wraps the inner service to stop a refused retry before it reaches the
//! dependency. [`FleetRetryLayer`] puts the two together. [`Classify`] says which results are
//! failures (by default every `Err`, retryable).

mod classify;
mod layer;
mod policy;

pub use classify::{Classify, ErrorsAreRetryable, Outcome};
pub use layer::{FleetRetry, FleetRetryLayer};
pub use policy::{Attempt, FleetPolicy, Gate, GateFuture, RetryRefused, Wait};
