//! Attempt ceilings and backoff: how many executions a job gets and how long it waits between them.
//!
//! `max_attempts` always counts executions *including the first*: `max_attempts = 5` means at
//! most 4 retries.

use std::collections::HashMap;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

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

/// Exponential backoff with jitter and a cap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay after the first failed attempt, before jitter.
    pub base: Duration,
    /// Growth per attempt (2 doubles the delay each time).
    pub factor: f64,
    /// No delay exceeds this, before jitter.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(2),
            factor: 2.0,
            cap: Duration::from_secs(600),
        }
    }
}

impl Backoff {
    /// The delay after attempt `failed_attempt` (1 = the first execution) failed, before jitter:
    /// `min(cap, base × factor^(failed_attempt − 1))`.
    #[must_use]
    pub fn nominal(&self, failed_attempt: u32) -> Duration {
        let exponent = i32::try_from(failed_attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let secs = self.base.as_secs_f64() * self.factor.powi(exponent);
        let cap = self.cap.as_secs_f64();
        if secs.is_finite() && secs < cap {
            Duration::from_secs_f64(secs.max(0.0))
        } else {
            self.cap
        }
    }

    /// The delay to wait after attempt `failed_attempt` failed: "equal jitter", uniform in
    /// `[nominal / 2, nominal]`, so retries spread out while the backoff still grows. A
    /// `Retry-After` from the dependency is a lower bound.
    pub fn delay<R: Rng + ?Sized>(
        &self,
        failed_attempt: u32,
        retry_after: Option<Duration>,
        rng: &mut R,
    ) -> Duration {
        let nominal = self.nominal(failed_attempt);
        let half = nominal / 2;
        let jittered = half + half.mul_f64(rng.random::<f64>());
        match retry_after {
            Some(floor) if floor > jittered => floor,
            _ => jittered,
        }
    }

    /// The smallest `max_attempts` whose backoff covers `recovery` with no jitter: the least `n`
    /// with `Σ_{k=0}^{n−1} min(cap, base × factor^k) ≥ recovery`.
    ///
    /// With base 2 s, factor 2 and cap 600 s: 60 s → 5, 900 s → 9, 4 h → 32 (see the note on
    /// the published "4 h → 30" in `docs/semantics.md`, "Notes"). Returns at least 1, at most 1000.
    #[must_use]
    pub fn attempts_for_recovery_window(&self, recovery: Duration) -> u32 {
        let mut covered = Duration::ZERO;
        for n in 1..=1000u32 {
            covered += self.nominal(n);
            if covered >= recovery {
                return n;
            }
        }
        1000
    }
}

/// The ceiling and backoff of one task.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TaskCeiling {
    /// Executions including the first.
    pub max_attempts: u32,
    /// Delays between executions.
    pub backoff: Backoff,
}

impl Default for TaskCeiling {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            backoff: Backoff::default(),
        }
    }
}

/// Ceilings per task, with a default for tasks not listed.
#[derive(Debug, Clone, Default)]
pub struct Ceilings {
    /// For tasks without their own entry.
    pub default: TaskCeiling,
    /// Per task.
    pub tasks: HashMap<String, TaskCeiling>,
}

impl Ceilings {
    /// The ceiling of `task`.
    #[must_use]
    pub fn for_task(&self, task: &str) -> TaskCeiling {
        self.tasks.get(task).copied().unwrap_or(self.default)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    #[test]
    fn recovery_window_reference_points() {
        let b = Backoff::default();
        assert_eq!(b.attempts_for_recovery_window(Duration::from_secs(60)), 5);
        assert_eq!(b.attempts_for_recovery_window(Duration::from_secs(900)), 9);
        // 30 attempts cover 13,622 s (3.8 h); 4 h needs 32. See docs/semantics.md, "Notes".
        assert_eq!(
            b.attempts_for_recovery_window(Duration::from_secs(4 * 3600)),
            32
        );
        assert_eq!(b.attempts_for_recovery_window(Duration::ZERO), 1);
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered_within_bounds() {
        let b = Backoff::default();
        assert_eq!(b.nominal(1), Duration::from_secs(2));
        assert_eq!(b.nominal(4), Duration::from_secs(16));
        assert_eq!(b.nominal(20), Duration::from_secs(600));
        assert_eq!(b.nominal(u32::MAX), Duration::from_secs(600));
        let mut rng = SmallRng::seed_from_u64(7);
        for attempt in 1..15 {
            let d = b.delay(attempt, None, &mut rng);
            assert!(
                d >= b.nominal(attempt) / 2 && d <= b.nominal(attempt),
                "{attempt}: {d:?}"
            );
        }
    }

    #[test]
    fn retry_after_is_a_lower_bound() {
        let b = Backoff::default();
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(
            b.delay(1, Some(Duration::from_secs(30)), &mut rng),
            Duration::from_secs(30)
        );
        let d = b.delay(5, Some(Duration::from_millis(1)), &mut rng);
        assert!(d >= Duration::from_secs(16));
    }

    #[test]
    fn classes_follow_the_contract() {
        assert!((6..=9).contains(&JobClass::Idempotent.max_attempts()));
        assert!((3..=4).contains(&JobClass::Metered.max_attempts()));
        assert!((1..=2).contains(&JobClass::Paid.max_attempts()));
        assert_eq!(JobClass::SideEffect.max_attempts(), 1);
        assert_eq!(JobClass::Batch.max_attempts(), 2);
    }
}
