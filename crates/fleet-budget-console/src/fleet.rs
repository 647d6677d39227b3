//! The fleet overview: every dependency's budget, overrides, breaker and calls in flight, as
//! the library's read model gives them (`fleet_budget::view`, the same views and alerts
//! `budgetctl status` prints), worst first, laid out for the pages and `/api/overview` with every
//! text from Redis through the console's one door ([`crate::pages::t`]); the workers in fallback
//! per dependency from the worker registry (`fleet_budget::control::workers`); and a short
//! history per dependency for its chart and the overview's sparklines.
//!
//! Why the history is the console's own: Redis holds two windows of counters per dependency
//! (the current one and the previous), which is what the allowance needs and no more. The
//! console reads every dependency every few seconds anyway, so it keeps the last
//! [`HISTORY_POINTS`] readings of each in memory, and one reading a minute for the last hour;
//! the charts say how far back they reach. No Prometheus needed.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use fleet_budget::control::{FleetWorkers, fleet_workers};
use fleet_budget::store::RedisStore;
use fleet_budget::view::{self, Alert, DependencyView};
use fleet_budget::{Config, Dependency, StoreError, WindowCounters};
use serde::Serialize;

/// Readings kept per dependency for its chart.
pub(crate) const HISTORY_POINTS: usize = 120;
/// Readings a minute apart kept per dependency for its sparkline: the last hour.
pub(crate) const HOUR_POINTS: usize = 60;
/// Dependencies whose history is kept at most (those of the last reading, by name): bounds the
/// console's memory whatever Redis holds (about 11 KB each).
pub(crate) const HISTORY_DEPENDENCIES: usize = 5_000;

/// One dependency as the overview shows it. Text from Redis is already escaped by the
/// printable rules (invisible and bidirectional characters by code point).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DependencyRow {
    pub(crate) dependency: String,
    pub(crate) allowance: u64,
    /// Retries granted in the last window (sliding estimate).
    pub(crate) spent: u64,
    pub(crate) remaining: u64,
    pub(crate) denied: u64,
    pub(crate) denials_per_sec: f64,
    pub(crate) first_attempts: u64,
    pub(crate) amplification: Option<f64>,
    pub(crate) window_secs: f64,
    pub(crate) policy: String,
    pub(crate) conflict: Option<String>,
    pub(crate) frozen: Option<OverrideView>,
    pub(crate) set: Option<OverrideView>,
    pub(crate) breaker: Option<BreakerView>,
    pub(crate) concurrency: Option<ConcurrencyView>,
    /// Workers whose fresh report (the worker registry) says they decide this dependency from
    /// their fallback; `None` when the registry could not be read. Silent workers are not
    /// counted: they may be cut off from Redis, or stopped ([`WorkersLine`]).
    pub(crate) workers_in_fallback: Option<u64>,
    /// The worst alert's text (empty: none).
    pub(crate) alert: String,
    /// The worst alert's severity: 0 (fine) to 5 (frozen); the overview sorts by it, then by
    /// denials per second.
    pub(crate) severity: u8,
    /// Every alert, worst first (the library's, the same `budgetctl status --json` prints).
    pub(crate) alerts: Vec<Alert>,
    pub(crate) now_ms: u64,
    /// The two windows Redis holds: previous and current (granted, denied, first attempts).
    pub(crate) windows: [[u64; 3]; 2],
}

/// An override in force, for people.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OverrideView {
    pub(crate) what: String,
    pub(crate) actor: String,
    pub(crate) reason: String,
    pub(crate) expires_in_secs: f64,
}

/// A breaker as the overview shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BreakerView {
    pub(crate) state: &'static str,
    pub(crate) half_opens_in_secs: f64,
    pub(crate) probes_issued: u64,
    pub(crate) probe_successes: u64,
    pub(crate) times_opened: u64,
    pub(crate) failures: f64,
    pub(crate) calls: f64,
}

/// Calls in flight against the cap.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct ConcurrencyView {
    pub(crate) in_flight: u64,
    pub(crate) cap: u64,
}

/// A dependency whose key cannot be read.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Unusable {
    pub(crate) dependency: String,
    pub(crate) error: String,
}

/// The worker registry in one line: the fleet as its workers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct WorkersLine {
    /// Fresh, readable reports.
    pub(crate) reporting: u64,
    /// Of those, the workers deciding some dependency from their fallback.
    pub(crate) in_fallback: u64,
    /// Entries not refreshed for three beats: stopped, or cut off from Redis (and then in
    /// fallback for everything, unable to say so).
    pub(crate) silent: u64,
    /// Entries that are no worker's report (written by hand, another version).
    pub(crate) unreadable: u64,
    /// Ids in the registry.
    pub(crate) total: u64,
    /// Whether more than [`WORKERS_READ`] entries were there (the counts are of those read).
    pub(crate) truncated: bool,
}

