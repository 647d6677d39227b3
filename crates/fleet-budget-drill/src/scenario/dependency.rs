//! The dependency of the scenarios, on real time: a service with a hard cap on the calls it
//! works on at once, a latency that rises as those calls near the cap, a queue past the cap, and
//! callers that give up after a timeout. A period of trouble follows a schedule: the service
//! fails a share of its calls after doing the work (it fails *slowly*), or it is down and
//! refuses every call at once.
//!
//! A call the caller abandoned at its timeout is not cancelled: the service still works on it
//! (it never learnt the caller left), so it stays in flight until it completes. That is what
//! turns timeouts into a storm: the retries of abandoned calls queue behind the calls they
//! retry.
//!
//! The latency of a call with `n` calls being worked on is `latency × (1 + ¼ (n / cap)⁴)`: a
//! quarter more at the cap, the shape of the time-stepped model of `simulate concurrency`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{Semaphore, oneshot};

/// Calls are counted per second for this many seconds of a run at most; later ones count in
/// the last second.
const MAX_SECONDS: usize = 3_600;

/// What goes wrong with the dependency, and when (relative to the start of a run).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Trouble {
    /// When it starts.
    #[serde(rename = "from_ms", serialize_with = "millis")]
    pub from: Duration,
    /// When it ends.
    #[serde(rename = "until_ms", serialize_with = "millis")]
    pub until: Duration,
    /// What it is.
    pub kind: TroubleKind,
}

/// How the dependency misbehaves during its trouble.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TroubleKind {
    /// It works on every call as usual, then fails this many in every ten (a 503 after the
    /// full latency).
    FailsSlowly {
        /// Failed calls in every ten.
        in_ten: u64,
    },
    /// It is down: every call is refused at once.
    Down,
}

/// The dependency's shape.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Profile {
    /// Calls it works on at once; more wait in its queue.
    pub cap: usize,
    /// Time it takes to serve a call when idle.
    #[serde(rename = "latency_ms", serialize_with = "millis")]
    pub latency: Duration,
    /// How long a caller waits for an answer before giving up (a timeout is a failure).
    #[serde(rename = "timeout_ms", serialize_with = "millis")]
    pub timeout: Duration,
    /// Its trouble.
    pub trouble: Trouble,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's signature
fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u128(d.as_millis())
}

/// How a call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallFailure {
    /// The service answered 503 after working on it.
    Failed,
    /// No answer within the caller's timeout.
    TimedOut,
    /// The service is down: refused at once.
    Refused,
    /// The job's input is bad: 400, whatever the load.
    BadInput,
}

/// The dependency, shared by every worker of a run.
#[derive(Debug)]
pub(crate) struct Dependency {
    profile: Profile,
    started: Instant,
    queue: Arc<Semaphore>,
    /// Calls queued or worked on, abandoned ones included.
    in_flight: Arc<AtomicU64>,
    peak_in_flight: Arc<AtomicU64>,
    calls: AtomicU64,
    timeouts: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    per_second: Mutex<Vec<u64>>,
    peak_per_second: Mutex<Vec<u64>>,
}

impl Dependency {
    /// A dependency with `profile`; its schedule starts now.
    pub(crate) fn new(profile: Profile) -> Self {
        Self {
            profile,
            started: Instant::now(),
            queue: Arc::new(Semaphore::new(profile.cap)),
            in_flight: Arc::default(),
            peak_in_flight: Arc::default(),
            calls: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            per_second: Mutex::default(),
            peak_per_second: Mutex::default(),
        }
    }

    /// Time since the start of the run.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Whether it is in trouble now.
    pub(crate) fn in_trouble(&self) -> bool {
        let t = self.profile.trouble;
        (t.from..t.until).contains(&self.elapsed())
    }

