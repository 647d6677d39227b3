//! The circuit breaker's line of a dependency: its state as Redis holds it (an open breaker
//! whose period ended shown half-open), and the line `status` prints under the table.

use fleet_budget::breaker::{BreakerState, BreakerStatus};
use serde::Serialize;

/// A dependency's circuit breaker as Redis holds it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BreakerLine {
    /// `closed`, `open` or `half_open` (an open breaker whose period ended half-opens at the
    /// next call: shown as `half_open` with `open_remaining_secs` 0).
    pub(crate) state: &'static str,
    pub(crate) open_remaining_secs: f64,
    pub(crate) probes_issued: u64,
    pub(crate) probe_successes: u64,
    /// Seconds since the last change of state; null if it never changed while the key lived.
    pub(crate) changed_secs_ago: Option<f64>,
    pub(crate) times_opened: u64,
    /// Calls and failures in the breaker's window (sliding estimates).
    pub(crate) calls: f64,
    pub(crate) failures: f64,
}

impl BreakerLine {
    #[allow(clippy::cast_precision_loss)]
    pub(super) fn new(s: &BreakerStatus) -> Self {
        let due = s.state == BreakerState::Open && s.now_ms >= s.open_until_ms;
        Self {
            state: if due {
                BreakerState::HalfOpen.as_str()
            } else {
                s.state.as_str()
            },
            open_remaining_secs: if s.state == BreakerState::Open {
                s.open_until_ms.saturating_sub(s.now_ms) as f64 / 1000.0
            } else {
                0.0
            },
            probes_issued: s.probes_issued,
            probe_successes: s.probe_successes,
            changed_secs_ago: (s.changed_ms > 0)
                .then(|| s.now_ms.saturating_sub(s.changed_ms) as f64 / 1000.0),
            times_opened: s.times_opened,
            calls: s.volume,
            failures: s.failures,
        }
    }

    /// The breaker's line under the table.
    pub(super) fn render(&self) -> String {
        let changed = self
            .changed_secs_ago
            .map_or_else(String::new, |s| format!(", changed {s:.1}s ago"));
        match self.state {
            "open" => format!(
                "  BREAKER OPEN: no call runs, jobs wait in the delay tiers; half-opens in {:.1}s (opened {} times{changed})\n",
                self.open_remaining_secs, self.times_opened
            ),
            "half_open" => format!(
                "  BREAKER HALF-OPEN: {} probes out, {} succeeded (opened {} times{changed})\n",
                self.probes_issued, self.probe_successes, self.times_opened
            ),
            _ => format!(
                "  breaker closed: {:.0} failures of {:.0} calls in its window (opened {} times{changed})\n",
                self.failures, self.calls, self.times_opened
            ),
        }
    }
}
