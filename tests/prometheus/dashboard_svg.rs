//! Draws the dashboard's panels as one SVG from Prometheus range queries: a picture of what the
//! Grafana dashboard shows, made without Grafana (which Debian does not package).

use std::fmt::Write;

use serde_json::Value;

/// One line of a panel.
pub(crate) struct Series {
    pub(crate) label: String,
    /// (unix seconds, value), in time order; NaN and infinite values left out.
    pub(crate) points: Vec<(f64, f64)>,
}

impl Series {
    /// A series of a `query_range` result, labelled by Grafana's `{{label}}` legend format.
    pub(crate) fn from_prometheus(result: &Value, legend: &str) -> Self {
        let mut label = legend.to_owned();
        if let Some(metric) = result["metric"].as_object() {
            for (k, v) in metric {
                label = label.replace(&format!("{{{{{k}}}}}"), v.as_str().unwrap_or(""));
            }
        }
        let points = result["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                let t = p[0].as_f64()?;
                let v: f64 = p[1].as_str()?.parse().ok()?;
                v.is_finite().then_some((t, v))
            })
            .collect();
        Self { label, points }
    }
}

/// One panel: a title, a unit (Grafana's), and its lines.
pub(crate) struct Panel {
    pub(crate) title: String,
    pub(crate) unit: String,
    pub(crate) series: Vec<Series>,
}

const WIDTH: f64 = 1400.0;
const COLUMNS: usize = 2;
const PANEL_W: f64 = 680.0;
const PANEL_H: f64 = 250.0;
const GAP: f64 = 13.0;
const TOP: f64 = 56.0;
const PALETTE: [&str; 8] = [
    "#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#f2495c", "#b877d9", "#8ab8ff", "#fade2a",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn format_value(v: f64, unit: &str) -> String {
    match unit {
        "percentunit" => format!("{:.0}%", v * 100.0),
        "s" if v < 1.0 => format!("{:.1} ms", v * 1000.0),
        "s" => format!("{v:.0} s"),
        "x" => format!("{v:.2}x"),
        "ops" => format!("{v:.0}/s"),
        _ if v.abs() >= 100.0 || v == v.trunc() => format!("{v:.0}"),
        _ => format!("{v:.2}"),
    }
}

/// The SVG of `panels`, over `[start, end]` (unix seconds), with vertical `markers`.
pub(crate) fn render(
    title: &str,
    panels: &[Panel],
    start: f64,
    end: f64,
    markers: &[(f64, &str)],
) -> String {
    let rows = panels.len().div_ceil(COLUMNS);
    #[allow(clippy::cast_precision_loss)]
    let height = TOP + rows as f64 * (PANEL_H + GAP) + GAP;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Inter, Helvetica, Arial, sans-serif">
<rect width="100%" height="100%" fill="#111217"/>
<text x="{GAP}" y="34" fill="#ccccdc" font-size="20" font-weight="600">{}</text>"##,
        escape(title)
    );
    for (i, panel) in panels.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let (x0, y0) = (
            GAP + (i % COLUMNS) as f64 * (PANEL_W + GAP),
            TOP + (i / COLUMNS) as f64 * (PANEL_H + GAP),
        );
        draw_panel(&mut svg, panel, x0, y0, start, end, markers);
    }
    svg.push_str("</svg>\n");
    svg
}

fn draw_panel(
    svg: &mut String,
    panel: &Panel,
    x0: f64,
    y0: f64,
    start: f64,
    end: f64,
    markers: &[(f64, &str)],
) {
    let (plot_x, plot_y) = (x0 + 60.0, y0 + 34.0);
    let (plot_w, plot_h) = (PANEL_W - 75.0, PANEL_H - 90.0);
    let _ = writeln!(
        svg,
        r##"<rect x="{x0}" y="{y0}" width="{PANEL_W}" height="{PANEL_H}" rx="3" fill="#181b1f" stroke="#2c3235"/>
<text x="{}" y="{}" fill="#ccccdc" font-size="14" font-weight="500">{}</text>"##,
        x0 + 10.0,
        y0 + 22.0,
        escape(&panel.title)
    );
    let values = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1));
    let max = values.fold(0.0_f64, f64::max);
    let max = if max <= 0.0 { 1.0 } else { max * 1.1 };
    let sx = |t: f64| plot_x + (t - start) / (end - start).max(1.0) * plot_w;
    let sy = |v: f64| plot_y + plot_h - v / max * plot_h;
    for k in 0..=4 {
        let v = max * f64::from(k) / 4.0;
        let y = sy(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{plot_x}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#2c3235"/><text x="{:.1}" y="{:.1}" fill="#8e8e8e" font-size="10" text-anchor="end">{}</text>"##,
            plot_x + plot_w,
            plot_x - 6.0,
            y + 3.0,
            escape(&format_value(v, &panel.unit))
        );
    }
    for (t, label) in markers {
        let x = sx(*t);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{plot_y}" x2="{x:.1}" y2="{:.1}" stroke="#f2495c" stroke-dasharray="4 3" opacity="0.7"/><text x="{:.1}" y="{:.1}" fill="#f2495c" font-size="10">{label}</text>"##,
            plot_y + plot_h,
            x + 3.0,
            plot_y + 10.0
        );
    }
    let seconds = (end - start).max(1.0);
    for k in 0..=4 {
        let t = start + seconds * f64::from(k) / 4.0;
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" fill="#8e8e8e" font-size="10" text-anchor="middle">{:.0}s</text>"##,
            sx(t),
            plot_y + plot_h + 14.0,
            t - start
        );
    }
    if panel.series.iter().all(|s| s.points.is_empty()) {
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" fill="#8e8e8e" font-size="13" text-anchor="middle">no data</text>"##,
            plot_x + plot_w / 2.0,
            plot_y + plot_h / 2.0
        );
    }
    let mut legend_x = x0 + 10.0;
    for (i, series) in panel.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let points: Vec<String> = series
            .points
            .iter()
            .map(|&(t, v)| format!("{:.1},{:.1}", sx(t), sy(v)))
            .collect();
        if !points.is_empty() {
            let _ = writeln!(
                svg,
                r##"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"##,
                points.join(" ")
            );
        }
        let legend_y = y0 + PANEL_H - 14.0;
        let _ = writeln!(
            svg,
            r##"<rect x="{legend_x:.1}" y="{:.1}" width="12" height="3" fill="{color}"/><text x="{:.1}" y="{legend_y:.1}" fill="#ccccdc" font-size="11">{}</text>"##,
            legend_y - 4.0,
            legend_x + 16.0,
            escape(&series.label)
        );
        #[allow(clippy::cast_precision_loss)]
        let advance = 30.0 + series.label.len() as f64 * 6.2;
        legend_x += advance;
    }
}
