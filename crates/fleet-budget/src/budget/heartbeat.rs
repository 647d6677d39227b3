//! The worker registry, written: every `redis.heartbeat_ms` (default 5 s) a background task
//! sends this worker's report to Redis with `lua/heartbeat.lua`, so that tools (the console,
//! `crate::control::workers`) see which workers report and which dependencies each decides
//! from its fallback (the state behind [`FleetBudget::in_fallback`] and the
//! `fleet_budget_fallback_active` gauge, which only the worker's own `/metrics` shows).
//!
//! The registry never affects a decision: a beat that fails is not a store failure (no
//! dependency goes into the fallback for it), is logged at debug once per run of failures, and
//! waits no longer than any store call (the store's deadline). The task holds the budget only
//! weakly: it ends when the last clone of the budget is dropped, and then, as on
//! [`FleetBudget::shutdown`], sends a `leave` so the worker is gone from the registry rather
//! than silent. A worker that is killed, or cut off from Redis, cannot say so: its entry stops
//! being refreshed, and readers call it silent after three beats.
//!
//! The report (JSON, version 1; at most [`MAX_REPORT_BYTES`], the script's bound):
//!
//! ```json
//! {"v":1,"id":"web-1-4242-9f3a","host":"web-1","pid":4242,"lang":"rust","version":"0.2.0",
//!  "started_ms":1764950000000,"interval_ms":5000,
//!  "fallback":[{"dependency":"search","for_ms":1200}],"fallback_more":0}
//! ```
//!
//! `fallback` lists at most [`MAX_FALLBACK_LISTED`] dependencies in name order, fewer when their
//! names would pass the size bound; `fallback_more` counts those left out.
//!
//! [`FleetBudget::in_fallback`]: super::FleetBudget::in_fallback
//! [`FleetBudget::shutdown`]: super::FleetBudget::shutdown

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use tokio::sync::{Mutex, Notify};

use super::Inner;
use crate::dependency::Dependency;
use crate::printable::is_unsafe_char;
use crate::store::RedisStore;

/// The version of the report's JSON.
pub const REPORT_VERSION: u64 = 1;
/// The largest report `lua/heartbeat.lua` takes.
pub const MAX_REPORT_BYTES: usize = 4096;
/// The longest worker id `lua/heartbeat.lua` takes.
pub const MAX_WORKER_ID_BYTES: usize = 200;
/// Dependencies in fallback listed in one report, at most.
pub const MAX_FALLBACK_LISTED: usize = 64;
/// The longest host name kept in a worker id (the pid and a random suffix follow it).
const MAX_HOST_BYTES: usize = 160;

/// How long a worker that stopped beating stays in the registry: twenty beats, and at least
/// ten minutes, so an incident's silent workers are still listed while someone looks.
#[must_use]
pub fn retention(interval: Duration) -> Duration {
    (interval * 20).clamp(Duration::from_secs(600), Duration::from_secs(7 * 24 * 3600))
}

/// What the task and [`FleetBudget::shutdown`](super::FleetBudget::shutdown) share.
#[derive(Debug)]
pub(super) struct Registry {
    store: Arc<RedisStore>,
    pub(super) id: String,
    host: String,
    pid: u32,
    started_ms: u64,
    pub(super) interval: Duration,
    /// Set once the worker left; held across each call so no beat lands after the leave.
    left: Mutex<bool>,
    /// Whether the last call failed (a run of failures is logged once).
    failing: AtomicBool,
    /// Wakes the task to end (shutdown).
    pub(super) stop: Notify,
}

impl Registry {
    pub(super) fn new(store: Arc<RedisStore>, id: Option<String>, interval: Duration) -> Self {
        let host = host_name();
        let pid = std::process::id();
        let id = id.unwrap_or_else(|| format!("{host}-{pid}-{:04x}", rand::random::<u16>()));
        Self {
            store,
            id,
            host,
            pid,
            started_ms: wall_ms(),
            interval,
            left: Mutex::new(false),
            failing: AtomicBool::new(false),
            stop: Notify::new(),
        }
    }

    /// The report for the dependencies in fallback now (each with how long, in ms).
    pub(super) fn report(&self, fallback: &[(Dependency, u64)]) -> String {
        let mut text = json!({
            "v": REPORT_VERSION,
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "lang": "rust",
            "version": env!("CARGO_PKG_VERSION"),
            "started_ms": self.started_ms,
            "interval_ms": u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX),
        })
        .to_string();
        text.pop(); // the closing brace: the list follows
        // The id and host are at most 200 bytes each (escaped in JSON at most 6x, still far
        // below the bound); the list gets what is left, with room for the closing fields.
        let room = MAX_REPORT_BYTES.saturating_sub(text.len() + 64);
        let mut list = String::from("[");
        let mut listed = 0;
        for (dependency, for_ms) in fallback {
            let entry = json!({"dependency": dependency.as_str(), "for_ms": for_ms}).to_string();
            if listed == MAX_FALLBACK_LISTED || list.len() + entry.len() + 2 > room {
                break;
            }
            if listed > 0 {
                list.push(',');
            }
            list.push_str(&entry);
            listed += 1;
        }
        list.push(']');
        let more = fallback.len() - listed;
        text.push_str(&format!(",\"fallback\":{list},\"fallback_more\":{more}}}"));
        text
    }

    /// One beat, unless the worker left. Errors are logged, never returned: see the module.
    async fn beat(&self, report: &str) {
        let left = self.left.lock().await;
        if *left {
            return;
        }
        let retention_ms = u64::try_from(retention(self.interval).as_millis()).unwrap_or(0);
        let result = self
            .store
            .heartbeat_beat(&self.id, report, retention_ms)
            .await;
        drop(left);
        self.note(result.err());
    }

    /// Takes the worker out of the registry; beats after this are not sent.
    pub(super) async fn leave(&self) {
        let mut left = self.left.lock().await;
        if *left {
            return;
        }
        *left = true;
        let result = self.store.heartbeat_leave(&self.id).await;
        drop(left);
        self.stop.notify_one();
        self.note(result.err());
    }

    fn note(&self, error: Option<crate::error::StoreError>) {
        match error {
            None => self.failing.store(false, Ordering::Relaxed),
            Some(error) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::debug!(%error, worker = %self.id, "worker registry heartbeat failed (decisions are unaffected)");
                }
            }
        }
    }
}

