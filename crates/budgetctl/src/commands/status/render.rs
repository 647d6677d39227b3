//! `status` for people: the table of budgets with an alert per dependency, then the policy in
//! force, conflicts, breaker and overrides of each, and the keys that cannot be used.

use fleet_budget::printable::escape_text;

use super::view::{DependencyStatus, StatusReport};
use crate::output::table_aligned;

/// The report for people: the table, then each dependency's details and the unusable keys.
pub(super) fn render(report: &StatusReport) -> String {
    let mut out = format!(
        "budgets in {} under `{}` (sliding estimates over the last window)\n",
        report.redis, report.key_prefix
    );
    if report.dependencies.is_empty() && report.unusable.is_empty() {
        out.push_str("no dependency configured or found in Redis\n");
        return out;
    }
    let mut rows = vec![
        [
            "dependency",
            "window",
            "rolls in",
            "successes",
            "first attempts",
            "executions",
            "retries granted",
            "retries denied",
            "allowance",
            "remaining",
            "amplif.",
            "alert",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for d in &report.dependencies {
        rows.push(vec![
            d.dependency.clone(),
            format!("{}s", d.window_secs),
            format!("{:.1}s", d.window_remaining_secs),
            d.successes.to_string(),
            d.first_attempts.to_string(),
            d.executions.to_string(),
            d.retries_granted.to_string(),
            d.retries_denied.to_string(),
            d.allowance.to_string(),
            d.remaining.to_string(),
            d.amplification
                .map_or_else(|| "-".to_owned(), |a| format!("{a:.2}x")),
            d.alert().to_owned(),
        ]);
    }
    out.push_str(&table_aligned(&rows, &[0, 11]));
    for d in &report.dependencies {
        out.push_str(&details(d));
    }
    for p in &report.unusable {
        out.push_str(&format!(
            "UNUSABLE {}: key {} {}\n",
            p.dependency, p.key, p.error
        ));
    }
    out
}

/// The lines under the table for `d`: policy in force, conflicts, breaker, overrides.
#[allow(clippy::cast_precision_loss)]
fn details(d: &DependencyStatus) -> String {
    let secs = |until: u64| until.saturating_sub(d.now_ms) as f64 / 1000.0;
    let mut out = format!("{}: policy in force: {}\n", d.dependency, d.policy_in_force);
    if let (Some(policy), Some(age)) = (&d.conflicting_policy, d.conflict_age_secs) {
        let policy = escape_text(policy);
        out.push_str(&format!(
            "  CONFLICT: {} calls sent another policy, the last `{policy}` {age:.1}s ago \
             (window_ms ratio min_allowance basis mode); they are served by the policy in force\n",
            d.conflicts
        ));
    }
    if let Some(b) = &d.breaker {
        out.push_str(&super::breaker::render(b));
    }
    if let Some(c) = &d.concurrency {
        out.push_str(&format!(
            "  in flight: {} calls of a cap of {}\n",
            c.in_flight, c.cap
        ));
    }
    if let Some(f) = &d.overrides.freeze {
        out.push_str(&format!(
            "  FROZEN by {} (\"{}\"): no retry granted, expires in {:.1}s\n",
            escape_text(&f.actor),
            escape_text(&f.reason),
            secs(f.until_ms)
        ));
    }
    if let Some(o) = &d.overrides.set {
        let ratio = o.ratio.map_or_else(String::new, |r| format!(" ratio {r}"));
        let floor = o
            .min_allowance
            .map_or_else(String::new, |m| format!(" min_allowance {m}"));
        out.push_str(&format!(
            "  SET{ratio}{floor} by {} (\"{}\"), expires in {:.1}s\n",
            escape_text(&o.actor),
            escape_text(&o.reason),
            secs(o.until_ms)
        ));
    }
    out
}
