//! What happens to a failed job: retry after a delay, or dead-letter with a reason.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::allowance::BudgetSnapshot;
use crate::dependency::Dependency;

/// How a failure should be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// Worth retrying (a timeout, a 5xx-like error).
    Retryable,
    /// Retrying cannot help (bad input, a 4xx-like error).
    NonRetryable,
    /// Retryable, and the dependency said when: the delay is at least this long.
    RetryAfter(Duration),
    /// The message cannot even be decoded. Never retried.
    Poison,
}

/// A failed execution, as the handler describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// How to treat it.
    pub kind: FailureKind,
    /// A short class of error (`timeout`, `http_503`, `decode`), for headers and metrics.
    pub class: String,
    /// The error text (redacted and truncated before it leaves the process).
    pub message: String,
    /// The dependency that failed, when the job calls several ([`Failure::in_dependency`]);
    /// `None`: the task's own dependency.
    pub dependency: Option<String>,
}

impl Failure {
    /// A retryable failure.
    pub fn retryable(error: impl fmt::Display) -> Self {
        Self {
            kind: FailureKind::Retryable,
            class: "error".to_owned(),
            message: error.to_string(),
            dependency: None,
        }
    }

    /// A failure that retrying cannot fix.
    pub fn non_retryable(error: impl fmt::Display) -> Self {
        Self {
            kind: FailureKind::NonRetryable,
            class: "error".to_owned(),
            message: error.to_string(),
            dependency: None,
        }
    }

    /// A retryable failure whose delay must be at least `after` (a `Retry-After`).
    pub fn retry_after(after: Duration, error: impl fmt::Display) -> Self {
        Self {
            kind: FailureKind::RetryAfter(after),
            class: "error".to_owned(),
            message: error.to_string(),
            dependency: None,
        }
    }

    /// An undecodable message.
    pub fn poison(error: impl fmt::Display) -> Self {
        Self {
            kind: FailureKind::Poison,
            class: "poison".to_owned(),
            message: error.to_string(),
            dependency: None,
        }
    }

    /// Names the dependency that failed, for a job that calls several: the retry is asked of
    /// that dependency's budget instead of the task's (see `budget::fanout`).
    #[must_use]
    pub fn in_dependency(mut self, dependency: impl Into<String>) -> Self {
        self.dependency = Some(dependency.into());
        self
    }

    /// Sets the error class.
    #[must_use]
    pub fn with_class(mut self, class: impl Into<String>) -> Self {
        self.class = class.into();
        self
    }

    /// Whether a retry could help.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            FailureKind::Retryable | FailureKind::RetryAfter(_)
        )
    }

    /// The lower bound on the delay, if the dependency sent one.
    #[must_use]
    pub fn retry_after_hint(&self) -> Option<Duration> {
        match self.kind {
            FailureKind::RetryAfter(d) => Some(d),
            _ => None,
        }
    }
}

/// Why a job was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The failure cannot be fixed by retrying (includes undecodable messages). No budget spent.
    NonRetryable,
    /// `attempt >= max_attempts`. No budget spent.
    AttemptsExhausted,
    /// The dependency's fleet-wide retry budget refused the retry.
    BudgetExhausted,
    /// An operator froze the dependency's retries (`budgetctl budget freeze`): none is granted,
    /// the floor included, until the freeze expires or is lifted.
    BudgetFrozen,
    /// The retry got the rate budget, but the dependency's calls in flight were at its
    /// concurrency cap when it was to run (`[dependencies.X.concurrency] cap`).
    ConcurrencyCap,
    /// The retry got the rate budget, but the retries in flight filled the concurrency budget's
    /// retry share when it was to run.
    ConcurrencyRetryShare,
    /// The dependency's circuit breaker stayed open (or half-open with every probe out) for
    /// longer than the job may wait (`[dependencies.X.breaker] max_wait_secs`). No attempt spent.
    CircuitOpen,
    /// A job fanning out to several dependencies used up its retries across its branches
    /// ([`crate::budget::FanOut`]). No budget spent.
    FanoutExhausted,
    /// The job would wait longer than its task's `max_delay`: a `Retry-After` past it, or a
    /// `fb-not-before-ms` further away than it. No budget spent.
    DelayExceeded,
}

impl DeadLetterReason {
    /// Every reason.
    pub const ALL: [Self; 9] = [
        Self::NonRetryable,
        Self::AttemptsExhausted,
        Self::BudgetExhausted,
        Self::BudgetFrozen,
        Self::ConcurrencyCap,
        Self::ConcurrencyRetryShare,
        Self::CircuitOpen,
        Self::FanoutExhausted,
        Self::DelayExceeded,
    ];

