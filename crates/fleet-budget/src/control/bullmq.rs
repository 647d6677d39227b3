//! The BullMQ jobs the budget refused that a Node.js worker without `[amqp]` kept in BullMQ's
//! failed set, as the fleet records them beside BullMQ's own keys (which this crate never
//! writes: BullMQ's Lua scripts own them).
//!
//! The Node.js client (`clients/node/src/bullmqKept.ts`) pushes one small JSON object per kept
//! job on the left of `<prefix>:v1:bullmq-kept:{<queue>}` (the job id, its task, dependency,
//! reason, error class and error, when), bounded at 100,000 entries, and counts the entries it
//! dropped past that bound in `…:bullmq-kept-dropped:{<queue>}`. `budgetctl replay
//! --bullmq-queue` moves entries to `…:bullmq-replay:{<queue>}` (which the queue's
//! `ReplayReceiver` drains back into BullMQ, each receiver through a list of its own,
//! `…:bullmq-replaying:{<queue>}:<id>`, and saying it is alive in `…:bullmq-receivers:{<queue>}`)
//! or parks them in `…:bullmq-parked:{<queue>}`. The console lists the queues and their kept jobs
//! from here.
//!
//! Anyone with access to Redis can write these keys: an entry is read with [`read_entry`] (bounded,
//! or why it is not one), a queue's name with [`queue_problem`], and a key of another type is
//! counted as such, never an error of the whole listing.

use std::collections::BTreeSet;

use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::Value;

use crate::error::StoreError;
use crate::keys::{bullmq_key, bullmq_key_pattern, bullmq_list_of_key};
use crate::store::{DiscoveryError, RedisStore};

/// A BullMQ queue name's bound, in bytes.
pub const QUEUE_MAX: usize = 200;
/// An entry longer than this is not one the Node.js client wrote (it writes a few hundred bytes).
pub const ENTRY_MAX: usize = 16 * 1024;
/// A job id's bound, in bytes.
pub const ID_MAX: usize = 512;
/// Queues [`kept_queues`] lists at most (by name): whatever keys Redis holds, a listing is
/// bounded.
pub const QUEUES_MAX: usize = 1_000;

/// `queue` as a BullMQ queue's name, or an error of `script` saying why it is not one.
fn bullmq_name(queue: &str, script: &'static str) -> Result<(), StoreError> {
    match queue_problem(queue) {
        None => Ok(()),
        Some(problem) => Err(StoreError::BadReply {
            script,
            detail: format!("the queue's name {problem}"),
        }),
    }
}

/// A length as a script answered it: `None` for [`NOT_OURS`] (a key of another type) or anything
/// but a whole number from 0.
fn length_of(v: redis::Value) -> Option<u64> {
    <i64 as redis::FromRedisValue>::from_redis_value(v)
        .ok()
        .filter(|n| *n != NOT_OURS)
        .and_then(|n| u64::try_from(n).ok())
}

/// The lists of a queue: the kept jobs, the count of those dropped past the bound, the jobs on
/// their way back to BullMQ, the parked ones.
const LISTS: [&str; 4] = ["kept", "kept-dropped", "replay", "parked"];
/// Queues whose lengths are read at once.
const READ_CONCURRENCY: usize = 16;

/// Why `queue` cannot be a BullMQ queue's name here, if it cannot: empty, longer than
/// [`QUEUE_MAX`] bytes, or holding `:` (BullMQ refuses it), a brace (the keys' hash tag) or a
/// control character.
#[must_use]
pub fn queue_problem(queue: &str) -> Option<String> {
    if queue.is_empty() {
        return Some("is empty".to_owned());
    }
    if queue.len() > QUEUE_MAX {
        return Some(format!("is longer than {QUEUE_MAX} bytes"));
    }
    queue
        .chars()
        .find(|c| matches!(c, ':' | '{' | '}') || c.is_control())
        .map(|c| format!("holds {c:?} (no ':', braces or control characters)"))
}

