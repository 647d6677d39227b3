//! The SVG chart of a dependency's past: a series over time as a line, horizontal marks (tune's
//! recommended ratio), vertical marks (the incident report's budget exhausted and recovered), and
//! stretches shaded (the incidents). Written by hand: a few elements, every text escaped.
//!
//! Why here, beside [`crate::history`]: `budgetctl tune`, `budgetctl incident report` and the
//! console's incident page draw the same series, and must draw them the same way; no I/O, so a
//! chart is a function of its points.

use std::fmt::Write as _;

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 300.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 40.0;

/// A line chart.
#[derive(Debug, Default, Clone)]
pub struct Chart {
    /// Its title (drawn top left, and the SVG's `<title>`).
    pub title: String,
    /// What the y axis counts (drawn top right).
    pub y_label: String,
    /// The x axis's start (Unix ms).
    pub start_ms: u64,
    /// The x axis's end (Unix ms).
    pub end_ms: u64,
    /// Points (Unix ms, value); `None` is a gap in the line. Values above `y_max` are drawn at
    /// the top (marked as clipped in the legend).
    pub points: Vec<(u64, Option<f64>)>,
    /// Horizontal lines: value and label.
    pub marks: Vec<(f64, String)>,
    /// Shaded stretches: start and end, Unix ms.
    pub shaded: Vec<(u64, u64)>,
    /// Vertical lines: Unix ms and label (`class="event"`).
    pub events: Vec<(u64, String)>,
    /// The top of the y axis (default: the largest of the points and marks, times 1.1).
    pub y_max: Option<f64>,
}

