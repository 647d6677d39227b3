//! `status --watch`'s trend: per dependency, a bar per window of the last few, the retries
//! granted against the allowance.

use super::view::DependencyStatus;

/// Windows `--watch` keeps per dependency for its trend.
const TREND_WINDOWS: usize = 12;
/// Spend against allowance, from none to all of it.
const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// `--watch`'s memory: per dependency, the last reading of each of the last windows (retries
/// granted against the allowance, and whether retries were denied). Bounded: at most
/// [`TREND_WINDOWS`] windows for each dependency shown.
#[derive(Debug, Default)]
pub(super) struct Trend {
    windows: std::collections::BTreeMap<String, std::collections::VecDeque<TrendPoint>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TrendPoint {
    window_index: u64,
    retries_granted: u64,
    allowance: u64,
    denied: bool,
}

impl Trend {
    /// Keeps the latest reading of each window; forgets dependencies no longer shown.
    pub(super) fn record(&mut self, rows: &[DependencyStatus]) {
        self.windows
            .retain(|d, _| rows.iter().any(|r| &r.dependency == d));
        for r in rows {
            let points = self.windows.entry(r.dependency.clone()).or_default();
            let point = TrendPoint {
                window_index: r.window_index,
                retries_granted: r.retries_granted,
                allowance: r.allowance,
                denied: r.retries_denied > 0,
            };
            match points.back_mut() {
                Some(last) if last.window_index == point.window_index => *last = point,
                _ => points.push_back(point),
            }
            while points.len() > TREND_WINDOWS {
                points.pop_front();
            }
        }
    }

    /// One line per dependency: a bar per window, the retries granted against the allowance
    /// (`!` where retries were denied), oldest first.
    pub(super) fn render(&self) -> String {
        let mut out = format!(
            "\nspend against allowance, last {TREND_WINDOWS} windows (▁ none … █ all of it, ! retries denied)\n"
        );
        let width = self.windows.keys().map(String::len).max().unwrap_or(0);
        for (dependency, points) in &self.windows {
            let bars: String = points.iter().map(|p| bar(*p)).collect();
            let now = points
                .back()
                .map(|p| format!("{}/{}", p.retries_granted, p.allowance))
                .unwrap_or_default();
            out.push_str(&format!(
                "  {dependency:<width$}  {bars:<TREND_WINDOWS$}  now {now}\n"
            ));
        }
        out
    }
}

/// The bar of one window.
fn bar(p: TrendPoint) -> char {
    if p.denied {
        return '!';
    }
    let last = BARS.len() - 1;
    let step = match p
        .retries_granted
        .saturating_mul(last as u64)
        .checked_div(p.allowance)
    {
        Some(scaled) => usize::try_from(scaled).unwrap_or(last).min(last),
        None if p.retries_granted > 0 => last,
        None => 0,
    };
    BARS.get(step).copied().unwrap_or('█')
}

#[cfg(test)]
mod tests {
    use super::{TREND_WINDOWS, Trend};
    use crate::commands::status::view::DependencyStatus;

    fn row(
        dependency: &str,
        window_index: u64,
        granted: u64,
        allowance: u64,
        denied: u64,
    ) -> DependencyStatus {
        DependencyStatus {
            dependency: dependency.to_owned(),
            window_secs: 60.0,
            window_remaining_secs: 1.0,
            successes: 0,
            first_attempts: 0,
            executions: granted,
            retries_granted: granted,
            retries_denied: denied,
            allowance,
            remaining: allowance.saturating_sub(granted),
            amplification: None,
            policy_in_force: String::new(),
            conflicts: 0,
            conflicting_policy: None,
            conflict_age_secs: None,
            overrides: fleet_budget::control::Overrides::default(),
            now_ms: 0,
            window_index,
            breaker: None,
            concurrency: None,
            alerts: Vec::new(),
            enforcement: "enforce",
            would_deny: 0,
            retries: granted,
            denied,
        }
    }

    #[test]
    fn the_trend_keeps_one_bar_per_window_and_marks_denials() {
        let mut trend = Trend::default();
        // Two readings in window 1: the later one counts.
        trend.record(&[row("search", 1, 1, 10, 0), row("mail", 1, 0, 10, 0)]);
        trend.record(&[row("search", 1, 5, 10, 0), row("mail", 1, 0, 10, 0)]);
        trend.record(&[row("search", 2, 10, 10, 0), row("mail", 2, 0, 10, 0)]);
        trend.record(&[row("search", 3, 10, 10, 4), row("mail", 3, 0, 10, 0)]);
        let text = trend.render();
        assert!(text.contains("  search  ▄█!"), "{text}");
        assert!(text.contains("now 10/10"), "{text}");
        assert!(text.contains("  mail    ▁▁▁"), "{text}");
        // Bounded, and dependencies no longer shown are forgotten.
        for w in 4..40 {
            trend.record(&[row("search", w, 0, 10, 0)]);
        }
        assert_eq!(trend.windows["search"].len(), TREND_WINDOWS);
        assert!(!trend.render().contains("mail"));
    }
}
