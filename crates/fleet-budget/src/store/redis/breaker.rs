//! The circuit breaker's calls: `lua/breaker.lua` on a dependency's breaker hash
//! (`<budget key>:cb`, the budget's hash-tag slot), one call per decision. What the answer
//! means is `crate::breaker`'s; this file only calls.

use redis::Value;

use super::RedisStore;
use super::scripts::BREAKER_SCRIPT;
use crate::dependency::Dependency;
use crate::error::StoreError;

/// The breaker's settings as `lua/breaker.lua` takes them (`lua/README.md`, "Breaker").
#[derive(Debug, Clone, Copy)]
pub(crate) struct BreakerArgs {
    pub(crate) window_ms: u64,
    pub(crate) failure_ratio: f64,
    pub(crate) min_volume: u64,
    pub(crate) open_ms: u64,
    pub(crate) half_open_probes: u64,
    pub(crate) close_after: u64,
    pub(crate) probe_timeout_ms: u64,
}

impl RedisStore {
    /// The breaker hash of `dependency`.
    pub(crate) fn breaker_key(&self, dependency: &Dependency) -> String {
        format!("{}:cb", self.key(dependency))
    }

    /// One `breaker.lua` call: `op` (`admit`, `record`, `cancel`, `status`) with the breaker's
    /// settings and the op's `extra` arguments; its reply as sent.
    ///
    /// # Errors
    /// The store failed or passed its deadline; a key of another type is
    /// [`StoreError::BadKey`].
    pub(crate) async fn breaker_call(
        &self,
        dependency: &Dependency,
        args: &BreakerArgs,
        op: &str,
        extra: &[String],
    ) -> Result<Vec<Value>, StoreError> {
        let mut invocation = BREAKER_SCRIPT.key(self.breaker_key(dependency));
        invocation
            .arg(op)
            .arg(args.window_ms)
            .arg(args.failure_ratio.to_string())
            .arg(args.min_volume)
            .arg(args.open_ms)
            .arg(args.half_open_probes)
            .arg(args.close_after)
            .arg(args.probe_timeout_ms);
        for a in extra {
            invocation.arg(a);
        }
        self.invoke("breaker", invocation).await
    }
}
