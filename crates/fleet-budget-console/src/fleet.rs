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

use fleet_budget::control::{FleetWorkers, WorkerEntry, fleet_workers};
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
    /// The current window's index (server time / window length): which window `windows[1]`
    /// is, for counting denials over more than the two windows Redis holds.
    pub(crate) window_index: u64,
    /// `enforce` (refused retries are dead-lettered) or `shadow` (counted and retried anyway).
    pub(crate) enforcement: &'static str,
    /// An operator's switch in force (`budgetctl budget shadow|enforce`, or the console's
    /// button); `None`: the configuration decides.
    pub(crate) enforcement_switch: Option<SwitchView>,
    /// In shadow, the retries enforcement would have denied in the last window (the budget's
    /// window, `window_secs`); 0 while enforced.
    pub(crate) would_deny: u64,
}

/// An operator's enforcement switch, for people.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SwitchView {
    pub(crate) enforcement: &'static str,
    pub(crate) actor: String,
    pub(crate) reason: String,
    /// Seconds until it ends; `None`: until the next switch.
    pub(crate) expires_in_secs: Option<f64>,
    /// Server ms when it was switched.
    pub(crate) since_ms: u64,
}

/// An override in force, for people.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OverrideView {
    pub(crate) what: String,
    pub(crate) actor: String,
    pub(crate) reason: String,
    pub(crate) expires_in_secs: f64,
    /// Server ms when it ends.
    pub(crate) until_ms: u64,
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

/// The version of `/api/overview`'s shape (`docs/schemas/console/overview.schema.json`). 2:
/// paged, [`JSON_PER_PAGE`] rows a page (version 1 listed every row: 1,000 dependencies made
/// half a megabyte, and one page can hold at most what a reading found, 100,000 keys a node).
pub(crate) const OVERVIEW_SCHEMA: u32 = 2;
/// Rows (and unusable keys) a page of `/api/overview`: about 100 KB of the rows a fleet
/// usually has (515 KB per 1,000 in `docs/BENCHMARKS.md`).
pub(crate) const JSON_PER_PAGE: usize = 200;

/// The whole overview.
#[derive(Debug, Clone)]
pub(crate) struct Overview {
    pub(crate) key_prefix: String,
    pub(crate) dependencies: Vec<DependencyRow>,
    pub(crate) unusable: Vec<Unusable>,
    /// The worker registry, when it could be read.
    pub(crate) workers: Option<WorkersLine>,
    /// Why it could not (redacted, escaped).
    pub(crate) workers_error: Option<String>,
    /// The registry as this reading read it (texts through [`workers_shown`]), its entries
    /// worst first ([`worst_first`]): what the workers' page and `/api/workers` show a page of,
    /// so that neither reads (up to 10,000 entries) per request.
    pub(crate) registry: Option<Arc<FleetWorkers>>,
    /// The console's clock (Unix ms) when this reading ended (set after [`overview`] returns:
    /// not in [`Overview::json_pages`], added to each answer by [`Overview::json`]).
    pub(crate) read_at_ms: u64,
    /// How long the reading took (ms), its serialization included (as `read_at_ms`).
    pub(crate) read_took_ms: u64,
    /// The pages of `/api/overview` serialized once per reading, in the background, each
    /// without its closing `}`: serializing 1,000 rows per request cost 84 ms (debug build,
    /// loaded machine); now an answer copies one page's bytes and adds the reading's times
    /// ([`Overview::json`]). Empty only in an `Overview` made by hand.
    pub(crate) json_pages: Vec<Vec<u8>>,
}

/// One page of `/api/overview` as serialized: the reading's fields, with its rows and its
/// unusable keys cut to the page.
#[derive(Serialize)]
struct JsonPage<'a> {
    schema_version: u32,
    key_prefix: &'a str,
    listed: usize,
    page: usize,
    pages: usize,
    per_page: usize,
    dependencies: &'a [DependencyRow],
    unusable_listed: usize,
    unusable: &'a [Unusable],
    workers: &'a Option<WorkersLine>,
    workers_error: &'a Option<String>,
}

impl Overview {
    /// Serializes every page of the reading once, for every `/api/overview` answer until the
    /// next reading.
    fn serialize_once(&mut self) {
        self.json_pages = (1..=self.json_page_count())
            .map(|n| self.page_head(n))
            .collect();
    }

    /// The pages of `/api/overview`: enough for the rows and for the unusable keys, at least one.
    fn json_page_count(&self) -> usize {
        self.dependencies
            .len()
            .max(self.unusable.len())
            .div_ceil(JSON_PER_PAGE)
            .max(1)
    }

