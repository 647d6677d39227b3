//! The budget's time: milliseconds since the Unix epoch, from the system clock, a coarse copy of
//! it read from memory, or a manual clock that tests move by hand.
//!
//! One [`Clock`] serves a [`crate::FleetBudget`]: the windows of its local store, the probe
//! interval of a failing fleet store, and the age of pending deposits
//! ([`crate::FleetBudgetBuilder::clock`]). [`now_ms`] is the one place the system clock is read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, as the store sees them.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// Milliseconds since the Unix epoch on the system's wall clock (0 before 1970).
#[must_use]
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        now_ms()
    }
}

/// The wall clock read from memory: a background thread refreshes it every
/// [`CoarseClock::RESOLUTION`], so a read costs an atomic load instead of a system call.
///
/// The local store's default: its windows are seconds long, so a few milliseconds of resolution
/// change nothing, and a decision gets cheaper than the clock read it would otherwise make. The
/// thread is started once per process on first use; if it cannot be started, reads fall back to
/// [`SystemClock`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CoarseClock;

static COARSE_NOW_MS: AtomicU64 = AtomicU64::new(0);
static COARSE_TICKER: OnceLock<bool> = OnceLock::new();

impl CoarseClock {
    /// How stale a reading can be.
    pub const RESOLUTION: Duration = Duration::from_millis(2);

    fn ticker_running() -> bool {
        *COARSE_TICKER.get_or_init(|| {
            COARSE_NOW_MS.store(SystemClock.now_ms(), Ordering::Relaxed);
            std::thread::Builder::new()
                .name("fleet-budget-clock".to_owned())
                .spawn(|| {
                    loop {
                        std::thread::sleep(Self::RESOLUTION);
                        COARSE_NOW_MS.store(SystemClock.now_ms(), Ordering::Relaxed);
                    }
                })
                .is_ok()
        })
    }
}

impl Clock for CoarseClock {
    fn now_ms(&self) -> u64 {
        if Self::ticker_running() {
            COARSE_NOW_MS.load(Ordering::Relaxed)
        } else {
            SystemClock.now_ms()
        }
    }
}

/// A clock that only moves when told to. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `start_ms`.
    #[must_use]
    pub fn new(start_ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(start_ms)))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `ms`.
    pub fn set_ms(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coarse_clock_follows_the_system_clock() {
        let coarse = CoarseClock.now_ms();
        let system = SystemClock.now_ms();
        assert!(system.abs_diff(coarse) < 1000, "{coarse} vs {system}");
        let manual = ManualClock::new(5);
        manual.advance(Duration::from_millis(10));
        assert_eq!(manual.now_ms(), 15);
    }
}
