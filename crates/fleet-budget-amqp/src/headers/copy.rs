//! The properties of a copy that must outlive its reader: a dead-letter, a park, a replay, a
//! message put back after an inspection. None of them may expire, whatever the original carried.
//!
//! A producer's per-message `expiration` is a relative TTL the broker applies in every queue the
//! message enters: copied onto a dead-letter it deletes the dead-letter a few seconds later, before
//! anyone replays it. So copies drop it and keep its value in
//! [`super::ORIGINAL_EXPIRATION`] (for the handler and the operator). Replay does **not** restore it
//! on the job sent back to the work queue: the TTL measured the producer's patience with the first
//! delivery; a replay is an operator's decision, after the incident, to run the job anyway, and a
//! restored TTL would let the broker expire the replayed job again (into the dead-letter queue
//! without the headers that explain it). Retry-tier copies drop it too: a tier queue's own
//! `x-message-ttl` is the only clock they run on.
//!
//! Two more properties of the original can make every copy unpublishable, so that the job would
//! loop instead of being dead-lettered or parked:
//!
//! * `user_id`: the broker refuses a publish whose `user_id` is not the publishing connection's
//!   user (`PRECONDITION_FAILED`), and a worker rarely runs as the producer's user. Copies drop
//!   it and keep it in [`super::ORIGINAL_USER_ID`].
//! * headers too large for one frame: the content header (all properties) must fit in one frame
//!   of the connection's `frame_max` (128 KiB on RabbitMQ by default), and a copy adds its own
//!   headers to the original's. [`fit_frame`] drops the largest headers until it fits and names
//!   each in [`super::DROPPED_HEADERS`] (the body, the job itself, is never touched).

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::fields::{get_str, remove, set_str};
use super::{DROPPED_HEADERS, ERROR_TEXT_MAX_BYTES, ORIGINAL_EXPIRATION, ORIGINAL_USER_ID};

/// `properties` without `expiration` and `user_id` (their values kept in
/// [`ORIGINAL_EXPIRATION`] and [`ORIGINAL_USER_ID`] unless those headers are already set), with
/// `headers` as the headers.
#[must_use]
pub fn without_expiration(
    properties: &BasicProperties,
    mut headers: FieldTable,
) -> BasicProperties {
    for (value, header) in [
        (properties.expiration(), ORIGINAL_EXPIRATION),
        (properties.user_id(), ORIGINAL_USER_ID),
    ] {
        if let Some(v) = value
            && get_str(&headers, header).ok().flatten().is_none()
        {
            set_str(&mut headers, header, v.as_str());
        }
    }
    let p = properties;
    let mut out = BasicProperties::default().with_headers(headers);
    if let Some(v) = p.content_type() {
        out = out.with_content_type(v.clone());
    }
    if let Some(v) = p.content_encoding() {
        out = out.with_content_encoding(v.clone());
    }
    if let Some(v) = p.delivery_mode() {
        out = out.with_delivery_mode(*v);
    }
    if let Some(v) = p.priority() {
        out = out.with_priority(*v);
    }
    if let Some(v) = p.correlation_id() {
        out = out.with_correlation_id(v.clone());
    }
    if let Some(v) = p.reply_to() {
        out = out.with_reply_to(v.clone());
    }
    if let Some(v) = p.message_id() {
        out = out.with_message_id(v.clone());
    }
    if let Some(v) = p.timestamp() {
        out = out.with_timestamp(*v);
    }
    if let Some(v) = p.kind() {
        out = out.with_type(v.clone());
    }
    if let Some(v) = p.app_id() {
        out = out.with_app_id(v.clone());
    }
    if let Some(v) = p.cluster_id() {
        out = out.with_cluster_id(v.clone());
    }
    out
}

/// The properties of `delivery` put back into the queue it was read from after an inspection:
/// the same message (id, body, headers) without `x-delivery-count` (the copy is a fresh message
/// to the broker: nothing counts the look against it) and without `expiration`.
#[must_use]
pub fn put_back(properties: &BasicProperties) -> BasicProperties {
    let mut table = properties.headers().clone().unwrap_or_default();
    super::fields::remove(&mut table, "x-delivery-count");
    without_expiration(properties, table).with_delivery_mode(2)
}

/// Bytes of a content-header frame besides the properties: frame header (7) and end (1), class
/// and weight (4), body size (8), property flags (2).
const HEADER_FRAME_OVERHEAD: usize = 22;