/// One kept job, as the Node.js client records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptJob {
    /// BullMQ's job id (`<id>~r<n>` once replayed `n` times).
    pub id: String,
    /// The dependency whose budget refused its retry.
    pub dependency: String,
    /// The job's name (its task).
    pub task: String,
    /// Why it was kept (`budget_exhausted`, …).
    pub reason: String,
    /// The error class of its last attempt.
    pub error_class: String,
    /// The error of its last attempt.
    pub error: String,
    /// When it was kept (Unix ms; 0 when the entry does not say).
    pub at_ms: u64,
}

#[derive(Deserialize)]
struct Entry {
    id: Option<Value>,
    dependency: Option<String>,
    task: Option<String>,
    reason: Option<String>,
    error_class: Option<String>,
    error: Option<String>,
    at_ms: Option<u64>,
}

/// `raw` as a kept job, or why it cannot be one (`readKeptEntry` of the Node.js client).
///
/// # Errors
/// The entry is longer than [`ENTRY_MAX`], not a JSON object, or names no job id or dependency.
pub fn read_entry(raw: &str) -> Result<KeptJob, String> {
    if raw.len() > ENTRY_MAX {
        return Err(format!("the entry is longer than {ENTRY_MAX} bytes"));
    }
    let e: Entry =
        serde_json::from_str(raw).map_err(|e| format!("the entry is not a JSON object ({e})"))?;
    let id = match e.id {
        Some(Value::String(s)) if !s.is_empty() && s.len() <= ID_MAX => s,
        Some(Value::Number(n)) if n.is_u64() => n.to_string(),
        _ => {
            return Err(format!(
                "the entry names no job id (\"id\": a string of 1 to {ID_MAX} bytes)"
            ));
        }
    };
    let dependency = e
        .dependency
        .filter(|d| !d.is_empty())
        .ok_or("the entry names no dependency (\"dependency\")")?;
    Ok(KeptJob {
        id,
        dependency,
        task: e.task.unwrap_or_default(),
        reason: e.reason.unwrap_or_default(),
        error_class: e.error_class.unwrap_or_default(),
        error: e.error.unwrap_or_default(),
        at_ms: e.at_ms.unwrap_or(0),
    })
}

/// How many times the job of `id` was replayed already: its `~r<n>` suffix (1 to 9 digits), else
/// 0 (`replaysOf` of the Node.js client).
#[must_use]
pub fn replays_of(id: &str) -> u32 {
    id.rsplit_once("~r")
        .map(|(_, n)| n)
        .filter(|n| (1..=9).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A queue's lists by length. `None`: the key holds something else (of another type, or a
/// count that is no number): written by someone else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptQueue {
    /// The BullMQ queue's name.
    pub queue: String,
    /// Jobs kept, waiting for a replay.
    pub kept: Option<u64>,
    /// Jobs dropped past the kept list's bound (still in BullMQ's failed set).
    pub dropped: Option<u64>,
    /// Jobs a replay moved that the queue's receiver has not put back yet.
    pub replay: Option<u64>,
    /// Jobs a replay parked.
    pub parked: Option<u64>,
}

/// The queues with kept jobs, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeptQueues {
    /// The queues' names, sorted, at most [`QUEUES_MAX`].
    pub queues: Vec<String>,
    /// Whether more were found than listed.
    pub truncated: bool,
}

/// The queues that have one of the fleet's lists of kept jobs in `store` (on every master of a
/// cluster), by name: keys of another shape, or whose queue name is no BullMQ name, are left out.
///
/// # Errors
/// A node could not be scanned (the error names it).
pub async fn kept_queues(store: &RedisStore) -> Result<KeptQueues, DiscoveryError> {
    let prefix = store.prefix();
    // Each queue has up to four keys: enough for QUEUES_MAX queues and a little more.
    let keys = store
        .scan_keys(&bullmq_key_pattern(prefix), LISTS.len() * QUEUES_MAX + 1)
        .await?;
    let names: BTreeSet<&str> = keys
        .iter()
        .filter_map(|k| std::str::from_utf8(k).ok())
        .filter_map(|k| bullmq_list_of_key(prefix, k))
        .filter(|(list, queue)| LISTS.contains(list) && queue_problem(queue).is_none())
        .map(|(_, queue)| queue)
        .collect();
    let truncated = names.len() > QUEUES_MAX;
    Ok(KeptQueues {
        queues: names
            .into_iter()
            .take(QUEUES_MAX)
            .map(str::to_owned)
            .collect(),
        truncated,
    })
}

