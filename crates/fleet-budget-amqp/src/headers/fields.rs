//! Reading and writing AMQP header tables: the value types this crate writes, the many it reads.
//!
//! Strings are written as AMQP long strings (the broker rejects short strings in tables) and
//! integers as signed 64-bit integers; readers also accept short strings, every integer width and
//! decimal text, so a worker in another language may write either.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use super::BROKER_DELIVERY_HEADERS;

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
    pub(crate) fn new(name: &str, problem: impl Into<String>) -> Self {
        Self {
            name: name.to_owned(),
            problem: problem.into(),
        }
    }

    pub(crate) fn missing(name: &str) -> Self {
        Self::new(name, "missing")
    }
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

pub(crate) fn get_u32(table: &FieldTable, name: &str) -> Result<Option<u32>, HeaderError> {
    match get_u64(table, name)? {
        None => Ok(None),
        Some(v) => u32::try_from(v)
            .map(Some)
            .map_err(|_| HeaderError::new(name, format!("{v} is too large"))),
    }
}

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
