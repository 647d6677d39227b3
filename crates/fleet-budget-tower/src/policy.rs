//! [`FleetPolicy`], a [`tower::retry::Policy`] that asks the fleet budget, and [`Gate`], which
//! keeps a refused retry from reaching the dependency.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use fleet_budget::{Decision, Failure, FleetBudget};
use tower::Service;
use tower::retry::Policy;

use crate::classify::{Classify, Outcome};

/// A request on its way through [`FleetPolicy`]: the caller's request and what the policy knows
/// of it (which execution is under way; a refusal). Clones share that state, so the copy
/// [`tower::retry::Retry`] keeps for the next attempt sees the policy's answer.
#[derive(Debug)]
pub struct Attempt<R> {
    request: R,
    state: Arc<State>,
}

#[derive(Debug)]
struct State {
    /// The number of the execution under way, from 1.
    number: AtomicU32,
    /// Set when the budget refused a retry: the gate answers with it.
    refused: Mutex<Option<RetryRefused>>,
}

impl<R> Attempt<R> {
    /// A request's first attempt.
    pub fn new(request: R) -> Self {
        Self {
            request,
            state: Arc::new(State {
                number: AtomicU32::new(1),
                refused: Mutex::new(None),
            }),
        }
    }

    /// The number of the execution under way: 1 for the first, 2 for the first retry.
    pub fn number(&self) -> u32 {
        self.state.number.load(Ordering::Acquire)
    }

    /// The caller's request.
    pub fn request(&self) -> &R {
        &self.request
    }

    /// The refusal of the budget, once it refused.
    pub fn refused(&self) -> Option<RetryRefused> {
        self.state
            .refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn refuse(&self, refused: RetryRefused) {
        *self
            .state
            .refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(refused);
    }
}

impl<R: Clone> Clone for Attempt<R> {
    fn clone(&self) -> Self {
        Self {
            request: self.request.clone(),
            state: Arc::clone(&self.state),
        }
    }
}

/// The error a request ends with when the fleet budget refused its retry (or the ceiling of its
/// task did: `attempts_exhausted`, `delay_exceeded`). It carries the budget's decision and the
/// failure that asked. The inner service's error type must be `From<RetryRefused>`
/// (`tower::BoxError` is).
#[derive(Debug, Clone, PartialEq)]
pub struct RetryRefused {
    /// The execution that failed, from 1.
    pub attempt: u32,
    /// Its failure's text.
    pub failure: String,
    /// Why there is no retry: the dead-letter reason (`budget_exhausted`, `budget_frozen`,
    /// `attempts_exhausted`, `delay_exceeded`), or `error` when the budget could not decide.
    pub reason: String,
    /// The budget's decision (`None` when it could not decide).
    pub decision: Option<Decision>,
}

impl RetryRefused {
    fn new(attempt: u32, failure: &Failure, decision: Result<Decision, String>) -> Self {
        let (reason, decision) = match decision {
            Ok(d) => (
                d.dead_letter_reason()
                    .map_or("retry", |r| r.as_str())
                    .to_owned(),
                Some(d),
            ),
            Err(e) => (format!("error: {e}"), None),
        };
        Self {
            attempt,
            failure: failure.message.clone(),
            reason,
            decision,
        }
    }
}

impl fmt::Display for RetryRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no retry after attempt {} ({}): {}",
            self.attempt, self.reason, self.failure
        )
    }
}

impl std::error::Error for RetryRefused {}

/// A [`tower::retry::Policy`] backed by a [`FleetBudget`]: a result its [`Classify`] calls a
/// retryable failure is retried when the fleet budget of `task`'s dependency grants it, after
/// the delay the budget computes (backoff, at least any `Retry-After`), within the task's
/// ceiling. tower asks a policy at once and the budget answers over the network, so
/// [`Policy::retry`] returns a wait that asks the budget, then sleeps the granted delay; a
/// refusal is recorded in the [`Attempt`] and answered by the [`Gate`] in front of the inner
/// service, without calling it. Use it with [`tower::retry::Retry`] over [`FleetPolicy::gate`],
/// or take both at once with [`crate::FleetRetryLayer`].
#[derive(Debug, Clone)]
pub struct FleetPolicy<C> {
    budget: FleetBudget,
    task: Arc<str>,
    classify: C,
}

