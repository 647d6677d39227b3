//! The report as Markdown or as one HTML page: the same sections, the charts as SVG (files
//! linked from Markdown, inline in HTML); the sections' text and the charts are the model's
//! (`fleet_budget_amqp::incident`), as on the console's incident page. Every text from Redis or Prometheus is escaped.

use std::fmt::Write as _;
use std::path::Path;

use fleet_budget_amqp::incident::Report;

use fleet_budget_sim::chart::{escape, file_name};

/// A Markdown table cell: escaped for display, `|` and newlines kept out.
fn cell(text: &str) -> String {
    fleet_budget::printable::escape_text(text)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('|', "\\|")
        .replace(['\n', '\r'], " ")
}

/// The report as Markdown; charts written to `chart_dir` (and linked) when given.
pub(super) fn markdown(r: &Report, chart_dir: Option<&Path>) -> anyhow::Result<String> {
    let mut s = String::new();
    let _ = writeln!(s, "# Incident report: {}\n", cell(&r.dependency));
    for line in r.summary() {
        let _ = writeln!(s, "- {}", cell(&line));
    }
    if let Some(dir) = chart_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("--chart-dir {}: {e}", dir.display()))?;
        s.push('\n');
        for (name, chart) in r.charts() {
            let file = format!("{}-{name}.svg", file_name(&r.dependency));
            let path = dir.join(&file);
            std::fs::write(&path, chart.svg())
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
            let _ = writeln!(s, "![{name}]({})", path.display());
        }
    }
    for (heading, rows) in r.sections() {
        let _ = writeln!(s, "\n## {heading}\n");
        if rows.len() <= 1 {
            s.push_str("(none)\n");
            continue;
        }
        for (i, row) in rows.iter().enumerate() {
            let cells: Vec<String> = row.iter().map(|c| cell(c)).collect();
            let _ = writeln!(s, "| {} |", cells.join(" | "));
            if i == 0 {
                let _ = writeln!(s, "|{}", "---|".repeat(row.len()));
            }
        }
    }
    Ok(s)
}

/// The report as one HTML page, charts inline.
pub(super) fn html(r: &Report) -> String {
    let mut s = String::new();
    let title = format!("Incident report: {}", r.dependency);
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
         <style>body{{font-family:sans-serif;margin:2em;max-width:1000px}}\
         table{{border-collapse:collapse;margin:0.5em 0}}td,th{{border:1px solid #ccc;\
         padding:2px 6px;text-align:left;font-size:13px}}</style></head><body>\n<h1>{}</h1>\n<ul>",
        escape(&title),
        escape(&title)
    );
    for line in r.summary() {
        let _ = write!(s, "<li>{}</li>", escape(&line));
    }
    s.push_str("</ul>\n");
    for (name, chart) in r.charts() {
        let _ = writeln!(s, "<figure id=\"chart-{name}\">{}</figure>", chart.svg());
    }
    for (i, (heading, rows)) in r.sections().into_iter().enumerate() {
        let _ = writeln!(s, "<h2>{}</h2>", escape(&heading));
        if rows.len() <= 1 {
            s.push_str("<p>(none)</p>\n");
            continue;
        }
        let _ = write!(s, "<table id=\"section-{i}\">");
        for (n, row) in rows.iter().enumerate() {
            let tag = if n == 0 { "th" } else { "td" };
            s.push_str("<tr>");
            for c in row {
                let _ = write!(s, "<{tag}>{}</{tag}>", escape(c));
            }
            s.push_str("</tr>");
        }
        s.push_str("</table>\n");
    }
    s.push_str("</body></html>\n");
    s
}