/// The lengths of each of `queues`' lists (one script call a queue, at most 16 at once).
///
/// # Errors
/// Redis failed or passed the store's deadline; a queue name is not a BullMQ name.
pub async fn kept_lengths(
    store: &RedisStore,
    queues: &[String],
) -> Result<Vec<KeptQueue>, StoreError> {
    // Boxed with their type spelled out: a closure in `stream::iter(...).map(...)` makes a
    // caller's future (an axum handler's) fail the `Send` check over a higher-ranked lifetime
    // (as `view::read_fleet`).
    let reads: Vec<Lengths<'_>> = queues
        .iter()
        .map(|q| -> Lengths<'_> { Box::pin(queue_lengths(store, q)) })
        .collect();
    futures::stream::iter(reads)
        .buffered(READ_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// One queue's lengths' read, boxed.
type Lengths<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<KeptQueue, StoreError>> + Send + 'a>>;

/// What [`LENGTHS_LUA`] answers for a key that is neither missing nor of its kind.
const NOT_OURS: i64 = -1;

/// The lengths of a queue's lists (`KEYS`: kept, kept-dropped, replay, parked): a list's `LLEN`,
/// the dropped count's value, 0 for a missing key, -1 for a key of another type or a count that
/// is no whole number from 0 to 2^53 - 1 (what Lua holds exactly). Read-only.
const LENGTHS_LUA: &str = r"
local out = {}
for i, k in ipairs(KEYS) do
  local t = redis.call('TYPE', k)['ok']
  if t == 'none' then
    out[i] = 0
  elseif i == 2 and t == 'string' then
    local n = tonumber(redis.call('GET', k))
    if n and n >= 0 and n <= 9007199254740991 and n == math.floor(n) then out[i] = n else out[i] = -1 end
  elseif i ~= 2 and t == 'list' then
    out[i] = redis.call('LLEN', k)
  else
    out[i] = -1
  end
end
return out
";

static LENGTHS_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(LENGTHS_LUA));

/// The lengths of one queue's lists (one read-only script call).
///
/// # Errors
/// Redis failed or passed the store's deadline; the queue name is not a BullMQ name.
pub async fn queue_lengths(store: &RedisStore, queue: &str) -> Result<KeptQueue, StoreError> {
    bullmq_name(queue, "bullmq_lengths")?;
    let prefix = store.prefix();
    let mut call = LENGTHS_SCRIPT.prepare_invoke();
    for list in LISTS {
        call.key(bullmq_key(prefix, list, queue));
    }
    let reply = store.invoke("bullmq_lengths", call).await?;
    let mut n = reply.into_iter().map(length_of);
    let mut next = || n.next().flatten();
    Ok(KeptQueue {
        queue: queue.to_owned(),
        kept: next(),
        dropped: next(),
        replay: next(),
        parked: next(),
    })
}

/// An entry of a kept list: the job, or why the entry is not one (with its first bytes).
pub type KeptEntry = Result<KeptJob, String>;

/// Entries `from` to `from + count` of `queue`'s kept list, newest first (the Node.js client
/// pushes on the left).
///
/// # Errors
/// Redis failed or passed the store's deadline; the key is not a list; the queue name is not a
/// BullMQ name.
pub async fn kept_jobs(
    store: &RedisStore,
    queue: &str,
    from: u64,
    count: u64,
) -> Result<Vec<KeptEntry>, StoreError> {
    bullmq_name(queue, "LRANGE")?;
    if count == 0 {
        return Ok(Vec::new());
    }
    let last = from.saturating_add(count - 1);
    let key = bullmq_key(store.prefix(), "kept", queue);
    let raw: Vec<Vec<u8>> = store
        .query_repeatable(redis::cmd("LRANGE").arg(&key).arg(from).arg(last))
        .await?;
    Ok(raw
        .iter()
        .map(|bytes| match std::str::from_utf8(bytes) {
            Ok(text) => read_entry(text),
            Err(_) => Err("the entry is not UTF-8 text".to_owned()),
        })
        .collect())
}

/// Receivers [`receivers`] reads at most: the most recently heard.
pub const RECEIVERS_SHOWN: usize = 20;
/// A receiver id's bound, in bytes (the Node.js client's).
pub const RECEIVER_ID_MAX: usize = 200;

/// A receiver of a queue's replays, as it last said it was alive (the Node.js client's
/// `ReplayReceiver` beats every few seconds; the others take back what one not heard from for its
/// `staleAfterMs`, 60 s by default, had in hand).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receiver {
    /// Its id (`receiverId`, the host's name by default).
    pub id: String,
    /// When it last said it was alive (Unix ms).
    pub heard_ms: u64,
    /// Requests in its hand (`…:bullmq-replaying:{<queue>}:<id>`); `None`: the key holds
    /// something else.
    pub in_hand: Option<u64>,
}

/// A queue's receivers, most recently heard first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Receivers {
    /// At most [`RECEIVERS_SHOWN`]; ids longer than [`RECEIVER_ID_MAX`] or not UTF-8 left out.
    pub shown: Vec<Receiver>,
    /// How many the set holds; `None`: its key holds something else than a sorted set.
    pub known: Option<u64>,
}