impl Chart {
    /// The chart as an SVG document.
    #[must_use]
    pub fn svg(&self) -> String {
        let finite_max = self
            .points
            .iter()
            .filter_map(|p| p.1)
            .filter(|v| v.is_finite())
            .chain(self.marks.iter().map(|m| m.0))
            .fold(0.0_f64, f64::max);
        let y_max = self
            .y_max
            .unwrap_or(finite_max * 1.1)
            .max(f64::MIN_POSITIVE);
        let span = self.end_ms.saturating_sub(self.start_ms).max(1) as f64;
        let plot_w = WIDTH - LEFT - RIGHT;
        let plot_h = HEIGHT - TOP - BOTTOM;
        let x = |t: u64| LEFT + (t.saturating_sub(self.start_ms) as f64 / span).min(1.0) * plot_w;
        let y = |v: f64| TOP + plot_h - (v / y_max).clamp(0.0, 1.0) * plot_h;
        let mut s = String::new();
        let _ = write!(
            s,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
             viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"11\">\
             <title>{}</title><rect width=\"100%\" height=\"100%\" fill=\"white\"/>",
            escape(&self.title)
        );
        for (a, b) in &self.shaded {
            let (xa, xb) = (x(*a), x(*b));
            let _ = write!(
                s,
                "<rect class=\"incident\" x=\"{xa:.1}\" y=\"{TOP}\" width=\"{:.1}\" \
                 height=\"{plot_h}\" fill=\"#f4b6b6\" opacity=\"0.6\"/>",
                (xb - xa).max(1.0)
            );
        }
        // Axes and their labels.
        let _ = write!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{:.1}\" stroke=\"#333\"/>\
             <line x1=\"{LEFT}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#333\"/>",
            TOP + plot_h,
            TOP + plot_h,
            LEFT + plot_w,
            TOP + plot_h
        );
        for k in 0..=4 {
            let v = y_max * f64::from(k) / 4.0;
            let _ = write!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                LEFT - 4.0,
                y(v) + 4.0,
                short(v)
            );
        }
        let _ = write!(
            s,
            "<text x=\"{LEFT}\" y=\"{:.1}\">{}</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
             <text x=\"{LEFT}\" y=\"18\" font-size=\"13\">{}</text>\
             <text x=\"{:.1}\" y=\"18\" text-anchor=\"end\">{}</text>",
            HEIGHT - 10.0,
            escape(&rfc3339_ms(self.start_ms)),
            LEFT + plot_w,
            HEIGHT - 10.0,
            escape(&format!(
                "{} ({} later)",
                rfc3339_ms(self.end_ms),
                human_ms(self.end_ms.saturating_sub(self.start_ms))
            )),
            escape(&self.title),
            LEFT + plot_w,
            escape(&self.y_label)
        );
        // The series, split at gaps.
        let mut line = String::new();
        let flush = |line: &mut String, s: &mut String| {
            if !line.is_empty() {
                let _ = write!(
                    s,
                    "<polyline class=\"series\" fill=\"none\" stroke=\"#1f5fa8\" \
                     stroke-width=\"1.5\" points=\"{}\"/>",
                    line.trim_end()
                );
                line.clear();
            }
        };
        for (t, v) in &self.points {
            match v {
                Some(v) => {
                    let v = if v.is_finite() { *v } else { y_max };
                    let _ = write!(line, "{:.1},{:.1} ", x(*t), y(v));
                }
                None => flush(&mut line, &mut s),
            }
        }
        flush(&mut line, &mut s);
        for (k, (t, label)) in self.events.iter().enumerate() {
            // Labels alternate between two heights, so that two close events stay readable.
            let label_y = TOP + 12.0 + if k % 2 == 0 { 0.0 } else { 12.0 };
            let _ = write!(
                s,
                "<line class=\"event\" x1=\"{0:.1}\" y1=\"{TOP}\" x2=\"{0:.1}\" y2=\"{1:.1}\" \
                 stroke=\"#7d3c98\" stroke-dasharray=\"2 2\"/>\
                 <text x=\"{2:.1}\" y=\"{label_y:.1}\" fill=\"#7d3c98\">{3}</text>",
                x(*t),
                TOP + plot_h,
                x(*t) + 3.0,
                escape(label)
            );
        }
        for (v, label) in &self.marks {
            let _ = write!(
                s,
                "<line class=\"mark\" x1=\"{LEFT}\" y1=\"{0:.1}\" x2=\"{1:.1}\" y2=\"{0:.1}\" \
                 stroke=\"#c0392b\" stroke-dasharray=\"6 3\"/>\
                 <text x=\"{1:.1}\" y=\"{2:.1}\" text-anchor=\"end\" fill=\"#c0392b\">{3}</text>",
                y(*v),
                LEFT + plot_w,
                y(*v) - 4.0,
                escape(label)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// A dependency name as a file name: what is not `[A-Za-z0-9._-]` becomes `_`, never a path.
#[must_use]
pub fn file_name(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .take(100)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.trim_matches('.').is_empty() {
        format!("_{cleaned}")
    } else {
        cleaned
    }
}

/// Text for SVG and HTML.
#[must_use]
pub fn escape(text: &str) -> String {
    let shown = fleet_budget::printable::escape_text(text);
    let mut out = String::with_capacity(shown.len());
    for c in shown.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A length of time as people read it: `850ms`, `2.5s`, `4m05s`, `3h20m`.
#[must_use]
#[allow(clippy::cast_precision_loss)] // under a minute
pub fn human_ms(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

pub use fleet_budget::printable::rfc3339_ms;

fn short(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_safe_file_names_and_text_is_escaped() {
        assert_eq!(file_name("paid-api"), "paid-api");
        assert_eq!(file_name("../etc/passwd"), ".._etc_passwd");
        assert_eq!(file_name(".."), "_..");
        let chart = Chart {
            title: "<script>".into(),
            start_ms: 0,
            end_ms: 10,
            points: vec![(0, Some(1.0)), (5, None), (10, Some(f64::INFINITY))],
            marks: vec![(0.5, "r & b".into())],
            shaded: vec![(2, 4)],
            events: vec![(3, "<i>exhausted</i>".into())],
            ..Chart::default()
        };
        let svg = chart.svg();
        assert!(!svg.contains("<script>") && svg.contains("&lt;script&gt;"));
        assert!(svg.contains("r &amp; b"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("class=\"incident\"").count(), 1);
        assert_eq!(svg.matches("class=\"event\"").count(), 1);
        assert!(svg.contains("&lt;i&gt;exhausted&lt;/i&gt;"));
        assert_eq!(rfc3339_ms(1_796_604_919_000), "2026-12-07T00:55:19Z");
        assert_eq!(
            rfc3339_ms(u64::MAX),
            format!("{} ms after the epoch (past the year 9999)", u64::MAX)
        );
        assert_eq!(human_ms(245_000), "4m05s");
    }
}
