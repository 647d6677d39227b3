//! The SVG chart of a dependency's history: a series over time as a line, horizontal marks (the
//! recommended ratio), and stretches shaded (the incidents). Written by hand: a few elements,
//! every text escaped, the same for `tune` and `incident report`.

use std::fmt::Write as _;
use std::path::Path;

use super::{Range, Tuned, human_ms};
use crate::when::rfc3339_ms;

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 300.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 40.0;

/// A line chart.
#[derive(Debug, Default)]
pub(crate) struct Chart {
    pub(crate) title: String,
    pub(crate) y_label: String,
    pub(crate) start_ms: u64,
    pub(crate) end_ms: u64,
    /// Points (Unix ms, value); `None` is a gap in the line. Values above `y_max` are drawn at
    /// the top (marked as clipped in the legend).
    pub(crate) points: Vec<(u64, Option<f64>)>,
    /// Horizontal lines: value and label.
    pub(crate) marks: Vec<(f64, String)>,
    /// Shaded stretches: start and end, Unix ms.
    pub(crate) shaded: Vec<(u64, u64)>,
    /// The top of the y axis (default: the largest of the points and marks, times 1.1).
    pub(crate) y_max: Option<f64>,
}

impl Chart {
    /// The chart as an SVG document.
    pub(crate) fn svg(&self) -> String {
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

/// Writes `<dir>/<dependency>.svg` for `tune`: the retry fraction, the recommended ratio, the
/// incidents shaded. Returns the path written.
pub(crate) fn write(dir: &Path, t: &Tuned, range: &Range) -> anyhow::Result<String> {
    let mut chart = Chart {
        title: format!("{}: retry fraction per step", t.dependency),
        y_label: "retries asked / deposits".to_owned(),
        start_ms: range.start_ms,
        end_ms: range.end_ms,
        points: t.samples.iter().map(|s| (s.at_ms, s.fraction())).collect(),
        ..Chart::default()
    };
    if let Some(r) = &t.recommendation {
        chart
            .marks
            .push((r.ratio, format!("recommended ratio {}", r.ratio)));
        chart.marks.push((
            r.healthy_fraction,
            format!("healthy p99 {:.4}", r.healthy_fraction),
        ));
        chart.shaded = r.incidents.iter().map(|i| (i.start_ms, i.end_ms)).collect();
        // Incidents' infinite or huge fractions would flatten the healthy line: the top is a
        // few times the ratio, what is above drawn at the top.
        chart.y_max = Some(r.ratio * 3.0);
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("--chart-dir {}: {e}", dir.display()))?;
    let path = dir.join(format!("{}.svg", file_name(&t.dependency)));
    std::fs::write(&path, chart.svg())
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    Ok(path.display().to_string())
}

/// A dependency name as a file name: what is not `[A-Za-z0-9._-]` becomes `_`, never a path.
pub(crate) fn file_name(name: &str) -> String {
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
pub(crate) fn escape(text: &str) -> String {
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
            ..Chart::default()
        };
        let svg = chart.svg();
        assert!(!svg.contains("<script>") && svg.contains("&lt;script&gt;"));
        assert!(svg.contains("r &amp; b"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("class=\"incident\"").count(), 1);
    }
}
