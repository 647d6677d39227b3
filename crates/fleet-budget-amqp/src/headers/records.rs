//! The records carried in headers: what a worker reads before running a job ([`JobHeaders`]),
//! what a retry carries ([`RetryRecord`]), what a dead-letter says ([`DeadLetterRecord`]), and
//! the headers of replayed and parked copies.

use fleet_budget::{BudgetSnapshot, BudgetSource, DeadLetterReason};
use lapin::types::FieldTable;

use super::fields::{HeaderError, get_str, get_u32, get_u64, remove, set_str, set_u64};
use super::{
    ATTEMPT, ATTEMPTS, BROKER_DELIVERY_HEADERS, BUDGET_ALLOWANCE, BUDGET_RETRIES, BUDGET_SOURCE,
    BUDGET_WINDOW_INDEX, BUDGET_WINDOW_MS, DEAD_LETTER_HEADERS, DEAD_LETTERED_MS, DEPENDENCY,
    ERROR, ERROR_CLASS, FIRST_FAILURE_MS, HELD_SINCE_MS, HOLD_REASON, NOT_BEFORE_MS,
    ORIGINAL_EXCHANGE, ORIGINAL_QUEUE, ORIGINAL_ROUTING_KEY, PARK_REASON, PARKED_MS, REASON,
    REPLAYED_MS, REPLAYS, RETRY_DELAY_MS, RETRY_TIER_MS, SHADOW_DENIED, TASK, UNREADABLE_HEADERS,
    error_text, now_ms,
};

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
    /// When the job was first held without running, if it is being held (Unix ms).
    pub held_since_ms: Option<u64>,
}

