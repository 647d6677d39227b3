//! The enforcement switch of a dependency (`crate::control::enforcement`): `HMGET` to read it,
//! and one `MULTI` (`DEL`, `HSET`, `PEXPIRE`) to replace it. What it means is `control`'s; this
//! file only calls.

use redis::Value;

use super::RedisStore;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::keys::enforcement_key;

impl RedisStore {
    /// The values of `fields` of `dependency`'s enforcement switch, in order (missing ones, or
    /// all of them when there is none, nil).
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub(crate) async fn enforcement_fields(
        &self,
        dependency: &Dependency,
        fields: &[&str],
    ) -> Result<Vec<Value>, StoreError> {
        let mut hmget = redis::cmd("HMGET");
        hmget
            .arg(enforcement_key(self.prefix(), dependency))
            .arg(fields);
        self.query(&hmget).await
    }

    /// Replaces `dependency`'s enforcement switch with `fields` (name, value pairs), ending
    /// `expire_ms` from now (`None`: until replaced), in one transaction.
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub(crate) async fn replace_enforcement(
        &self,
        dependency: &Dependency,
        fields: &[(&str, String)],
        expire_ms: Option<u64>,
    ) -> Result<(), StoreError> {
        let key = enforcement_key(self.prefix(), dependency);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .del(&key)
            .ignore()
            .hset_multiple(&key, fields)
            .ignore();
        if let Some(ms) = expire_ms {
            pipe.cmd("PEXPIRE").arg(&key).arg(ms).ignore();
        }
        self.query_pipeline::<()>(&pipe).await
    }
}
