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
//! Memory is bounded: the sample keeps, per message, what an operator decides by (each text
//! redacted and cut at [`HEADER_VALUE_MAX`] bytes), and the details its page shows (headers,
//! typed, and the body, cut at [`BODY_MAX`]) within [`DETAIL_BUDGET`] for the whole sample.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::clock::now_ms;
use fleet_budget::redact::redact_text;
use fleet_budget_amqp::dead_letters::QueueCounts;
use fleet_budget_amqp::headers;
use fleet_budget_amqp::inspect::{Look, inspect_queue_with};
use fleet_budget_amqp::replay::QueuedMessage;
use fleet_budget_amqp::{AmqpError, InspectOptions, ReplayFilter};
use lapin::message::Delivery;
use lapin::types::AMQPValue;

/// Bytes kept of one header value, of each text field of a sampled message, and shown whole on
/// the message page (the lists show less, [`crate::pages`]); the original length is kept
/// beside it, so a cut is said.
pub(crate) const HEADER_VALUE_MAX: usize = 8 * 1024;
/// Headers kept of one message.
const HEADERS_MAX: usize = 64;
/// Bytes kept of one message's body (the message page shows them, escaped).
pub(crate) const BODY_MAX: usize = 64 * 1024;
/// Bytes of headers and bodies kept for the whole sample: beyond it a message's page says its
/// details were not kept (a sample of 10,000 messages of 100 KB headers stays bounded).
pub(crate) const DETAIL_BUDGET: usize = 32 * 1024 * 1024;
/// Entries of a table or an array rendered in a header value.
const NESTED_MAX: usize = 32;

/// One header (or property) as read: its name, its AMQP type in a word, its value as text
/// (redacted, cut at [`HEADER_VALUE_MAX`] bytes), and the length of the whole text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Field {
    pub(crate) name: String,
    pub(crate) kind: &'static str,
    pub(crate) value: String,
    pub(crate) whole_bytes: usize,
}

/// A message's properties and headers.
pub(crate) type HeaderList = Vec<Field>;

/// What the broker's `x-death` header says of one dead-lettering (a queue the message died in).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Death {
    pub(crate) queue: String,
    pub(crate) reason: String,
    pub(crate) count: Option<u64>,
    pub(crate) time_ms: Option<u64>,
    pub(crate) exchange: String,
}

/// One message's details, for its page.
#[derive(Debug, Clone, Default)]
pub(crate) struct Detail {
    pub(crate) headers: HeaderList,
    /// The body, cut at [`BODY_MAX`] bytes (lossy UTF-8; the page escapes it).
    pub(crate) body: String,
    pub(crate) body_bytes: usize,
    pub(crate) content_type: Option<String>,
    /// The broker's own dead-letterings of it (`x-death`), oldest last as the broker keeps them.
    pub(crate) deaths: Vec<Death>,
}

impl Detail {
    fn weight(&self) -> usize {
        self.body.len()
            + self
                .headers
                .iter()
                .map(|f| f.name.len() + f.value.len() + 16)
                .sum::<usize>()
    }

    /// The body pretty-printed when it is JSON (and whole), else as read.
    pub(crate) fn body_shown(&self) -> (String, bool) {
        if self.body.len() == self.body_bytes
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&self.body)
            && let Ok(pretty) = serde_json::to_string_pretty(&v)
        {
            return (cut(&pretty, BODY_MAX * 2).0, true);
        }
        (self.body.clone(), false)
    }
}

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

/// One message of a sample: its fields redacted and each cut at [`HEADER_VALUE_MAX`] bytes
/// (the lists cut them shorter; the message page shows what is kept, and says a cut).
#[derive(Debug, Clone)]
pub(crate) struct Sampled {
    pub(crate) message: QueuedMessage,
    pub(crate) first_failure_ms: Option<u64>,
}

