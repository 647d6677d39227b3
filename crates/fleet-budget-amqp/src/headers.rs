//! Every header name this crate reads or writes, and message identity: the one place to look.
//!
//! Application headers start with `fb-`, never `x-` (those belong to the broker: `x-death`,
//! `x-delivery-count`, ...). Strings are written as AMQP long strings and integers as signed
//! 64-bit integers; readers also accept short strings, every integer width and decimal text, so a
//! worker in another language may write either.
//!
//! The AMQP `message_id` is the job's identity: producers set it ([`new_message_id`] when they have
//! none), it is copied unchanged onto every retry, dead-letter, replay and park, and consumers
//! deduplicate on it (delivery is at least once). A message that arrives without one gets one on
//! its first republish, and keeps it from then on.

use std::time::{SystemTime, UNIX_EPOCH};

use fleet_budget::redact::{redact_text, truncate};
use fleet_budget::{BudgetSnapshot, BudgetSource, DeadLetterReason};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use rand::Rng;

/// Number of the execution this delivery is (1 = first; absent means 1). Reset by replay.
pub const ATTEMPT: &str = "fb-attempt";
/// How many times the message has been replayed from the dead-letter queue (absent means 0).
pub const REPLAYS: &str = "fb-replays";
/// The task (job type). Producers may set it or the AMQP `type` property; dead-letters carry it.
pub const TASK: &str = "fb-task";
/// The dependency whose budget the task spends.
pub const DEPENDENCY: &str = "fb-dependency";
/// Why the message was dead-lettered: `non_retryable`, `attempts_exhausted`, `budget_exhausted`.
pub const REASON: &str = "fb-reason";
/// The exchange the job was first published to (set once, kept across retries).
pub const ORIGINAL_EXCHANGE: &str = "fb-original-exchange";
/// The routing key the job was first published with (set once, kept across retries).
pub const ORIGINAL_ROUTING_KEY: &str = "fb-original-routing-key";
/// The queue the job was consumed from.
pub const ORIGINAL_QUEUE: &str = "fb-original-queue";
/// Executions made before the job was dead-lettered.
pub const ATTEMPTS: &str = "fb-attempts";
/// When the first execution of this life of the job failed (Unix milliseconds).
pub const FIRST_FAILURE_MS: &str = "fb-first-failure-ms";
/// When the job was dead-lettered (Unix milliseconds).
pub const DEAD_LETTERED_MS: &str = "fb-dead-lettered-ms";
/// Class of the last error (`timeout`, `http_503`, `poison`).
pub const ERROR_CLASS: &str = "fb-error-class";
/// Text of the last error, redacted and truncated to [`ERROR_TEXT_MAX_BYTES`].
pub const ERROR: &str = "fb-error";
/// Budget snapshot at the refusal: the allowance of the window.
pub const BUDGET_ALLOWANCE: &str = "fb-budget-allowance";
/// Budget snapshot: the sliding estimate of retries granted, rounded down.
pub const BUDGET_RETRIES: &str = "fb-budget-retries";
/// Budget snapshot: the window length in milliseconds.
pub const BUDGET_WINDOW_MS: &str = "fb-budget-window-ms";
/// Budget snapshot: the window index (`floor(server_time / window)`).
pub const BUDGET_WINDOW_INDEX: &str = "fb-budget-window-index";
/// Which budget decided: `fleet`, `local_fallback`, `blind`, `local`.
pub const BUDGET_SOURCE: &str = "fb-budget-source";
/// The backoff delay computed for the pending retry (milliseconds, jitter included).
pub const RETRY_DELAY_MS: &str = "fb-retry-delay-ms";
/// The delay tier the retry waited in (milliseconds).
pub const RETRY_TIER_MS: &str = "fb-retry-tier-ms";
/// When a retry whose delay exceeds the longest tier may run (Unix ms): it arrives early and
/// waits in a tier again, without running or spending budget. Set only in that case.
pub const NOT_BEFORE_MS: &str = "fb-not-before-ms";
/// When the message was last replayed (Unix milliseconds).
pub const REPLAYED_MS: &str = "fb-replayed-ms";
/// Why the replayer parked the message instead of replaying it.
pub const PARK_REASON: &str = "fb-park-reason";
/// When the message was parked (Unix milliseconds).
pub const PARKED_MS: &str = "fb-parked-ms";

