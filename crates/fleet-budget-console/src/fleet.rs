//! The fleet overview: every dependency's budget, overrides, breaker and concurrency, read
//! from Redis through the library's public reads (the same `status.lua` reply `budgetctl status`
//! prints), sorted worst first, with the workers in fallback per dependency from the worker
//! registry (`fleet_budget::control::workers`); and a short history per dependency for its page.
//!
//! Why the history is the console's own: Redis holds two windows of counters per dependency
//! (the current one and the previous), which is what the allowance needs and no more. The
//! console reads every dependency every few seconds anyway (to keep the overview's trend), so
//! it keeps the last [`HISTORY_POINTS`] readings in memory; the chart says how far back it
//! reaches. No Prometheus needed.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use fleet_budget::breaker::{BreakerState, status_on};
use fleet_budget::control::{FleetStatus, FleetWorkers, Overrides, fleet_status, fleet_workers};
use fleet_budget::store::RedisStore;
use fleet_budget::{Config, Dependency, StoreError, WindowCounters};
use futures::StreamExt;
use serde::Serialize;

/// Readings kept per dependency for its chart.
pub(crate) const HISTORY_POINTS: usize = 120;
/// Dependencies read at once (each read is two or three round trips).
const READS_AT_ONCE: usize = 64;

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
    pub(crate) alert: &'static str,
    /// 0 (fine) to 5 (frozen); the overview sorts by it, then by denials per second.
    pub(crate) severity: u8,
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

#[allow(clippy::cast_precision_loss)]
fn row(dependency: &Dependency, fleet: &FleetStatus) -> DependencyRow {
    let s = &fleet.snapshot;
    let WindowCounters {
        first_attempts,
        retries,
        denied,
        ..
    } = s.estimates();
    let window_secs = s.window_ms as f64 / 1000.0;
    let p = &fleet.policy;
    let expires = |until: u64| until.saturating_sub(fleet.now_ms) as f64 / 1000.0;
    let Overrides { freeze, set } = &fleet.overrides;
    let counters = |w: &WindowCounters| [w.retries, w.denied, w.first_attempts];
    DependencyRow {
        dependency: shown(dependency.as_str()),
        allowance: s.allowance,
        spent: retries,
        remaining: s.remaining(),
        denied,
        denials_per_sec: if window_secs > 0.0 {
            denied as f64 / window_secs
        } else {
            0.0
        },
        first_attempts,
        amplification: (first_attempts > 0)
            .then(|| (first_attempts + retries) as f64 / first_attempts as f64),
        window_secs,
        policy: format!(
            "window {}ms, ratio {}, min_allowance {}, deposit {}, mode {}",
            p.window_ms(),
            p.ratio,
            p.min_allowance,
            p.deposit.as_str(),
            p.mode.as_str()
        ),
        conflict: fleet.conflicting_policy.as_deref().map(|c| {
            format!(
                "{} calls sent another policy, the last `{}`",
                fleet.conflicts,
                shown(c)
            )
        }),
        frozen: freeze.as_ref().map(|f| OverrideView {
            what: "freeze".to_owned(),
            actor: shown(&f.actor),
            reason: shown(&f.reason),
            expires_in_secs: expires(f.until_ms),
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
            expires_in_secs: expires(o.until_ms),
        }),
        breaker: None,
        concurrency: None,
        workers_in_fallback: None,
        alert: "",
        severity: 0,
        now_ms: fleet.now_ms,
        windows: [counters(&s.previous), counters(&s.current)],
    }
}

impl DependencyRow {
    /// The alert and the severity, from what was read.
    fn judge(&mut self) {
        let open = self.breaker.as_ref().is_some_and(|b| b.state != "closed");
        let (severity, alert) = if self.frozen.is_some() {
            (5, "FROZEN: an operator froze retries")
        } else if open {
            (4, "BREAKER: circuit open, jobs wait instead of calling")
        } else if self.denied > 0 && self.remaining == 0 {
            (3, "DENYING: budget exhausted, retries are dead-lettered")
        } else if self.amplification.is_some_and(|a| a > 1.5) {
            (2, "AMPLIFIED: retries above 50% of traffic")
        } else if self.denied > 0 || self.conflict.is_some() {
            (
                1,
                if self.denied > 0 {
                    "denials in the last window"
                } else {
                    "policy conflict"
                },
            )
        } else {
            (0, "")
        };
        self.severity = severity;
        self.alert = alert;
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
        None => {
            let mut deps: Vec<Dependency> = config.policies.keys().cloned().collect();
            let found = store.discover_dependencies().await.map_err(|e| e.source)?;
            deps.extend(found);
            deps.sort();
            deps.dedup();
            deps
        }
    };
    // Boxed with their type spelled out: a closure in `stream::iter(...).map(...)` makes the
    // handler's future fail the `Send` check over a higher-ranked lifetime.
    let futures: Vec<Read<'_>> = dependencies
        .iter()
        .map(|d| -> Read<'_> { Box::pin(read_one(config, store, d)) })
        .collect();
    let reads = futures::stream::iter(futures)
        .buffered(READS_AT_ONCE)
        .collect::<Vec<_>>()
        .await;
    let mut rows = Vec::new();
    let mut unusable = Vec::new();
    for read in reads {
        match read {
            Ok(row) => rows.push(row),
            Err((dependency, StoreError::BadKey { key, detail })) => unusable.push(Unusable {
                dependency: shown(dependency.as_str()),
                error: shown(&fleet_budget::redact::redact_text(&format!(
                    "key {key}: {detail}"
                ))),
            }),
            Err((_, e)) => return Err(e),
        }
    }
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
    rows.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(b.denials_per_sec.total_cmp(&a.denials_per_sec))
            .then(a.dependency.cmp(&b.dependency))
    });
    Ok(Overview {
        schema_version: 1,
        key_prefix: store.prefix().to_owned(),
        dependencies: rows,
        unusable,
        workers,
        workers_error,
    })
}

