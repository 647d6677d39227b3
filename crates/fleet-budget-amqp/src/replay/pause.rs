//! Pausing a replay run while the budget of a message's dependency is exhausted: moving it back
//! then would only fail it again. A fresh "not exhausted" is trusted for `budget_cache`; while
//! exhausted, the budget is asked again every `budget_poll`.

use std::collections::HashMap;
use std::time::Duration;

use fleet_budget::Dependency;
use fleet_budget::printable::escape_text;
use tokio::time::Instant;

use super::Replayer;
use super::report::ReplayProgress;
use super::select::ReplayOptions;

impl Replayer {
    /// Waits while `dependency`'s budget has no headroom; returns the time paused.
    pub(super) async fn wait_for_budget(
        &self,
        dependency: &str,
        options: &ReplayOptions,
        checked: &mut HashMap<String, Instant>,
        p: &mut ReplayProgress,
        progress: &mut (impl FnMut(&ReplayProgress) + Send),
    ) -> Duration {
        let Some(budget) = &self.budget else {
            return Duration::ZERO;
        };
        let Ok(dep) = Dependency::new(dependency) else {
            return Duration::ZERO;
        };
        if checked
            .get(dependency)
            .is_some_and(|t| t.elapsed() < options.budget_cache)
        {
            return Duration::ZERO;
        }
        let start = Instant::now();
        loop {
            let (snapshot, _) = budget.status(&dep).await;
            if snapshot.remaining() > 0 {
                checked.insert(dependency.to_owned(), Instant::now());
                if p.paused_on.take().is_some() {
                    tracing::info!(dependency = %escape_text(dependency), "budget has headroom again; replay resumes");
                    progress(p);
                    return start.elapsed();
                }
                // Asking is not pausing: a run that never waited reports no pause.
                return Duration::ZERO;
            }
            if p.paused_on.is_none() {
                tracing::info!(dependency = %escape_text(dependency), "budget exhausted; replay paused");
                p.paused_on = Some(dependency.to_owned());
                progress(p);
            }
            tokio::time::sleep(options.budget_poll).await;
        }
    }
}