/// Headers that describe one dead-lettering; removed when the message is replayed.
pub const DEAD_LETTER_HEADERS: [&str; 15] = [
    REASON,
    DEPENDENCY,
    ATTEMPTS,
    FIRST_FAILURE_MS,
    DEAD_LETTERED_MS,
    ERROR_CLASS,
    ERROR,
    BUDGET_ALLOWANCE,
    BUDGET_RETRIES,
    BUDGET_WINDOW_MS,
    BUDGET_WINDOW_INDEX,
    BUDGET_SOURCE,
    RETRY_DELAY_MS,
    RETRY_TIER_MS,
    NOT_BEFORE_MS,
];

/// Longest error text carried in [`ERROR`], in bytes.
pub const ERROR_TEXT_MAX_BYTES: usize = 512;

/// A header that is present but cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header {name}: {problem}")]
pub struct HeaderError {
    /// The header.
    pub name: String,
    /// What is wrong with it.
    pub problem: String,
}

impl HeaderError {
    fn new(name: &str, problem: impl Into<String>) -> Self {
        Self {
            name: name.to_owned(),
            problem: problem.into(),
        }
    }

    fn missing(name: &str) -> Self {
        Self::new(name, "missing")
    }
}

/// A fresh message id: 128 random bits in hex.
#[must_use]
pub fn new_message_id() -> String {
    let bits: u128 = rand::rng().random();
    format!("{bits:032x}")
}

/// The message id, when the message has a non-empty one.
#[must_use]
pub fn message_id(properties: &BasicProperties) -> Option<&str> {
    properties
        .message_id()
        .as_ref()
        .map(ShortString::as_str)
        .filter(|s| !s.is_empty())
}

/// `properties` with a message id: the existing one, else a new one. Never replaces an id.
#[must_use]
pub fn with_message_id(properties: BasicProperties) -> BasicProperties {
    if message_id(&properties).is_some() {
        properties
    } else {
        properties.with_message_id(ShortString::from(new_message_id()))
    }
}

/// Error text as it may leave the process: secrets redacted, at most
/// [`ERROR_TEXT_MAX_BYTES`] bytes.
#[must_use]
pub fn error_text(message: &str) -> String {
    truncate(&redact_text(message), ERROR_TEXT_MAX_BYTES)
}

/// Milliseconds since the Unix epoch, now.
#[must_use]
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The headers of `properties` (empty when there are none).
#[must_use]
pub fn table(properties: &BasicProperties) -> FieldTable {
    properties.headers().clone().unwrap_or_default()
}

/// Sets a string header (as a long string: the broker rejects short strings in tables).
pub fn set_str(table: &mut FieldTable, name: &str, value: &str) {
    table.insert(
        ShortString::from(name),
        AMQPValue::LongString(LongString::from(value)),
    );
}

/// Sets an integer header.
pub fn set_u64(table: &mut FieldTable, name: &str, value: u64) {
    table.insert(
        ShortString::from(name),
        AMQPValue::LongLongInt(i64::try_from(value).unwrap_or(i64::MAX)),
    );
}

/// Removes a header.
pub fn remove(table: &mut FieldTable, name: &str) {
    let kept: Vec<(ShortString, AMQPValue)> = table
        .inner()
        .iter()
        .filter(|(k, _)| k.as_str() != name)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut out = FieldTable::default();
    for (k, v) in kept {
        out.insert(k, v);
    }
    *table = out;
}

/// A string header: `Ok(None)` when absent, an error when present but not text.
///
/// # Errors
/// The value is not a (UTF-8) string.
pub fn get_str(table: &FieldTable, name: &str) -> Result<Option<String>, HeaderError> {
    match table.inner().get(name) {
        None | Some(AMQPValue::Void) => Ok(None),
        Some(AMQPValue::LongString(s)) => String::from_utf8(s.as_bytes().to_vec())
            .map(Some)
            .map_err(|_| HeaderError::new(name, "is not UTF-8 text")),
        Some(AMQPValue::ShortString(s)) => Ok(Some(s.as_str().to_owned())),
        Some(other) => Err(HeaderError::new(
            name,
            format!("expected text, found {:?}", other.get_type()),
        )),
    }
}