/// One dependency's read, boxed.
type Read<'a> = std::pin::Pin<
    Box<dyn Future<Output = Result<DependencyRow, (Dependency, StoreError)>> + Send + 'a>,
>;

async fn read_one(
    config: &Config,
    store: &RedisStore,
    dependency: &Dependency,
) -> Result<DependencyRow, (Dependency, StoreError)> {
    let fail = |e| (dependency.clone(), e);
    let policy = config.policy(dependency);
    let fleet = fleet_status(store, dependency, &policy)
        .await
        .map_err(fail)?;
    let mut r = row(dependency, &fleet);
    if let Some(policy) = config.breakers.get(dependency) {
        let b = status_on(store, dependency, policy).await.map_err(fail)?;
        let due = b.state == BreakerState::Open && b.now_ms >= b.open_until_ms;
        #[allow(clippy::cast_precision_loss)]
        let half_opens_in_secs = if b.state == BreakerState::Open {
            b.open_until_ms.saturating_sub(b.now_ms) as f64 / 1000.0
        } else {
            0.0
        };
        r.breaker = Some(BreakerView {
            state: if due {
                BreakerState::HalfOpen.as_str()
            } else {
                b.state.as_str()
            },
            half_opens_in_secs,
            probes_issued: b.probes_issued,
            probe_successes: b.probe_successes,
            times_opened: b.times_opened,
            failures: b.failures,
            calls: b.volume,
        });
    }
    if let Some(policy) = config.concurrency.get(dependency) {
        // The lease sets hold a lease per call in flight, scored by when it expires: those
        // not yet expired are in flight (`crates/fleet-budget/src/concurrency/lease.rs`).
        let base = store.key(dependency);
        let mut in_flight = 0;
        for set in [format!("{base}:lp"), format!("{base}:lr")] {
            let mut zcount = redis::cmd("ZCOUNT");
            zcount.arg(&set).arg(fleet.now_ms).arg("+inf");
            match store.query::<u64>(&zcount).await {
                Ok(n) => in_flight += n,
                // A key of another type (written by hand): the row says nothing rather than a
                // wrong count.
                Err(StoreError::Redis(e)) if e.code() == Some("WRONGTYPE") => {}
                Err(e) => return Err(fail(e)),
            }
        }
        r.concurrency = Some(ConcurrencyView {
            in_flight,
            cap: policy.cap,
        });
    }
    r.judge();
    Ok(r)
}

/// One reading of a dependency, for its chart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Point {
    pub(crate) at_ms: u64,
    pub(crate) spent: u64,
    pub(crate) allowance: u64,
    pub(crate) denied: u64,
}

/// The last readings of each dependency seen, bounded: [`HISTORY_POINTS`] per dependency, and
/// only dependencies of the last reading.
#[derive(Debug, Default)]
pub(crate) struct History {
    points: BTreeMap<String, VecDeque<Point>>,
}

impl History {
    pub(crate) fn record(&mut self, overview: &Overview) {
        self.points
            .retain(|d, _| overview.dependencies.iter().any(|r| &r.dependency == d));
        for r in &overview.dependencies {
            let points = self.points.entry(r.dependency.clone()).or_default();
            points.push_back(Point {
                at_ms: r.now_ms,
                spent: r.spent,
                allowance: r.allowance,
                denied: r.denied,
            });
            while points.len() > HISTORY_POINTS {
                points.pop_front();
            }
        }
    }

    pub(crate) fn of(&self, dependency: &str) -> Vec<Point> {
        self.points
            .get(dependency)
            .map(|p| p.iter().copied().collect())
            .unwrap_or_default()
    }
}
