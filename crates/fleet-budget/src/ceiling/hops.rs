//! Exact delays from fixed delay tiers: a delay is waited out by passing through several tiers
//! in turn, each a queue with one TTL (no per-message TTL, so no head-of-line blocking).
//!
//! The next hop for a remaining wait `r`, over tiers sorted shortest first:
//!
//! 1. the shortest tier `t` with `r ≤ t < r + resolution` ends the wait in one hop, late by less
//!    than the resolution;
//! 2. otherwise the longest tier `t ≤ r` (the wait goes on after it);
//! 3. otherwise (`r` below every tier) the shortest tier.
//!
//! The resolution is the shortest tier. The wait is over when the remaining time is zero or
//! less: a job never comes back before its delay, and comes back less than one resolution
//! after it (plus the time each hop takes to route). With tiers of 1, 2, 4, … 1,024 s any
//! delay up to 2,047 s takes at most 11 hops (one per bit of the delay in whole seconds);
//! with any other set the same rule holds, with more hops.

use std::time::Duration;

/// The shortest tier: no wait through `tiers` is late by this much or more. `None` without tiers.
#[must_use]
pub fn resolution(tiers: &[Duration]) -> Option<Duration> {
    tiers.iter().copied().filter(|t| !t.is_zero()).min()
}

/// The tier to wait in next with `remaining` still to wait (`None` when the wait is over, or
/// there are no tiers). `tiers` need not be sorted; zero tiers are ignored.
#[must_use]
pub fn next_hop(remaining: Duration, tiers: &[Duration]) -> Option<Duration> {
    if remaining.is_zero() {
        return None;
    }
    let resolution = resolution(tiers)?;
    let usable = || tiers.iter().copied().filter(|t| !t.is_zero());
    let ends = usable()
        .filter(|t| *t >= remaining && *t - remaining < resolution)
        .min();
    ends.or_else(|| usable().filter(|t| *t <= remaining).max())
        .or(Some(resolution))
}

/// Every hop of a wait of `delay` through `tiers`, in order (empty for no wait or no tiers).
/// At most `limit` hops are planned (a guard for callers; the real plan is far shorter).
#[must_use]
pub fn hop_plan(delay: Duration, tiers: &[Duration], limit: usize) -> Vec<Duration> {
    let mut hops = Vec::new();
    let mut remaining = delay;
    while hops.len() < limit {
        let Some(hop) = next_hop(remaining, tiers) else {
            break;
        };
        hops.push(hop);
        remaining = remaining.saturating_sub(hop);
    }
    hops
}

/// Tiers of `2^k × resolution` for `k = 0..count`: 1, 2, 4, … 1,024 s for a resolution of 1 s
/// and 11 tiers.
#[must_use]
pub fn powers_of_two(resolution: Duration, count: u32) -> Vec<Duration> {
    (0..count)
        .map_while(|k| 1u32.checked_shl(k).and_then(|m| resolution.checked_mul(m)))
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn default_tiers() -> Vec<Duration> {
        powers_of_two(secs(1), 11)
    }

    #[test]
    fn whole_seconds_go_by_their_bits() {
        let t = default_tiers();
        assert_eq!(t.last(), Some(&secs(1024)));
        assert_eq!(hop_plan(secs(8), &t, 64), [secs(8)]);
        assert_eq!(hop_plan(secs(9), &t, 64), [secs(8), secs(1)]);
        assert_eq!(
            hop_plan(secs(15), &t, 64),
            [secs(8), secs(4), secs(2), secs(1)]
        );
        // 7.5 s: one 8 s hop, half a second late, rather than four hops.
        assert_eq!(hop_plan(Duration::from_millis(7500), &t, 64), [secs(8)]);
        assert_eq!(hop_plan(Duration::ZERO, &t, 64), []);
        assert_eq!(hop_plan(secs(5), &[], 64), []);
        // Longer than every tier: the longest, again.
        assert_eq!(hop_plan(secs(3000), &t, 64)[..2], [secs(1024), secs(1024)]);
    }

    #[test]
    fn the_old_tiers_still_reach_any_delay() {
        let old = [secs(1), secs(5), secs(30), secs(120), secs(600)];
        assert_eq!(
            hop_plan(secs(8), &old, 64),
            [secs(5), secs(1), secs(1), secs(1)]
        );
        assert_eq!(
            hop_plan(secs(16), &old, 64).iter().sum::<Duration>(),
            secs(16)
        );
    }

    /// Checks one wait: never early, late by less than the resolution, within `max_hops`.
    fn check(delay: Duration, tiers: &[Duration], max_hops: usize) -> Result<(), TestCaseError> {
        // One hop more than allowed is planned, so a long plan fails as "too many hops", not
        // as "early" because the plan was cut short.
        let hops = hop_plan(delay, tiers, max_hops.saturating_add(1));
        let total: Duration = hops.iter().sum();
        let resolution = resolution(tiers).unwrap_or_default();
        prop_assert!(total >= delay, "{delay:?}: {hops:?} early");
        prop_assert!(total < delay + resolution, "{delay:?}: {hops:?} late");
        prop_assert!(hops.len() <= max_hops, "{delay:?}: {} hops", hops.len());
        prop_assert!(hops.iter().all(|h| tiers.contains(h)));
        Ok(())
    }

    #[test]
    fn every_millisecond_delay_from_1_s_to_the_cap_arrives_within_a_second() {
        // The default cap is 600 s; jitter stretches it to 750 s. Every 37 ms up to 800 s.
        let t = default_tiers();
        for ms in (1000..=800_000u64).step_by(37) {
            check(Duration::from_millis(ms), &t, 11).unwrap();
        }
        for s in 1..=2047 {
            check(secs(s), &t, 11).unwrap();
        }
    }

    proptest! {
        #[test]
        fn any_delay_through_powers_of_two_is_never_early_and_within_resolution(
            ms in 1u64..2_047_000,
        ) {
            check(Duration::from_millis(ms), &default_tiers(), 11)?;
        }

        #[test]
        fn any_delay_through_any_tiers_is_never_early_and_within_resolution(
            tiers in proptest::collection::vec(1u64..100_000, 1..8),
            ms in 0u64..1_000_000,
        ) {
            let tiers: Vec<Duration> = tiers.into_iter().map(Duration::from_millis).collect();
            let delay = Duration::from_millis(ms);
            let shortest = resolution(&tiers).unwrap_or_default();
            // At most one hop per shortest tier, plus one.
            let hops_needed = ms / u64::try_from(shortest.as_millis()).unwrap_or(1).max(1);
            // Tiers of a few milliseconds and a delay of minutes make plans of 100,000s of hops:
            // true, but slow to check 256 times in a debug build.
            prop_assume!(hops_needed <= 20_000);
            let bound = usize::try_from(hops_needed)
                .unwrap_or(usize::MAX)
                .saturating_add(1);
            check(delay, &tiers, bound)?;
        }
    }
}
