//! The report's per-minute figures, read from Prometheus: the workers' counters of one
//! dependency summed over the fleet, one point a step (`increase` over the step), and the
//! incidents found in them as `budgetctl tune` finds them
//! ([`fleet_budget_sim::history::incidents`]).
//!
//! Why here and not in each front end: `budgetctl incident report` and the console's incident
//! page ask Prometheus the same queries and must show the same minutes; the client is the
//! library's ([`Prometheus`]: each request within its deadline, the answer bounded).

use std::collections::BTreeMap;

use fleet_budget::DepositBasis;
use fleet_budget::metrics::{Prometheus, PrometheusSeries};
use fleet_budget_sim::history::{self, Rules, Sample};

use super::{Minute, Report, Span};

/// The step of the per-minute figures when the caller names none: a minute, or longer (whole
/// seconds) to keep within the points Prometheus answers per series.
#[must_use]
pub fn default_step_ms(span_ms: u64) -> u64 {
    span_ms
        .div_ceil(Prometheus::MAX_POINTS - 1)
        .max(60_000)
        .div_ceil(1000)
        * 1000
}

impl Report {
    /// Reads the per-minute figures of the report's range, every [`Report::step_ms`], and finds
    /// the incidents in them (the retry fraction over deposits counted as `deposit` says, above
    /// the report's ratio, or the breaker open). Says where they came from in
    /// [`Report::sources`].
    ///
    /// # Errors
    /// Prometheus did not answer one of the queries as documented (the text names the URL,
    /// password redacted, and the query); the report is left without figures.
    pub async fn read_prometheus(
        &mut self,
        prometheus: &Prometheus,
        deposit: DepositBasis,
    ) -> Result<(), String> {
        // Prometheus's steps are whole seconds; a step of 0 would be no step at all.
        self.step_ms = self.step_ms.max(1000);
        let minutes = self.minutes_from(prometheus).await?;
        let samples: Vec<Sample> = minutes
            .iter()
            .map(|m| Sample {
                at_ms: m.at_ms,
                deposits: if deposit == DepositBasis::Request {
                    m.first_attempts
                } else {
                    m.successes
                },
                retries: m.retries_granted + m.retries_denied,
                denied: m.retries_denied,
                breaker_open: m.breaker.get("open").is_some_and(|n| *n > 0.0),
                ..Sample::default()
            })
            .collect();
        self.incidents = history::incidents(&samples, self.step_ms, self.ratio, &Rules::default())
            .iter()
            .map(|i| Span {
                start_ms: i.start_ms,
                end_ms: i.end_ms,
                duration_ms: i.duration_ms,
            })
            .collect();
        self.minutes = minutes;
        self.sources.push(format!(
            "Prometheus {}: the workers' counters summed over the fleet, a point every {}s",
            prometheus.shown(),
            self.step_ms / 1000
        ));
        Ok(())
    }

    /// The counters of the dependency, one [`Minute`] a step from `since_ms` to `until_ms`.
    async fn minutes_from(&self, prometheus: &Prometheus) -> Result<Vec<Minute>, String> {
        let (start, end, step) = (self.since_ms, self.until_ms, self.step_ms);
        let dependency = self.dependency.as_str();
        // The dependency is a label value: a PromQL string with its quotes and backslashes
        // escaped.
        let label = dependency.replace('\\', "\\\\").replace('"', "\\\"");
        let sel = format!("{{dependency=\"{label}\"}}");
        let get = async |query: String| prometheus.range(&query, start, end, step).await;
        let sum = |metric: &str| format!("sum by (dependency) (increase({metric}{sel}[{step}ms]))");
        let first = get(sum("fleet_budget_first_attempts_total")).await?;
        let executions = get(sum("fleet_budget_executions_total")).await?;
        let successes = get(sum("fleet_budget_successes_total")).await?;
        let granted = get(sum("fleet_budget_retries_granted_total")).await?;
        let denied = get(sum("fleet_budget_retries_denied_total")).await?;
        // By reason and by state entered: the label is put in `dependency`'s place, so that the
        // answer reads like the others (bounded by the enums of the metrics).
        let by = |metric: &str, label: &str| {
            format!(
                "label_replace(sum by ({label}) (increase({metric}{sel}[{step}ms])), \
                 \"dependency\", \"$1\", \"{label}\", \"(.*)\")"
            )
        };
        let dead = get(by("fleet_budget_dead_letters_total", "reason")).await?;
        let breaker = get(by("fleet_budget_breaker_transitions_total", "to")).await?;
        let at = |s: &PrometheusSeries, t: u64| {
            s.get(dependency)
                .and_then(|p| p.get(&t))
                .copied()
                .unwrap_or(0.0)
        };
        let by_label = |s: &PrometheusSeries, t: u64| {
            s.iter()
                .filter_map(|(k, p)| p.get(&t).filter(|v| **v > 0.0).map(|v| (k.clone(), *v)))
                .collect::<BTreeMap<String, f64>>()
        };
        Ok((0..=end.saturating_sub(start) / step)
            .map(|k| {
                let t = start + k * step;
                Minute {
                    at_ms: t,
                    first_attempts: at(&first, t),
                    executions: at(&executions, t),
                    successes: at(&successes, t),
                    retries_granted: at(&granted, t),
                    retries_denied: at(&denied, t),
                    dead_letters: by_label(&dead, t),
                    breaker: by_label(&breaker, t),
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_step_is_a_minute_or_what_keeps_a_range_within_prometheus_points() {
        assert_eq!(default_step_ms(3_600_000), 60_000);
        let fourteen_days = 14 * 24 * 3_600_000;
        let step = default_step_ms(fourteen_days);
        assert!(step > 60_000 && step.is_multiple_of(1000));
        assert!(fourteen_days / step < Prometheus::MAX_POINTS);
    }
}
