//! `tune`'s chart of a dependency: the retry fraction, the recommended ratio, the incidents
//! shaded; drawn by the library's chart (`fleet_budget_sim::chart`, which the incident report
//! and the console draw with too).

use std::path::Path;

use fleet_budget_sim::chart::{Chart, file_name};

use super::{Range, Tuned};

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