    /// Page `n` (1-based, within [`Overview::json_page_count`]) as a JSON object without its
    /// closing `}`.
    fn page_head(&self, n: usize) -> Vec<u8> {
        let cut = |len: usize| {
            let from = ((n - 1) * JSON_PER_PAGE).min(len);
            from..(from + JSON_PER_PAGE).min(len)
        };
        let page = JsonPage {
            schema_version: OVERVIEW_SCHEMA,
            key_prefix: &self.key_prefix,
            listed: self.dependencies.len(),
            page: n,
            pages: self.json_page_count(),
            per_page: JSON_PER_PAGE,
            dependencies: self
                .dependencies
                .get(cut(self.dependencies.len()))
                .unwrap_or_default(),
            unusable_listed: self.unusable.len(),
            unusable: self
                .unusable
                .get(cut(self.unusable.len()))
                .unwrap_or_default(),
            workers: &self.workers,
            workers_error: &self.workers_error,
        };
        // Nothing here fails to serialize (no map with keys other than text); were it to, the
        // answer would still be an object, with its version.
        let mut json = serde_json::to_vec(&page)
            .unwrap_or_else(|_| format!("{{\"schema_version\":{OVERVIEW_SCHEMA}}}").into_bytes());
        json.pop();
        json
    }

    /// The answer of `/api/overview?page=N` (held to
    /// `docs/schemas/console/overview.schema.json`): page `asked` (1-based, clamped to the
    /// pages there are; none: the first) as serialized once, with when the reading was made,
    /// how long it took, and how old it is at `now_ms` (the console's clock).
    pub(crate) fn json(&self, now_ms: u64, asked: Option<&str>) -> Vec<u8> {
        let pages = self.json_page_count();
        let n = asked
            .and_then(|p| p.trim().parse::<usize>().ok())
            .unwrap_or(1)
            .clamp(1, pages);
        let times = format!(
            "\"read_at_ms\":{},\"read_took_ms\":{},\"read_age_ms\":{}}}",
            self.read_at_ms,
            self.read_took_ms,
            now_ms.saturating_sub(self.read_at_ms)
        );
        // Absent only when made by hand (never by [`overview`]): serialized now.
        let fresh;
        let head = match self.json_pages.get(n - 1) {
            Some(head) => head,
            None => {
                fresh = self.page_head(n);
                &fresh
            }
        };
        let mut out = Vec::with_capacity(head.len() + 1 + times.len());
        out.extend_from_slice(head);
        out.push(b',');
        out.extend_from_slice(times.as_bytes());
        out
    }
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

/// Where an entry stands in the workers' list: in fallback first (a worker deciding from its
/// fallback now), then unreadable, silent, and reporting.
pub(crate) fn rank(w: &WorkerEntry) -> u8 {
    if w.in_fallback() {
        0
    } else if w.unreadable.is_some() {
        1
    } else if w.silent {
        2
    } else {
        3
    }
}

/// The registry's entries worst first ([`rank`]), each rank last seen first (as read).
pub(crate) fn worst_first(read: &mut FleetWorkers) {
    read.workers.sort_by_key(rank);
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
            until_ms: f.until_ms,
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
            until_ms: o.until_ms,
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
        window_index: v.window_index,
        enforcement: v.enforcement.as_str(),
        enforcement_switch: v.enforcement_switch.as_ref().map(|s| SwitchView {
            enforcement: s.enforcement.as_str(),
            actor: shown(&s.actor),
            reason: shown(&s.reason),
            expires_in_secs: s.until_ms.map(|u| v.secs_until(u)),
            since_ms: s.since_ms,
        }),
        would_deny: v.would_deny(),
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
    let (workers, workers_error, registry) = match workers(store).await {
        Ok(read) => {
            let by_dependency = read.in_fallback_by_dependency();
            for r in &mut rows {
                r.workers_in_fallback =
                    Some(by_dependency.get(&r.dependency).copied().unwrap_or(0));
            }
            let line = WorkersLine::of(&read);
            let mut registry = workers_shown(read);
            worst_first(&mut registry);
            (Some(line), None, Some(Arc::new(registry)))
        }
        Err(e) => (None, Some(e), None),
    };
    let mut ov = Overview {
        key_prefix: store.prefix().to_owned(),
        dependencies: rows,
        unusable,
        workers,
        workers_error,
        registry,
        read_at_ms: fleet_budget::clock::now_ms(),
        read_took_ms: 0,
        json_pages: Vec::new(),
    };
    ov.serialize_once();
    Ok(ov)
}

/// The console's last reading of the whole fleet, which every overview (page, fragment, JSON)
/// is rendered from. Why: reading 1,000 dependencies costs hundreds of milliseconds, and a page
/// view that read them itself cost that each time, for every viewer; the console reads them
/// anyway every few seconds for the history, so a page is that reading rendered, saying how old
/// it is. An operator's change is followed by a new reading before its answer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reading {
    /// The last reading that succeeded (`None` before the first).
    pub(crate) overview: Option<Arc<Overview>>,
    /// Why the last attempt failed; `None` when it succeeded (or none was made yet).
    pub(crate) failure: Option<Arc<StoreError>>,
    /// The number of the read this came from (reads are numbered as they start).
    pub(crate) read: u64,
}

