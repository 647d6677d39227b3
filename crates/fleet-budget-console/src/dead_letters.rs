//! The dead-letter and parked queues, grouped by dependency × reason × error class from their
//! dead-letter index (`fleet_budget_amqp::dead_letters`: counts of the whole queue, read in the
//! background every refresh, no message read), and messages one by one from a sample read only
//! when an operator asks for one.
//!
//! Why the index for counts: RabbitMQ cannot be asked "how many dead letters of `search` failed
//! with `timeout`" without reading each message, and a read of 100,000 messages (each put back as
//! a fresh copy, `fleet_budget_amqp::inspect`) takes minutes and rewrites the queue; a sample's
//! counts were the sample's (2,908 shown for a group of 28,919). The index counts the whole queue
//! as messages enter and leave; the page shows it beside the depth, exact or an estimate with
//! why. Messages one by one still need a read: that one is the sample, at most `sample`
//! messages, read only when an operator asks ("Read messages now"), never by a page view.
//!
//! Memory is bounded: the sample keeps, per message, what an operator decides by (about 1 kB
//! with the error text, bounded at 512 bytes by the library), and the headers of at most
//! [`HEADERS_PER_GROUP`] messages per group (each value at most [`HEADER_VALUE_MAX`] chars).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use fleet_budget::clock::now_ms;
use fleet_budget::redact::redact_text;
use fleet_budget_amqp::dead_letters::QueueCounts;
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
    /// The queue's depth and dead-letter index, read every refresh (no message read): what
    /// the groups' counts are, exact or labelled an estimate.
    pub(crate) counts: Option<QueueCounts>,
    /// Why the last read of the counts failed, if it did.
    pub(crate) counts_error: Option<String>,
}

impl Sample {
    /// The groups of the whole queue from its index: each row `filter` may select (a row it
    /// cannot decide, a message id or error text filter or a time inside a minute, is shown),
    /// by dependency × reason × error class, most messages first. Empty before the first read.
    pub(crate) fn index_groups(&self, filter: &ReplayFilter) -> Vec<Group> {
        let Some(counts) = &self.counts else {
            return Vec::new();
        };
        let mut groups: BTreeMap<(String, String, String), Group> = BTreeMap::new();
        for (row, n) in &counts.rows {
            if filter.selects_row(row) == Some(false) {
                continue;
            }
            let g = groups
                .entry((
                    row.dependency.clone(),
                    row.reason.clone(),
                    row.error_class.clone(),
                ))
                .or_insert_with(|| Group {
                    dependency: row.dependency.clone(),
                    reason: row.reason.clone(),
                    error_class: row.error_class.clone(),
                    count: 0,
                    oldest_ms: None,
                });
            g.count += n;
            if row.minute > 0 {
                let at = row.minute.saturating_mul(60_000);
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
            .filter(|s| {
                s.message.selected_by(filter)
                    && s.message.error_class.as_deref().unwrap_or("") == error_class
            })
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
        counts: None,
        counts_error: None,
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
    fn groups_come_from_the_index_and_members_from_the_sample() {
        use fleet_budget_amqp::dead_letters::Row;
        let row = |dep: &str, class: &str, minute: u64| Row {
            dependency: dep.to_owned(),
            reason: "budget_exhausted".to_owned(),
            error_class: class.to_owned(),
            task: "t".to_owned(),
            original_exchange: "x".to_owned(),
            replays: 0,
            minute,
        };
        let sample = Sample {
            messages: vec![
                sampled("search", "budget_exhausted", "timeout", 30),
                sampled("search", "budget_exhausted", "http_503", 20),
            ],
            counts: Some(QueueCounts {
                depth: 28_922,
                rows: vec![
                    (row("search", "timeout", 3), 28_000),
                    (row("search", "timeout", 2), 919),
                    (row("search", "http_503", 2), 3),
                ],
                ..QueueCounts::default()
            }),
            ..Sample::default()
        };
        let all = sample.index_groups(&ReplayFilter::default());
        assert_eq!(
            all.iter()
                .map(|g| (g.error_class.as_str(), g.count, g.oldest_ms))
                .collect::<Vec<_>>(),
            [
                ("timeout", 28_919, Some(120_000)),
                ("http_503", 3, Some(120_000))
            ],
            "the whole queue's counts, not a sample's"
        );
        let mail = ReplayFilter {
            dependency: Some("mail".into()),
            ..ReplayFilter::default()
        };
        assert!(sample.index_groups(&mail).is_empty());
        let search = ReplayFilter {
            dependency: Some("search".into()),
            ..ReplayFilter::default()
        };
        assert_eq!(sample.members(&search, "http_503", 10).len(), 1);
        assert!(sample.message("search-30").is_some());
    }
}
