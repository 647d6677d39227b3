//! The dead-letter index's calls: `dead_letters.lua` (changes, in one round trip per batch) and
//! the reads of a queue's index (`HLEN`, `HGETALL`). What a row means is the broker crate's; what
//! the index promises is `crate::control::dead_letters`'s; this file only calls.

use redis::Value;

use super::RedisStore;
use super::scripts::DEAD_LETTERS_SCRIPT;
use crate::error::StoreError;
use crate::keys::{dead_letters_key, dead_letters_writer_key};

impl RedisStore {
    /// One `dead_letters.lua` call: `changes` (row, delta) on `queue`'s index, new rows refused
    /// past `max_rows`. Returns the change applied to each, in order.
    ///
    /// # Errors
    /// Redis refused an argument or the key (named), failed, or passed the store's deadline.
    pub(crate) async fn dead_letters_change(
        &self,
        queue: &str,
        max_rows: u64,
        changes: &[(String, i64)],
    ) -> Result<Vec<i64>, StoreError> {
        let mut invocation = DEAD_LETTERS_SCRIPT.key(dead_letters_key(self.prefix(), queue));
        invocation.arg(max_rows);
        for (row, delta) in changes {
            invocation.arg(row).arg(*delta);
        }
        let reply = self.invoke("dead_letters", invocation).await?;
        integers(&reply)
    }

    /// One `dead_letters.lua` call as writer `writer`'s batch `seq` (its `KEYS[2]` form):
    /// applied only if `seq` is above the last batch the writer applied, so it may be sent again
    /// after a timeout. `None` when it was applied before (nothing written).
    ///
    /// # Errors
    /// As [`RedisStore::dead_letters_change`], and the writer's key is of another type.
    pub(crate) async fn dead_letters_change_once(
        &self,
        queue: &str,
        writer: &str,
        seq: u64,
        max_rows: u64,
        changes: &[(String, i64)],
    ) -> Result<Option<Vec<i64>>, StoreError> {
        let mut invocation = DEAD_LETTERS_SCRIPT.key(dead_letters_key(self.prefix(), queue));
        invocation
            .key(dead_letters_writer_key(self.prefix(), queue, writer))
            .arg(max_rows)
            .arg(seq);
        for (row, delta) in changes {
            invocation.arg(row).arg(*delta);
        }
        let reply = self.invoke("dead_letters", invocation).await?;
        if reply.is_empty() {
            return Ok(None);
        }
        integers(&reply).map(Some)
    }

    /// The rows of `queue`'s index and their counts as Redis holds them, or `Err` with the
    /// number of rows when there are more than `max_rows` (written by someone else: not read).
    ///
    /// # Errors
    /// Redis failed, the key is not a hash, or the store's deadline passed (each read is tried
    /// up to three times: reading twice changes nothing).
    pub(crate) async fn dead_letters_read(
        &self,
        queue: &str,
        max_rows: u64,
    ) -> Result<Result<Vec<(Vec<u8>, Vec<u8>)>, u64>, StoreError> {
        let key = dead_letters_key(self.prefix(), queue);
        let rows: u64 = self.query_repeatable(redis::cmd("HLEN").arg(&key)).await?;
        if rows > max_rows {
            return Ok(Err(rows));
        }
        let all: Vec<(Vec<u8>, Vec<u8>)> = self
            .query_repeatable(redis::cmd("HGETALL").arg(&key))
            .await?;
        Ok(Ok(all))
    }
}

/// The script's reply: one integer per pair.
fn integers(reply: &[Value]) -> Result<Vec<i64>, StoreError> {
    reply
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::Int(n) => Ok(*n),
            _ => Err(StoreError::BadReply {
                script: "dead_letters",
                detail: format!("field {} is not an integer", i + 1),
            }),
        })
        .collect()
}