impl<C> FleetPolicy<C> {
    /// A policy for `task` (mapped to its dependency by the budget's configuration).
    ///
    /// # Errors
    /// The task has no dependency and cannot be its own ([`FleetBudget::route`]).
    pub fn new(budget: FleetBudget, task: &str, classify: C) -> Result<Self, fleet_budget::Error> {
        budget.route(task)?;
        Ok(Self {
            budget,
            task: Arc::from(task),
            classify,
        })
    }

    /// The task whose budget and ceiling it uses.
    pub fn task(&self) -> &str {
        &self.task
    }

    /// The inner service behind the gate this policy's refusals need.
    pub fn gate<S>(&self, inner: S) -> Gate<S, C>
    where
        C: Clone,
    {
        Gate {
            inner,
            budget: self.budget.clone(),
            task: Arc::clone(&self.task),
            classify: self.classify.clone(),
        }
    }
}

/// The wait [`FleetPolicy`] returns: asking the budget, then the granted delay.
pub type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

impl<R, Res, E, C> Policy<Attempt<R>, Res, E> for FleetPolicy<C>
where
    R: Clone,
    C: Classify<Res, E>,
{
    type Future = Wait;

    fn retry(&mut self, req: &mut Attempt<R>, result: &mut Result<Res, E>) -> Option<Wait> {
        if req.refused().is_some() {
            return None; // the gate's answer: the refusal is the result
        }
        let failure = match self.classify.classify(result) {
            Outcome::Success => return None,
            Outcome::Failure(f) if !f.is_retryable() => return None,
            Outcome::Failure(f) => f,
        };
        let attempt = req.number();
        let budget = self.budget.clone();
        let task = Arc::clone(&self.task);
        let next = Attempt {
            request: (),
            state: Arc::clone(&req.state),
        };
        Some(Box::pin(async move {
            match budget.on_failure(&task, attempt, &failure).await {
                Ok(Decision::Retry {
                    delay,
                    next_attempt,
                    ..
                }) => {
                    next.state.number.store(next_attempt, Ordering::Release);
                    tokio::time::sleep(delay).await;
                }
                Ok(refused) => next.refuse(RetryRefused::new(attempt, &failure, Ok(refused))),
                Err(e) => next.refuse(RetryRefused::new(attempt, &failure, Err(e.to_string()))),
            }
        }))
    }

    fn clone_request(&mut self, req: &Attempt<R>) -> Option<Attempt<R>> {
        Some(req.clone())
    }
}

/// The inner service behind [`FleetPolicy`]: it answers a refused retry with [`RetryRefused`]
/// without calling the dependency, and counts the deposits of each execution (every attempt,
/// and each success by the policy's [`Classify`]) in the budget, as the queue workers do.
#[derive(Debug, Clone)]
pub struct Gate<S, C> {
    inner: S,
    budget: FleetBudget,
    task: Arc<str>,
    classify: C,
}

/// The future of a [`Gate`] call.
pub type GateFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, R, C> Service<Attempt<R>> for Gate<S, C>
where
    S: Service<R>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: From<RetryRefused> + Send + 'static,
    C: Classify<S::Response, S::Error> + Clone + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = GateFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, attempt: Attempt<R>) -> Self::Future {
        if let Some(refused) = attempt.refused() {
            return Box::pin(std::future::ready(Err(S::Error::from(refused))));
        }
        let number = attempt.number();
        let call = self.inner.call(attempt.request);
        let budget = self.budget.clone();
        let task = Arc::clone(&self.task);
        let classify = self.classify.clone();
        Box::pin(async move {
            // Counted in the process and sent coalesced (no round trip here). The task was
            // checked when the policy was made, the only error these return.
            let _ = budget.on_attempt(&task, number).await;
            let result = call.await;
            if classify.classify(&result) == Outcome::Success {
                let _ = budget.on_success(&task).await;
            }
            result
        })
    }
}
