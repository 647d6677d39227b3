//! The overview's sparklines from Prometheus, when the console is given one
//! (`--prometheus-url`): the last hour of each dependency's amplification and denials, from the
//! counters the workers export (`fleet_budget_first_attempts_total`,
//! `fleet_budget_retries_granted_total`, `fleet_budget_retries_denied_total`), read with range
//! queries (`GET /api/v1/query_range`) in the background; the pages fall back to the console's
//! own history, and say which they show.
//!
//! Why Prometheus when the console keeps a history: the console's history starts when the
//! console starts (a restart during an incident forgets the hour before it) and holds what one
//! console read; Prometheus holds what every worker counted, for as long as it keeps it.
//!
//! The client is the library's (`fleet_budget::metrics::Prometheus`, as `budgetctl tune` reads
//! Prometheus): each request within a deadline, the body bounded, the series and their points
//! bounded, credentials in the URL sent as `Authorization` and never shown.

use std::collections::BTreeMap;
use std::time::Duration;

use fleet_budget::metrics::{Prometheus, PrometheusSeries as Series};

use crate::fleet::Point;

/// The last hour to `end_ms` of every dependency the workers count, one point every
/// `step`: amplification (executions per first attempt over the step) and the retries
/// denied in the step. Three range queries, each within the client's deadline.
///
/// # Errors
/// Prometheus did not answer as documented (the error says how, redacted).
pub(crate) async fn hour(
    prometheus: &Prometheus,
    end_ms: u64,
    step: Duration,
) -> Result<BTreeMap<String, Vec<Point>>, String> {
    let step_ms = u64::try_from(step.as_millis()).unwrap_or(60_000).max(1_000);
    let start_ms = end_ms.saturating_sub(3_600_000);
    let increase = |metric: &str| format!("sum by (dependency) (increase({metric}[{step_ms}ms]))");
    let get = async |metric: &str| {
        prometheus
            .range(&increase(metric), start_ms, end_ms, step_ms)
            .await
    };
    let firsts = get("fleet_budget_first_attempts_total").await?;
    let granted = get("fleet_budget_retries_granted_total").await?;
    let denied = get("fleet_budget_retries_denied_total").await?;
    let mut hours = BTreeMap::new();
    let names: std::collections::BTreeSet<&String> = firsts
        .keys()
        .chain(granted.keys())
        .chain(denied.keys())
        .collect();
    for name in names {
        let at = |s: &Series, t: u64| s.get(name).and_then(|p| p.get(&t)).copied();
        let mut times: Vec<u64> = [&firsts, &granted, &denied]
            .iter()
            .filter_map(|s| s.get(name))
            .flat_map(|p| p.keys().copied())
            .collect();
        times.sort_unstable();
        times.dedup();
        let points = times
            .into_iter()
            .map(|t| {
                let f = at(&firsts, t).unwrap_or(0.0);
                let g = at(&granted, t).unwrap_or(0.0);
                Point {
                    at_ms: t,
                    spent: whole(g),
                    allowance: 0,
                    denied: whole(at(&denied, t).unwrap_or(0.0)),
                    amplification: (f > 0.0).then(|| (f + g) / f),
                }
            })
            .collect();
        hours.insert(crate::pages::t(name), points);
    }
    Ok(hours)
}

/// A count as a whole number (a non-negative, finite increase rounded).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn whole(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        v.round().min(9.0e15) as u64
    } else {
        0
    }
}
