//! Operators' calls: overrides (`lua/override.lua` into the budget hash, `HMGET` and `TIME` to
//! read them) and the audit stream (`XADD` with `MAXLEN`, `XTRIM MINID`, `XREVRANGE`). What an
//! override or an entry means is `crate::control`'s; this file only calls.

use redis::Value;

use super::RedisStore;
use super::scripts::OVERRIDE_SCRIPT;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::keys::audit_key;

/// A stream entry as Redis sends it: the id, and the field and value pairs, as bytes (anyone
/// with access can add an entry, and one field that is not UTF-8 must not make the whole trail
/// unreadable).
pub(crate) type RawEntry = (Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>);

impl RedisStore {
    /// The server's time, in ms.
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub(crate) async fn server_time_ms(&self) -> Result<u64, StoreError> {
        let (secs, micros): (u64, u64) = self.query(&redis::cmd("TIME")).await?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// The values of `fields` in `dependency`'s budget hash, in order (missing ones nil).
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub(crate) async fn budget_fields(
        &self,
        dependency: &Dependency,
        fields: &[&str],
    ) -> Result<Vec<Value>, StoreError> {
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(self.key(dependency)).arg(fields);
        self.query(&hmget).await
    }

    /// One `override.lua` call on `dependency`'s budget: `args` as `lua/README.md`
    /// ("Overrides") lists them, the action first; its reply as sent.
    ///
    /// # Errors
    /// Redis refused a value (the error names it), failed, or passed the store's deadline.
    pub(crate) async fn run_override(
        &self,
        dependency: &Dependency,
        args: &[String],
    ) -> Result<Vec<Value>, StoreError> {
        let mut invocation = OVERRIDE_SCRIPT.key(self.key(dependency));
        for arg in args {
            invocation.arg(arg);
        }
        self.invoke("override", invocation).await
    }

    /// Appends an entry of `fields` to the audit stream, keeping at most `max_entries` (exact
    /// trimming: the trail grows at human speed, and an approximate trim keeps whole nodes of
    /// 100 entries, so a bound of 10 would keep 100); returns the entry's id.
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub(crate) async fn audit_append(
        &self,
        max_entries: u64,
        fields: &[(&str, &str)],
    ) -> Result<String, StoreError> {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(audit_key(self.prefix()))
            .arg("MAXLEN")
            .arg(max_entries)
            .arg("*");
        for (field, value) in fields {
            xadd.arg(*field).arg(*value);
        }
        self.query(&xadd).await
    }

    /// [`Self::audit_append`] to a trail that exists (`XADD NOMKSTREAM`): `None`, and nothing
    /// written, when the stream is gone (never made, or lost to an eviction, `FLUSHALL` or a
    /// restart without persistence).
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub(crate) async fn audit_append_to_existing(
        &self,
        max_entries: u64,
        fields: &[(&str, &str)],
    ) -> Result<Option<String>, StoreError> {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(audit_key(self.prefix()))
            .arg("NOMKSTREAM")
            .arg("MAXLEN")
            .arg(max_entries)
            .arg("*");
        for (field, value) in fields {
            xadd.arg(*field).arg(*value);
        }
        self.query(&xadd).await
    }

    /// Drops the audit entries older than server ms `min_ms`.
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub(crate) async fn audit_trim(&self, min_ms: u64) -> Result<(), StoreError> {
        let mut trim = redis::cmd("XTRIM");
        trim.arg(audit_key(self.prefix())).arg("MINID").arg(min_ms);
        let _: u64 = self.query(&trim).await?;
        Ok(())
    }

    /// At most `count` audit entries between `since` and `until` (stream ids or `-` and `+`),
    /// newest first.
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub(crate) async fn audit_range(
        &self,
        until: &str,
        since: &str,
        count: u64,
    ) -> Result<Vec<RawEntry>, StoreError> {
        let mut xrange = redis::cmd("XREVRANGE");
        xrange
            .arg(audit_key(self.prefix()))
            .arg(until)
            .arg(since)
            .arg("COUNT")
            .arg(count);
        self.query(&xrange).await
    }
}
