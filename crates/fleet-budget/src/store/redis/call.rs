//! One call to Redis within the store's deadline: a script ([`RedisStore::invoke`]) or a
//! command ([`RedisStore::query`]), on the connection `connect.rs` keeps. Every file of this
//! folder that talks to Redis goes through here.

use redis::ScriptInvocation;

use super::RedisStore;
use super::connect::Connection;
use super::reply::bad_key;
use crate::error::StoreError;

/// How many times a call that may be repeated (a read, a delete, a write of the same value) is
/// tried when Redis passed the deadline or the connection dropped: one miss under load (a box
/// at load 14, a Redis busy with a large command) says little about the next.
const REPEATABLE_TRIES: u32 = 3;

impl RedisStore {
    /// Runs one command within the store's deadline (for tools: overrides, the audit stream).
    ///
    /// # Errors
    /// The call failed or passed its deadline.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        let call = async {
            let reply: T = match self.connection().await? {
                Connection::Single(mut c) => cmd.query_async(&mut c).await?,
                Connection::Cluster(mut c) => cmd.query_async(&mut c).await?,
            };
            Ok::<_, StoreError>(reply)
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
    }

    /// Runs the commands of `pipe` in one round trip within the store's deadline (their keys
    /// must share a slot on Redis Cluster).
    ///
    /// # Errors
    /// The call failed or passed its deadline.
    pub(crate) async fn query_pipeline<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, StoreError> {
        let call = async {
            let reply: T = match self.connection().await? {
                Connection::Single(mut c) => pipe.query_async(&mut c).await?,
                Connection::Cluster(mut c) => pipe.query_async(&mut c).await?,
            };
            Ok::<_, StoreError>(reply)
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
    }

    /// [`RedisStore::query`] of a command that may be repeated without changing its effect (a
    /// read, a delete, a write of the same value): tried again, up to three times in all, when
    /// Redis passed the deadline or the connection failed.
    ///
    /// # Errors
    /// The last try failed or passed its deadline.
    pub async fn query_repeatable<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        repeated(|| self.query(cmd)).await
    }

    /// [`RedisStore::query_pipeline`] of commands that may be repeated, as
    /// [`RedisStore::query_repeatable`].
    ///
    /// # Errors
    /// The last try failed or passed its deadline.
    pub(crate) async fn query_pipeline_repeatable<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, StoreError> {
        repeated(|| self.query_pipeline(pipe)).await
    }

    /// Runs `invocation` (its keys and arguments set) within the store's deadline.
    ///
    /// # Errors
    /// The call failed or passed its deadline.
    pub async fn invoke(
        &self,
        script: &'static str,
        invocation: ScriptInvocation<'_>,
    ) -> Result<Vec<redis::Value>, StoreError> {
        let call = async {
            let reply: Vec<redis::Value> = match self.connection().await? {
                Connection::Single(mut c) => invocation.invoke_async(&mut c).await?,
                Connection::Cluster(mut c) => invocation.invoke_async(&mut c).await?,
            };
            Ok::<_, StoreError>(reply)
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(reply) => reply.map_err(|e| match e {
                StoreError::BadReply { detail, .. } => StoreError::BadReply { script, detail },
                StoreError::Redis(e) => bad_key(&e).unwrap_or(StoreError::Redis(e)),
                other => other,
            }),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

/// Whether a failed call may succeed if tried again at once: the deadline passed or the
/// connection failed (not an answer of Redis: a refused command, a key of another type).
fn worth_again(e: &StoreError) -> bool {
    e.is_timeout() || e.is_connection_error()
}

/// `call`, tried again (up to [`REPEATABLE_TRIES`] in all, a little later each time) while it
/// fails in a way [`worth_again`] says a new try may not.
async fn repeated<T, F, Fut>(mut call: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut tries = 1;
    loop {
        match call().await {
            Err(e) if tries < REPEATABLE_TRIES && worth_again(&e) => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20 * u64::from(tries))).await;
            }
            done => return done,
        }
    }
}