/// The whole overview.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Overview {
    pub(crate) schema_version: u32,
    pub(crate) key_prefix: String,
    pub(crate) dependencies: Vec<DependencyRow>,
    pub(crate) unusable: Vec<Unusable>,
    /// The worker registry, when it could be read.
    pub(crate) workers: Option<WorkersLine>,
    /// Why it could not (redacted, escaped).
    pub(crate) workers_error: Option<String>,
}

/// Registry entries the console reads at most (freshest first).
pub(crate) const WORKERS_READ: u64 = 10_000;

impl WorkersLine {
    pub(crate) fn of(read: &FleetWorkers) -> Self {
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        Self {
            reporting: count(read.reporting()),
            in_fallback: count(read.in_fallback()),
            silent: count(read.silent()),
            unreadable: count(
                read.workers
                    .iter()
                    .filter(|w| w.unreadable.is_some())
                    .count(),
            ),
            total: read.total,
            truncated: read.truncated,
        }
    }
}

/// The registry, or why it cannot be read (a Redis user without its commands, a key of
/// another type): the overview shows the budgets either way.
pub(crate) async fn workers(store: &RedisStore) -> Result<FleetWorkers, String> {
    fleet_workers(store, WORKERS_READ)
        .await
        .map_err(|e| shown(&fleet_budget::redact::redact_text(&e.to_string())))
}

/// Text from Redis as the overview and its JSON show it: redacted and escaped, through the
/// console's one door for outside text ([`crate::pages::t`]).
fn shown(s: &str) -> String {
    crate::pages::t(s)
}

/// The worker registry with every text a worker wrote redacted and escaped
/// ([`crate::pages::t`]), for its page and its JSON.
pub(crate) fn workers_shown(mut read: FleetWorkers) -> FleetWorkers {
    let opt = |v: &mut Option<String>| {
        if let Some(s) = v.as_mut() {
            *s = shown(s);
        }
    };
    for w in &mut read.workers {
        w.id = shown(&w.id);
        opt(&mut w.unreadable);
        opt(&mut w.host);
        opt(&mut w.lang);
        opt(&mut w.version);
        for f in &mut w.fallback {
            f.dependency = shown(&f.dependency);
        }
    }
    read
}

/// `v` laid out for the pages and the JSON: its texts through [`shown`].
fn row(v: &DependencyView) -> DependencyRow {
    let counters = |w: &WindowCounters| [w.retries, w.denied, w.first_attempts];
    let (freeze, set) = (&v.overrides.freeze, &v.overrides.set);
    DependencyRow {
        dependency: shown(v.dependency.as_str()),
        allowance: v.allowance,
        spent: v.retries_granted,
        remaining: v.remaining,
        denied: v.retries_denied,
        denials_per_sec: v.denials_per_sec(),
        first_attempts: v.first_attempts,
        amplification: v.amplification,
        window_secs: DependencyView::secs(v.window_ms),
        policy: v.policy_in_force(),
        conflict: v.conflicting_policy.as_deref().map(|c| {
            format!(
                "{} calls sent another policy, the last `{}`",
                v.conflicts,
                shown(c)
            )
        }),
        frozen: freeze.as_ref().map(|f| OverrideView {
            what: "freeze".to_owned(),
            actor: shown(&f.actor),
            reason: shown(&f.reason),
            expires_in_secs: v.secs_until(f.until_ms),
        }),
        set: set.as_ref().map(|o| OverrideView {
            what: format!(
                "set{}{}",
                o.ratio.map_or_else(String::new, |r| format!(" ratio {r}")),
                o.min_allowance
                    .map_or_else(String::new, |m| format!(" min_allowance {m}"))
            ),
            actor: shown(&o.actor),
            reason: shown(&o.reason),
            expires_in_secs: v.secs_until(o.until_ms),
        }),
        breaker: v.breaker.as_ref().map(|b| BreakerView {
            state: b.state.as_str(),
            half_opens_in_secs: b.open_remaining_secs,
            probes_issued: b.probes_issued,
            probe_successes: b.probe_successes,
            times_opened: b.times_opened,
            failures: b.failures,
            calls: b.calls,
        }),
        concurrency: v.in_flight.map(|c| ConcurrencyView {
            in_flight: c.in_flight,
            cap: c.cap,
        }),
        workers_in_fallback: None,
        alert: v.alert().map_or_else(String::new, |a| a.text.clone()),
        severity: v.severity(),
        alerts: v.alerts.clone(),
        now_ms: v.now_ms,
        windows: [counters(&v.windows[0]), counters(&v.windows[1])],
    }
}

