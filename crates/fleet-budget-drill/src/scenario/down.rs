//! `--scenario down`: the dependency refuses every call for a while, then comes back.
//!
//! Without a breaker, every job that arrives while it is down spends all its attempts in a few
//! seconds (the backoffs are short) and is dead-lettered `max_attempts`; the backlog drains only
//! when someone replays the dead letters. With the fleet-wide circuit breaker (in Redis) the
//! failures open it; jobs then wait in the delay tiers without running or spending an attempt;
//! after the open period a few probes (spent from the rate budget's floor) test the dependency,
//! reopen it while it is still down, close it once it answers, and the held jobs drain on their
//! own.

use std::time::Duration;

use fleet_budget::Config;
use fleet_budget::breaker::BreakerPolicy;

use super::dependency::{Profile, Trouble, TroubleKind};
use super::{Scenario, Setup};
use crate::{DEPENDENCY, DrillError};

/// Default length of each phase (healthy, down, recovered).
const PHASE: Duration = Duration::from_secs(5);
/// Default jobs per second.
const RATE: u32 = 60;

fn breaker() -> BreakerPolicy {
    BreakerPolicy {
        window: Duration::from_secs(2),
        failure_ratio: 0.5,
        min_volume: 20,
        open: Duration::from_secs(2),
        half_open_probes: 3,
        close_after: 2,
        probe_timeout: Duration::from_secs(5),
        max_wait: Duration::from_secs(120),
    }
}

pub(super) fn setup(phase: Option<Duration>, rate: Option<u32>) -> Setup {
    let phase = phase.unwrap_or(PHASE);
    let b = breaker();
    Setup {
        scenario: Scenario::Down,
        labels: ["without breaker", "with breaker"],
        profile: Profile {
            cap: 50,
            latency: Duration::from_millis(50),
            timeout: Duration::from_secs(1),
            trouble: Trouble {
                from: phase,
                until: phase * 2,
                kind: TroubleKind::Down,
            },
        },
        rate: rate.unwrap_or(RATE),
        submit_for: phase * 3,
        workers: 4,
        prefetch: 8,
        replay_rate: RATE,
        protection: format!(
            "circuit breaker on `{DEPENDENCY}`: opens at {:.0}% failures over {}+ calls in {}s, open {}s, {} probes, closes after {} successes; jobs wait up to {}s",
            b.failure_ratio * 100.0,
            b.min_volume,
            b.window.as_secs(),
            b.open.as_secs(),
            b.half_open_probes,
            b.close_after,
            b.max_wait.as_secs()
        ),
        protect,
    }
}

fn protect(c: &mut Config) -> Result<(), DrillError> {
    c.breakers.insert(
        fleet_budget::Dependency::new(DEPENDENCY)?,
        breaker().checked()?,
    );
    Ok(())
}
