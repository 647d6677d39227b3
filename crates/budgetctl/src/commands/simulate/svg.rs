//! The line chart that `simulate capacity --svg` and `simulate concurrency --timeline --svg`
//! draw: a figure per tick for two runs, without a budget (red) and with one (blue), against a
//! reference line (grey), in SVG.

use std::path::Path;

use plotters::prelude::*;

/// A line: its legend and its points (tick, value).
pub(super) type Line = (String, Vec<(i64, f64)>);

/// What a chart shows.
pub(super) struct TwoRuns {
    pub(super) caption: String,
    pub(super) x_desc: String,
    pub(super) y_desc: &'static str,
    /// The x axis runs from tick 0 to this one.
    pub(super) last_tick: i64,
    /// The y axis runs from 0 to this.
    pub(super) y_max: f64,
    pub(super) without: Line,
    pub(super) with: Line,
    pub(super) reference: Line,
}

impl TwoRuns {
    /// Draws the chart to `path`.
    pub(super) fn draw(self, path: &Path) -> anyhow::Result<()> {
        let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("{e}");
        let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(self.caption, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0i64..self.last_tick, 0f64..self.y_max)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(self.x_desc)
            .y_desc(self.y_desc)
            .draw()
            .map_err(|e| err(&e))?;
        for ((label, points), style) in [
            (self.without, RED.stroke_width(2)),
            (self.with, BLUE.stroke_width(2)),
            (self.reference, BLACK.mix(0.5).into()),
        ] {
            chart
                .draw_series(LineSeries::new(points, style))
                .map_err(|e| err(&e))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
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
