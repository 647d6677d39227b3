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

use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};

use super::ORIGINAL_EXPIRATION;
use super::fields::{get_str, set_str};

/// `properties` without `expiration` (its value kept in [`ORIGINAL_EXPIRATION`] unless that
/// header is already set), with `headers` as the headers.
#[must_use]
pub fn without_expiration(
    properties: &BasicProperties,
    mut headers: FieldTable,
) -> BasicProperties {
    if let Some(exp) = properties.expiration()
        && get_str(&headers, ORIGINAL_EXPIRATION)
            .ok()
            .flatten()
            .is_none()
    {
        set_str(&mut headers, ORIGINAL_EXPIRATION, exp.as_str());
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
    if let Some(v) = p.user_id() {
        out = out.with_user_id(v.clone());
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