/// Reads every dependency configured or found in Redis (or only `only`), worst first.
///
/// # Errors
/// Redis failed or passed its deadline (a key of another type is listed as unusable instead).
pub(crate) async fn overview(
    config: &Config,
    store: &Arc<RedisStore>,
    only: Option<&Dependency>,
) -> Result<Overview, StoreError> {
    let dependencies: Vec<Dependency> = match only {
        Some(d) => vec![d.clone()],
        None => view::read::dependencies(store, config)
            .await
            .map_err(|e| e.source)?,
    };
    let fleet = view::read_fleet(store, config, &dependencies).await?;
    let mut rows: Vec<DependencyRow> = fleet.worst_first().into_iter().map(row).collect();
    let unusable = fleet
        .unusable
        .iter()
        .map(|u| Unusable {
            dependency: shown(u.dependency.as_str()),
            error: shown(&format!("key {}: {}", u.key, u.detail)),
        })
        .collect();
    let (workers, workers_error) = match workers(store).await {
        Ok(read) => {
            let by_dependency = read.in_fallback_by_dependency();
            for r in &mut rows {
                r.workers_in_fallback =
                    Some(by_dependency.get(&r.dependency).copied().unwrap_or(0));
            }
            (Some(WorkersLine::of(&read)), None)
        }
        Err(e) => (None, Some(e)),
    };
    Ok(Overview {
        schema_version: 1,
        key_prefix: store.prefix().to_owned(),
        dependencies: rows,
        unusable,
        workers,
        workers_error,
    })
}

/// One reading of a dependency, for its charts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Point {
    pub(crate) at_ms: u64,
    pub(crate) spent: u64,
    pub(crate) allowance: u64,
    pub(crate) denied: u64,
    /// Executions per first attempt over the window then; `None` without traffic.
    pub(crate) amplification: Option<f64>,
}

/// The readings kept of one dependency: the last [`HISTORY_POINTS`], and one a minute for the
/// last hour.
#[derive(Debug, Default)]
struct Kept {
    recent: VecDeque<Point>,
    hour: VecDeque<Point>,
}

/// The last readings of each dependency seen, bounded: [`HISTORY_POINTS`] and [`HOUR_POINTS`]
/// per dependency, for at most [`HISTORY_DEPENDENCIES`] dependencies, only those of the last
/// reading.
#[derive(Debug, Default)]
pub(crate) struct History {
    points: BTreeMap<String, Kept>,
}

impl History {
    pub(crate) fn record(&mut self, overview: &Overview) {
        self.points
            .retain(|d, _| overview.dependencies.iter().any(|r| &r.dependency == d));
        for r in &overview.dependencies {
            if !self.points.contains_key(&r.dependency) && self.points.len() >= HISTORY_DEPENDENCIES
            {
                continue;
            }
            let kept = self.points.entry(r.dependency.clone()).or_default();
            let point = Point {
                at_ms: r.now_ms,
                spent: r.spent,
                allowance: r.allowance,
                denied: r.denied,
                amplification: r.amplification,
            };
            kept.recent.push_back(point);
            while kept.recent.len() > HISTORY_POINTS {
                kept.recent.pop_front();
            }
            // One a minute: a new point once the last is a minute old (or from the future:
            // a server clock set back).
            match kept.hour.back() {
                Some(last) if point.at_ms >= last.at_ms && point.at_ms - last.at_ms < 60_000 => {}
                _ => kept.hour.push_back(point),
            }
            while kept.hour.len() > HOUR_POINTS
                || kept
                    .hour
                    .front()
                    .is_some_and(|f| f.at_ms.saturating_add(3_600_000) < point.at_ms)
            {
                kept.hour.pop_front();
            }
        }
    }

    /// The last readings of `dependency`, oldest first.
    pub(crate) fn of(&self, dependency: &str) -> Vec<Point> {
        self.points
            .get(dependency)
            .map(|k| k.recent.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The readings a minute apart of `dependency` over the last hour, oldest first.
    pub(crate) fn hour_of(&self, dependency: &str) -> Vec<Point> {
        self.points
            .get(dependency)
            .map(|k| k.hour.iter().copied().collect())
            .unwrap_or_default()
    }
}