/// A non-negative integer header: `Ok(None)` when absent.
///
/// # Errors
/// The value is negative, fractional, or not a number.
pub fn get_u64(table: &FieldTable, name: &str) -> Result<Option<u64>, HeaderError> {
    let bad = |v: &dyn std::fmt::Debug| {
        HeaderError::new(
            name,
            format!("expected a non-negative integer, found {v:?}"),
        )
    };
    let value: i128 = match table.inner().get(name) {
        None | Some(AMQPValue::Void) => return Ok(None),
        Some(AMQPValue::ShortShortInt(v)) => i128::from(*v),
        Some(AMQPValue::ShortShortUInt(v)) => i128::from(*v),
        Some(AMQPValue::ShortInt(v)) => i128::from(*v),
        Some(AMQPValue::ShortUInt(v)) => i128::from(*v),
        Some(AMQPValue::LongInt(v)) => i128::from(*v),
        Some(AMQPValue::LongUInt(v)) => i128::from(*v),
        Some(AMQPValue::LongLongInt(v)) => i128::from(*v),
        Some(AMQPValue::Timestamp(v)) => i128::from(*v),
        Some(AMQPValue::LongString(s)) => {
            let text = String::from_utf8_lossy(s.as_bytes());
            text.trim().parse::<i128>().map_err(|_| bad(&text))?
        }
        Some(AMQPValue::ShortString(s)) => s
            .as_str()
            .trim()
            .parse::<i128>()
            .map_err(|_| bad(&s.as_str()))?,
        Some(other) => return Err(bad(other)),
    };
    u64::try_from(value).map(Some).map_err(|_| bad(&value))
}

fn get_u32(table: &FieldTable, name: &str) -> Result<Option<u32>, HeaderError> {
    match get_u64(table, name)? {
        None => Ok(None),
        Some(v) => u32::try_from(v)
            .map(Some)
            .map_err(|_| HeaderError::new(name, format!("{v} is too large"))),
    }
}

/// What a worker reads from a delivery's headers before running the job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobHeaders {
    /// The execution number of this delivery (1 when absent).
    pub attempt: u32,
    /// Replays so far (0 when absent).
    pub replays: u32,
    /// The task header, if set.
    pub task: Option<String>,
    /// Where the job was first published, if it has been republished before.
    pub original_exchange: Option<String>,
    /// The routing key it was first published with, if it has been republished before.
    pub original_routing_key: Option<String>,
    /// The first failure of this life of the job.
    pub first_failure_ms: Option<u64>,
    /// The retry may not run before this time (delays longer than the longest tier).
    pub not_before_ms: Option<u64>,
}

impl JobHeaders {
    /// Reads the job headers.
    ///
    /// # Errors
    /// A header of this crate is present but malformed (an attempt of 0 included).
    pub fn parse(table: &FieldTable) -> Result<Self, HeaderError> {
        let attempt = get_u32(table, ATTEMPT)?.unwrap_or(1);
        if attempt == 0 {
            return Err(HeaderError::new(ATTEMPT, "must be at least 1"));
        }
        Ok(Self {
            attempt,
            replays: get_u32(table, REPLAYS)?.unwrap_or(0),
            task: get_str(table, TASK)?.filter(|t| !t.is_empty()),
            original_exchange: get_str(table, ORIGINAL_EXCHANGE)?,
            original_routing_key: get_str(table, ORIGINAL_ROUTING_KEY)?,
            first_failure_ms: get_u64(table, FIRST_FAILURE_MS)?,
            not_before_ms: get_u64(table, NOT_BEFORE_MS)?,
        })
    }
}

/// The budget as it was when a retry was refused, as carried in dead-letter headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetHeaders {
    /// Allowance of the window.
    pub allowance: u64,
    /// Retries granted (sliding estimate, rounded down).
    pub retries: u64,
    /// Window length in milliseconds.
    pub window_ms: u64,
    /// Window index.
    pub window_index: u64,
}