/// The last hour of each dependency read from Prometheus (`crate::prometheus`), for the
/// overview's sparklines.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sparks {
    /// Prometheus's URL, password redacted.
    pub(crate) from: String,
    /// Each dependency's points (escaped names), oldest first, one a step.
    pub(crate) hours: BTreeMap<String, Vec<Point>>,
    /// The console's clock when read.
    pub(crate) read_at_ms: u64,
    /// Why the last read failed (the sparklines are then the console's own).
    pub(crate) error: Option<String>,
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
    /// In shadow: the retries denied in each window (by its index) the console saw in shadow,
    /// over the last hour, as (the most seen, the count when it was last seen enforced: what
    /// enforcement denied before the switch); the windows' length (a new length starts the
    /// count again).
    shadow: BTreeMap<u64, (u64, u64)>,
    shadow_window_ms: u64,
    /// The window and its denials at the last reading that found the dependency enforced.
    last_enforced: Option<(u64, u64)>,
}

/// What enforcement would have dead-lettered of a dependency in shadow, counted by the
/// console from its readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShadowCount {
    /// Retries denied (jobs that enforcement would have dead-lettered).
    pub(crate) denied: u64,
    /// The windows counted.
    pub(crate) windows: u64,
    /// Their length (ms): the budget's window.
    pub(crate) window_ms: u64,
    /// How far back the count reaches (ms): an hour, or less when the console has not seen
    /// the dependency in shadow that long.
    pub(crate) covers_ms: u64,
}

const HOUR_MS: u64 = 3_600_000;