    /// One call, as the caller sees it: the answer, or [`CallFailure::TimedOut`] once the
    /// caller's timeout has passed (the service then goes on working on it).
    pub(crate) async fn call(&self, bad_input: bool) -> Result<(), CallFailure> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let second = usize::try_from(self.elapsed().as_secs())
            .unwrap_or(usize::MAX)
            .min(MAX_SECONDS - 1);
        bump_at(&self.per_second, second);
        let trouble = self.in_trouble().then_some(self.profile.trouble.kind);
        if matches!(trouble, Some(TroubleKind::Down)) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            // A refused connection still costs a round trip.
            tokio::time::sleep(Duration::from_millis(2)).await;
            return Err(CallFailure::Refused);
        }
        let fails = match trouble {
            Some(TroubleKind::FailsSlowly { in_ten }) => n % 10 < in_ten,
            _ => false,
        };
        let (answer_tx, answer) = oneshot::channel();
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_in_flight.fetch_max(now, Ordering::Relaxed);
        {
            let mut peaks = lock(&self.peak_per_second);
            if peaks.len() <= second {
                peaks.resize(second + 1, 0);
            }
            if let Some(p) = peaks.get_mut(second) {
                *p = (*p).max(now);
            }
        }
        let (queue, in_flight) = (Arc::clone(&self.queue), Arc::clone(&self.in_flight));
        let (cap, latency) = (self.profile.cap, self.profile.latency);
        // The service's side: it works on the call whether or not the caller still waits.
        tokio::spawn(async move {
            if let Ok(_slot) = queue.acquire().await {
                let working = cap.saturating_sub(queue.available_permits());
                #[allow(clippy::cast_precision_loss)]
                let load = working as f64 / cap.max(1) as f64;
                tokio::time::sleep(latency.mul_f64(1.0 + 0.25 * load.powi(4))).await;
            }
            in_flight.fetch_sub(1, Ordering::Relaxed);
            let _ = answer_tx.send(());
        });
        match tokio::time::timeout(self.profile.timeout, answer).await {
            Err(_) => {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                Err(CallFailure::TimedOut)
            }
            Ok(_) if bad_input => Err(CallFailure::BadInput),
            Ok(_) if fails => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                Err(CallFailure::Failed)
            }
            Ok(_) => Ok(()),
        }
    }

    /// Calls made so far (executions).
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Calls queued or worked on now.
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The most calls queued or worked on at once.
    pub(crate) fn peak_in_flight(&self) -> u64 {
        self.peak_in_flight.load(Ordering::Relaxed)
    }

    /// Calls whose caller gave up.
    pub(crate) fn timeouts(&self) -> u64 {
        self.timeouts.load(Ordering::Relaxed)
    }

    /// Calls refused while down.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Calls answered 503.
    pub(crate) fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Calls in each second of the run.
    pub(crate) fn per_second(&self) -> Vec<u64> {
        lock(&self.per_second).clone()
    }

    /// The most calls in flight in each second of the run.
    pub(crate) fn peak_in_flight_per_second(&self) -> Vec<u64> {
        lock(&self.peak_per_second).clone()
    }
}

fn bump_at(counts: &Mutex<Vec<u64>>, i: usize) {
    let mut counts = lock(counts);
    if counts.len() <= i {
        counts.resize(i + 1, 0);
    }
    if let Some(c) = counts.get_mut(i) {
        *c += 1;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(kind: TroubleKind, from_ms: u64) -> Profile {
        Profile {
            cap: 2,
            latency: Duration::from_millis(40),
            timeout: Duration::from_millis(400),
            trouble: Trouble {
                from: Duration::from_millis(from_ms),
                until: Duration::from_secs(3_600),
                kind,
            },
        }
    }

    #[tokio::test]
    async fn abandoned_calls_stay_in_flight_past_the_cap() {
        let d = Dependency::new(Profile {
            latency: Duration::from_secs(600),
            timeout: Duration::from_millis(1),
            ..profile(TroubleKind::Down, 3_600_000)
        });
        for _ in 0..6 {
            assert_eq!(d.call(false).await, Err(CallFailure::TimedOut));
        }
        // Every caller gave up; the service still has all six: two worked on, four queued.
        assert_eq!((d.timeouts(), d.in_flight(), d.peak_in_flight()), (6, 6, 6));
        assert_eq!(d.calls(), 6);
    }

    #[tokio::test]
    async fn a_slow_failure_takes_its_slot_and_a_down_service_refuses() {
        let d = Dependency::new(profile(TroubleKind::FailsSlowly { in_ten: 4 }, 0));
        let mut failed = 0;
        for _ in 0..10 {
            if d.call(false).await == Err(CallFailure::Failed) {
                failed += 1;
            }
        }
        assert_eq!(failed, 4);
        assert_eq!(d.call(true).await, Err(CallFailure::BadInput));
        let down = Dependency::new(profile(TroubleKind::Down, 0));
        assert_eq!(down.call(false).await, Err(CallFailure::Refused));
        assert_eq!((down.refused(), down.in_flight()), (1, 0));
    }
}