/// The encoded size of the content-header frame that carries `properties`, in bytes.
#[must_use]
pub fn header_frame_size(properties: &BasicProperties) -> usize {
    let short = |s: &Option<ShortString>| s.as_ref().map_or(0, |s| 1 + s.as_str().len());
    let p = properties;
    HEADER_FRAME_OVERHEAD
        + short(p.content_type())
        + short(p.content_encoding())
        + p.headers().as_ref().map_or(0, table_size)
        + p.delivery_mode().map_or(0, |_| 1)
        + p.priority().map_or(0, |_| 1)
        + short(p.correlation_id())
        + short(p.reply_to())
        + short(p.expiration())
        + short(p.message_id())
        + p.timestamp().map_or(0, |_| 8)
        + short(p.kind())
        + short(p.user_id())
        + short(p.app_id())
        + short(p.cluster_id())
}

fn table_size(t: &FieldTable) -> usize {
    4 + t
        .inner()
        .iter()
        .map(|(k, v)| entry_size(k.as_str(), v))
        .sum::<usize>()
}

fn entry_size(key: &str, value: &AMQPValue) -> usize {
    1 + key.len() + 1 + value_size(value)
}

fn value_size(v: &AMQPValue) -> usize {
    match v {
        AMQPValue::Void => 0,
        AMQPValue::Boolean(_) | AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => 1,
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => 2,
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) | AMQPValue::Float(_) => 4,
        AMQPValue::DecimalValue(_) => 5,
        AMQPValue::LongLongInt(_) | AMQPValue::Double(_) | AMQPValue::Timestamp(_) => 8,
        AMQPValue::ShortString(s) => 1 + s.as_str().len(),
        AMQPValue::LongString(s) => 4 + s.as_bytes().len(),
        AMQPValue::ByteArray(b) => 4 + b.as_slice().len(),
        AMQPValue::FieldArray(a) => {
            4 + a
                .as_slice()
                .iter()
                .map(|v| 1 + value_size(v))
                .sum::<usize>()
        }
        AMQPValue::FieldTable(t) => table_size(t),
    }
}