impl Kept {
    /// Counts the denials of the windows `r` shows, when in shadow. A window's counter only
    /// grows while it is current, and Redis keeps it, final, as the previous window for one
    /// window more: so each window's count is the largest seen of it, and a window read only
    /// while current (the console missed its last seconds) is counted with what was seen. The
    /// previous window is counted only when the console saw it in shadow while it was current;
    /// the window of the switch counts from the denials of the last reading before it (those
    /// enforcement denied are not counted; those between that reading and the switch are).
    fn count_shadow(&mut self, r: &DependencyRow) {
        if r.enforcement != "shadow" {
            self.last_enforced = Some((r.window_index, r.windows[1][1]));
            return;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // ms of a window
        let window_ms = (r.window_secs * 1000.0).round().max(0.0) as u64;
        if window_ms == 0 {
            return;
        }
        if window_ms != self.shadow_window_ms {
            self.shadow.clear();
            self.shadow_window_ms = window_ms;
        }
        let [previous, current] = r.windows;
        let baseline = match self.last_enforced.take() {
            Some((i, denied)) if i == r.window_index => denied,
            _ => 0,
        };
        let now = self.shadow.entry(r.window_index).or_insert((0, baseline));
        now.0 = now.0.max(current[1]);
        if let Some(before) = r
            .window_index
            .checked_sub(1)
            .and_then(|i| self.shadow.get_mut(&i))
        {
            before.0 = before.0.max(previous[1]);
        }
        // Windows that ended more than an hour ago are dropped.
        let oldest_end = r.now_ms.saturating_sub(HOUR_MS);
        self.shadow
            .retain(|i, _| i.saturating_add(1).saturating_mul(window_ms) > oldest_end);
    }
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
            kept.count_shadow(r);
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

    /// What enforcement would have dead-lettered of `dependency` over the last hour the console
    /// saw it in shadow (server time `now_ms`); `None` when it never saw it in shadow, or when
    /// the budget's window is longer than an hour (its `would_deny` is then the better count).
    pub(crate) fn shadow_hour(&self, dependency: &str, now_ms: u64) -> Option<ShadowCount> {
        let kept = self.points.get(dependency)?;
        let window_ms = kept.shadow_window_ms;
        if window_ms == 0 || window_ms > HOUR_MS {
            return None;
        }
        let oldest_end = now_ms.saturating_sub(HOUR_MS);
        let counted: Vec<(u64, u64)> = kept
            .shadow
            .iter()
            .filter(|(i, _)| i.saturating_add(1).saturating_mul(window_ms) > oldest_end)
            .map(|(i, (most, baseline))| (*i, most.saturating_sub(*baseline)))
            .collect();
        let first = counted.first()?.0;
        Some(ShadowCount {
            denied: counted.iter().map(|(_, n)| n).sum(),
            windows: u64::try_from(counted.len()).unwrap_or(u64::MAX),
            window_ms,
            covers_ms: now_ms
                .saturating_sub(first.saturating_mul(window_ms))
                .min(HOUR_MS),
        })
    }

    /// The readings a minute apart of `dependency` over the last hour, oldest first.
    pub(crate) fn hour_of(&self, dependency: &str) -> Vec<Point> {
        self.points
            .get(dependency)
            .map(|k| k.hour.iter().copied().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{DependencyRow, History, JSON_PER_PAGE, OVERVIEW_SCHEMA, Overview, Unusable};

    const WINDOW_MS: u64 = 60_000;

    /// A reading of `d` in window `index`, `at` ms into it, with the previous and current
    /// windows' denials.
    pub(crate) fn reading(
        d: &str,
        shadow: bool,
        index: u64,
        at: u64,
        denied: [u64; 2],
    ) -> DependencyRow {
        DependencyRow {
            dependency: d.to_owned(),
            allowance: 10,
            spent: 10,
            remaining: 0,
            denied: denied[0] + denied[1],
            denials_per_sec: 0.0,
            first_attempts: 100,
            amplification: Some(1.1),
            window_secs: 60.0,
            policy: String::new(),
            conflict: None,
            frozen: None,
            set: None,
            breaker: None,
            concurrency: None,
            workers_in_fallback: None,
            alert: String::new(),
            severity: 0,
            alerts: Vec::new(),
            now_ms: index * WINDOW_MS + at,
            windows: [[0, denied[0], 0], [0, denied[1], 0]],
            window_index: index,
            enforcement: if shadow { "shadow" } else { "enforce" },
            enforcement_switch: None,
            would_deny: 0,
        }
    }

    fn record(h: &mut History, r: DependencyRow) {
        h.record(&overview_of(vec![r]));
    }

    /// A reading of `rows`, made by hand: nothing else read, nothing serialized.
    fn overview_of(rows: Vec<DependencyRow>) -> Overview {
        Overview {
            key_prefix: String::new(),
            dependencies: rows,
            unusable: Vec::new(),
            workers: None,
            workers_error: None,
            registry: None,
            read_at_ms: 0,
            read_took_ms: 0,
            json_pages: Vec::new(),
        }
    }

    #[test]
    fn the_json_is_serialized_once_and_carries_the_reading_s_times() {
        let mut ov = Overview {
            key_prefix: "p\"q".to_owned(),
            dependencies: vec![reading("s", true, 100, 10_000, [0, 3])],
            unusable: Vec::new(),
            workers: None,
            workers_error: Some("nope".to_owned()),
            registry: None,
            read_at_ms: 1_000,
            read_took_ms: 7,
            json_pages: Vec::new(),
        };
        // By hand (no pages yet), then as a reading serializes it: the same answer.
        let lazy: serde_json::Value = serde_json::from_slice(&ov.json(1_500, None)).unwrap();
        ov.serialize_once();
        assert_eq!(ov.json_pages.len(), 1);
        let once: serde_json::Value = serde_json::from_slice(&ov.json(1_500, None)).unwrap();
        assert_eq!(lazy, once);
        assert_eq!(once["schema_version"], OVERVIEW_SCHEMA);
        assert_eq!(once["key_prefix"], "p\"q");
        assert_eq!(once["dependencies"][0]["dependency"], "s");
        assert_eq!(
            (once["page"].clone(), once["pages"].clone()),
            (1.into(), 1.into())
        );
        assert_eq!(once["read_at_ms"], 1_000);
        assert_eq!(once["read_took_ms"], 7);
        assert_eq!(once["read_age_ms"], 500);
        // A clock set back: an age of 0, not a wrap.
        let back: serde_json::Value = serde_json::from_slice(&ov.json(10, None)).unwrap();
        assert_eq!(back["read_age_ms"], 0);
    }

    #[test]
    fn the_json_is_paged_and_every_row_is_on_exactly_one_page() {
        let rows = 2 * JSON_PER_PAGE + 50;
        let mut ov = overview_of(
            (0..rows)
                .map(|i| reading(&format!("d{i}"), false, 1, 0, [0, 0]))
                .collect(),
        );
        ov.unusable = (0..=JSON_PER_PAGE)
            .map(|i| Unusable {
                dependency: format!("u{i}"),
                error: "a list".to_owned(),
            })
            .collect();
        ov.serialize_once();
        fn page_of(ov: &Overview, asked: Option<&str>) -> serde_json::Value {
            serde_json::from_slice(&ov.json(0, asked)).unwrap()
        }
        let names = |v: &serde_json::Value, list: &str| -> Vec<String> {
            v[list]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["dependency"].as_str().unwrap().to_owned())
                .collect()
        };
        let (mut shown, mut unusable) = (Vec::new(), Vec::new());
        for n in 1..=3 {
            let p = page_of(&ov, Some(&n.to_string()));
            assert_eq!(p["page"], n);
            assert_eq!(p["pages"], 3);
            assert_eq!(p["per_page"], JSON_PER_PAGE);
            assert_eq!(p["listed"], rows);
            assert_eq!(p["unusable_listed"], JSON_PER_PAGE + 1);
            shown.extend(names(&p, "dependencies"));
            unusable.extend(names(&p, "unusable"));
        }
        let all: Vec<String> = (0..rows).map(|i| format!("d{i}")).collect();
        assert_eq!(shown, all);
        assert_eq!(unusable.len(), JSON_PER_PAGE + 1);
        // Past the last: the last; not a number, none or 0: the first.
        assert_eq!(page_of(&ov, Some("99"))["page"], 3);
        for asked in [None, Some("x"), Some("0"), Some("-1")] {
            assert_eq!(page_of(&ov, asked)["page"], 1, "{asked:?}");
        }
        // An empty reading is one page of nothing.
        ov.dependencies.clear();
        ov.unusable.clear();
        ov.serialize_once();
        let empty = page_of(&ov, Some("2"));
        assert_eq!(
            (empty["page"].clone(), empty["pages"].clone()),
            (1.into(), 1.into())
        );
        assert_eq!(empty["dependencies"], serde_json::json!([]));
    }

    #[test]
    fn shadow_counts_each_window_once_from_the_switch_on() {
        let mut h = History::default();
        // Enforced: 3 denied in window 100 (dead-lettered, not counted).
        record(&mut h, reading("s", false, 100, 10_000, [0, 3]));
        assert_eq!(h.shadow_hour("s", 100 * WINDOW_MS + 10_000), None);
        // Switched: the window's count goes on from 3.
        record(&mut h, reading("s", true, 100, 20_000, [0, 5]));
        record(&mut h, reading("s", true, 100, 55_000, [0, 7]));
        // The window rolled: its final count (8) is now the previous window's.
        record(&mut h, reading("s", true, 101, 1_000, [8, 2]));
        record(&mut h, reading("s", true, 101, 6_000, [8, 4]));
        let now = 101 * WINDOW_MS + 6_000;
        let c = h.shadow_hour("s", now).unwrap();
        assert_eq!(c.denied, (8 - 3) + 4);
        assert_eq!(c.windows, 2);
        assert_eq!(c.window_ms, WINDOW_MS);
        assert_eq!(c.covers_ms, 66_000);
        // An hour later with readings all along: only the windows of the last hour count.
        for i in 102..=170 {
            record(&mut h, reading("s", true, i, 30_000, [1, 1]));
        }
        let c = h.shadow_hour("s", 170 * WINDOW_MS + 30_000).unwrap();
        assert_eq!(c.covers_ms, 3_600_000);
        assert_eq!(
            c.windows, 61,
            "the windows that ended in the last hour and the current"
        );
        assert_eq!(c.denied, 61);
        // Enforced again: nothing new is counted, and a dependency never in shadow has none.
        record(&mut h, reading("s", false, 171, 0, [1, 50]));
        assert_eq!(h.shadow_hour("s", 171 * WINDOW_MS).unwrap().denied, 60);
        record(&mut h, reading("t", false, 171, 0, [1, 50]));
        assert_eq!(h.shadow_hour("t", 171 * WINDOW_MS), None);
    }
}