impl JobHeaders {
    /// Reads the job headers.
    ///
    /// # Errors
    /// A header of this crate is present but malformed (an attempt of 0 included).
    pub fn parse(table: &FieldTable) -> Result<Self, HeaderError> {
        // Headers the frame guard had to remove: the job is not what its producer sent.
        if let Some(removed) = get_str(table, UNREADABLE_HEADERS)? {
            return Err(HeaderError::new(UNREADABLE_HEADERS, removed));
        }
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
            held_since_ms: get_u64(table, HELD_SINCE_MS)?,
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
        Self {
            allowance: s.allowance,
            retries: s.estimates().retries,
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

/// Everything a retry carries: the next attempt, its delay and tier, where the job came from and
/// the failure that caused it. Written over the delivery's own headers (the job's headers stay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryRecord {
    /// The task.
    pub task: String,
    /// The execution number of the retry (the failed attempt + 1).
    pub attempt: u32,
    /// The backoff delay computed for it (ms, jitter included).
    pub delay_ms: u64,
    /// The delay of the tier it waits in (ms).
    pub tier_ms: u64,
    /// When it may run (Unix ms): set only when the delay exceeds the tier, so that it waits
    /// again when it comes back early.
    pub not_before_ms: Option<u64>,
    /// Where it was first published.
    pub original_exchange: String,
    /// The routing key it was first published with.
    pub original_routing_key: String,
    /// The queue it is consumed from (and comes back to).
    pub original_queue: String,
    /// The first failure of this life of the job (Unix ms).
    pub first_failure_ms: u64,
    /// Class of the failure.
    pub error_class: String,
    /// Text of the failure (redacted and truncated when written).
    pub error: String,
    /// The reason enforcement would have dead-lettered it, when its dependency is in shadow
    /// and the budget refused it ([`SHADOW_DENIED`]).
    pub shadow_denied: Option<&'static str>,
}

impl RetryRecord {
    /// Writes the record into `table`; a [`NOT_BEFORE_MS`] of an earlier retry is removed when
    /// this one has none.
    pub fn write(&self, table: &mut FieldTable) {
        set_u64(table, ATTEMPT, u64::from(self.attempt));
        set_u64(table, RETRY_DELAY_MS, self.delay_ms);
        set_u64(table, RETRY_TIER_MS, self.tier_ms);
        match self.not_before_ms {
            Some(at) => set_u64(table, NOT_BEFORE_MS, at),
            None => remove(table, NOT_BEFORE_MS),
        }
        set_str(table, ORIGINAL_EXCHANGE, &self.original_exchange);
        set_str(table, ORIGINAL_ROUTING_KEY, &self.original_routing_key);
        set_str(table, ORIGINAL_QUEUE, &self.original_queue);
        set_u64(table, FIRST_FAILURE_MS, self.first_failure_ms);
        set_str(table, TASK, &self.task);
        set_str(table, ERROR_CLASS, &self.error_class);
        set_str(table, ERROR, &error_text(&self.error));
        match self.shadow_denied {
            Some(reason) => set_str(table, SHADOW_DENIED, reason),
            None => remove(table, SHADOW_DENIED),
        }
        remove(table, HOLD_REASON);
        remove(table, HELD_SINCE_MS);
    }
}

/// What a job held without running carries ([`crate::Outcome::Hold`]): why, since when, and
/// enough to come back as the same job (its task and where it was first published), since a
/// held first attempt has no other header of this crate yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldRecord {
    /// The task.
    pub task: String,
    /// Why it is held (`primary_at_cap`, `circuit_open`).
    pub reason: String,
    /// When it was first held (Unix ms): kept from hold to hold.
    pub held_since_ms: u64,
    /// Where it was first published.
    pub original_exchange: String,
    /// The routing key it was first published with.
    pub original_routing_key: String,
    /// The queue it is consumed from (and comes back to).
    pub original_queue: String,
}

impl HoldRecord {
    /// Writes the record into `table` (the attempt and every other header stay as they are).
    pub fn write(&self, table: &mut FieldTable) {
        set_str(table, TASK, &self.task);
        set_str(table, HOLD_REASON, &self.reason);
        set_u64(table, HELD_SINCE_MS, self.held_since_ms);
        set_str(table, ORIGINAL_EXCHANGE, &self.original_exchange);
        set_str(table, ORIGINAL_ROUTING_KEY, &self.original_routing_key);
        set_str(table, ORIGINAL_QUEUE, &self.original_queue);
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

#[cfg(test)]
mod tests {
    use lapin::types::{AMQPValue, LongString, ShortString};

    use super::*;
    use crate::headers::is_application_header;

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

    fn retry() -> RetryRecord {
        RetryRecord {
            task: "index".into(),
            attempt: 3,
            delay_ms: 1500,
            tier_ms: 1000,
            not_before_ms: Some(9_000),
            original_exchange: "fleet.work".into(),
            original_routing_key: "index".into(),
            original_queue: "fleet.work".into(),
            first_failure_ms: 7_000,
            error_class: "timeout".into(),
            error: "GET https://bob:hunter2@search/x timed out".into(),
            shadow_denied: None,
        }
    }

    #[test]
    fn a_retry_record_is_what_the_next_attempt_reads() {
        let mut t = FieldTable::default();
        set_str(&mut t, "fb-custom", "kept");
        retry().write(&mut t);
        let job = JobHeaders::parse(&t).unwrap();
        assert_eq!(
            job,
            JobHeaders {
                attempt: 3,
                replays: 0,
                task: Some("index".into()),
                original_exchange: Some("fleet.work".into()),
                original_routing_key: Some("index".into()),
                first_failure_ms: Some(7_000),
                not_before_ms: Some(9_000),
                held_since_ms: None,
            }
        );
        assert_eq!(get_u64(&t, RETRY_DELAY_MS).unwrap(), Some(1500));
        assert_eq!(get_u64(&t, RETRY_TIER_MS).unwrap(), Some(1000));
        assert_eq!(get_str(&t, "fb-custom").unwrap().as_deref(), Some("kept"));
        let error = get_str(&t, ERROR).unwrap().unwrap();
        assert!(!error.contains("hunter2"), "{error}");
        // A later retry that fits its tier drops the earlier not-before time.
        RetryRecord {
            not_before_ms: None,
            ..retry()
        }
        .write(&mut t);
        assert_eq!(get_u64(&t, NOT_BEFORE_MS).unwrap(), None);
    }

    /// A retry its budget refused in shadow says so; a later one the budget granted does not.
    #[test]
    fn a_retry_granted_in_shadow_carries_the_reason_enforcement_would_have_given() {
        let mut t = FieldTable::default();
        RetryRecord {
            shadow_denied: Some("budget_exhausted"),
            ..retry()
        }
        .write(&mut t);
        assert_eq!(
            get_str(&t, SHADOW_DENIED).unwrap().as_deref(),
            Some("budget_exhausted")
        );
        retry().write(&mut t);
        assert_eq!(get_str(&t, SHADOW_DENIED).unwrap(), None);
    }

    #[test]
    fn dead_letters_carry_the_sliding_estimate_of_retries_rounded_down() {
        let snapshot = BudgetSnapshot {
            window_ms: 60_000,
            window_index: 9,
            previous_weight_ms: 30_000,
            current: fleet_budget::WindowCounters {
                retries: 3,
                ..Default::default()
            },
            previous: fleet_budget::WindowCounters {
                retries: 11,
                ..Default::default()
            },
            allowance: 10,
            ..BudgetSnapshot::default()
        };
        assert_eq!(
            BudgetHeaders::from(&snapshot),
            BudgetHeaders {
                allowance: 10,
                retries: 8, // 3 + 11 × 0.5, rounded down
                window_ms: 60_000,
                window_index: 9,
            }
        );
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
}
