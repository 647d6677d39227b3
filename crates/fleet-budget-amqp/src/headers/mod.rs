//! Every header name this crate reads or writes, and message identity: the one place to look.
//!
//! Application headers start with `fb-`, never `x-` (those belong to the broker: `x-death`,
//! `x-delivery-count`, ...). How values are written and read is in [`fields`]; the records that
//! group them (a retry, a dead-letter, the job's own headers) are in [`records`].
//!
//! The AMQP `message_id` is the job's identity: producers set it ([`new_message_id`] when they have
//! none), it is copied unchanged onto every retry, dead-letter, replay and park, and consumers
//! deduplicate on it (delivery is at least once). A message that arrives without one gets one on
//! its first republish, and keeps it from then on.

use fleet_budget::redact::{redact_text, truncate};
use lapin::BasicProperties;
use lapin::types::ShortString;
use rand::Rng;

pub mod copy;
pub mod fields;
pub mod records;

pub use copy::{fit_frame, header_frame_size, put_back, without_expiration};
pub use fields::{
    HeaderError, get_str, get_u64, remove, set_str, set_u64, table, without_broker_headers,
};
pub use records::{
    BudgetHeaders, DeadLetterRecord, HoldRecord, JobHeaders, RetryRecord, park_headers,
    replay_headers,
};

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
/// Which budget decided: `fleet`, `fleet_cache` (a denial of the fleet budget that still stood in
/// this process), `local_fallback`, `blind`, `local`.
pub const BUDGET_SOURCE: &str = "fb-budget-source";
/// The backoff delay computed for the pending retry (milliseconds, jitter included).
pub const RETRY_DELAY_MS: &str = "fb-retry-delay-ms";
/// Set on a retry its dependency's budget refused while in shadow (`enforcement = "shadow"` or
/// `budgetctl budget shadow`): the reason enforcement would have dead-lettered it
/// (`budget_exhausted`). Absent on a retry the budget granted.
pub const SHADOW_DENIED: &str = "fb-shadow-denied";
/// The delay tier the retry waited in (milliseconds).
pub const RETRY_TIER_MS: &str = "fb-retry-tier-ms";
/// When a retry whose delay exceeds the longest tier may run (Unix ms): it arrives early and
/// waits in a tier again, without running or spending budget. Set only in that case.
pub const NOT_BEFORE_MS: &str = "fb-not-before-ms";
/// Why the job waits in a tier without running (`primary_at_cap`, `circuit_open`): set while
/// [`fleet_budget::FleetBudget::admit`] holds it, removed once it runs.
pub const HOLD_REASON: &str = "fb-hold-reason";
/// When the job was first held without running (Unix ms), kept across its holds and removed
/// once it runs: a job held longer than its limit in all is dead-lettered.
pub const HELD_SINCE_MS: &str = "fb-held-since-ms";
/// When the message was last replayed (Unix milliseconds).
pub const REPLAYED_MS: &str = "fb-replayed-ms";
/// Why the replayer parked the message instead of replaying it.
pub const PARK_REASON: &str = "fb-park-reason";
/// When the message was parked (Unix milliseconds).
pub const PARKED_MS: &str = "fb-parked-ms";
/// The producer's per-message `expiration`, kept when a copy drops it (see [`copy`]).
pub const ORIGINAL_EXPIRATION: &str = "fb-original-expiration";

/// The producer's `user_id`, kept when a copy drops it (the broker refuses a `user_id` that is
/// not the publishing connection's user; see [`copy`]).
pub const ORIGINAL_USER_ID: &str = "fb-original-user-id";
/// Headers dropped from a copy so that it fits one frame, with their sizes (see
/// [`copy::fit_frame`]).
pub const DROPPED_HEADERS: &str = "fb-dropped-headers";

/// What the frame guard removed from a delivery's properties on receipt because lapin's parser
/// could not read it safely (headers nested too deep, a table it cannot read, a short string
/// that is not UTF-8), as text. A job carrying it is dead-lettered with that text, class
/// `malformed_header`, without running (see [`crate::frame_guard`]).
pub const UNREADABLE_HEADERS: &str = "fb-unreadable-headers";

/// Headers that describe one dead-lettering; removed when the message is replayed.
pub const DEAD_LETTER_HEADERS: [&str; 17] = [
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
    HOLD_REASON,
    HELD_SINCE_MS,
];

/// Longest error text carried in [`ERROR`], in bytes.
pub const ERROR_TEXT_MAX_BYTES: usize = 512;

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

/// Milliseconds since the Unix epoch, now: the time headers carry (`fb-dead-lettered-ms`, ...).
/// The core's [`fleet_budget::clock::now_ms`], the one read of the system clock.
pub use fleet_budget::clock::now_ms;

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

/// Whether `name` is an application header name of this crate (`fb-`, never `x-`).
#[must_use]
pub fn is_application_header(name: &str) -> bool {
    name.starts_with("fb-")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names that are not in [`DEAD_LETTER_HEADERS`].
    const OTHERS: [&str; 13] = [
        ATTEMPT,
        REPLAYS,
        TASK,
        ORIGINAL_EXCHANGE,
        ORIGINAL_ROUTING_KEY,
        ORIGINAL_QUEUE,
        REPLAYED_MS,
        PARK_REASON,
        PARKED_MS,
        ORIGINAL_EXPIRATION,
        ORIGINAL_USER_ID,
        DROPPED_HEADERS,
        "fb-",
    ];

    #[test]
    fn application_headers_never_start_with_x() {
        for name in DEAD_LETTER_HEADERS.into_iter().chain(OTHERS) {
            assert!(!name.starts_with("x-"), "{name}");
            assert!(is_application_header(name), "{name}");
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
    fn message_ids_are_kept_once_set() {
        let p = with_message_id(BasicProperties::default());
        let id = message_id(&p).unwrap().to_owned();
        assert_eq!(id.len(), 32);
        assert_eq!(message_id(&with_message_id(p)).unwrap(), id);
    }
}
