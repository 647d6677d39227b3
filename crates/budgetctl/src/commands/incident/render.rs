//! The report as Markdown or as one HTML page: the same sections, the charts as SVG (files
//! linked from Markdown, inline in HTML). Every text from Redis or Prometheus is escaped.

use std::fmt::Write as _;
use std::path::Path;

use super::{Report, Waiting};
use crate::commands::tune::chart::{Chart, escape, file_name};
use crate::when::rfc3339_ms;

/// The charts: retries denied per step, amplification per step, dead letters per step.
fn charts(r: &Report) -> Vec<(&'static str, Chart)> {
    if r.minutes.is_empty() {
        return Vec::new();
    }
    let step = r.step_ms / 1000;
    let base = |title: String, y: &str| Chart {
        title,
        y_label: y.to_owned(),
        start_ms: r.since_ms,
        end_ms: r.until_ms,
        shaded: r.incidents.iter().map(|i| (i.start_ms, i.end_ms)).collect(),
        ..Chart::default()
    };
    let mut denied = base(
        format!("{}: retries denied per {step}s", r.dependency),
        "retries denied",
    );
    denied.points = r
        .minutes
        .iter()
        .map(|m| (m.at_ms, Some(m.retries_denied)))
        .collect();
    let mut amplification = base(
        format!("{}: amplification per {step}s", r.dependency),
        "executions / first attempts",
    );
    amplification.points = r
        .minutes
        .iter()
        .map(|m| (m.at_ms, m.amplification()))
        .collect();
    amplification.marks.push((1.0, "1.0".to_owned()));
    let mut dead = base(
        format!("{}: dead letters per {step}s", r.dependency),
        "dead-letter decisions",
    );
    dead.points = r
        .minutes
        .iter()
        .map(|m| (m.at_ms, Some(m.dead_letters.values().sum())))
        .collect();
    vec![
        ("denied", denied),
        ("amplification", amplification),
        ("dead-letters", dead),
    ]
}

/// A Markdown table cell: escaped for display, `|` and newlines kept out.
fn cell(text: &str) -> String {
    fleet_budget::printable::escape_text(text)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('|', "\\|")
        .replace(['\n', '\r'], " ")
}

