//! The SVG chart of `simulate concurrency --timeline --svg`: calls in flight per tick against
//! the dependency's cap, without and with the concurrency budget, while the dependency slows.

use std::path::Path;

use fleet_budget_sim::slowing::{SlowingParams, SlowingReport};
use plotters::prelude::*;

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
        let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("{e}");
        let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let ticks = i64::from(p.ticks.max(2));
        #[allow(clippy::cast_precision_loss)]
        let cap = p.cap as f64;
        let y_max = self
            .without
            .peak_in_flight
            .max(self.with.peak_in_flight)
            .max(cap)
            * 1.1;
        let caption = format!(
            "Calls in flight: cap {}, {} primary, latency x{} from tick {} for {} ticks",
            p.cap, p.primary, p.slow_factor, p.slow_from, p.slow_ticks
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0i64..(ticks - 1), 0f64..y_max)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(format!("tick ({} ms)", p.tick_ms))
            .y_desc("calls in flight (queued included)")
            .draw()
            .map_err(|e| err(&e))?;
        let series = |r: &SlowingReport| -> Vec<(i64, f64)> {
            r.ticks
                .iter()
                .map(|t| (i64::from(t.tick), t.in_flight))
                .collect()
        };
        chart
            .draw_series(LineSeries::new(series(self.without), RED.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label("without a budget")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(series(self.with), BLUE.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label("with the concurrency budget")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(
                vec![(0, cap), (ticks - 1, cap)],
                BLACK.mix(0.5),
            ))
            .map_err(|e| err(&e))?
            .label("cap")
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