/// `properties` fitted to a content-header frame of at most `frame_max` bytes: while they do not
/// fit, the largest header is dropped and named, with its size, in [`DROPPED_HEADERS`] (a long
/// string of at most 512 bytes, itself never dropped). Unchanged when they fit. The other
/// properties are short strings of at most 255 bytes each, so dropping headers always makes them
/// fit a frame of the protocol's minimum size (4,096 bytes).
#[must_use]
pub fn fit_frame(properties: BasicProperties, frame_max: usize) -> BasicProperties {
    if header_frame_size(&properties) <= frame_max {
        return properties;
    }
    let mut table = properties.headers().clone().unwrap_or_default();
    // A copy of a copy: the list of the earlier note goes on.
    let mut dropped: Vec<String> = get_str(&table, DROPPED_HEADERS)
        .ok()
        .flatten()
        .map(|note| {
            note.split_once(": ")
                .map_or(note.clone(), |(_, list)| list.to_owned())
        })
        .into_iter()
        .collect();
    remove(&mut table, DROPPED_HEADERS);
    // Room for the note: its entry at its longest.
    let note_room = entry_size(
        DROPPED_HEADERS,
        &AMQPValue::LongString(vec![0; ERROR_TEXT_MAX_BYTES].into()),
    );
    let without_headers =
        header_frame_size(&properties.clone().with_headers(FieldTable::default()));
    loop {
        if without_headers + table_size(&table) + note_room <= frame_max {
            break;
        }
        let largest = table
            .inner()
            .iter()
            .map(|(k, v)| (entry_size(k.as_str(), v), k.clone()))
            .max();
        let Some((size, key)) = largest else { break };
        remove(&mut table, key.as_str());
        dropped.push(format!("{} ({size} bytes)", key.as_str()));
    }
    let mut note = format!(
        "dropped so that the message fits one frame of {frame_max} bytes: {}",
        dropped.join(", ")
    );
    if note.len() > ERROR_TEXT_MAX_BYTES {
        let mut end = ERROR_TEXT_MAX_BYTES - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    set_str(&mut table, DROPPED_HEADERS, &note);
    properties.with_headers(table)
}

/// Whether the properties carry an `expiration` (tests and checks).
#[must_use]
pub fn expires(properties: &BasicProperties) -> bool {
    properties
        .expiration()
        .as_ref()
        .is_some_and(|e: &ShortString| !e.as_str().is_empty())
}

#[cfg(test)]
mod tests {
    use lapin::types::AMQPValue;

    use super::*;

    #[test]
    fn copies_drop_the_user_id_the_broker_would_refuse_and_keep_it_in_a_header() {
        let p = BasicProperties::default()
            .with_user_id("alice".into())
            .with_message_id("m1".into());
        let c = put_back(&p);
        assert!(c.user_id().is_none());
        let h = c.headers().clone().unwrap();
        assert_eq!(
            get_str(&h, ORIGINAL_USER_ID).unwrap().as_deref(),
            Some("alice")
        );
    }

    #[test]
    fn the_frame_size_is_what_lapin_writes() {
        use lapin::protocol::BasicProperties as P;
        let mut t = FieldTable::default();
        set_str(&mut t, "fb-task", "index");
        t.insert("n".into(), AMQPValue::LongLongInt(7));
        t.insert("b".into(), AMQPValue::Boolean(true));
        t.insert(
            "a".into(),
            AMQPValue::FieldArray(vec![AMQPValue::LongInt(1), AMQPValue::Void].into()),
        );
        let mut inner = FieldTable::default();
        inner.insert("x".into(), AMQPValue::ShortString("yz".into()));
        t.insert("t".into(), AMQPValue::FieldTable(inner));
        let p: P = BasicProperties::default()
            .with_message_id("m1".into())
            .with_type("index".into())
            .with_delivery_mode(2)
            .with_timestamp(1)
            .with_headers(t);
        // The reference: the frame as the protocol crate lapin uses encodes it.
        let frame = amq_protocol::frame::AMQPFrame::Header(
            1,
            amq_protocol::frame::AMQPContentHeader {
                class_id: 60,
                body_size: 3,
                properties: p.clone(),
            },
        );
        let (_, written) = amq_protocol::frame::gen_frame(&frame)(Vec::<u8>::new().into())
            .unwrap()
            .into_inner();
        assert_eq!(header_frame_size(&p), usize::try_from(written).unwrap());
    }

    #[test]
    fn oversized_headers_are_dropped_largest_first_with_a_note() {
        let mut t = FieldTable::default();
        set_str(&mut t, "fb-task", "index");
        set_str(&mut t, "big", &"x".repeat(10_000));
        set_str(&mut t, "medium", &"y".repeat(3_800));
        let p = BasicProperties::default().with_headers(t);
        assert_eq!(fit_frame(p.clone(), 20_000), p, "fits: unchanged");
        let fitted = fit_frame(p, 8_000);
        assert!(header_frame_size(&fitted) <= 8_000);
        let h = fitted.headers().clone().unwrap();
        assert!(!h.inner().contains_key("big"));
        assert!(h.inner().contains_key("medium"), "only what is needed goes");
        assert_eq!(get_str(&h, "fb-task").unwrap().as_deref(), Some("index"));
        let note = get_str(&h, DROPPED_HEADERS).unwrap().unwrap();
        assert!(note.contains("big (10009 bytes)"), "{note}");
        // Smaller still: the next largest goes too, and the note lists both.
        let tiny = fit_frame(fitted, 3_000);
        assert!(header_frame_size(&tiny) <= 3_000);
        let note = get_str(&tiny.headers().clone().unwrap(), DROPPED_HEADERS)
            .unwrap()
            .unwrap();
        assert_eq!(
            note,
            "dropped so that the message fits one frame of 3000 bytes: big (10009 bytes), medium (3812 bytes)"
        );
    }

    #[test]
    fn copies_drop_expiration_and_keep_everything_else() {
        let mut t = FieldTable::default();
        t.insert("x-delivery-count".into(), AMQPValue::LongLongInt(7));
        set_str(&mut t, "fb-task", "index");
        let p = BasicProperties::default()
            .with_expiration("4000".into())
            .with_message_id("m1".into())
            .with_type("index".into())
            .with_priority(3)
            .with_headers(t);
        let c = put_back(&p);
        assert!(!expires(&c));
        assert_eq!(c.message_id().as_ref().unwrap().as_str(), "m1");
        assert_eq!(c.kind().as_ref().unwrap().as_str(), "index");
        assert_eq!(*c.priority(), Some(3));
        assert_eq!(*c.delivery_mode(), Some(2));
        let h = c.headers().clone().unwrap();
        assert_eq!(
            get_str(&h, ORIGINAL_EXPIRATION).unwrap().as_deref(),
            Some("4000")
        );
        assert_eq!(get_str(&h, "fb-task").unwrap().as_deref(), Some("index"));
        assert!(!h.inner().contains_key("x-delivery-count"));
        // A second copy keeps the first recorded value.
        let again = without_expiration(&c.with_expiration("1".into()), h);
        let h = again.headers().clone().unwrap();
        assert_eq!(
            get_str(&h, ORIGINAL_EXPIRATION).unwrap().as_deref(),
            Some("4000")
        );
    }
}
