//! `--scenario slow`: the dependency — a cap of 20 calls at once, 16 in flight at
//! normal load — fails 4 calls in 10, slowly (after the full latency), for a while. Each failure
//! may be retried (up to the drill's attempts, no rate limit in either run).
//!
//! Without a budget the retries add to the primaries: past the cap calls queue, queued calls
//! time out, a timeout is a failure and a failure a retry, and the abandoned calls stay in
//! the service's queue. With the concurrency budget (`ConcurrencyPolicy::derived(20, 16, 3)`:
//! a retry share of (20 − 16) / 16 = 25%, at least 3 slots) a retry runs only on a free retry
//! slot and is dead-lettered `concurrency_retry_share` at once otherwise, to be replayed after
//! recovery.

use std::time::Duration;

use fleet_budget::Config;
use fleet_budget::concurrency::ConcurrencyPolicy;

use super::dependency::{Profile, Trouble, TroubleKind};
use super::{Scenario, Setup};
use crate::{DEPENDENCY, DrillError};

/// The dependency's cap, and the primary calls in flight it is sized for.
const CAP: u64 = 20;
const PLANNED_PRIMARY: u64 = 16;
const MIN_RETRY_SLOTS: u64 = 3;
/// Service time when idle.
const LATENCY: Duration = Duration::from_millis(200);
/// Callers give up after this.
const TIMEOUT: Duration = Duration::from_millis(800);
/// Default length of each phase (normal, failing, recovered).
const PHASE: Duration = Duration::from_secs(5);

pub(super) fn setup(phase: Option<Duration>, rate: Option<u32>) -> Setup {
    let phase = phase.unwrap_or(PHASE);
    // 16 in flight at the latency near 16/20 of the cap (about 1.1 × the idle latency).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let planned_rate = (PLANNED_PRIMARY as f64 / (LATENCY.as_secs_f64() * 1.1)).round() as u32;
    Setup {
        scenario: Scenario::Slow,
        labels: ["without budget", "with concurrency budget"],
        profile: Profile {
            cap: usize::try_from(CAP).unwrap_or(usize::MAX),
            latency: LATENCY,
            timeout: TIMEOUT,
            trouble: Trouble {
                from: phase,
                until: phase * 2,
                kind: TroubleKind::FailsSlowly { in_ten: 4 },
            },
        },
        rate: rate.unwrap_or(planned_rate),
        submit_for: phase * 3,
        workers: 4,
        prefetch: 16,
        replay_rate: planned_rate / 2,
        protection: format!(
            "concurrency budget on `{DEPENDENCY}`: cap {CAP}, planned primary {PLANNED_PRIMARY} (retry share {:.0}%), at least {MIN_RETRY_SLOTS} retry slots",
            retry_share() * 100.0
        ),
        protect,
    }
}

#[allow(clippy::cast_precision_loss)]
fn retry_share() -> f64 {
    (CAP - PLANNED_PRIMARY) as f64 / PLANNED_PRIMARY as f64
}

fn protect(c: &mut Config) -> Result<(), DrillError> {
    let mut policy = ConcurrencyPolicy::derived(CAP, PLANNED_PRIMARY, MIN_RETRY_SLOTS)?;
    // Longer than any call of the scenario (a handler returns by the timeout).
    policy.lease = Duration::from_secs(10);
    c.concurrency
        .insert(fleet_budget::Dependency::new(DEPENDENCY)?, policy);
    Ok(())
}
