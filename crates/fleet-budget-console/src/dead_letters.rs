//! The dead-letter and parked queues, grouped by dependency × reason × error class, from a
//! sample kept in memory and refreshed in the background.
//!
//! Why a sample: RabbitMQ cannot be asked "how many dead letters of `search` failed with
//! `timeout`" without reading each message, and a read of 100,000 messages (each put back as a
//! fresh copy, `fleet_budget_amqp::inspect`) takes minutes. A page view must not do that, nor
//! may ten operators' browsers do it ten times. So one background task reads at most
//! `sample` messages of each queue every `refresh` (a look moves the messages it read to the
//! tail, so successive samples of a deep queue cover different messages), and every page
//! reads the sample: its age, its size and the queue's depth (a passive declare, cheap) are on
//! the page beside the counts.
//!
//! Memory is bounded: the sample keeps, per message, what an operator decides by (about 1 kB
//! with the error text, bounded at 512 bytes by the library), and the headers of at most
//! [`HEADERS_PER_GROUP`] messages per group (each value at most [`HEADER_VALUE_MAX`] chars).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use fleet_budget::clock::now_ms;
use fleet_budget::redact::redact_text;
use fleet_budget_amqp::headers;
use fleet_budget_amqp::replay::QueuedMessage;
use fleet_budget_amqp::{AmqpError, InspectOptions, ReplayFilter, inspect_queue};
use lapin::message::Delivery;
use lapin::types::AMQPValue;

/// Messages per group whose headers are kept (the message page reads them).
pub(crate) const HEADERS_PER_GROUP: usize = 50;
/// Characters kept of one header value.
pub(crate) const HEADER_VALUE_MAX: usize = 2_000;
/// Headers kept of one message.
const HEADERS_MAX: usize = 64;

/// A message's properties and headers as text: (name, value).
pub(crate) type HeaderList = Vec<(String, String)>;

/// Which queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Which {
    Dead,
    Parked,
}

impl Which {
    pub(crate) fn parse(s: Option<&str>) -> Self {
        if s == Some("parked") {
            Self::Parked
        } else {
            Self::Dead
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Dead => "dead",
            Self::Parked => "parked",
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Dead => "dead-letter",
            Self::Parked => "parked",
        }
    }
}

/// One message of a sample.
#[derive(Debug, Clone)]
pub(crate) struct Sampled {
    pub(crate) message: QueuedMessage,
    pub(crate) first_failure_ms: Option<u64>,
}

impl Sampled {
    /// The group's key: dependency, reason, error class (`?` where unknown).
    pub(crate) fn group(&self) -> (String, String, String) {
        let m = &self.message;
        let or = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".to_owned());
        (or(&m.dependency), or(&m.reason), or(&m.error_class))
    }
}

/// A group of the sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Group {
    pub(crate) dependency: String,
    pub(crate) reason: String,
    pub(crate) error_class: String,
    pub(crate) count: u64,
    pub(crate) oldest_ms: Option<u64>,
}

/// What the last read of one queue found.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sample {
    pub(crate) queue: String,
    /// Messages in the queue when it was read.
    pub(crate) depth: u64,
    /// Messages read.
    pub(crate) sampled: u64,
    /// When the read ended (Unix ms), 0 before the first.
    pub(crate) taken_ms: u64,
    /// How long the read took.
    pub(crate) took: Duration,
    pub(crate) messages: Vec<Sampled>,
    /// Headers of some messages, by message id.
    pub(crate) headers: HashMap<String, HeaderList>,
    /// Why the last read failed, if it did (the sample is then the one before).
    pub(crate) error: Option<String>,
}

impl Sample {
    /// The groups of the messages `filter` selects, most messages first.
    pub(crate) fn groups(&self, filter: &ReplayFilter) -> Vec<Group> {
        let mut groups: BTreeMap<(String, String, String), Group> = BTreeMap::new();
        for s in self
            .messages
            .iter()
            .filter(|s| s.message.selected_by(filter))
        {
            let (dependency, reason, error_class) = s.group();
            let g = groups
                .entry((dependency.clone(), reason.clone(), error_class.clone()))
                .or_insert(Group {
                    dependency,
                    reason,
                    error_class,
                    count: 0,
                    oldest_ms: None,
                });
            g.count += 1;
            if let Some(at) = s.message.dead_lettered_ms {
                g.oldest_ms = Some(g.oldest_ms.map_or(at, |o| o.min(at)));
            }
        }
        let mut groups: Vec<Group> = groups.into_values().collect();
        groups.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.dependency.cmp(&b.dependency))
        });
        groups
    }

    /// The messages of one group that `filter` selects, at most `limit`.
    pub(crate) fn members(
        &self,
        filter: &ReplayFilter,
        error_class: &str,
        limit: usize,
    ) -> Vec<&Sampled> {
        self.messages
            .iter()
            .filter(|s| s.message.selected_by(filter) && s.group().2 == error_class)
            .take(limit)
            .collect()
    }

    /// One message by id, with its headers if they were kept.
    pub(crate) fn message(&self, id: &str) -> Option<(&Sampled, Option<&HeaderList>)> {
        self.messages
            .iter()
            .find(|s| s.message.message_id.as_deref() == Some(id))
            .map(|s| (s, self.headers.get(id)))
    }
}

