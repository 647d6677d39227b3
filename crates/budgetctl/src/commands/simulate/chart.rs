//! The SVG chart of `simulate capacity --svg`: offered load per tick, with and without the
//! budget, against the dependency's capacity.

use std::path::Path;

use fleet_budget_sim::capacity::{CapacityParams, CapacityReport};

use super::svg::TwoRuns;

/// What the chart shows.
pub(super) struct Chart<'a> {
    /// The model's parameters (the budget of `with` aside).
    pub(super) params: CapacityParams,
    /// The run without a budget.
    pub(super) without: &'a CapacityReport,
    /// The run with a budget of `ratio`.
    pub(super) with: &'a CapacityReport,
    /// The budget ratio of `with`.
    pub(super) ratio: f64,
}

impl Chart<'_> {
    /// Draws the chart to `path`.
    pub(super) fn draw(&self, path: &Path) -> anyhow::Result<()> {
        let p = &self.params;
        let ticks = i64::from(p.ticks.max(1));
        let peak = self
            .without
            .peak_offered
            .max(self.with.peak_offered)
            .max(p.capacity)
            .max(1);
        #[allow(clippy::cast_precision_loss)]
        let series = |r: &CapacityReport| -> Vec<(i64, f64)> {
            r.ticks
                .iter()
                .map(|t| (i64::from(t.tick), t.offered as f64))
                .collect()
        };
        #[allow(clippy::cast_precision_loss)]
        let capacity_line: Vec<(i64, f64)> = (0..p.ticks.max(1))
            .map(|t| (i64::from(t), p.capacity_at(t) as f64))
            .collect();
        #[allow(clippy::cast_precision_loss)]
        let y_max = peak as f64 * 1.1;
        TwoRuns {
            caption: format!(
                "Offered load per tick: {} jobs/tick, capacity {} -> {} for {} ticks",
                p.incoming, p.capacity, p.degraded_capacity, p.degraded_ticks
            ),
            x_desc: "tick".to_owned(),
            y_desc: "calls offered to the dependency",
            last_tick: (ticks - 1).max(1),
            y_max,
            without: ("without budget".to_owned(), series(self.without)),
            with: (
                format!("with a {:.0}% budget", self.ratio * 100.0),
                series(self.with),
            ),
            reference: ("dependency capacity".to_owned(), capacity_line),
        }
        .draw(path)
    }
}