/// The sections as (heading, rows of cells); the first row is the header.
fn sections(r: &Report) -> Vec<(String, Vec<Vec<String>>)> {
    let mut out = Vec::new();
    let mut timeline = vec![vec!["time".to_owned(), "event".to_owned()]];
    timeline.extend(
        r.timeline
            .iter()
            .map(|e| vec![rfc3339_ms(e.at_ms), e.what.clone()]),
    );
    out.push(("Timeline".to_owned(), timeline));

    let mut minutes = vec![
        [
            "time",
            "first attempts",
            "executions",
            "amplification",
            "retries granted",
            "retries denied",
            "dead letters",
            "breaker",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for m in &r.minutes {
        let busy = m.first_attempts + m.executions + m.retries_denied + m.dead_letters.len() as f64;
        if busy <= 0.0 && m.breaker.is_empty() {
            continue;
        }
        minutes.push(vec![
            rfc3339_ms(m.at_ms),
            format!("{:.0}", m.first_attempts),
            format!("{:.0}", m.executions),
            m.amplification().map_or("-".into(), |a| format!("{a:.2}")),
            format!("{:.0}", m.retries_granted),
            format!("{:.0}", m.retries_denied),
            m.dead_letters
                .iter()
                .map(|(k, v)| format!("{k} {v:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
            m.breaker
                .iter()
                .map(|(k, v)| format!("{k} {v:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
        ]);
    }
    out.push((format!("Per {}s", r.step_ms / 1000), minutes));

    let mut overrides = vec![
        ["time", "action", "who", "why", "before", "after"]
            .map(str::to_owned)
            .to_vec(),
    ];
    for o in &r.overrides {
        let json =
            |v: &Option<serde_json::Value>| v.as_ref().map_or(String::new(), ToString::to_string);
        overrides.push(vec![
            rfc3339_ms(o.at_ms),
            o.action.clone(),
            o.actor.clone(),
            o.reason.clone(),
            json(&o.before),
            json(&o.after),
        ]);
    }
    out.push(("Overrides (audit trail)".to_owned(), overrides));

    let mut waiting = vec![
        ["queue", "reason", "error class", "messages"]
            .map(str::to_owned)
            .to_vec(),
    ];
    waiting.extend(r.waiting.iter().map(|w: &Waiting| {
        vec![
            w.queue.to_owned(),
            w.reason.clone(),
            w.error_class.clone(),
            w.count.to_string(),
        ]
    }));
    out.push((
        "Dead letters waiting, by reason and error class (dead-letter index)".to_owned(),
        waiting,
    ));

    let mut replays = vec![
        [
            "time", "action", "who", "why", "moved", "parked", "purged", "skipped", "failed",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for p in &r.replays {
        replays.push(vec![
            rfc3339_ms(p.at_ms),
            if p.all_dependencies {
                format!("{} (every dependency)", p.action)
            } else {
                p.action.clone()
            },
            p.actor.clone(),
            p.note.clone(),
            p.moved.to_string(),
            p.parked.to_string(),
            p.purged.to_string(),
            p.skipped.to_string(),
            p.failed.to_string(),
        ]);
    }
    out.push(("Replays and purges (audit trail)".to_owned(), replays));

    let a = &r.accounting;
    let mut accounting = vec![vec!["".to_owned(), "messages".to_owned()]];
    accounting.push(vec![
        "dead-lettered in the range (workers' counters)".to_owned(),
        a.dead_lettered
            .map_or("unknown (no Prometheus)".into(), |d| d.to_string()),
    ]);
    accounting.push(vec![
        "still in the dead-letter queue".to_owned(),
        a.waiting.to_string(),
    ]);
    accounting.push(vec!["replayed".to_owned(), a.replayed.to_string()]);
    accounting.push(vec![
        "parked by a replay".to_owned(),
        a.parked_by_replay.to_string(),
    ]);
    accounting.push(vec![
        "unaccounted for".to_owned(),
        a.unaccounted.map_or("-".into(), |u| u.to_string()),
    ]);
    out.push((
        "Accounting: where every dead letter went".to_owned(),
        accounting,
    ));
    out
}

fn summary(r: &Report) -> Vec<String> {
    let mut lines = vec![format!(
        "{} from {} to {}; policy in force: ratio {}, min_allowance {}.",
        r.dependency,
        rfc3339_ms(r.since_ms),
        rfc3339_ms(r.until_ms),
        r.ratio,
        r.min_allowance
    )];
    if !r.minutes.is_empty() {
        lines.push(format!(
            "{} incident(s) found (stretches of 2+ steps with the retry fraction above the ratio \
             or the breaker open, as `budgetctl tune` finds them).",
            r.incidents.len()
        ));
    }
    match r.accounting.unaccounted {
        Some(0) => lines.push("Every dead letter is accounted for.".to_owned()),
        Some(n) => lines.push(format!(
            "{n} dead letters are not accounted for (positive: decided but neither waiting, \
             replayed nor parked; negative: found more than decided in the range)."
        )),
        None => {}
    }
    lines.extend(r.sources.iter().map(|s| format!("Source: {s}.")));
    lines
}

/// The report as Markdown; charts written to `chart_dir` (and linked) when given.
pub(super) fn markdown(r: &Report, chart_dir: Option<&Path>) -> anyhow::Result<String> {
    let mut s = String::new();
    let _ = writeln!(s, "# Incident report: {}\n", cell(&r.dependency));
    for line in summary(r) {
        let _ = writeln!(s, "- {}", cell(&line));
    }
    if let Some(dir) = chart_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("--chart-dir {}: {e}", dir.display()))?;
        s.push('\n');
        for (name, chart) in charts(r) {
            let file = format!("{}-{name}.svg", file_name(&r.dependency));
            let path = dir.join(&file);
            std::fs::write(&path, chart.svg())
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
            let _ = writeln!(s, "![{name}]({})", path.display());
        }
    }
    for (heading, rows) in sections(r) {
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
    for line in summary(r) {
        let _ = write!(s, "<li>{}</li>", escape(&line));
    }
    s.push_str("</ul>\n");
    for (name, chart) in charts(r) {
        let _ = writeln!(s, "<figure id=\"chart-{name}\">{}</figure>", chart.svg());
    }
    for (i, (heading, rows)) in sections(r).into_iter().enumerate() {
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
