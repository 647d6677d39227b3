//! Attempt ceilings and backoff: how many executions a job gets and how long it waits between them.
//!
//! * [`backoff`]: the exponential backoff and its centred jitter (why centred: see there);
//! * [`window`]: ceilings by time, a task retrying until its recovery window has passed;
//! * [`plan`]: the schedule a ceiling gives, for planning (`budgetctl plan`);
//! * [`hops`]: exact delays through fixed delay tiers (the broker's retry queues).
//!
//! `max_attempts` always counts executions *including the first*: `max_attempts = 5` means at
//! most 4 retries.
//!
//! `max_delay` bounds how long a job may be told to wait: a backoff delay is capped at it, and a
//! wait the job asks for itself (a dependency's `Retry-After`, a `fb-not-before-ms` header) that
//! is longer dead-letters the job `delay_exceeded` instead of holding it in the delay tiers
//! forever, never run and never dead-lettered.

pub mod backoff;
pub mod hops;
pub mod plan;
pub mod window;

use std::collections::HashMap;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

pub use backoff::Backoff;
pub use plan::{GUIDE_WINDOWS, PlannedAttempt, Schedule};
pub use window::{MAX_ATTEMPTS, delay_within_window};

/// Kinds of job with a default ceiling each (semantics: "Ceilings differ by job class").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobClass {
    /// Cheap idempotent internal calls: 8 attempts (the contract says 6–9).
    Idempotent,
    /// Metered third-party APIs: 4 attempts (3–4); honour `Retry-After`.
    Metered,
    /// Paid inference or rendering: 2 attempts (1–2).
    Paid,
    /// Non-idempotent side effects: 1 attempt, plus an idempotency key on the call.
    SideEffect,
    /// Batch reconciliation: 2 attempts.
    Batch,
}

impl JobClass {
    /// The default `max_attempts` of the class (executions including the first).
    #[must_use]
    pub fn max_attempts(self) -> u32 {
        match self {
            Self::Idempotent => 8,
            Self::Metered => 4,
            Self::Paid | Self::Batch => 2,
            Self::SideEffect => 1,
        }
    }

    /// Every class, for documentation and error messages.
    pub const ALL: [Self; 5] = [
        Self::Idempotent,
        Self::Metered,
        Self::Paid,
        Self::SideEffect,
        Self::Batch,
    ];

    /// The configuration name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idempotent => "idempotent",
            Self::Metered => "metered",
            Self::Paid => "paid",
            Self::SideEffect => "side_effect",
            Self::Batch => "batch",
        }
    }
}

/// The ceiling and backoff of one task.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TaskCeiling {
    /// Executions including the first. For a task with a recovery window, the count its window
    /// gives without jitter ([`Backoff::attempts_for_recovery_window`]): shown for planning, and
    /// the ceiling only when a caller cannot say when the first failure was.
    pub max_attempts: u32,
    /// Delays between executions.
    pub backoff: Backoff,
    /// A ceiling by time: retry until this long after the job's first failure, the last attempt
    /// running when it ends ([`window`]).
    pub recovery_window: Option<Duration>,
    /// The longest the job may wait before its next execution (`max_delay_secs`): backoff
    /// delays are capped at it, and a longer `Retry-After` or `fb-not-before-ms` dead-letters
    /// the job `delay_exceeded`. `None` as configured means the default
    /// ([`Ceilings::for_task`] fills it in).
    pub max_delay: Option<Duration>,
}

impl Default for TaskCeiling {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            backoff: Backoff::default(),
            recovery_window: None,
            max_delay: None,
        }
    }
}

impl TaskCeiling {
    /// A ceiling by time: retries until `window` after the first failure, with `backoff`.
    #[must_use]
    pub fn recovery_window(backoff: Backoff, window: Duration) -> Self {
        Self {
            max_attempts: backoff.attempts_for_recovery_window(window),
            backoff,
            recovery_window: Some(window),
            max_delay: None,
        }
    }

    /// Whether the job may wait `wait` before its next execution (at most `max_delay`).
    #[must_use]
    pub fn allows_wait(&self, wait: Duration) -> bool {
        self.max_delay.is_none_or(|max| wait <= max)
    }

    /// Whether the failure of execution `failed_attempt`, `since_first_failure` after the job's
    /// first failure (zero when this is the first), is final. A ceiling by time is reached
    /// when its window has passed; without the time, or without a window, the count decides.
    /// No ceiling allows more than [`MAX_ATTEMPTS`] executions.
    #[must_use]
    pub fn exhausted(&self, failed_attempt: u32, since_first_failure: Option<Duration>) -> bool {
        match (self.recovery_window, since_first_failure) {
            (Some(window), Some(elapsed)) => elapsed >= window || failed_attempt >= MAX_ATTEMPTS,
            _ => failed_attempt >= self.max_attempts,
        }
    }

    /// The delay after execution `failed_attempt` failed: the backoff's jittered delay, fitted
    /// to the recovery window when there is one and the time since the first failure is known
    /// ([`delay_within_window`]), and at most `max_delay`. A `Retry-After` is a lower bound, even
    /// past the window; one past `max_delay` is the caller's to refuse ([`Self::allows_wait`],
    /// checked before the budget is asked), so it is never shortened here.
    pub fn delay<R: Rng + ?Sized>(
        &self,
        failed_attempt: u32,
        since_first_failure: Option<Duration>,
        retry_after: Option<Duration>,
        rng: &mut R,
    ) -> Duration {
        let drawn = Backoff::jitter(self.backoff.nominal(failed_attempt), rng);
        let fitted = match (self.recovery_window, since_first_failure) {
            (Some(window), Some(elapsed)) => {
                delay_within_window(&self.backoff, failed_attempt, elapsed, window, drawn)
                    .unwrap_or(drawn)
            }
            _ => drawn,
        };
        let fitted = self.max_delay.map_or(fitted, |max| fitted.min(max));
        match retry_after {
            Some(floor) if floor > fitted => floor,
            _ => fitted,
        }
    }
}

