//! The worker registry, read: which workers report, which dependencies each decides from its
//! fallback, and which went silent. Workers write it (`crate::budget::heartbeat`, through
//! `lua/heartbeat.lua`); the console and other tools read it with [`fleet_workers`].
//!
//! Anyone with access to Redis can write the registry, so nothing in it is trusted: a report
//! that is not the JSON a worker writes (garbage, a wrong type, a value larger than any worker
//! writes, which is never fetched) gives an entry marked [`WorkerEntry::unreadable`], never a
//! panic; a last-seen score that is not a time (`inf`, negative) or lies ahead of the server's
//! clock marks the entry too. Every text is escaped by the printable rules and cut to
//! [`MAX_TEXT_CHARS`].
//!
//! **Silent** means the worker's entry was not refreshed for three of its beats (15 s when its
//! interval is unknown), by the server's clock: it stopped, or it is cut off from Redis and, in
//! that case, deciding from its fallback for every dependency. A worker cut off from Redis
//! cannot report; only its own `/metrics` (`fleet_budget_fallback_active`) says so.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::budget::heartbeat::{MAX_REPORT_BYTES, REPORT_VERSION};
use crate::error::StoreError;
use crate::printable::escape_text;
use crate::store::{RedisStore, Report};

#[cfg(test)]
mod tests;

/// The most entries one read returns, whatever the caller asks.
pub const MAX_LIMIT: u64 = 100_000;
/// Characters kept of any text from a report (after escaping).
pub const MAX_TEXT_CHARS: usize = 256;
/// A worker whose interval is unknown is silent after this long without a beat.
pub const SILENT_UNKNOWN_MS: u64 = 15_000;
/// Beats a worker may miss before it is called silent.
pub const SILENT_AFTER_BEATS: u64 = 3;
/// How far ahead of the server's clock a last-seen time may be (a failover to a server whose
/// clock is behind) before the entry is marked.
const AHEAD_TOLERANCE_MS: u64 = 60_000;

/// The registry as one read saw it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetWorkers {
    /// Server ms of the read.
    pub now_ms: u64,
    /// Ids in the registry (also those past the limit).
    pub total: u64,
    /// Whether entries were left out: `total` is more than `workers` holds.
    pub truncated: bool,
    /// The entries read, last seen first.
    pub workers: Vec<WorkerEntry>,
}

/// One worker's entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerEntry {
    /// The worker id (escaped).
    pub id: String,
    /// When it last reported (server ms), when the score is a time.
    pub last_seen_ms: Option<u64>,
    /// How long ago (ms), when known.
    pub age_ms: Option<u64>,
    /// Not refreshed for [`SILENT_AFTER_BEATS`] beats, or no usable time: see the module.
    pub silent: bool,
    /// Why the entry cannot be read as a worker's report, when it cannot (the fields below
    /// then hold what could be read, if anything).
    pub unreadable: Option<String>,
    /// The worker's host, as it reported it (escaped).
    pub host: Option<String>,
    /// Its process id.
    pub pid: Option<u64>,
    /// Its library's language (`rust`, ...; escaped).
    pub lang: Option<String>,
    /// Its library's version (escaped).
    pub version: Option<String>,
    /// When it started (the worker's clock, ms).
    pub started_ms: Option<u64>,
    /// How often it reports (ms).
    pub interval_ms: Option<u64>,
    /// The dependencies it decides from its fallback, with how long.
    pub fallback: Vec<FallbackEntry>,
    /// Dependencies in fallback its report left out (bounded report).
    pub fallback_more: u64,
}

/// A dependency a worker decides from its fallback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FallbackEntry {
    /// The dependency (escaped).
    pub dependency: String,
    /// For how long (the worker's clock, ms).
    pub for_ms: u64,
}

impl WorkerEntry {
    /// Whether the entry is a fresh, readable report: a worker that reports now.
    #[must_use]
    pub fn is_fresh(&self) -> bool {
        !self.silent && self.unreadable.is_none()
    }

    /// Whether it is fresh and decides some dependency from its fallback.
    #[must_use]
    pub fn in_fallback(&self) -> bool {
        self.is_fresh() && (!self.fallback.is_empty() || self.fallback_more > 0)
    }
}

impl FleetWorkers {
    /// Fresh workers ([`WorkerEntry::is_fresh`]).
    #[must_use]
    pub fn reporting(&self) -> usize {
        self.workers.iter().filter(|w| w.is_fresh()).count()
    }

    /// Fresh workers deciding some dependency from their fallback.
    #[must_use]
    pub fn in_fallback(&self) -> usize {
        self.workers.iter().filter(|w| w.in_fallback()).count()
    }

    /// Silent entries.
    #[must_use]
    pub fn silent(&self) -> usize {
        self.workers.iter().filter(|w| w.silent).count()
    }

    /// Fresh workers in fallback per dependency (escaped names, as the entries hold them).
    #[must_use]
    pub fn in_fallback_by_dependency(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for w in self.workers.iter().filter(|w| w.is_fresh()) {
            for f in &w.fallback {
                *counts.entry(f.dependency.clone()).or_insert(0) += 1;
            }
        }
        counts
    }
}

