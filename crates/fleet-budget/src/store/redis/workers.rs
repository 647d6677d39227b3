//! The worker registry's calls: `heartbeat.lua` (a worker's beat and its leave) and the reads
//! a tool makes of the two keys (`TIME`, `ZCARD`, `ZRANGE ... REV WITHSCORES`, `HSTRLEN`,
//! `HMGET`). What a
//! report says and when a worker is silent is `crate::control::workers`'s; this file only calls.

use redis::Value;

use super::RedisStore;
use super::reply::count_at;
use super::scripts::HEARTBEAT_SCRIPT;
use crate::error::StoreError;
use crate::keys::{workers_key, workers_seen_key};

/// The registry as read, before any of it is trusted: the server's time, how many ids the
/// sorted set holds, and the freshest ids with their scores and reports, as Redis sent them.
#[derive(Debug, Clone)]
pub(crate) struct RawWorkers {
    /// Server ms of the read.
    pub(crate) now_ms: u64,
    /// Ids in the sorted set (all of them, not only those read).
    pub(crate) total: u64,
    /// Id, last seen (the score as Redis spells it) and report.
    pub(crate) entries: Vec<(Vec<u8>, String, Report)>,
}

/// A worker's report as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// The bytes written under the id.
    Text(Vec<u8>),
    /// No report under the id (left, pruned, or never written).
    Missing,
    /// A value larger than any worker writes: its size, not fetched.
    TooLarge(u64),
}

/// Ids whose reports are read together: a chunk is at most `READ_CHUNK` reports of the bound a
/// reader gives (4 KiB by the script: 2 MiB), one round trip of lengths and one of reports.
pub(crate) const READ_CHUNK: usize = 500;

impl RedisStore {
    /// One `heartbeat.lua` `beat`: `report` under `id`, pruning entries older than
    /// `retention_ms`. Returns the server's time and the entries pruned.
    ///
    /// # Errors
    /// Redis refused an argument or a key (named), failed, or passed the store's deadline.
    pub(crate) async fn heartbeat_beat(
        &self,
        id: &str,
        report: &str,
        retention_ms: u64,
    ) -> Result<(u64, u64), StoreError> {
        let mut invocation = HEARTBEAT_SCRIPT.key(workers_key(self.prefix()));
        invocation
            .key(workers_seen_key(self.prefix()))
            .arg("beat")
            .arg(id)
            .arg(report)
            .arg(retention_ms);
        let reply = self.invoke("heartbeat", invocation).await?;
        Ok((
            count_at("heartbeat", &reply, 0)?,
            count_at("heartbeat", &reply, 1)?,
        ))
    }

    /// One `heartbeat.lua` `leave`: `id` out of the registry. Returns whether it was there.
    ///
    /// # Errors
    /// Redis refused a key (named), failed, or passed the store's deadline.
    pub(crate) async fn heartbeat_leave(&self, id: &str) -> Result<bool, StoreError> {
        let mut invocation = HEARTBEAT_SCRIPT.key(workers_key(self.prefix()));
        invocation
            .key(workers_seen_key(self.prefix()))
            .arg("leave")
            .arg(id);
        let reply = self.invoke("heartbeat", invocation).await?;
        Ok(count_at("heartbeat", &reply, 1)? > 0)
    }

    /// The `limit` ids seen last (freshest first) with their reports, the number of ids, and
    /// the server's time. Reports are read [`READ_CHUNK`] ids at a time, each chunk its own
    /// round trips within the store's deadline, and only those of at most `max_report_bytes`
    /// (`HSTRLEN` first): a value stuffed by hand is named by its size, never fetched.
    ///
    /// # Errors
    /// Redis failed, passed the store's deadline, or holds a key of another type.
    pub(crate) async fn read_workers(
        &self,
        limit: u64,
        max_report_bytes: u64,
    ) -> Result<RawWorkers, StoreError> {
        let seen_key = workers_seen_key(self.prefix());
        let reports_key = workers_key(self.prefix());
        let now_ms = self.server_time_ms().await?;
        let mut entries = Vec::new();
        if limit == 0 {
            let mut zcard = redis::cmd("ZCARD");
            zcard.arg(&seen_key);
            let total: u64 = self.query(&zcard).await?;
            return Ok(RawWorkers {
                now_ms,
                total,
                entries,
            });
        }
        // The count and the freshest ids in one round trip (both keys share the slot `{workers}`).
        // Scores as text: a score written by hand may be `inf`, which no integer type takes.
        let mut first = redis::pipe();
        first.cmd("ZCARD").arg(&seen_key);
        first
            .cmd("ZRANGE")
            .arg(&seen_key)
            .arg(0)
            .arg(limit - 1)
            .arg("REV")
            .arg("WITHSCORES");
        let (total, seen): (u64, Vec<(Vec<u8>, String)>) = self.query_pipeline(&first).await?;
        for chunk in seen.chunks(READ_CHUNK) {
            let mut lengths = redis::pipe();
            for (id, _) in chunk {
                lengths.cmd("HSTRLEN").arg(&reports_key).arg(id.as_slice());
            }
            let lengths: Vec<u64> = self.query_pipeline(&lengths).await?;
            let wanted: Vec<&[u8]> = chunk
                .iter()
                .zip(&lengths)
                .filter(|(_, len)| **len > 0 && **len <= max_report_bytes)
                .map(|((id, _), _)| id.as_slice())
                .collect();
            let mut fetched = if wanted.is_empty() {
                Vec::new()
            } else {
                let mut hmget = redis::cmd("HMGET");
                hmget.arg(&reports_key).arg(&wanted);
                self.query::<Vec<Value>>(&hmget).await?
            }
            .into_iter();
            for ((id, score), len) in chunk.iter().zip(lengths) {
                let report = match len {
                    0 => Report::Missing,
                    len if len > max_report_bytes => Report::TooLarge(len),
                    _ => match fetched.next() {
                        Some(Value::BulkString(bytes)) => Report::Text(bytes),
                        // Changed between the two calls: read again next time.
                        _ => Report::Missing,
                    },
                };
                entries.push((id.clone(), score.clone(), report));
            }
        }
        Ok(RawWorkers {
            now_ms,
            total,
            entries,
        })
    }
}