/// The `max_delay` of tasks that set none: the longest of the default retry tiers (1,024 s), or
/// twice the task's backoff cap when that is longer ([`Ceilings::for_task`]).
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(1024);

/// Ceilings per task, with a default for tasks not listed.
#[derive(Debug, Clone)]
pub struct Ceilings {
    /// For tasks without their own entry.
    pub default: TaskCeiling,
    /// Per task.
    pub tasks: HashMap<String, TaskCeiling>,
    /// The `max_delay` of a task that sets none (neither in `[tasks.*]` nor in `[defaults]`):
    /// the longest retry tier. [`DEFAULT_MAX_DELAY`] unless the broker's configuration says
    /// otherwise (`fleet-budget-amqp` sets it from `amqp.retry_tiers_secs`).
    pub default_max_delay: Duration,
}

impl Default for Ceilings {
    fn default() -> Self {
        Self {
            default: TaskCeiling::default(),
            tasks: HashMap::new(),
            default_max_delay: DEFAULT_MAX_DELAY,
        }
    }
}

impl Ceilings {
    /// The ceiling of `task`, its `max_delay` filled in: as configured, else
    /// [`Ceilings::default_max_delay`] or twice the task's backoff cap, whichever is longer, so
    /// that the default never cuts a delay the task's own backoff draws (jitter reaches 5⁄4 of
    /// the cap, and a recovery window's last delay is lengthened by at most half a delay more).
    #[must_use]
    pub fn for_task(&self, task: &str) -> TaskCeiling {
        let mut ceiling = self.tasks.get(task).copied().unwrap_or(self.default);
        let own_backoff = ceiling.backoff.cap.saturating_mul(2);
        ceiling.max_delay = Some(
            ceiling
                .max_delay
                .unwrap_or_else(|| self.default_max_delay.max(own_backoff)),
        );
        ceiling
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    #[test]
    fn classes_follow_the_contract() {
        assert!((6..=9).contains(&JobClass::Idempotent.max_attempts()));
        assert!((3..=4).contains(&JobClass::Metered.max_attempts()));
        assert!((1..=2).contains(&JobClass::Paid.max_attempts()));
        assert_eq!(JobClass::SideEffect.max_attempts(), 1);
        assert_eq!(JobClass::Batch.max_attempts(), 2);
    }

    #[test]
    fn a_window_ceiling_counts_time_when_it_has_it() {
        let c = TaskCeiling::recovery_window(Backoff::default(), Duration::from_secs(15));
        assert_eq!(c.max_attempts, 4);
        let s = |secs| Some(Duration::from_secs(secs));
        assert!(!c.exhausted(1, s(0)));
        assert!(!c.exhausted(9, s(14)), "time, not the count, decides");
        assert!(c.exhausted(2, s(15)));
        assert!(c.exhausted(4, None), "without the time, the derived count");
        assert!(c.exhausted(MAX_ATTEMPTS, s(0)));
        let mut rng = SmallRng::seed_from_u64(3);
        assert_eq!(c.delay(3, s(6), None, &mut rng), Duration::from_secs(9));
        assert_eq!(
            c.delay(3, s(6), s(20), &mut rng),
            Duration::from_secs(20),
            "Retry-After is a floor"
        );
        let count = TaskCeiling::default();
        assert!(!count.exhausted(4, s(10_000)));
        assert!(count.exhausted(5, s(0)));
    }

    #[test]
    fn max_delay_caps_the_backoff_and_bounds_what_a_job_may_wait() {
        let capped = TaskCeiling {
            backoff: Backoff {
                cap: Duration::from_secs(86_400),
                ..Backoff::default()
            },
            max_delay: Some(Duration::from_secs(100)),
            ..TaskCeiling::default()
        };
        let mut rng = SmallRng::seed_from_u64(1);
        for attempt in 1..40 {
            assert!(capped.delay(attempt, None, None, &mut rng) <= Duration::from_secs(100));
        }
        assert!(capped.allows_wait(Duration::from_secs(100)));
        assert!(!capped.allows_wait(Duration::from_millis(100_001)));
        assert!(
            TaskCeiling::default().allows_wait(Duration::MAX),
            "unset: unbounded"
        );
        let ceilings = Ceilings {
            tasks: HashMap::from([("own".to_owned(), capped)]),
            ..Ceilings::default()
        };
        assert_eq!(
            ceilings.for_task("own").max_delay,
            Some(Duration::from_secs(100))
        );
        assert_eq!(
            ceilings.for_task("other").max_delay,
            Some(Duration::from_secs(1200)),
            "twice the default 600 s backoff cap, longer than the longest default tier"
        );
        // Unset: never shorter than what the task's own backoff can draw.
        let slow = TaskCeiling {
            max_delay: None,
            ..capped
        };
        let ceilings = Ceilings {
            tasks: HashMap::from([("slow".to_owned(), slow)]),
            default_max_delay: Duration::from_millis(200),
            ..Ceilings::default()
        };
        assert_eq!(
            ceilings.for_task("slow").max_delay,
            Some(Duration::from_secs(2 * 86_400))
        );
        let short_cap = Ceilings {
            default: TaskCeiling {
                backoff: Backoff {
                    cap: Duration::from_secs(10),
                    ..Backoff::default()
                },
                ..TaskCeiling::default()
            },
            ..Ceilings::default()
        };
        assert_eq!(
            short_cap.for_task("any").max_delay,
            Some(DEFAULT_MAX_DELAY),
            "the longest tier"
        );
    }
}