    /// The wire name (`non_retryable`, `attempts_exhausted`, `budget_exhausted`,
    /// `budget_frozen`, `concurrency_cap`, `concurrency_retry_share`, `circuit_open`,
    /// `fanout_exhausted`, `delay_exceeded`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NonRetryable => "non_retryable",
            Self::AttemptsExhausted => "attempts_exhausted",
            Self::BudgetExhausted => "budget_exhausted",
            Self::BudgetFrozen => "budget_frozen",
            Self::ConcurrencyCap => "concurrency_cap",
            Self::ConcurrencyRetryShare => "concurrency_retry_share",
            Self::CircuitOpen => "circuit_open",
            Self::FanoutExhausted => "fanout_exhausted",
            Self::DelayExceeded => "delay_exceeded",
        }
    }

    /// Parses a wire name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which budget answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetSource {
    /// The fleet-wide store (Redis).
    Fleet,
    /// A denial of the fleet-wide store that still stands, answered in the process without a
    /// call (`redis.deny_cache_ms`): the budget was exhausted and cannot grant before a change.
    FleetCache,
    /// The per-process fallback budget, because the fleet store did not answer in time.
    LocalFallback,
    /// Fallback `deny` or `allow`: no budget was consulted.
    Blind,
    /// A local-only budget by configuration (no Redis).
    Local,
    /// No budget was asked: the failure was not retryable, the attempts were exhausted, or the
    /// delay was past the task's `max_delay`.
    NotConsulted,
}

impl BudgetSource {
    /// The wire name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fleet => "fleet",
            Self::FleetCache => "fleet_cache",
            Self::LocalFallback => "local_fallback",
            Self::Blind => "blind",
            Self::Local => "local",
            Self::NotConsulted => "not_consulted",
        }
    }

    /// Every source.
    pub const ALL: [Self; 6] = [
        Self::Fleet,
        Self::FleetCache,
        Self::LocalFallback,
        Self::Blind,
        Self::Local,
        Self::NotConsulted,
    ];

    /// Parses a wire name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.as_str() == s)
    }
}

/// Whether a dependency's rate budget has the last word (`enforcement` in `[defaults]` and
/// `[dependencies.X]`, and the operators' `budgetctl budget shadow|enforce`).
///
/// In [`Enforcement::Shadow`] every decision is made exactly as in enforcement (the same
/// scripts, the same counters: a retry the budget refuses is counted as a denial in Redis and in
/// `fleet_budget_retries_denied_total`), but a retry refused with `budget_exhausted` is retried
/// as if granted, its [`Decision::Retry`] saying so (`shadow_denied`) and counted in
/// `fleet_budget_retries_would_deny_total`. Everything else still dead-letters: the failure
/// not retryable, the ceiling, `max_delay`, an operator's freeze (an order, not an
/// observation), the concurrency budget and the circuit breaker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    /// A refused retry is dead-lettered (the default).
    #[default]
    Enforce,
    /// A refused retry is counted as a denial and retried anyway.
    Shadow,
}

impl Enforcement {
    /// The wire name: `enforce` or `shadow`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Shadow => "shadow",
        }
    }

    /// Parses a wire name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Enforce, Self::Shadow]
            .into_iter()
            .find(|e| e.as_str() == s)
    }
}

impl fmt::Display for Enforcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of [`crate::FleetBudget::on_failure`].
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Retry the job after `delay`.
    Retry {
        /// The dependency whose budget paid for it.
        dependency: Dependency,
        /// How long to wait: backoff with jitter, at least any `Retry-After`.
        delay: Duration,
        /// The attempt number of the retry (the failed attempt + 1).
        next_attempt: u32,
        /// The budget after this grant.
        snapshot: BudgetSnapshot,
        /// Which budget granted it.
        source: BudgetSource,
        /// The dependency is in shadow ([`Enforcement::Shadow`]) and its budget refused this
        /// retry for this reason: enforcement would have dead-lettered the job. `None`: the
        /// budget granted it.
        shadow_denied: Option<DeadLetterReason>,
    },
    /// Dead-letter the job now.
    DeadLetter {
        /// The dependency of the task.
        dependency: Dependency,
        /// Why.
        reason: DeadLetterReason,
        /// The budget as seen when it refused (only for `budget_exhausted` and `budget_frozen`).
        snapshot: Option<BudgetSnapshot>,
        /// Which budget refused (`NotConsulted` unless the reason is `budget_exhausted`).
        source: BudgetSource,
    },
}

impl Decision {
    /// Whether the job is to be retried.
    #[must_use]
    pub fn is_retry(&self) -> bool {
        matches!(self, Self::Retry { .. })
    }

    /// The reason enforcement would have dead-lettered a retry granted in shadow
    /// ([`Enforcement::Shadow`]).
    #[must_use]
    pub fn shadow_denied(&self) -> Option<DeadLetterReason> {
        match self {
            Self::Retry { shadow_denied, .. } => *shadow_denied,
            Self::DeadLetter { .. } => None,
        }
    }

    /// The reason, when the job is dead-lettered.
    #[must_use]
    pub fn dead_letter_reason(&self) -> Option<DeadLetterReason> {
        match self {
            Self::DeadLetter { reason, .. } => Some(*reason),
            Self::Retry { .. } => None,
        }
    }
}
