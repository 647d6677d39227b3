//! The circuit breaker's line under `status`'s table, from the library's view of it
//! ([`fleet_budget::view::BreakerView`]: an open breaker whose period ended reads half-open).

use fleet_budget::breaker::BreakerState;
use fleet_budget::view::BreakerView;

/// The breaker's line under the table.
pub(super) fn render(b: &BreakerView) -> String {
    let changed = b
        .changed_secs_ago
        .map_or_else(String::new, |s| format!(", changed {s:.1}s ago"));
    match b.state {
        BreakerState::Open => format!(
            "  BREAKER OPEN: no call runs, jobs wait in the delay tiers; half-opens in {:.1}s (opened {} times{changed})\n",
            b.open_remaining_secs, b.times_opened
        ),
        BreakerState::HalfOpen => format!(
            "  BREAKER HALF-OPEN: {} probes out, {} succeeded (opened {} times{changed})\n",
            b.probes_issued, b.probe_successes, b.times_opened
        ),
        BreakerState::Closed => format!(
            "  breaker closed: {:.0} failures of {:.0} calls in its window (opened {} times{changed})\n",
            b.failures, b.calls, b.times_opened
        ),
    }
}
