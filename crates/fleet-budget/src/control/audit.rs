//! The audit trail: every override, replay, purge and migration, in one Redis stream per key
//! prefix (`<prefix>:v1:audit`), bounded by count (`XADD MAXLEN`) and by age (`XTRIM MINID`).
//! Times are the server's (the stream id), so entries from hosts with skewed clocks sort right.
//! The bounds are the configuration's `[audit]` section (`Config::audit.log()`).
//!
//! The stream has no expiry, so an eviction policy of the `volatile-*` kind never takes it; an
//! `allkeys-*` policy, `FLUSHALL` or a restart without persistence takes it whole (it is one
//! key). Nothing in Redis can then tell a lost trail from one never started, so the entry that
//! starts a trail says so: it is written only when no stream exists (`XADD NOMKSTREAM` first),
//! carries `trail_started` (shown by `budgetctl audit --json` and the console), and the writer
//! logs a warning. A reader who sees `trail_started` on an entry after the first install knows
//! that everything before it is gone (docs/semantics.md, "Lost budgets").

use std::time::Duration;

use serde::Serialize;

use crate::error::StoreError;
use crate::store::RedisStore;

/// How much of the trail Redis keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditLog {
    /// At most this many entries.
    pub max_entries: u64,
    /// Entries older than this are trimmed.
    pub max_age: Duration,
}

impl Default for AuditLog {
    /// The last 10,000 entries or 90 days, whichever is less.
    fn default() -> Self {
        Self {
            max_entries: 10_000,
            max_age: Duration::from_secs(90 * 24 * 3600),
        }
    }
}

/// One entry of the trail.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    /// The stream id (`<ms>-<seq>`), empty before it is recorded.
    pub id: String,
    /// Server ms (from the id), 0 before it is recorded.
    pub at_ms: u64,
    /// Who (`--actor`, default user@host).
    pub actor: String,
    /// What: `freeze`, `unfreeze`, `set`, `clear` (overrides), `replay`, `parked_replay`,
    /// `parked_purge` (`fleet_budget_amqp::replay::audit`), `migrate`.
    pub action: String,
    /// Which dependency, when the action has one.
    pub dependency: Option<String>,
    /// Why.
    pub reason: String,
    /// The state before (JSON), when the action has one.
    pub before: Option<serde_json::Value>,
    /// The state after (JSON), when the action has one.
    pub after: Option<serde_json::Value>,
    /// This entry started the trail: no stream existed when it was written, so the trail is new
    /// or everything recorded before it was lost (evicted, flushed, or a restart without
    /// persistence). Omitted from JSON when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub trail_started: bool,
}

/// The field that marks the entry that started a trail, and its value.
const TRAIL_STARTED: (&str, &str) = ("trail", "started");