impl From<&BudgetSnapshot> for BudgetHeaders {
    fn from(s: &BudgetSnapshot) -> Self {
        let window = u128::from(s.window_ms.max(1));
        Self {
            allowance: s.allowance,
            retries: u64::try_from(s.retries_scaled() / window).unwrap_or(u64::MAX),
            window_ms: s.window_ms,
            window_index: s.window_index,
        }
    }
}

/// Everything a dead-lettered message says about why and where from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterRecord {
    /// The task.
    pub task: String,
    /// Its dependency.
    pub dependency: String,
    /// Why it was dead-lettered.
    pub reason: DeadLetterReason,
    /// Where it was first published.
    pub original_exchange: String,
    /// The routing key it was first published with.
    pub original_routing_key: String,
    /// The queue it was consumed from.
    pub original_queue: String,
    /// Executions made.
    pub attempts: u32,
    /// First failure (Unix ms).
    pub first_failure_ms: u64,
    /// Dead-lettered at (Unix ms).
    pub dead_lettered_ms: u64,
    /// Error class.
    pub error_class: String,
    /// Redacted, truncated error text.
    pub error: String,
    /// The budget at the refusal (for `budget_exhausted`).
    pub budget: Option<BudgetHeaders>,
    /// Which budget decided.
    pub budget_source: Option<BudgetSource>,
    /// Replays so far.
    pub replays: u32,
}

impl DeadLetterRecord {
    /// Writes the record into `table` (error text redacted and truncated again, to be sure).
    pub fn write(&self, table: &mut FieldTable) {
        set_str(table, TASK, &self.task);
        set_str(table, DEPENDENCY, &self.dependency);
        set_str(table, REASON, self.reason.as_str());
        set_str(table, ORIGINAL_EXCHANGE, &self.original_exchange);
        set_str(table, ORIGINAL_ROUTING_KEY, &self.original_routing_key);
        set_str(table, ORIGINAL_QUEUE, &self.original_queue);
        set_u64(table, ATTEMPTS, u64::from(self.attempts));
        set_u64(table, FIRST_FAILURE_MS, self.first_failure_ms);
        set_u64(table, DEAD_LETTERED_MS, self.dead_lettered_ms);
        set_str(table, ERROR_CLASS, &self.error_class);
        set_str(table, ERROR, &error_text(&self.error));
        set_u64(table, REPLAYS, u64::from(self.replays));
        if let Some(b) = self.budget {
            set_u64(table, BUDGET_ALLOWANCE, b.allowance);
            set_u64(table, BUDGET_RETRIES, b.retries);
            set_u64(table, BUDGET_WINDOW_MS, b.window_ms);
            set_u64(table, BUDGET_WINDOW_INDEX, b.window_index);
        }
        if let Some(source) = self.budget_source {
            set_str(table, BUDGET_SOURCE, source.as_str());
        }
    }

    /// Reads a dead-lettered message's headers.
    ///
    /// # Errors
    /// A required header is missing or malformed; the error names it.
    pub fn parse(table: &FieldTable) -> Result<Self, HeaderError> {
        let req_str = |name: &str| get_str(table, name)?.ok_or_else(|| HeaderError::missing(name));
        let req_u64 = |name: &str| get_u64(table, name)?.ok_or_else(|| HeaderError::missing(name));
        let reason_text = req_str(REASON)?;
        let reason = DeadLetterReason::parse(&reason_text)
            .ok_or_else(|| HeaderError::new(REASON, format!("unknown reason {reason_text:?}")))?;
        let dependency = req_str(DEPENDENCY)?;
        if dependency.is_empty() {
            return Err(HeaderError::new(DEPENDENCY, "is empty"));
        }
        let budget = match get_u64(table, BUDGET_ALLOWANCE)? {
            Some(allowance) => Some(BudgetHeaders {
                allowance,
                retries: get_u64(table, BUDGET_RETRIES)?.unwrap_or(0),
                window_ms: get_u64(table, BUDGET_WINDOW_MS)?.unwrap_or(0),
                window_index: get_u64(table, BUDGET_WINDOW_INDEX)?.unwrap_or(0),
            }),
            None => None,
        };
        let budget_source = get_str(table, BUDGET_SOURCE)?.and_then(|s| BudgetSource::parse(&s));
        Ok(Self {
            task: req_str(TASK)?,
            dependency,
            reason,
            original_exchange: req_str(ORIGINAL_EXCHANGE)?,
            original_routing_key: req_str(ORIGINAL_ROUTING_KEY)?,
            original_queue: get_str(table, ORIGINAL_QUEUE)?.unwrap_or_default(),
            attempts: get_u32(table, ATTEMPTS)?.unwrap_or(0),
            first_failure_ms: get_u64(table, FIRST_FAILURE_MS)?.unwrap_or(0),
            dead_lettered_ms: req_u64(DEAD_LETTERED_MS)?,
            error_class: get_str(table, ERROR_CLASS)?.unwrap_or_default(),
            error: get_str(table, ERROR)?.unwrap_or_default(),
            budget,
            budget_source,
            replays: get_u32(table, REPLAYS)?.unwrap_or(0),
        })
    }
}

