//! The SVG chart of `simulate concurrency --timeline --svg`: calls in flight per tick against
//! the dependency's cap, without and with the concurrency budget, while the dependency slows.

use std::path::Path;

use fleet_budget_sim::slowing::{SlowingParams, SlowingReport};

use super::svg::TwoRuns;

/// What the chart shows.
pub(super) struct TimelineChart<'a> {
    /// The model's parameters (the budget aside).
    pub(super) params: SlowingParams,
    /// The run without a budget.
    pub(super) without: &'a SlowingReport,
    /// The run with the concurrency budget.
    pub(super) with: &'a SlowingReport,
}

impl TimelineChart<'_> {
    /// Draws the chart to `path`.
    pub(super) fn draw(&self, path: &Path) -> anyhow::Result<()> {
        let p = &self.params;
        let ticks = i64::from(p.ticks.max(2));
        #[allow(clippy::cast_precision_loss)]
        let cap = p.cap as f64;
        let series = |r: &SlowingReport| -> Vec<(i64, f64)> {
            r.ticks
                .iter()
                .map(|t| (i64::from(t.tick), t.in_flight))
                .collect()
        };
        TwoRuns {
            caption: format!(
                "Calls in flight: cap {}, {} primary, latency x{} from tick {} for {} ticks",
                p.cap, p.primary, p.slow_factor, p.slow_from, p.slow_ticks
            ),
            x_desc: format!("tick ({} ms)", p.tick_ms),
            y_desc: "calls in flight (queued included)",
            last_tick: ticks - 1,
            y_max: self
                .without
                .peak_in_flight
                .max(self.with.peak_in_flight)
                .max(cap)
                * 1.1,
            without: ("without a budget".to_owned(), series(self.without)),
            with: ("with the concurrency budget".to_owned(), series(self.with)),
            reference: ("cap".to_owned(), vec![(0, cap), (ticks - 1, cap)]),
        }
        .draw(path)
    }
}
