//! Looking at dead letters and parked messages one by one (`budgetctl dlq peek`, `parked list`),
//! through the non-destructive read of [`super::inspect`]: a look never brings a message closer
//! to a delivery limit.
//!
//! [`QueuedMessage`] is what an operator needs to decide about one message (id, task,
//! dependency, reason, attempts, when, the redacted error, and for a parked one why it was
//! parked); [`QueuedMessage::selected_by`] is the one place that says whether a message matches
//! a filter, shared with [`super::purge`].

use lapin::message::Delivery;

use super::inspect::{InspectOptions, Look, inspect_queue_with};
use super::select::ReplayFilter;
use crate::connection::ConnectionConfig;
use crate::error::AmqpError;
use crate::headers::{self, DeadLetterRecord};

/// One message of the dead-letter or parked queue, as an operator sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueuedMessage {
    /// The AMQP message id (the job's identity), when it has one.
    pub message_id: Option<String>,
    /// The task (`fb-task`, else the AMQP `type`), when known.
    pub task: Option<String>,
    /// The dependency whose budget it spends, when known.
    pub dependency: Option<String>,
    /// Why it was dead-lettered (`budget_exhausted`, ...), when known.
    pub reason: Option<String>,
    /// Executions made.
    pub attempts: Option<u32>,
    /// When it was dead-lettered (Unix ms).
    pub dead_lettered_ms: Option<u64>,
    /// The error class.
    pub error_class: Option<String>,
    /// The error text, redacted (again: whatever the worker wrote) and at most 512 bytes.
    pub error: Option<String>,
    /// Times replayed.
    pub replays: u32,
    /// Why it was parked (parked messages).
    pub park_reason: Option<String>,
    /// When it was parked (Unix ms).
    pub parked_ms: Option<u64>,
    /// Why its dead-letter headers cannot be read, when they cannot (a message the broker
    /// dead-lettered itself, or a damaged one); the fields above are then best effort.
    pub unreadable: Option<String>,
}

impl QueuedMessage {
    /// Reads a delivery's properties and headers; never fails (unreadable headers are said so
    /// in [`QueuedMessage::unreadable`]).
    #[must_use]
    pub fn read(delivery: &Delivery) -> Self {
        let props = &delivery.properties;
        let table = headers::table(props);
        let text = |name: &str| {
            headers::get_str(&table, name)
                .ok()
                .flatten()
                .filter(|s| !s.is_empty())
                .map(|s| headers::error_text(&s))
        };
        let number = |name: &str| headers::get_u64(&table, name).ok().flatten();
        let mut m = Self {
            message_id: headers::message_id(props).map(str::to_owned),
            park_reason: text(headers::PARK_REASON),
            parked_ms: number(headers::PARKED_MS),
            ..Self::default()
        };
        match DeadLetterRecord::parse(&table) {
            Ok(r) => {
                m.task = Some(r.task).filter(|t| !t.is_empty());
                m.dependency = Some(r.dependency);
                m.reason = Some(r.reason.as_str().to_owned());
                m.attempts = Some(r.attempts);
                m.dead_lettered_ms = Some(r.dead_lettered_ms);
                m.error_class = Some(r.error_class).filter(|c| !c.is_empty());
                m.error = Some(headers::error_text(&r.error)).filter(|e| !e.is_empty());
                m.replays = r.replays;
            }
            Err(e) => {
                m.unreadable = Some(e.to_string());
                m.task = text(headers::TASK);
                m.dependency = text(headers::DEPENDENCY);
                m.reason = text(headers::REASON);
                m.dead_lettered_ms = number(headers::DEAD_LETTERED_MS);
                m.error = text(headers::ERROR);
            }
        }
        if m.task.is_none() {
            m.task = props
                .kind()
                .as_ref()
                .map(|k| headers::error_text(k.as_str()))
                .filter(|k| !k.is_empty());
        }
        m
    }

    /// Whether `filter` selects this message. A message whose dead-letter headers cannot be
    /// read is selected only by an empty filter or one with `malformed` (nothing in it can be
    /// trusted to match a field).
    #[must_use]
    pub fn selected_by(&self, filter: &ReplayFilter) -> bool {
        if filter.is_empty() {
            return true;
        }
        let is = |want: &Option<String>, have: &Option<String>| {
            want.as_ref().is_none_or(|w| have.as_ref() == Some(w))
        };
        if self.unreadable.is_some() {
            // A message id names one message, malformed or not.
            return filter.malformed && is(&filter.message_id, &self.message_id);
        }
        // As the index keeps them (`ReplayFilter::matches`).
        let cut = |have: &Option<String>| have.as_deref().map(crate::dead_letters::bounded);
        let same = |want: &Option<String>, have: &Option<String>| {
            want.as_deref()
                .is_none_or(|w| cut(have).as_deref() == Some(&*crate::dead_letters::bounded(w)))
        };
        let at = self.dead_lettered_ms.unwrap_or(0);
        same(&filter.dependency, &self.dependency)
            && same(&filter.task, &self.task)
            && is(&filter.message_id, &self.message_id)
            && filter
                .reason
                .is_none_or(|r| self.reason.as_deref() == Some(r.as_str()))
            && same(&filter.error_class, &self.error_class)
            && filter.since_ms.is_none_or(|t| at >= t)
            && filter.until_ms.is_none_or(|t| at < t)
            && filter
                .error_contains
                .as_deref()
                .is_none_or(|e| self.error.as_deref().is_some_and(|text| text.contains(e)))
    }
}

/// What a peek saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peek {
    /// Messages in the queue at the start.
    pub total: u64,
    /// Messages read (the read stops at the limit).
    pub seen: u64,
    /// The selected messages, in the order read, at most the limit.
    pub messages: Vec<QueuedMessage>,
    /// Messages put back whose original is not known to be removed (the broker did not answer
    /// behind the acks): possible duplicates, never losses. 0 unless the broker failed.
    pub uncertain: u64,
}

/// Shows up to `limit` messages of `queue` that `filter` selects, reading them through the
/// non-destructive [`inspect_queue_with`] and stopping at the limit.
///
/// # Errors
/// The broker cannot be reached, the queue does not exist, or the connection was lost (every
/// message stays in the queue).
pub async fn peek_queue(
    to: impl Into<ConnectionConfig>,
    queue: &str,
    filter: &ReplayFilter,
    limit: u64,
) -> Result<Peek, AmqpError> {
    let mut messages = Vec::new();
    let inspection = inspect_queue_with(to, queue, &InspectOptions::default(), |d| {
        let m = QueuedMessage::read(d);
        if m.selected_by(filter) {
            messages.push(m);
        }
        if u64::try_from(messages.len()).unwrap_or(u64::MAX) >= limit {
            Look::Stop
        } else {
            Look::Next
        }
    })
    .await?;
    Ok(Peek {
        total: inspection.total,
        seen: inspection.seen,
        messages,
        uncertain: inspection.uncertain,
    })
}
