//! [`FleetRetryLayer`]: [`FleetPolicy`] and its [`Gate`] in one layer.

use std::task::{Context, Poll};

use fleet_budget::FleetBudget;
use tower::retry::Retry;
use tower::retry::future::ResponseFuture;
use tower::{Layer, Service};

use crate::classify::ErrorsAreRetryable;
use crate::policy::{Attempt, FleetPolicy, Gate};

/// Wraps a service so that its failed requests are retried on the fleet budget of a task:
/// `ServiceBuilder::new().layer(FleetRetryLayer::new(budget, "search_query")?)`. The inner
/// service must be `Clone` (each request keeps a handle for its retries; wrap it in
/// `tower::buffer::Buffer` if it is not), its requests `Clone`, and its error
/// `From<RetryRefused>` (`tower::BoxError` is).
#[derive(Debug, Clone)]
pub struct FleetRetryLayer<C = ErrorsAreRetryable> {
    policy: FleetPolicy<C>,
}

impl FleetRetryLayer {
    /// Retries on `task`'s budget every `Err` of the inner service ([`ErrorsAreRetryable`]).
    ///
    /// # Errors
    /// The task has no dependency and cannot be its own ([`FleetBudget::route`]).
    pub fn new(budget: FleetBudget, task: &str) -> Result<Self, fleet_budget::Error> {
        Ok(Self {
            policy: FleetPolicy::new(budget, task, ErrorsAreRetryable)?,
        })
    }
}

impl<C> FleetRetryLayer<C> {
    /// The same layer with another classification of results ([`crate::Classify`]).
    ///
    /// # Errors
    /// As [`FleetRetryLayer::new`].
    pub fn with_classify<D>(
        budget: FleetBudget,
        task: &str,
        classify: D,
    ) -> Result<FleetRetryLayer<D>, fleet_budget::Error> {
        Ok(FleetRetryLayer {
            policy: FleetPolicy::new(budget, task, classify)?,
        })
    }

    /// Its policy.
    pub fn policy(&self) -> &FleetPolicy<C> {
        &self.policy
    }
}

impl<S, C: Clone> Layer<S> for FleetRetryLayer<C> {
    type Service = FleetRetry<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        FleetRetry {
            retry: Retry::new(self.policy.clone(), self.policy.gate(inner)),
        }
    }
}

/// A service whose failed requests are retried on the fleet budget ([`FleetRetryLayer`]).
#[derive(Debug, Clone)]
pub struct FleetRetry<S, C> {
    retry: Retry<FleetPolicy<C>, Gate<S, C>>,
}

impl<S, R, C> Service<R> for FleetRetry<S, C>
where
    Gate<S, C>: Service<Attempt<R>> + Clone,
    FleetPolicy<C>: tower::retry::Policy<
            Attempt<R>,
            <Gate<S, C> as Service<Attempt<R>>>::Response,
            <Gate<S, C> as Service<Attempt<R>>>::Error,
        > + Clone,
{
    type Response = <Gate<S, C> as Service<Attempt<R>>>::Response;
    type Error = <Gate<S, C> as Service<Attempt<R>>>::Error;
    type Future = ResponseFuture<FleetPolicy<C>, Gate<S, C>, Attempt<R>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<Attempt<R>>::poll_ready(&mut self.retry, cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.retry.call(Attempt::new(request))
    }
}