/// The background task: a beat at once, then every interval, until the budget is dropped
/// (then a leave) or shut down (which sends the leave itself).
pub(super) async fn heartbeat(inner: Weak<Inner>, registry: Arc<Registry>) {
    loop {
        let Some(strong) = inner.upgrade() else {
            registry.leave().await;
            return;
        };
        let report = registry.report(&strong.health.episodes());
        drop(strong);
        registry.beat(&report).await;
        let stopped = registry.stop.notified();
        tokio::select! {
            () = tokio::time::sleep(registry.interval) => {}
            () = stopped => {}
        }
        if *registry.left.lock().await {
            return;
        }
    }
}

/// This host's name, from `/proc/sys/kernel/hostname` or `$HOSTNAME`, with whitespace and the
/// characters the printable rules refuse left out, at most 160 bytes (a worker id, with the pid and
/// suffix, stays within [`MAX_WORKER_ID_BYTES`]).
#[must_use]
pub fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let host = sanitize(&raw, MAX_HOST_BYTES);
    if host.is_empty() {
        "unknown-host".to_owned()
    } else {
        host
    }
}

/// A worker id as given to the builder, made safe: whitespace and refused characters left out,
/// at most [`MAX_WORKER_ID_BYTES`]; `None` when nothing is left.
#[must_use]
pub fn worker_id(given: &str) -> Option<String> {
    Some(sanitize(given, MAX_WORKER_ID_BYTES)).filter(|id| !id.is_empty())
}

fn sanitize(text: &str, max_bytes: usize) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_whitespace() || is_unsafe_char(c) {
            continue;
        }
        if out.len() + c.len_utf8() > max_bytes {
            break;
        }
        out.push(c);
    }
    out
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RedisTarget;

    fn registry(id: Option<String>) -> Registry {
        let store = RedisStore::new(
            RedisTarget::Single("redis://127.0.0.1:1".to_owned()),
            "fb",
            Duration::from_millis(50),
        )
        .unwrap();
        Registry::new(Arc::new(store), id, Duration::from_secs(5))
    }

    #[tokio::test]
    async fn ids_and_hosts_keep_to_the_printable_rules_and_the_bound() {
        assert_eq!(worker_id(" a\u{202E}b\u{200B}c\n").as_deref(), Some("abc"));
        assert_eq!(worker_id("\u{202E} \t"), None);
        let long = "é".repeat(150);
        let id = worker_id(&long).unwrap();
        assert_eq!(id.len(), 200);
        assert!(host_name().len() <= MAX_HOST_BYTES && !host_name().is_empty());
        let r = registry(None);
        assert!(
            r.id.starts_with(&format!("{}-{}-", r.host, r.pid)),
            "{}",
            r.id
        );
        assert!(r.id.len() <= MAX_WORKER_ID_BYTES);
    }

    #[tokio::test]
    async fn the_report_is_json_v1_and_bounded_whatever_is_in_fallback() {
        let r = registry(Some("w".repeat(200)));
        let none: serde_json::Value = serde_json::from_str(&r.report(&[])).unwrap();
        assert_eq!(none["v"], 1);
        assert_eq!(none["lang"], "rust");
        assert_eq!(none["interval_ms"], 5000);
        assert_eq!(none["fallback"], json!([]));
        let one = vec![(Dependency::new("search").unwrap(), 1200)];
        let v: serde_json::Value = serde_json::from_str(&r.report(&one)).unwrap();
        assert_eq!(
            v["fallback"],
            json!([{"dependency": "search", "for_ms": 1200}])
        );
        assert_eq!(v["fallback_more"], 0);
        // 100 dependencies of 200 bytes: far more than fits.
        let many: Vec<(Dependency, u64)> = (0..100)
            .map(|i| {
                (
                    Dependency::new(&format!("{i:03}{}", "d".repeat(197))).unwrap(),
                    1,
                )
            })
            .collect();
        let text = r.report(&many);
        assert!(text.len() <= MAX_REPORT_BYTES, "{}", text.len());
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let listed = v["fallback"].as_array().unwrap().len();
        assert!(listed > 0);
        assert_eq!(v["fallback_more"], 100 - listed as u64);
        let short: Vec<(Dependency, u64)> = (0..100)
            .map(|i| (Dependency::new(&format!("d{i}")).unwrap(), 1))
            .collect();
        let v: serde_json::Value = serde_json::from_str(&r.report(&short)).unwrap();
        assert_eq!(v["fallback"].as_array().unwrap().len(), MAX_FALLBACK_LISTED);
        assert_eq!(v["fallback_more"], 36);
    }

    #[test]
    fn retention_is_twenty_beats_and_at_least_ten_minutes() {
        assert_eq!(retention(Duration::from_secs(5)), Duration::from_secs(600));
        assert_eq!(
            retention(Duration::from_secs(300)),
            Duration::from_secs(6000)
        );
    }
}