/// Reads up to `sample` messages of `queue` (put back as the library's look does).
///
/// # Errors
/// The broker failed or the queue does not exist.
pub(crate) async fn read_sample(
    to: fleet_budget_amqp::ConnectionConfig,
    queue: &str,
    sample: u64,
) -> Result<Sample, AmqpError> {
    let started = Instant::now();
    let mut messages = Vec::new();
    let mut kept: HashMap<(String, String, String), usize> = HashMap::new();
    let mut headers_of = HashMap::new();
    let options = InspectOptions {
        limit: Some(sample),
        ..InspectOptions::default()
    };
    let inspection = inspect_queue(to, queue, &options, |d| {
        let s = Sampled {
            message: QueuedMessage::read(d),
            first_failure_ms: headers::get_u64(
                &headers::table(&d.properties),
                headers::FIRST_FAILURE_MS,
            )
            .ok()
            .flatten(),
        };
        let n = kept.entry(s.group()).or_default();
        if let Some(id) = s.message.message_id.clone()
            && *n < HEADERS_PER_GROUP
        {
            *n += 1;
            headers_of.insert(id, header_list(d));
        }
        messages.push(s);
    })
    .await?;
    Ok(Sample {
        queue: queue.to_owned(),
        depth: inspection.total,
        sampled: inspection.seen,
        taken_ms: now_ms(),
        took: started.elapsed(),
        messages,
        headers: headers_of,
        error: None,
    })
}

/// A message's properties and headers as text (redacted; escaped where shown).
fn header_list(d: &Delivery) -> HeaderList {
    let p = &d.properties;
    let mut out = Vec::new();
    let mut put = |k: String, v: String| {
        let v: String = redact_text(&v).chars().take(HEADER_VALUE_MAX).collect();
        out.push((k, v));
    };
    if let Some(id) = p.message_id() {
        put("message_id".to_owned(), id.to_string());
    }
    if let Some(kind) = p.kind() {
        put("type".to_owned(), kind.to_string());
    }
    if let Some(ct) = p.content_type() {
        put("content_type".to_owned(), ct.to_string());
    }
    if let Some(t) = p.timestamp() {
        put("timestamp".to_owned(), t.to_string());
    }
    put("body_bytes".to_owned(), d.data.len().to_string());
    for (k, v) in headers::table(p).inner().iter().take(HEADERS_MAX) {
        put(format!("header {k}"), value_text(v));
    }
    out
}

fn value_text(v: &AMQPValue) -> String {
    match v {
        AMQPValue::LongString(s) => s.to_string(),
        AMQPValue::ShortString(s) => s.to_string(),
        other => {
            let text = format!("{other:?}");
            text.chars().take(HEADER_VALUE_MAX).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampled(dep: &str, reason: &str, class: &str, at: u64) -> Sampled {
        Sampled {
            message: QueuedMessage {
                message_id: Some(format!("{dep}-{at}")),
                dependency: Some(dep.to_owned()),
                reason: Some(reason.to_owned()),
                error_class: Some(class.to_owned()),
                dead_lettered_ms: Some(at),
                ..QueuedMessage::default()
            },
            first_failure_ms: None,
        }
    }

    #[test]
    fn groups_count_and_keep_the_oldest() {
        let sample = Sample {
            messages: vec![
                sampled("search", "budget_exhausted", "timeout", 30),
                sampled("search", "budget_exhausted", "timeout", 10),
                sampled("search", "budget_exhausted", "http_503", 20),
                sampled("mail", "non_retryable", "bad_request", 5),
            ],
            ..Sample::default()
        };
        let all = sample.groups(&ReplayFilter::default());
        assert_eq!(all.len(), 3);
        assert_eq!(
            all.first().map(|g| (g.count, g.oldest_ms)),
            Some((2, Some(10)))
        );
        let search = ReplayFilter {
            dependency: Some("search".into()),
            ..ReplayFilter::default()
        };
        assert_eq!(sample.groups(&search).len(), 2);
        assert_eq!(sample.members(&search, "http_503", 10).len(), 1);
        assert!(sample.message("mail-5").is_some());
    }
}