/// Reads the registry: at most `limit` entries (capped at [`MAX_LIMIT`]), the freshest first,
/// each judged against the server's time.
///
/// # Errors
/// Redis failed, passed the store's deadline, or holds a registry key of another type.
pub async fn fleet_workers(store: &RedisStore, limit: u64) -> Result<FleetWorkers, StoreError> {
    let raw = store
        .read_workers(limit.min(MAX_LIMIT), MAX_REPORT_BYTES as u64)
        .await?;
    let workers: Vec<WorkerEntry> = raw
        .entries
        .iter()
        .map(|(id, score, report)| entry(raw.now_ms, id, score, report))
        .collect();
    Ok(FleetWorkers {
        now_ms: raw.now_ms,
        total: raw.total,
        truncated: raw.total > workers.len() as u64,
        workers,
    })
}

/// One entry, judged at server ms `now`.
pub(crate) fn entry(now: u64, id: &[u8], score: &str, report: &Report) -> WorkerEntry {
    let mut e = WorkerEntry {
        id: text(&String::from_utf8_lossy(id)),
        last_seen_ms: None,
        age_ms: None,
        silent: true,
        unreadable: None,
        host: None,
        pid: None,
        lang: None,
        version: None,
        started_ms: None,
        interval_ms: None,
        fallback: Vec::new(),
        fallback_more: 0,
    };
    let mut problems: Vec<String> = Vec::new();
    match report {
        Report::Missing => problems.push("no report".to_owned()),
        Report::TooLarge(n) => problems.push(format!(
            "report of {n} bytes, more than a worker writes ({MAX_REPORT_BYTES})"
        )),
        Report::Text(bytes) => {
            if let Err(why) = read_report(&mut e, bytes) {
                problems.push(why);
            }
        }
    }
    let seen = score_ms(score);
    match seen {
        None => problems.push(format!("last seen {:?} is not a time", text(score))),
        Some(seen) if seen > now.saturating_add(AHEAD_TOLERANCE_MS) => {
            problems.push(format!(
                "last seen {seen} is ahead of the server's clock {now}"
            ));
        }
        Some(seen) => {
            let age = now.saturating_sub(seen);
            let limit = e
                .interval_ms
                .filter(|i| *i > 0)
                .map_or(SILENT_UNKNOWN_MS, |i| i.saturating_mul(SILENT_AFTER_BEATS));
            e.last_seen_ms = Some(seen);
            e.age_ms = Some(age);
            e.silent = age > limit;
        }
    }
    if !problems.is_empty() {
        e.unreadable = Some(problems.join("; "));
    }
    e
}

/// A last-seen score as ms: an integer as the script writes it, or any finite number at or
/// above 0 (rounded down; one past `u64` saturates, and is then far ahead of the clock).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked just before
fn score_ms(score: &str) -> Option<u64> {
    score.parse::<u64>().ok().or_else(|| {
        score
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| s as u64)
    })
}

/// The fields of a report, each taken only when it has the type a worker writes.
fn read_report(e: &mut WorkerEntry, bytes: &[u8]) -> Result<(), String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|err| {
        format!(
            "not JSON ({})",
            text(&err.to_string()).chars().take(80).collect::<String>()
        )
    })?;
    let Value::Object(o) = v else {
        return Err("not a JSON object".to_owned());
    };
    let uint = |k: &str| o.get(k).and_then(Value::as_u64);
    let string = |k: &str| o.get(k).and_then(Value::as_str).map(text);
    e.host = string("host");
    e.pid = uint("pid");
    e.lang = string("lang");
    e.version = string("version");
    e.started_ms = uint("started_ms");
    e.interval_ms = uint("interval_ms");
    e.fallback_more = uint("fallback_more").unwrap_or(0);
    if let Some(list) = o.get("fallback").and_then(Value::as_array) {
        e.fallback = list
            .iter()
            .filter_map(|f| {
                Some(FallbackEntry {
                    dependency: text(f.get("dependency")?.as_str()?),
                    for_ms: f.get("for_ms")?.as_u64()?,
                })
            })
            .collect();
        let bad = list.len() - e.fallback.len();
        e.fallback_more = e.fallback_more.saturating_add(bad as u64);
    }
    match uint("v") {
        Some(REPORT_VERSION) => {}
        Some(v) => {
            return Err(format!(
                "report version {v}, this reader knows {REPORT_VERSION}"
            ));
        }
        None => return Err("no report version".to_owned()),
    }
    if e.interval_ms.is_none() || e.pid.is_none() {
        return Err("report without interval_ms or pid".to_owned());
    }
    Ok(())
}

/// `s` escaped by the printable rules, cut to [`MAX_TEXT_CHARS`].
fn text(s: &str) -> String {
    let escaped = escape_text(s);
    if escaped.chars().count() <= MAX_TEXT_CHARS {
        return escaped.into_owned();
    }
    let mut cut: String = escaped.chars().take(MAX_TEXT_CHARS).collect();
    cut.push('…');
    cut
}