/// The receivers' set's size and its most recently heard members with their times (`KEYS[1]`;
/// `ARGV[1]`: how many), or `{-1}` for a key of another type. Read-only.
const RECEIVERS_LUA: &str = r"
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return {0} end
if t ~= 'zset' then return {-1} end
local out = {redis.call('ZCARD', KEYS[1])}
local last = redis.call('ZRANGE', KEYS[1], -tonumber(ARGV[1]), -1, 'WITHSCORES')
for i = 1, #last do out[#out + 1] = last[i] end
return out
";

/// Each key's `LLEN`: 0 when missing, -1 when of another type. Read-only.
const LLENS_LUA: &str = r"
local out = {}
for i, k in ipairs(KEYS) do
  local t = redis.call('TYPE', k)['ok']
  if t == 'none' then out[i] = 0 elseif t == 'list' then out[i] = redis.call('LLEN', k) else out[i] = -1 end
end
return out
";

static RECEIVERS_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(RECEIVERS_LUA));
static LLENS_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(LLENS_LUA));

/// `queue`'s receivers, most recently heard first, with the requests each holds (two read-only
/// script calls).
///
/// # Errors
/// Redis failed or passed the store's deadline; the queue name is not a BullMQ name.
pub async fn receivers(store: &RedisStore, queue: &str) -> Result<Receivers, StoreError> {
    bullmq_name(queue, "bullmq_receivers")?;
    let prefix = store.prefix();
    let mut call = RECEIVERS_SCRIPT.prepare_invoke();
    call.key(bullmq_key(prefix, "receivers", queue))
        .arg(RECEIVERS_SHOWN);
    let reply = store.invoke("bullmq_receivers", call).await?;
    let mut reply = reply.into_iter();
    let known = reply
        .next()
        .and_then(|v| <i64 as redis::FromRedisValue>::from_redis_value(v).ok())
        .and_then(|n| u64::try_from(n).ok());
    let rest: Vec<redis::Value> = reply.collect();
    let mut shown: Vec<(String, u64)> = rest
        .chunks_exact(2)
        .filter_map(|pair| {
            let [id, score] = pair else { return None };
            let id = <String as redis::FromRedisValue>::from_redis_value(id.clone()).ok()?;
            // Unix ms as the Node.js client writes them: a whole number (Redis prints one
            // without an exponent below 10^17); "inf", a fraction or a negative is left out.
            let heard = <u64 as redis::FromRedisValue>::from_redis_value(score.clone()).ok()?;
            (!id.is_empty() && id.len() <= RECEIVER_ID_MAX).then_some((id, heard))
        })
        .collect();
    // ZRANGE answers the last ones in ascending order: the most recent first.
    shown.reverse();
    if shown.is_empty() {
        return Ok(Receivers {
            shown: Vec::new(),
            known,
        });
    }
    let mut lens = LLENS_SCRIPT.prepare_invoke();
    for (id, _) in &shown {
        lens.key(format!("{}:{id}", bullmq_key(prefix, "replaying", queue)));
    }
    let lengths = store.invoke("bullmq_in_hand", lens).await?;
    let mut lengths = lengths.into_iter().map(length_of);
    Ok(Receivers {
        shown: shown
            .into_iter()
            .map(|(id, heard_ms)| Receiver {
                id,
                heard_ms,
                in_hand: lengths.next().flatten(),
            })
            .collect(),
        known,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_are_bounded_and_safe_in_a_key() {
        assert_eq!(queue_problem("search"), None);
        assert!(queue_problem("").is_some());
        assert!(queue_problem("a:b").is_some());
        assert!(queue_problem("a{b").is_some());
        assert!(queue_problem("a\nb").is_some());
        assert!(queue_problem(&"q".repeat(201)).is_some());
        assert_eq!(
            bullmq_key("fb", "kept", "search"),
            "fb:v1:bullmq-kept:{search}"
        );
        assert_eq!(
            bullmq_list_of_key("fb", "fb:v1:bullmq-kept-dropped:{search}"),
            Some(("kept-dropped", "search"))
        );
        assert_eq!(bullmq_list_of_key("fb", "fb:v1:{search}"), None);
        assert_eq!(bullmq_list_of_key("fb", "fb:v1:bullmq-kept:{search"), None);
    }

    #[test]
    fn entries_are_read_as_the_node_client_writes_them_or_refused() {
        let ok = read_entry(
            r#"{"v":1,"id":"doc-1","task":"index","dependency":"search","reason":"budget_exhausted","error_class":"http_503","error":"503","at_ms":1700000000000}"#,
        )
        .unwrap();
        assert_eq!(ok.id, "doc-1");
        assert_eq!(ok.dependency, "search");
        assert_eq!(ok.at_ms, 1_700_000_000_000);
        assert_eq!(
            read_entry(r#"{"id":17,"dependency":"d"}"#).unwrap().id,
            "17"
        );
        for bad in [
            "",
            "not json",
            "[1]",
            "null",
            r#"{"id":{"a":1},"dependency":"d"}"#,
            r#"{"dependency":"d"}"#,
            r#"{"id":"","dependency":"d"}"#,
            r#"{"id":-1,"dependency":"d"}"#,
            r#"{"id":"x"}"#,
            r#"{"id":"x","dependency":""}"#,
        ] {
            assert!(read_entry(bad).is_err(), "{bad}");
        }
        let long = format!(
            r#"{{"id":"x","dependency":"d","error":"{}"}}"#,
            "e".repeat(ENTRY_MAX)
        );
        assert!(read_entry(&long).is_err());
        assert!(
            read_entry(&format!(
                r#"{{"id":"{}","dependency":"d"}}"#,
                "i".repeat(ID_MAX + 1)
            ))
            .is_err()
        );
    }

    #[test]
    fn replays_are_counted_from_the_id_suffix() {
        assert_eq!(replays_of("doc-1"), 0);
        assert_eq!(replays_of("doc-1~r1"), 1);
        assert_eq!(replays_of("doc-1~r12"), 12);
        assert_eq!(replays_of("doc-1~r"), 0);
        assert_eq!(replays_of("doc-1~rx"), 0);
        assert_eq!(replays_of("doc-1~r1x"), 0);
        assert_eq!(replays_of("doc-1~r1234567890"), 0);
    }
}