/// The headers of a replayed copy: dead-letter headers and the attempt removed (the attempt
/// counter starts again at 1), the replay count incremented, the replay time stamped.
#[must_use]
pub fn replay_headers(dead: &FieldTable, replays: u32) -> FieldTable {
    let mut out = FieldTable::default();
    for (k, v) in dead.inner() {
        let name = k.as_str();
        if !(DEAD_LETTER_HEADERS.contains(&name)
            || BROKER_DELIVERY_HEADERS.contains(&name)
            || name == ATTEMPT)
        {
            out.insert(k.clone(), v.clone());
        }
    }
    set_u64(&mut out, REPLAYS, u64::from(replays.saturating_add(1)));
    set_u64(&mut out, REPLAYED_MS, now_ms());
    out
}

/// The headers of a parked copy: everything kept, plus why and when.
#[must_use]
pub fn park_headers(original: &FieldTable, reason: &str) -> FieldTable {
    let mut out = original.clone();
    set_str(&mut out, PARK_REASON, &error_text(reason));
    set_u64(&mut out, PARKED_MS, now_ms());
    out
}

/// Headers the broker adds to a delivery (`x-delivery-count`, `x-death`, `x-first-death-*`,
/// `x-last-death-*`): they describe that delivery, not the message, so copies drop them.
pub const BROKER_DELIVERY_HEADERS: [&str; 8] = [
    "x-delivery-count",
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
];

/// Set by the broker on a message it dead-lettered itself (`delivery_limit`, `expired`,
/// `rejected`, `maxlen`): read to explain why such a message has no `fb-` headers.
pub const BROKER_FIRST_DEATH_REASON: &str = "x-first-death-reason";

