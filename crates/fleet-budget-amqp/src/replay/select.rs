//! Which dead-lettered messages a replay is about ([`ReplayFilter`]), how it runs
//! ([`ReplayOptions`]), and the sorting of each message read: malformed, not selected, looping,
//! or to be replayed.

use std::time::Duration;

use fleet_budget::DeadLetterReason;
use lapin::message::Delivery;

use super::control::RateControl;
use crate::config::WorkerConfig;
use crate::dead_letters::bounded;
use crate::dead_letters::{Row, UNREADABLE};
use crate::headers::{self, DeadLetterRecord};
use crate::publish::SHORT_STRING_MAX;

/// Which dead-lettered messages a replay is about. Empty fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayFilter {
    /// Only this dependency.
    pub dependency: Option<String>,
    /// Only this reason.
    pub reason: Option<DeadLetterReason>,
    /// Only messages dead-lettered at or after this time (Unix ms).
    pub since_ms: Option<u64>,
    /// Only messages dead-lettered before this time (Unix ms).
    pub until_ms: Option<u64>,
    /// Only jobs of this task (compared on its first 256 bytes, as the dead-letter index keeps
    /// it, like `dependency` and `error_class`).
    pub task: Option<String>,
    /// Only the message with this id.
    pub message_id: Option<String>,
    /// Only messages whose (redacted) error text contains this.
    pub error_contains: Option<String>,
    /// Only messages of this error class (its first 256 bytes: a row of the index keeps no
    /// more, so a longer class selects what its row counts).
    pub error_class: Option<String>,
    /// Also select the messages whose dead-letter headers cannot be read (a producer's garbage,
    /// the broker's own dead letters), which a run parks. An empty filter selects them anyway;
    /// any other selects them only with this.
    pub malformed: bool,
}

impl ReplayFilter {
    /// Whether the filter selects everything (then messages whose headers cannot be read are
    /// selected too: nothing in them can be trusted to match a field).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// Whether messages whose dead-letter headers cannot be read are selected: by an empty
    /// filter, or one with [`ReplayFilter::malformed`].
    #[must_use]
    pub fn selects_malformed(&self) -> bool {
        self.malformed || self.is_empty()
    }

    /// Whether every message counted under `row` is selected (`Some(true)`), none is
    /// (`Some(false)`), or the row cannot tell (`None`: the filter names a message id or error
    /// text, which no row keeps, or a time inside the row's minute).
    #[must_use]
    pub fn selects_row(&self, row: &Row) -> Option<bool> {
        if row.reason == UNREADABLE {
            return Some(self.selects_malformed());
        }
        let same =
            |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| bounded(w) == have);
        let fields = same(&self.dependency, &row.dependency)
            && same(&self.task, &row.task)
            && same(&self.error_class, &row.error_class)
            && self.reason.is_none_or(|r| r.as_str() == row.reason);
        if !fields {
            return Some(false);
        }
        // The row's messages were dead-lettered in [start, end).
        let (start, end) = (
            row.minute.saturating_mul(60_000),
            row.minute.saturating_add(1).saturating_mul(60_000),
        );
        let mut certain = true;
        if let Some(t) = self.since_ms {
            if end <= t {
                return Some(false);
            }
            certain &= start >= t;
        }
        if let Some(t) = self.until_ms {
            if start >= t {
                return Some(false);
            }
            certain &= end <= t;
        }
        if self.message_id.is_some() || self.error_contains.is_some() {
            certain = false;
        }
        certain.then_some(true)
    }

    /// Whether `record`, of the message with id `message_id`, is selected.
    #[must_use]
    pub fn matches_message(&self, record: &DeadLetterRecord, message_id: Option<&str>) -> bool {
        self.matches(record)
            && self
                .message_id
                .as_deref()
                .is_none_or(|id| message_id == Some(id))
    }

    /// Whether `record` is selected (every field but `message_id`, which the record lacks).
    #[must_use]
    pub fn matches(&self, record: &DeadLetterRecord) -> bool {
        let same = |want: &Option<String>, have: &str| {
            want.as_deref().is_none_or(|w| bounded(w) == bounded(have))
        };
        same(&self.task, &record.task)
            && self
                .error_contains
                .as_deref()
                .is_none_or(|e| record.error.contains(e))
            && same(&self.dependency, &record.dependency)
            && self.reason.is_none_or(|r| r == record.reason)
            && same(&self.error_class, &record.error_class)
            && self.since_ms.is_none_or(|t| record.dead_lettered_ms >= t)
            && self.until_ms.is_none_or(|t| record.dead_lettered_ms < t)
    }
}

/// How a replay runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayOptions {
    /// What to replay.
    pub filter: ReplayFilter,
    /// Messages moved per second; `None` is unpaced.
    pub rate: Option<f64>,
    /// A message already replayed this many times is parked instead (default
    /// `amqp.max_replays`, 3).
    pub max_replays: u32,
    /// How often an exhausted budget is asked again while paused.
    pub budget_poll: Duration,
    /// How long a fresh "not exhausted" answer is trusted before asking again.
    pub budget_cache: Duration,
    /// The run ends early when no message arrives for this long (another consumer took them).
    pub idle_timeout: Duration,
    /// Copies awaiting their confirmation at a time.
    pub window: usize,
    /// Move at most this many messages; further matching ones are left in the dead-letter
    /// queue and counted as skipped (`None`: no limit).
    pub limit: Option<u64>,
    /// How the rate follows the dependency's failures (the closed loop; `rate` is its
    /// maximum).
    pub control: RateControl,
}

