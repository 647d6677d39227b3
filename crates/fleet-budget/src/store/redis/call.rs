//! One call to Redis within the store's deadline: a script ([`RedisStore::invoke`]) or a
//! command ([`RedisStore::query`]), on the connection `connect.rs` keeps. Every file of this
//! folder that talks to Redis goes through here.

use redis::ScriptInvocation;

use super::RedisStore;
use super::connect::Connection;
use super::reply::bad_key;
use crate::error::StoreError;

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