/// `table` without [`BROKER_DELIVERY_HEADERS`]: the headers of a copy the worker publishes.
#[must_use]
pub fn without_broker_headers(table: &FieldTable) -> FieldTable {
    let mut out = FieldTable::default();
    for (k, v) in table.inner() {
        if !BROKER_DELIVERY_HEADERS.contains(&k.as_str()) {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

/// Whether `name` is an application header name of this crate (`fb-`, never `x-`).
#[must_use]
pub fn is_application_header(name: &str) -> bool {
    name.starts_with("fb-")
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [&str; 25] = [
        ATTEMPT,
        REPLAYS,
        TASK,
        DEPENDENCY,
        REASON,
        ORIGINAL_EXCHANGE,
        ORIGINAL_ROUTING_KEY,
        ORIGINAL_QUEUE,
        ATTEMPTS,
        FIRST_FAILURE_MS,
        DEAD_LETTERED_MS,
        ERROR_CLASS,
        ERROR,
        BUDGET_ALLOWANCE,
        BUDGET_RETRIES,
        BUDGET_WINDOW_MS,
        BUDGET_WINDOW_INDEX,
        BUDGET_SOURCE,
        RETRY_DELAY_MS,
        RETRY_TIER_MS,
        NOT_BEFORE_MS,
        REPLAYED_MS,
        PARK_REASON,
        PARKED_MS,
        "fb-",
    ];

    #[test]
    fn application_headers_never_start_with_x() {
        for name in ALL {
            assert!(!name.starts_with("x-"), "{name}");
            assert!(is_application_header(name), "{name}");
        }
    }

    fn record() -> DeadLetterRecord {
        DeadLetterRecord {
            task: "index".into(),
            dependency: "search".into(),
            reason: DeadLetterReason::BudgetExhausted,
            original_exchange: "fleet.work".into(),
            original_routing_key: "index".into(),
            original_queue: "fleet.work".into(),
            attempts: 2,
            first_failure_ms: 1,
            dead_lettered_ms: 2,
            error_class: "http_503".into(),
            error: "GET https://bob:hunter2@search/x failed".into(),
            budget: Some(BudgetHeaders {
                allowance: 10,
                retries: 10,
                window_ms: 60_000,
                window_index: 7,
            }),
            budget_source: Some(BudgetSource::Fleet),
            replays: 1,
        }
    }

    #[test]
    fn dead_letter_record_round_trips_with_the_error_redacted() {
        let mut t = FieldTable::default();
        record().write(&mut t);
        let back = DeadLetterRecord::parse(&t).unwrap();
        assert!(!back.error.contains("hunter2"), "{}", back.error);
        assert_eq!(
            DeadLetterRecord {
                error: record().error,
                ..back
            },
            record()
        );
        for (k, v) in t.inner() {
            assert!(is_application_header(k.as_str()));
            assert!(
                !matches!(v, AMQPValue::ShortString(_)),
                "{k}: short strings close the connection"
            );
        }
    }

    #[test]
    fn long_error_text_is_truncated() {
        let t = error_text(&"password=swordfish ".repeat(200));
        assert!(
            t.len() <= ERROR_TEXT_MAX_BYTES && !t.contains("swordfish"),
            "{t}"
        );
    }

    #[test]
    fn malformed_headers_are_errors_not_panics() {
        let mut t = FieldTable::default();
        record().write(&mut t);
        set_str(&mut t, REASON, "gremlins");
        assert_eq!(DeadLetterRecord::parse(&t).unwrap_err().name, REASON);
        let mut t = FieldTable::default();
        record().write(&mut t);
        remove(&mut t, DEPENDENCY);
        assert_eq!(DeadLetterRecord::parse(&t).unwrap_err().problem, "missing");
        let mut t = FieldTable::default();
        t.insert(
            ShortString::from(ATTEMPT),
            AMQPValue::LongString(LongString::from(vec![0xff, 0xfe])),
        );
        assert!(JobHeaders::parse(&t).is_err());
        let mut t = FieldTable::default();
        t.insert(ShortString::from(ATTEMPT), AMQPValue::LongLongInt(-3));
        assert!(JobHeaders::parse(&t).is_err());
        let mut t = FieldTable::default();
        t.insert(ShortString::from(ATTEMPT), AMQPValue::Double(1.5));
        assert!(JobHeaders::parse(&t).is_err());
        set_u64(&mut t, ATTEMPT, 0);
        assert!(JobHeaders::parse(&t).is_err());
        assert_eq!(
            JobHeaders::parse(&FieldTable::default()).unwrap().attempt,
            1
        );
    }

    #[test]
    fn integers_are_read_from_any_width_and_from_text() {
        let mut t = FieldTable::default();
        t.insert(ShortString::from(ATTEMPT), AMQPValue::ShortShortUInt(3));
        t.insert(
            ShortString::from(REPLAYS),
            AMQPValue::LongString(LongString::from("2")),
        );
        let h = JobHeaders::parse(&t).unwrap();
        assert_eq!((h.attempt, h.replays), (3, 2));
    }

    #[test]
    fn replay_headers_reset_the_attempt_and_count_the_replay() {
        let mut t = FieldTable::default();
        record().write(&mut t);
        set_u64(&mut t, ATTEMPT, 4);
        let r = replay_headers(&t, 1);
        assert_eq!(get_u64(&r, REPLAYS).unwrap(), Some(2));
        assert_eq!(get_u64(&r, ATTEMPT).unwrap(), None);
        assert_eq!(get_str(&r, REASON).unwrap(), None);
        assert_eq!(
            get_str(&r, ORIGINAL_EXCHANGE).unwrap().as_deref(),
            Some("fleet.work")
        );
    }

    #[test]
    fn message_ids_are_kept_once_set() {
        let p = with_message_id(BasicProperties::default());
        let id = message_id(&p).unwrap().to_owned();
        assert_eq!(id.len(), 32);
        assert_eq!(message_id(&with_message_id(p)).unwrap(), id);
    }
}
