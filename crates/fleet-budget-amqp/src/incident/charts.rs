//! The report's charts: retries denied, amplification and dead letters per step, the incidents
//! shaded and the budget's turns (exhausted, recovered) marked; drawn by the library's chart
//! ([`fleet_budget_sim::chart`]).
//!
//! Why in the model: `budgetctl incident report` (Markdown and HTML) and the console's incident
//! page show the same charts, built here once; each front end only places the SVG.

use fleet_budget_sim::chart::Chart;

use super::Report;

/// A turn of the budget in the per-minute figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BudgetTurn {
    /// The first step with retries denied after one without (or the range's first step).
    Exhausted {
        /// The step's start (Unix ms).
        at_ms: u64,
        /// Retries denied in the step.
        denied: f64,
    },
    /// The first step without retries denied after one with.
    Recovered {
        /// The step's start (Unix ms).
        at_ms: u64,
    },
}

impl BudgetTurn {
    /// When (Unix ms).
    #[must_use]
    pub fn at_ms(&self) -> u64 {
        match self {
            Self::Exhausted { at_ms, .. } | Self::Recovered { at_ms } => *at_ms,
        }
    }

    /// Its label on a chart.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Exhausted { .. } => "exhausted",
            Self::Recovered { .. } => "recovered",
        }
    }
}

impl Report {
    /// The budget's turns, in time order: exhausted at the first step with denials, recovered at
    /// the first without again.
    #[must_use]
    pub fn budget_turns(&self) -> Vec<BudgetTurn> {
        let mut turns = Vec::new();
        let mut exhausted = false;
        for m in &self.minutes {
            let denying = m.retries_denied > 0.0;
            if denying && !exhausted {
                turns.push(BudgetTurn::Exhausted {
                    at_ms: m.at_ms,
                    denied: m.retries_denied,
                });
            } else if !denying && exhausted {
                turns.push(BudgetTurn::Recovered { at_ms: m.at_ms });
            }
            exhausted = denying;
        }
        turns
    }

    /// The charts as (name, chart): `denied`, `amplification`, `dead-letters`; none without
    /// the per-minute figures.
    #[must_use]
    pub fn charts(&self) -> Vec<(&'static str, Chart)> {
        if self.minutes.is_empty() {
            return Vec::new();
        }
        let step = self.step_ms / 1000;
        let events: Vec<(u64, String)> = self
            .budget_turns()
            .iter()
            .map(|t| (t.at_ms(), t.label().to_owned()))
            .collect();
        let chart = |title: &str, y_label: &str, points: Vec<(u64, Option<f64>)>| Chart {
            title: format!("{}: {title} per {step}s", self.dependency),
            y_label: y_label.to_owned(),
            start_ms: self.since_ms,
            end_ms: self.until_ms,
            points,
            shaded: self
                .incidents
                .iter()
                .map(|i| (i.start_ms, i.end_ms))
                .collect(),
            events: events.clone(),
            ..Chart::default()
        };
        let series = |f: &dyn Fn(&super::Minute) -> Option<f64>| {
            self.minutes.iter().map(|m| (m.at_ms, f(m))).collect()
        };
        let denied = chart(
            "retries denied",
            "retries denied",
            series(&|m| Some(m.retries_denied)),
        );
        let mut amplification = chart(
            "amplification",
            "executions / first attempts",
            series(&super::Minute::amplification),
        );
        amplification.marks.push((1.0, "1.0".to_owned()));
        let dead = chart(
            "dead letters",
            "dead-letter decisions",
            series(&|m| Some(m.dead_lettered())),
        );
        vec![
            ("denied", denied),
            ("amplification", amplification),
            ("dead-letters", dead),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::super::Minute;
    use super::*;

    #[test]
    fn the_budget_turns_are_marked_on_every_chart_and_an_empty_report_has_none() {
        let mut r = Report::new("search", 0, 300_000);
        assert!(r.charts().is_empty());
        r.minutes = [0.0, 4.0, 2.0, 0.0, 0.0, 1.0]
            .iter()
            .enumerate()
            .map(|(k, denied)| Minute {
                at_ms: k as u64 * 60_000,
                retries_denied: *denied,
                first_attempts: 10.0,
                executions: 10.0 + denied,
                ..Minute::default()
            })
            .collect();
        assert_eq!(
            r.budget_turns(),
            vec![
                BudgetTurn::Exhausted {
                    at_ms: 60_000,
                    denied: 4.0
                },
                BudgetTurn::Recovered { at_ms: 180_000 },
                BudgetTurn::Exhausted {
                    at_ms: 300_000,
                    denied: 1.0
                },
            ]
        );
        let charts = r.charts();
        assert_eq!(charts.len(), 3);
        for (_, c) in &charts {
            assert_eq!(c.svg().matches("class=\"event\"").count(), 3);
        }
    }
}