/// Keeps at most `max` characters of `text`.
fn bounded(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

impl AuditEntry {
    /// A new entry (actor kept to 200 characters, reason to 1,000).
    #[must_use]
    pub fn new(actor: &str, action: &str, dependency: Option<&str>, reason: &str) -> Self {
        Self {
            id: String::new(),
            at_ms: 0,
            actor: bounded(actor, 200),
            action: bounded(action, 50),
            dependency: dependency.map(|d| bounded(d, 200)),
            reason: bounded(reason, 1000),
            before: None,
            after: None,
            trail_started: false,
        }
    }

    /// With the state before and after.
    #[must_use]
    pub fn with_before_after(mut self, before: &impl Serialize, after: &impl Serialize) -> Self {
        self.before = serde_json::to_value(before).ok();
        self.after = serde_json::to_value(after).ok();
        self
    }
}

impl AuditLog {
    /// Appends `entry` to `store`'s trail and trims it; returns the entry's id.
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub async fn record(
        &self,
        store: &RedisStore,
        entry: &AuditEntry,
    ) -> Result<String, StoreError> {
        let json =
            |v: &Option<serde_json::Value>| v.as_ref().map(ToString::to_string).unwrap_or_default();
        let (before, after) = (json(&entry.before), json(&entry.after));
        let fields = [
            ("actor", entry.actor.as_str()),
            ("action", entry.action.as_str()),
            (
                "dependency",
                entry.dependency.as_deref().unwrap_or_default(),
            ),
            ("reason", entry.reason.as_str()),
            ("before", before.as_str()),
            ("after", after.as_str()),
        ];
        let max_entries = self.max_entries.max(1);
        let id = match store.audit_append_to_existing(max_entries, &fields).await? {
            Some(id) => id,
            None => {
                let mut starting = fields.to_vec();
                starting.push(TRAIL_STARTED);
                let id = store.audit_append(max_entries, &starting).await?;
                tracing::warn!(
                    action = entry.action.as_str(),
                    "the audit trail was empty: this entry starts it. If entries were recorded \
                     before, they were lost (an eviction policy other than noeviction, FLUSHALL, \
                     or a restart without persistence; `budgetctl doctor` checks the first and \
                     the last)"
                );
                id
            }
        };
        let now_ms = id_ms(&id);
        let max_age = u64::try_from(self.max_age.as_millis()).unwrap_or(u64::MAX);
        if now_ms > max_age {
            store.audit_trim(now_ms - max_age).await?;
        }
        Ok(id)
    }

    /// The entries since server ms `since_ms` (and until `until_ms`, if given), oldest first,
    /// for `dependency` if given, at most `limit` (the newest of them).
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub async fn read(
        &self,
        store: &RedisStore,
        since_ms: Option<u64>,
        until_ms: Option<u64>,
        dependency: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let until = until_ms.map_or_else(|| "+".to_owned(), |ms| ms.to_string());
        let since = since_ms.map_or_else(|| "-".to_owned(), |ms| ms.to_string());
        // Without a dependency filter the newest `limit` are the answer; with one, read up to
        // the whole (bounded) trail and filter.
        let count = match dependency {
            None => u64::try_from(limit)
                .unwrap_or(u64::MAX)
                .clamp(1, self.max_entries.max(1)),
            Some(_) => self.max_entries.max(1),
        };
        // Bytes, not text: one field that is not UTF-8 is shown with U+FFFD.
        let raw = store.audit_range(&until, &since, count).await?;
        let mut entries: Vec<AuditEntry> = raw
            .into_iter()
            .filter(|(_, fields)| {
                dependency.is_none_or(|d| raw_field(fields, "dependency") == d.as_bytes())
            })
            .take(limit)
            .map(|(id, fields)| entry_of(&id, &fields))
            .collect();
        entries.reverse();
        Ok(entries)
    }

    /// The entries since server ms `since_ms` until `until_ms`, oldest first, that are
    /// `dependency`'s, or of no dependency with an action among `unowned_actions`, at most
    /// `limit` (the newest of them). The trail is filtered in Redis ([`AUDIT_WHERE_LUA`]),
    /// [`AuditLog::READ_CHUNK`] entries a call, newest first, and only the entries kept cross
    /// the network and are parsed: a report after one dependency's entries of a full trail of
    /// 10,000 reads those, not the 10,000 (which cost 0.6 s to read in a debug build).
    ///
    /// # Errors
    /// Redis failed, passed the store's deadline, or the trail's key is not a stream.
    pub async fn read_where(
        &self,
        store: &RedisStore,
        since_ms: u64,
        until_ms: u64,
        dependency: &str,
        unowned_actions: &[&str],
        limit: usize,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let key = crate::keys::audit_key(store.prefix());
        let mut until = until_ms.to_string();
        // The trail holds at most `max_entries`: reading stops there whatever it holds.
        let mut budget = self.max_entries.max(1);
        let mut entries = Vec::new();
        while budget > 0 && entries.len() < limit {
            let count = budget.min(Self::READ_CHUNK);
            let mut call = AUDIT_WHERE_SCRIPT.key(&key);
            call.arg(&until)
                .arg(since_ms)
                .arg(count)
                .arg(dependency)
                .arg(unowned_actions);
            let reply = store.invoke("audit_where", call).await?;
            let bad = |detail: &str| StoreError::BadReply {
                script: "audit_where",
                detail: detail.to_owned(),
            };
            let mut reply = reply.into_iter();
            let (Some(scanned), Some(last), Some(kept)) =
                (reply.next(), reply.next(), reply.next())
            else {
                return Err(bad("not three values"));
            };
            let scanned: u64 = redis::FromRedisValue::from_redis_value(scanned)
                .map_err(|_| bad("the count scanned is not a number"))?;
            let last: Vec<u8> = redis::FromRedisValue::from_redis_value(last)
                .map_err(|_| bad("the last id scanned is not text"))?;
            let kept: Vec<RawEntry> = redis::FromRedisValue::from_redis_value(kept)
                .map_err(|_| bad("the entries kept are not stream entries"))?;
            budget = budget.saturating_sub(scanned);
            entries.extend(
                kept.iter()
                    .take(limit - entries.len())
                    .map(|(id, fields)| entry_of(id, fields)),
            );
            // The next call starts just before the oldest entry scanned.
            match id_before(&String::from_utf8_lossy(&last)) {
                Some(b) if scanned == count => until = b,
                _ => break,
            }
        }
        entries.reverse();
        Ok(entries)
    }

    /// Entries [`AuditLog::read_where`] scans a call (about a millisecond of Redis's time).
    pub const READ_CHUNK: u64 = 1000;
}

/// A stream entry as Redis sends it: its id and its fields.
type RawEntry = (Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>);

/// The filter of [`AuditLog::read_where`], run in Redis: `XREVRANGE` of at most `ARGV[3]`
/// entries from `ARGV[1]` down to `ARGV[2]`, replying with how many it scanned, the id of the
/// oldest of them (empty when none) and those whose `dependency` field is `ARGV[4]`, or empty
/// with an `action` among `ARGV[5..]`, as `XREVRANGE` replies them. Read-only.
pub const AUDIT_WHERE_LUA: &str = r"
local entries = redis.call('XREVRANGE', KEYS[1], ARGV[1], ARGV[2], 'COUNT', ARGV[3])
local kept = {}
for _, e in ipairs(entries) do
  local f = e[2]
  local action, dep = '', ''
  for i = 1, #f - 1, 2 do
    if f[i] == 'action' then action = f[i + 1] elseif f[i] == 'dependency' then dep = f[i + 1] end
  end
  local keep = dep == ARGV[4]
  if not keep and dep == '' then
    for j = 5, #ARGV do
      if action == ARGV[j] then keep = true break end
    end
  end
  if keep then kept[#kept + 1] = e end
end
local last = ''
if #entries > 0 then last = entries[#entries][1] end
return {#entries, last, kept}
";

static AUDIT_WHERE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(AUDIT_WHERE_LUA));

/// The greatest stream id before `id` (`ms-seq`), as an inclusive bound (for `XREVRANGE`, or a
/// page of the trail that goes on after `id`); `None` before the first or when `id` is no
/// stream id.
#[must_use]
pub fn id_before(id: &str) -> Option<String> {
    let (ms, seq) = id.split_once('-')?;
    let (ms, seq): (u64, u64) = (ms.parse().ok()?, seq.parse().ok()?);
    match seq.checked_sub(1) {
        Some(seq) => Some(format!("{ms}-{seq}")),
        None => Some(format!("{}-{}", ms.checked_sub(1)?, u64::MAX)),
    }
}

/// A field of a raw entry as stored, empty when absent.
fn raw_field<'a>(fields: &'a [(Vec<u8>, Vec<u8>)], name: &str) -> &'a [u8] {
    fields
        .iter()
        .find(|(k, _)| k == name.as_bytes())
        .map_or(&[], |(_, v)| v.as_slice())
}

/// A raw entry, parsed.
fn entry_of(id: &[u8], fields: &[(Vec<u8>, Vec<u8>)]) -> AuditEntry {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let fields: Vec<(String, String)> = fields.iter().map(|(k, v)| (text(k), text(v))).collect();
    parse_entry(text(id), &fields)
}

/// The ms part of a stream id.
fn id_ms(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_default()
}

fn parse_entry(id: String, fields: &[(String, String)]) -> AuditEntry {
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_default()
    };
    let json = |name: &str| serde_json::from_str(get(name)).ok();
    let dependency = Some(get("dependency")).filter(|d| !d.is_empty());
    let mut entry = AuditEntry::new(get("actor"), get("action"), dependency, get("reason"));
    entry.before = json("before");
    entry.after = json("after");
    entry.trail_started = get(TRAIL_STARTED.0) == TRAIL_STARTED.1;
    entry.at_ms = id_ms(&id);
    entry.id = id;
    entry
}
