//! The dead-letter index's calls: `dead_letters.lua` (changes, in one round trip per batch) and
//! the reads of a queue's index (`HLEN`, `HGETALL`). What a row means is the broker crate's; what
//! the index promises is `crate::control::dead_letters`'s; this file only calls.

use redis::Value;

use super::RedisStore;
use super::scripts::DEAD_LETTERS_SCRIPT;
use crate::error::StoreError;
use crate::keys::dead_letters_key;

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

    /// The rows of `queue`'s index and their counts as Redis holds them, or `Err` with the
    /// number of rows when there are more than `max_rows` (written by someone else: not read).
    ///
    /// # Errors
    /// Redis failed, the key is not a hash, or the store's deadline passed.
    pub(crate) async fn dead_letters_read(
        &self,
        queue: &str,
        max_rows: u64,
    ) -> Result<Result<Vec<(Vec<u8>, Vec<u8>)>, u64>, StoreError> {
        let key = dead_letters_key(self.prefix(), queue);
        let rows: u64 = self.query(redis::cmd("HLEN").arg(&key)).await?;
        if rows > max_rows {
            return Ok(Err(rows));
        }
        let all: Vec<(Vec<u8>, Vec<u8>)> = self.query(redis::cmd("HGETALL").arg(&key)).await?;
        Ok(Ok(all))
    }
}
