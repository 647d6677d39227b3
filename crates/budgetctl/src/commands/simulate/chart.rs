//! The SVG chart of `simulate capacity --svg`: offered load per tick, with and without the
//! budget, against the dependency's capacity.

use std::path::Path;

use fleet_budget_sim::capacity::{CapacityParams, CapacityReport};
use plotters::prelude::*;

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
        let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("{e}");
        let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let ticks = i64::from(p.ticks.max(1));
        let peak = self
            .without
            .peak_offered
            .max(self.with.peak_offered)
            .max(p.capacity)
            .max(1);
        #[allow(clippy::cast_precision_loss)]
        let y_max = peak as f64 * 1.1;
        let caption = format!(
            "Offered load per tick: {} jobs/tick, capacity {} -> {} for {} ticks",
            p.incoming, p.capacity, p.degraded_capacity, p.degraded_ticks
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0i64..(ticks - 1).max(1), 0f64..y_max)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("tick")
            .y_desc("calls offered to the dependency")
            .draw()
            .map_err(|e| err(&e))?;
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
        chart
            .draw_series(LineSeries::new(series(self.without), RED.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label("without budget")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(series(self.with), BLUE.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(format!("with a {:.0}% budget", self.ratio * 100.0))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(capacity_line, BLACK.mix(0.5)))
            .map_err(|e| err(&e))?
            .label("dependency capacity")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.5)));
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
        Ok(())
    }
}