/// A group of the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Group {
    pub(crate) dependency: String,
    pub(crate) reason: String,
    pub(crate) error_class: String,
    pub(crate) count: u64,
    pub(crate) oldest_ms: Option<u64>,
}

impl Group {
    /// The short key its links carry ([`group_key`]).
    pub(crate) fn key(&self) -> String {
        group_key(&self.dependency, &self.reason, &self.error_class)
    }
}

/// A short, stable key of a dependency × reason × error class (16 hex digits of FNV-1a): links
/// name a group by it, never by its text (an error class of 120 KB made a link that answered
/// 414).
pub(crate) fn group_key(dependency: &str, reason: &str, error_class: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [dependency, reason, error_class] {
        for b in part.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// How a list of groups or messages is sorted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Sort {
    /// Most messages first (groups), newest first (messages).
    #[default]
    Default,
    /// Oldest first.
    Oldest,
    /// By name (dependency, or task).
    Name,
}

impl Sort {
    pub(crate) fn parse(s: Option<&str>) -> Self {
        match s {
            Some("oldest") => Self::Oldest,
            Some("name") => Self::Name,
            _ => Self::Default,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Default => "",
            Self::Oldest => "oldest",
            Self::Name => "name",
        }
    }
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
    /// Shared: every page view clones the sample (a clone is then a count, not a copy).
    pub(crate) messages: Arc<Vec<Sampled>>,
    /// Details (headers, body) of messages, by message id, within [`DETAIL_BUDGET`].
    pub(crate) details: Arc<HashMap<String, Detail>>,
    /// Messages read whose details were not kept (the budget was spent).
    pub(crate) details_dropped: u64,
    /// Why the last read failed, if it did (the sample is then the one before).
    pub(crate) error: Option<String>,
    /// Why a read asked for has not started yet (a replay or purge is moving messages).
    pub(crate) waiting: Option<String>,
    /// The queue's depth and dead-letter index, read every refresh (no message read): what
    /// the groups' counts are, exact or labelled an estimate.
    pub(crate) counts: Option<QueueCounts>,
    /// When the counts were read (Unix ms).
    pub(crate) counts_ms: u64,
    /// Why the last read of the counts failed, if it did.
    pub(crate) counts_error: Option<String>,
}

impl Sample {
    /// The groups of the whole queue from its index: each row `filter` may select (a row it
    /// cannot decide, a message id or error text filter or a time inside a minute, is shown),
    /// by dependency × reason × error class, sorted. Empty before the first read.
    pub(crate) fn index_groups(&self, filter: &ReplayFilter, sort: Sort) -> Vec<Group> {
        let Some(counts) = &self.counts else {
            return Vec::new();
        };
        let mut groups: BTreeMap<(&str, &str, &str), Group> = BTreeMap::new();
        for (row, n) in &counts.rows {
            if filter.selects_row(row) == Some(false) {
                continue;
            }
            let g = groups
                .entry((&row.dependency, &row.reason, &row.error_class))
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
        match sort {
            Sort::Default => groups.sort_by(|a, b| {
                b.count
                    .cmp(&a.count)
                    .then_with(|| a.dependency.cmp(&b.dependency))
            }),
            Sort::Oldest => groups.sort_by(|a, b| {
                a.oldest_ms
                    .unwrap_or(u64::MAX)
                    .cmp(&b.oldest_ms.unwrap_or(u64::MAX))
                    .then_with(|| b.count.cmp(&a.count))
            }),
            Sort::Name => groups.sort_by(|a, b| {
                (&a.dependency, &a.reason, &a.error_class).cmp(&(
                    &b.dependency,
                    &b.reason,
                    &b.error_class,
                ))
            }),
        }
        groups
    }

    /// The group of the index whose [`group_key`] is `key`.
    pub(crate) fn group_by_key(&self, filter: &ReplayFilter, key: &str) -> Option<Group> {
        self.index_groups(filter, Sort::Name)
            .into_iter()
            .find(|g| g.key() == key)
    }

    /// Dead letters per dependency in the index: (dependency, messages), most first.
    pub(crate) fn per_dependency(&self) -> Vec<(String, u64)> {
        let Some(counts) = &self.counts else {
            return Vec::new();
        };
        let mut by: BTreeMap<&str, u64> = BTreeMap::new();
        for (row, n) in &counts.rows {
            *by.entry(&row.dependency).or_default() += n;
        }
        let mut out: Vec<(String, u64)> = by.into_iter().map(|(d, n)| (d.to_owned(), n)).collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }

    /// The sampled messages of one group that `filter` selects (`filter` without an error
    /// class: a message's class is compared here as the index keeps it, cut at 256 bytes),
    /// sorted: the page of `per` messages from `offset`, and how many there are in all.
    pub(crate) fn members(
        &self,
        filter: &ReplayFilter,
        error_class: &str,
        sort: Sort,
        offset: usize,
        per: usize,
    ) -> (Vec<&Sampled>, usize) {
        let mut all: Vec<&Sampled> = self
            .messages
            .iter()
            .filter(|s| {
                s.message.selected_by(filter)
                    && row_text(s.message.error_class.as_deref().unwrap_or("")) == error_class
            })
            .collect();
        match sort {
            Sort::Default => all.sort_by_key(|s| std::cmp::Reverse(s.message.dead_lettered_ms)),
            Sort::Oldest => all.sort_by_key(|s| s.message.dead_lettered_ms.unwrap_or(u64::MAX)),
            Sort::Name => all.sort_by(|a, b| a.message.task.cmp(&b.message.task)),
        }
        let total = all.len();
        let page = all.into_iter().skip(offset).take(per).collect();
        (page, total)
    }

    /// One message by id, with its details if they were kept.
    pub(crate) fn message(&self, id: &str) -> Option<(&Sampled, Option<&Detail>)> {
        self.messages
            .iter()
            .find(|s| s.message.message_id.as_deref() == Some(id))
            .map(|s| (s, self.details.get(id)))
    }
}

/// Bytes of a text the dead-letter index keeps in a row (`fleet_budget_amqp::dead_letters::Row`
/// cuts each field there).
pub(crate) const ROW_FIELD_MAX: usize = 256;

/// `text` as a row of the index holds it: cut at [`ROW_FIELD_MAX`] bytes, on a character
/// boundary, unmarked.
pub(crate) fn row_text(text: &str) -> &str {
    let mut end = text.len().min(ROW_FIELD_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or("")
}

/// `text` cut at `max` bytes on a character boundary (the cut marked `…`), and whether it was.
pub(crate) fn cut(text: &str, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text.to_owned(), false);
    }
    (fleet_budget::redact::truncate(text, max), true)
}

/// A text from a message: redacted whole, then cut (a cut first could leave half a secret in
/// a shape the redactor no longer knows).
fn kept(text: &str) -> String {
    cut(&redact_text(text), HEADER_VALUE_MAX).0
}

/// The message's text fields bounded: one longer than [`HEADER_VALUE_MAX`] is redacted whole
/// and cut (a 100 KB task name is kept as 8 KB); shorter ones are kept as read, so that they
/// still match the index's rows, and are redacted where shown (`crate::pages::t`).
fn bounded(mut m: QueuedMessage) -> QueuedMessage {
    for f in [
        &mut m.message_id,
        &mut m.task,
        &mut m.dependency,
        &mut m.reason,
        &mut m.error_class,
        &mut m.error,
        &mut m.park_reason,
        &mut m.unreadable,
    ] {
        if let Some(v) = f.as_mut()
            && v.len() > HEADER_VALUE_MAX
        {
            *v = kept(v);
        }
    }
    m
}

/// Reads up to `sample` messages of `queue` (put back as the library's look does), reading no
/// more once `stop_at` has passed: the look then ends as a look does, its copies confirmed and
/// their originals acked, and the sample is what it read (labelled with its size). Why: a read
/// cut off from outside (a timeout dropping it) closes its channel with copies confirmed whose
/// originals were not acked yet, and those come back beside their copies (8 duplicates at
/// 100,000 dead letters under load, 2026-12-07). The caller's timeout stays, later, for a broker
/// that stops answering.
///
/// # Errors
/// The broker failed or the queue does not exist.
pub(crate) async fn read_sample(
    to: fleet_budget_amqp::ConnectionConfig,
    queue: &str,
    sample: u64,
    stop_at: Instant,
) -> Result<Sample, AmqpError> {
    let started = Instant::now();
    let mut messages = Vec::new();
    let mut details = HashMap::new();
    let mut spent = 0usize;
    let mut dropped = 0u64;
    let options = InspectOptions {
        limit: Some(sample),
        ..InspectOptions::default()
    };
    let inspection = inspect_queue_with(to, queue, &options, |d| {
        let s = Sampled {
            message: bounded(QueuedMessage::read(d)),
            first_failure_ms: headers::get_u64(
                &headers::table(&d.properties),
                headers::FIRST_FAILURE_MS,
            )
            .ok()
            .flatten(),
        };
        if let Some(id) = s.message.message_id.clone() {
            let detail = detail_of(d);
            let weight = detail.weight() + id.len();
            if spent + weight <= DETAIL_BUDGET {
                spent += weight;
                details.insert(id, detail);
            } else {
                dropped += 1;
            }
        }
        messages.push(s);
        if Instant::now() >= stop_at {
            Look::Stop
        } else {
            Look::Next
        }
    })
    .await?;
    if inspection.seen < sample.min(inspection.total) {
        tracing::warn!(
            queue,
            read = inspection.seen,
            present = inspection.total,
            "the sample's read stopped at its time limit: the pages show what it read"
        );
    }
    Ok(Sample {
        queue: queue.to_owned(),
        depth: inspection.total,
        sampled: inspection.seen,
        taken_ms: now_ms(),
        took: started.elapsed(),
        messages: Arc::new(messages),
        details: Arc::new(details),
        details_dropped: dropped,
        ..Sample::default()
    })
}

/// A message's properties, headers and body, bounded and redacted (escaped where shown).
fn detail_of(d: &Delivery) -> Detail {
    let p = &d.properties;
    let mut out = Vec::new();
    let mut put = |name: &str, kind: &'static str, v: String| {
        let whole = redact_text(&v);
        let whole_bytes = whole.len();
        out.push(Field {
            name: name.to_owned(),
            kind,
            value: cut(&whole, HEADER_VALUE_MAX).0,
            whole_bytes,
        });
    };
    if let Some(id) = p.message_id() {
        put("message_id", "property", id.to_string());
    }
    if let Some(kind) = p.kind() {
        put("type", "property", kind.to_string());
    }
    if let Some(ct) = p.content_type() {
        put("content_type", "property", ct.to_string());
    }
    if let Some(t) = p.timestamp() {
        put("timestamp", "property", time_text(*t));
    }
    let table = headers::table(p);
    let entries = table.inner();
    for (k, v) in entries.iter().take(HEADERS_MAX) {
        let (kind, text) = value_text(v, 0);
        put(&format!("header {k}"), kind, text);
    }
    if entries.len() > HEADERS_MAX {
        put(
            "(more headers)",
            "note",
            format!("{} more headers not kept", entries.len() - HEADERS_MAX),
        );
    }
    let deaths = match entries.get("x-death") {
        Some(AMQPValue::FieldArray(a)) => a
            .as_slice()
            .iter()
            .take(NESTED_MAX)
            .filter_map(|v| match v {
                AMQPValue::FieldTable(t) => Some(death_of(t)),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let (body, _) = cut(
        &String::from_utf8_lossy(d.data.get(..BODY_MAX.min(d.data.len())).unwrap_or(&[])),
        BODY_MAX,
    );
    Detail {
        headers: out,
        body: redact_text(&body),
        body_bytes: d.data.len(),
        content_type: p.content_type().as_ref().map(|c| kept(c.as_str())),
        deaths,
    }
}

fn death_of(t: &lapin::types::FieldTable) -> Death {
    let text = |k: &str| {
        t.inner()
            .get(k)
            .map(|v| kept(&value_text(v, 1).1))
            .unwrap_or_default()
    };
    let num = |k: &str| match t.inner().get(k) {
        Some(v) => integer(v).and_then(|n| u64::try_from(n).ok()),
        None => None,
    };
    Death {
        queue: text("queue"),
        reason: text("reason"),
        count: num("count"),
        time_ms: num("time").map(|s| s.saturating_mul(1000)),
        exchange: text("exchange"),
    }
}

fn integer(v: &AMQPValue) -> Option<i128> {
    Some(match v {
        AMQPValue::ShortShortInt(n) => i128::from(*n),
        AMQPValue::ShortShortUInt(n) => i128::from(*n),
        AMQPValue::ShortInt(n) => i128::from(*n),
        AMQPValue::ShortUInt(n) => i128::from(*n),
        AMQPValue::LongInt(n) => i128::from(*n),
        AMQPValue::LongUInt(n) => i128::from(*n),
        AMQPValue::LongLongInt(n) => i128::from(*n),
        AMQPValue::Timestamp(n) => i128::from(*n),
        _ => return None,
    })
}

/// A Unix time in seconds (AMQP timestamps) as RFC 3339.
fn time_text(secs: u64) -> String {
    match std::time::UNIX_EPOCH.checked_add(Duration::from_secs(secs)) {
        Some(at) if secs < 253_402_300_800 => {
            format!("{} ({secs})", humantime::format_rfc3339_seconds(at))
        }
        _ => secs.to_string(),
    }
}

/// A header value as people read it, with its type in a word: numbers as numbers, booleans as
/// `true`/`false`, timestamps as times, tables and arrays with their entries (at most
/// [`NESTED_MAX`], three levels), bytes by their length. No debug print.
fn value_text(v: &AMQPValue, depth: usize) -> (&'static str, String) {
    if let Some(n) = integer(v)
        && !matches!(v, AMQPValue::Timestamp(_))
    {
        return ("integer", n.to_string());
    }
    match v {
        AMQPValue::Boolean(b) => ("boolean", b.to_string()),
        AMQPValue::Float(f) => ("number", f.to_string()),
        AMQPValue::Double(f) => ("number", f.to_string()),
        AMQPValue::DecimalValue(d) => {
            let scale = u32::from(d.scale.min(9));
            let div = 10u64.pow(scale);
            if scale == 0 {
                ("decimal", d.value.to_string())
            } else {
                (
                    "decimal",
                    format!(
                        "{}.{:0width$}",
                        u64::from(d.value) / div,
                        u64::from(d.value) % div,
                        width = scale as usize
                    ),
                )
            }
        }
        AMQPValue::ShortString(s) => ("text", s.to_string()),
        AMQPValue::LongString(s) => ("text", String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::Timestamp(t) => ("time", time_text(*t)),
        AMQPValue::ByteArray(b) => ("bytes", format!("{} bytes", b.as_slice().len())),
        AMQPValue::Void => ("void", String::new()),
        AMQPValue::FieldArray(a) => {
            if depth >= 3 {
                return ("array", format!("[{} entries]", a.as_slice().len()));
            }
            let mut parts: Vec<String> = a
                .as_slice()
                .iter()
                .take(NESTED_MAX)
                .map(|x| nested(x, depth))
                .collect();
            if a.as_slice().len() > NESTED_MAX {
                parts.push(format!("… {} more", a.as_slice().len() - NESTED_MAX));
            }
            ("array", format!("[{}]", parts.join(", ")))
        }
        AMQPValue::FieldTable(t) => {
            if depth >= 3 {
                return ("table", format!("{{{} entries}}", t.inner().len()));
            }
            let mut parts: Vec<String> = t
                .inner()
                .iter()
                .take(NESTED_MAX)
                .map(|(k, x)| format!("{k}: {}", nested(x, depth)))
                .collect();
            if t.inner().len() > NESTED_MAX {
                parts.push(format!("… {} more", t.inner().len() - NESTED_MAX));
            }
            ("table", format!("{{{}}}", parts.join(", ")))
        }
        // Integers are answered above.
        _ => ("value", String::new()),
    }
}

fn nested(v: &AMQPValue, depth: usize) -> String {
    let (_, text) = value_text(v, depth + 1);
    cut(&text, 1024).0
}

/// Refreshes the counts of the dead-letter and parked queues (depth and index: no message
/// read) every `dead_letter_refresh`, or sooner when asked; and reads a sample of messages only
/// when an operator asked for one (`App::sample_wanted`). A sample asked for while a replay or
/// purge moves messages waits for it, and says so; the counts go on being read meanwhile.
pub(crate) async fn keep_samples(app: Arc<crate::App>) {
    use std::sync::atomic::Ordering;

    use fleet_budget::control::DeadLetterIndex;
    use fleet_budget_amqp::Replayer;

    use crate::access::lock;
    loop {
        let read_messages = app.sample_wanted.swap(false, Ordering::Relaxed);
        let mut postponed = false;
        for (i, which) in [Which::Dead, Which::Parked].into_iter().enumerate() {
            let queue = match which {
                Which::Dead => app.topology.dead_queue.clone(),
                Which::Parked => app.topology.parked_queue.clone(),
            };
            let connection = app.settings.config.amqp.connection();
            let source = match which {
                Which::Dead => Replayer::new(connection, app.topology.clone(), None),
                Which::Parked => Replayer::parked(connection, app.topology.clone(), None),
            }
            .with_index(Some(DeadLetterIndex::new(Arc::clone(&app.store))));
            let counts = tokio::time::timeout(app.settings.upstream_timeout, source.counts()).await;
            {
                let mut samples = lock(&app.samples);
                if let Some(slot) = samples.get_mut(i) {
                    slot.queue.clone_from(&queue);
                    match counts {
                        Ok(Ok(c)) => {
                            slot.counts = Some(c);
                            slot.counts_ms = now_ms();
                            slot.counts_error = None;
                        }
                        Ok(Err(e)) => {
                            slot.counts_error = Some(redact_text(&e.to_string()));
                        }
                        Err(_) => {
                            slot.counts_error = Some(format!(
                                "the counts of {queue} passed {:?}",
                                app.settings.upstream_timeout
                            ));
                        }
                    }
                }
            }
            if !read_messages {
                continue;
            }
            // One reader or mover of the queues at a time; a replay or purge under way is not
            // waited for here (the counts above would stop with it): the read is put off.
            let Ok(guard) = app.queue_work.clone().try_lock_owned() else {
                postponed = true;
                if let Some(slot) = lock(&app.samples).get_mut(i) {
                    slot.waiting = Some(
                        "A read of messages was asked for: it waits until the replay or purge under way ends (see Replays); the messages shown are of the sample before."
                            .to_owned(),
                    );
                }
                continue;
            };
            // A sample of a deep queue takes a while: its bound is the sample's size, each
            // broker step has the connection's deadline, and the read stops reading at the
            // refresh period (at least a minute), ending as a look ends; the upstream deadline
            // after that is for a broker that stops answering.
            let reading = app
                .settings
                .dead_letter_refresh
                .max(Duration::from_secs(60));
            let read = tokio::time::timeout(
                reading + app.settings.upstream_timeout,
                read_sample(
                    app.settings.config.amqp.connection(),
                    &queue,
                    app.settings.dead_letter_sample,
                    Instant::now() + reading,
                ),
            )
            .await;
            drop(guard);
            let mut samples = lock(&app.samples);
            let Some(slot) = samples.get_mut(i) else {
                continue;
            };
            slot.waiting = None;
            match read {
                Ok(Ok(sample)) => {
                    let (counts, counts_ms, counts_error) =
                        (slot.counts.take(), slot.counts_ms, slot.counts_error.take());
                    *slot = Sample {
                        counts,
                        counts_ms,
                        counts_error,
                        ..sample
                    };
                }
                Ok(Err(e)) => {
                    slot.error = Some(redact_text(&e.to_string()));
                }
                Err(_) => {
                    slot.error = Some(format!(
                        "the read of {queue} did not end within {:?}",
                        reading + app.settings.upstream_timeout
                    ));
                }
            }
        }
        if postponed {
            app.sample_wanted.store(true, Ordering::Relaxed);
        }
        tokio::select! {
            () = tokio::time::sleep(app.settings.dead_letter_refresh) => {}
            () = app.refresh_now.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read whose time is up stops reading and ends as a look ends: its copies confirmed,
    /// their originals acked, so that every message is in the queue once afterwards (a read cut
    /// off by a timeout had left copies beside originals).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sample_stopped_at_its_time_leaves_every_message_once() {
        use std::collections::BTreeSet;

        use fleet_budget::DeadLetterReason;
        use fleet_budget_amqp::testing::TestBroker;

        const SEEDED: u32 = 1_000;
        let seeded_len = usize::try_from(SEEDED).expect("a small count");
        let broker = TestBroker::new("console-sample-stop");
        broker.migrate().await;
        let publisher = broker.publisher().await;
        let seeded = broker
            .seed_dead_letters(
                &publisher,
                seeded_len,
                "search",
                DeadLetterReason::BudgetExhausted,
                0,
                now_ms(),
            )
            .await;
        publisher.close().await;
        let queue = broker.topology.dead_queue.clone();
        // Time up before the first message, then at points into the read that fall, on this
        // machine, mid-batch (the read pipelines 256 copies at a time after its connect).
        let mut read = Vec::new();
        for allowed in [0, 200, 400, 700].map(Duration::from_millis) {
            let sample = read_sample(
                fleet_budget_amqp::ConnectionConfig::from(&broker.url),
                &queue,
                10_000,
                Instant::now() + allowed,
            )
            .await
            .expect("the sample's read");
            read.push(sample.sampled);
        }
        println!("sampled {read:?} of {SEEDED}, each read stopped at its time");
        assert_eq!(
            read[0], 1,
            "a read whose time is up takes one message and stops"
        );
        assert!(read.iter().all(|&n| n <= u64::from(SEEDED)), "{read:?}");
        let ready = broker
            .depth_reaching(&queue, SEEDED, Duration::from_secs(30))
            .await;
        let left = broker.drain(&queue).await;
        let ids: BTreeSet<String> = left
            .iter()
            .filter_map(|(p, _)| p.message_id().as_ref().map(ToString::to_string))
            .collect();
        assert_eq!(ready, SEEDED);
        assert_eq!(
            left.len(),
            seeded_len,
            "every message once: no copy beside its original"
        );
        assert_eq!(ids, seeded.into_iter().collect::<BTreeSet<_>>());
    }

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
            messages: Arc::new(vec![
                sampled("search", "budget_exhausted", "timeout", 30),
                sampled("search", "budget_exhausted", "http_503", 20),
            ]),
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
        let all = sample.index_groups(&ReplayFilter::default(), Sort::Default);
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
        assert!(sample.index_groups(&mail, Sort::Default).is_empty());
        let search = ReplayFilter {
            dependency: Some("search".into()),
            ..ReplayFilter::default()
        };
        assert_eq!(
            sample.members(&search, "http_503", Sort::Default, 0, 10).1,
            1
        );
        assert!(sample.message("search-30").is_some());
    }
}