impl ReplayOptions {
    /// Unfiltered, unpaced, with `config.amqp.max_replays`.
    #[must_use]
    pub fn new(config: &WorkerConfig) -> Self {
        Self {
            filter: ReplayFilter::default(),
            rate: None,
            max_replays: config.amqp.max_replays,
            budget_poll: Duration::from_millis(250),
            budget_cache: Duration::from_millis(100),
            idle_timeout: Duration::from_secs(3),
            window: 256,
            limit: None,
            control: RateControl::default(),
        }
    }
}

/// What becomes of one dead-lettered message.
pub(super) enum Class {
    /// Not a readable dead-letter, selected ([`ReplayFilter::selects_malformed`]): parked with
    /// this reason. (No field of a filter can match one: nothing in it can be trusted.)
    Malformed(String),
    /// Not selected by the filter, or beyond the limit: left in the dead-letter queue.
    Skip,
    /// Replayed `max_replays` times already: parked.
    Looping(DeadLetterRecord),
    /// To be moved back.
    Replay(DeadLetterRecord),
}

/// Sorts the messages of one run (or dry run), in the order they are read.
pub(super) struct Selection<'a> {
    options: &'a ReplayOptions,
    /// Messages sorted [`Class::Replay`] so far (what the limit counts).
    replays: u64,
}

impl<'a> Selection<'a> {
    pub(super) fn new(options: &'a ReplayOptions) -> Self {
        Self {
            options,
            replays: 0,
        }
    }

    /// Sorts the next message read.
    pub(super) fn sort(&mut self, delivery: &Delivery) -> Class {
        let filter = &self.options.filter;
        // A message id names one message, malformed or not.
        let named = |id: Option<&str>| filter.message_id.as_deref().is_none_or(|w| id == Some(w));
        match self.sort_all(delivery) {
            Class::Malformed(_)
                if !filter.selects_malformed()
                    || !named(headers::message_id(&delivery.properties)) =>
            {
                Class::Skip
            }
            class => class,
        }
    }

    /// Sorts the next message read, malformed ones whatever the filter.
    fn sort_all(&mut self, delivery: &Delivery) -> Class {
        let table = headers::table(&delivery.properties);
        let record = match DeadLetterRecord::parse(&table) {
            Err(e) => {
                let broker = headers::get_str(&table, headers::BROKER_FIRST_DEATH_REASON)
                    .ok()
                    .flatten();
                return Class::Malformed(match broker {
                    Some(r) => format!(
                        "malformed dead-letter: {e} (dead-lettered by the broker, reason {r})"
                    ),
                    None => format!("malformed dead-letter: {e}"),
                });
            }
            Ok(r) => r,
        };
        if record.original_routing_key.len() > SHORT_STRING_MAX
            || record.original_exchange.len() > SHORT_STRING_MAX
        {
            // It could never be published back: parked, not failed on every run forever.
            return Class::Malformed(format!(
                "its original exchange or routing key is over {SHORT_STRING_MAX} bytes: it can never be published back"
            ));
        }
        if let Ok(Some(removed)) = headers::get_str(&table, headers::UNREADABLE_HEADERS) {
            // The job is no longer what its producer sent: it would only come back here.
            return Class::Malformed(format!(
                "its headers could not be read and were removed on receipt ({removed})"
            ));
        }
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str());
        if !self.options.filter.matches_message(&record, id) {
            Class::Skip
        } else if record.replays >= self.options.max_replays {
            Class::Looping(record)
        } else if self.options.limit.is_some_and(|l| self.replays >= l) {
            Class::Skip
        } else {
            self.replays += 1;
            Class::Replay(record)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn record(error_class: &str) -> DeadLetterRecord {
        DeadLetterRecord {
            task: "index".into(),
            dependency: "search".into(),
            reason: DeadLetterReason::BudgetExhausted,
            original_exchange: "jobs".into(),
            original_routing_key: "search".into(),
            original_queue: "jobs".into(),
            attempts: 3,
            first_failure_ms: 1,
            dead_lettered_ms: 120_000,
            error_class: error_class.into(),
            error: String::new(),
            budget: None,
            budget_source: None,
            replays: 0,
        }
    }

    /// A class longer than a row keeps (a console row's button, a filter typed from `dlq stats`)
    /// selects the messages its row counts: the dry run by row and the run by message agree.
    #[test]
    fn a_long_error_class_selects_what_its_row_counts() {
        let long = format!("{}tail", "é".repeat(200));
        let r = record(&long);
        let row = Row::of_record(&r);
        for filter_class in [long, row.error_class.clone()] {
            let filter = ReplayFilter {
                error_class: Some(filter_class),
                ..ReplayFilter::default()
            };
            assert!(filter.matches(&r));
            assert_eq!(filter.selects_row(&row), Some(true));
        }
        let other = ReplayFilter {
            error_class: Some("timeout".into()),
            ..ReplayFilter::default()
        };
        assert!(!other.matches(&r));
        assert_eq!(other.selects_row(&row), Some(false));
    }
}
