//! [`Breaker`]: the breaker's decisions, one call of `lua/breaker.lua` each (made by the store,
//! `store/redis/breaker.rs`); here what the answers mean.

use std::sync::Arc;

use super::policy::BreakerPolicy;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::store::{BreakerArgs, RedisStore, count_at};

/// A breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls run; results are counted.
    Closed,
    /// No call runs until the open period ends.
    Open,
    /// A few probes run; the rest wait.
    HalfOpen,
}

impl BreakerState {
    /// The wire name (`closed`, `open`, `half_open`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }

    /// The script's code: 0, 1, 2.
    #[must_use]
    pub fn code(self) -> i64 {
        match self {
            Self::Closed => 0,
            Self::Open => 1,
            Self::HalfOpen => 2,
        }
    }

    fn of(script: &'static str, code: u64) -> Result<Self, StoreError> {
        match code {
            0 => Ok(Self::Closed),
            1 => Ok(Self::Open),
            2 => Ok(Self::HalfOpen),
            other => Err(StoreError::BadReply {
                script,
                detail: format!("state {other} is not 0, 1 or 2"),
            }),
        }
    }
}

/// What the breaker says about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Closed: run it.
    Run,
    /// Half-open: run it as a probe of this generation (report its result with it).
    Probe {
        /// The generation to report the probe's result with.
        generation: u64,
    },
    /// Open, or half-open with every probe out: do not run it now.
    Wait,
}

/// The answer to [`Breaker::admit`] or [`Breaker::record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    /// What to do (for [`Breaker::record`], always [`Verdict::Run`]).
    pub verdict: Verdict,
    /// The state after the call.
    pub state: BreakerState,
    /// Whether this call changed the state (exactly one call does, fleet-wide, per change).
    pub changed: bool,
    /// While open: when it half-opens (server ms).
    pub open_until_ms: u64,
    /// The server's time of the call (ms).
    pub now_ms: u64,
}

/// A breaker as Redis holds it (`budgetctl status`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerStatus {
    /// Its state (an open breaker whose period has ended half-opens at the next call).
    pub state: BreakerState,
    /// When the open period ends (server ms), if it was ever opened.
    pub open_until_ms: u64,
    /// Probes out in this half-open generation.
    pub probes_issued: u64,
    /// Probe successes in this half-open generation.
    pub probe_successes: u64,
    /// The last change of state (server ms; 0 = never).
    pub changed_ms: u64,
    /// Times opened while the key lived.
    pub times_opened: u64,
    /// Calls in the window (sliding estimate).
    pub volume: f64,
    /// Failures in the window (sliding estimate).
    pub failures: f64,
    /// The server's time (ms).
    pub now_ms: u64,
}

/// The breakers of a store's dependencies (`<prefix>:v1:{<dependency>}:cb`).
#[derive(Debug, Clone)]
pub struct Breaker {
    store: Arc<RedisStore>,
}

impl Breaker {
    /// Breakers kept on `store`.
    #[must_use]
    pub fn new(store: Arc<RedisStore>) -> Self {
        Self { store }
    }

    /// The breaker hash of `dependency`.
    #[must_use]
    pub fn key(&self, dependency: &Dependency) -> String {
        key_on(&self.store, dependency)
    }

    async fn call(
        &self,
        dependency: &Dependency,
        policy: &BreakerPolicy,
        op: &str,
        extra: &[String],
    ) -> Result<Vec<redis::Value>, StoreError> {
        call_on(&self.store, dependency, policy, op, extra).await
    }

    /// Asks whether a call may run now: closed → run; half-open with a probe left → a probe;
    /// otherwise wait. Moves an open breaker whose period has ended to half-open.
    ///
    /// # Errors
    /// The store failed, passed its deadline, or answered out of contract.
    pub async fn admit(
        &self,
        dependency: &Dependency,
        policy: &BreakerPolicy,
    ) -> Result<Decided, StoreError> {
        let reply = self.call(dependency, policy, "admit", &[]).await?;
        let field = |i| count_at("breaker", &reply, i);
        let state = BreakerState::of("breaker", field(1)?)?;
        let verdict = match field(0)? {
            0 => Verdict::Run,
            1 => Verdict::Probe {
                generation: field(2)?,
            },
            2 => Verdict::Wait,
            other => {
                return Err(StoreError::BadReply {
                    script: "breaker",
                    detail: format!("verdict {other} is not 0, 1 or 2"),
                });
            }
        };
        Ok(Decided {
            verdict,
            state,
            open_until_ms: field(3)?,
            changed: field(4)? == 1,
            now_ms: field(5)?,
        })
    }

    /// Reports the result of a call: `probe` is the generation of a probe, `None` for a call
    /// admitted while closed. Opens, closes or reopens the breaker when the result decides it.
    ///
    /// # Errors
    /// As [`Breaker::admit`].
    pub async fn record(
        &self,
        dependency: &Dependency,
        policy: &BreakerPolicy,
        success: bool,
        probe: Option<u64>,
    ) -> Result<Decided, StoreError> {
        let extra = [
            if success { "s" } else { "f" }.to_owned(),
            probe.unwrap_or(0).to_string(),
        ];
        let reply = self.call(dependency, policy, "record", &extra).await?;
        let field = |i| count_at("breaker", &reply, i);
        Ok(Decided {
            verdict: Verdict::Run,
            state: BreakerState::of("breaker", field(0)?)?,
            open_until_ms: field(2)?,
            changed: field(3)? == 1,
            now_ms: field(4)?,
        })
    }

    /// Gives back a probe of `generation` that was not sent (the rate budget refused it).
    ///
    /// # Errors
    /// As [`Breaker::admit`].
    pub async fn cancel(
        &self,
        dependency: &Dependency,
        policy: &BreakerPolicy,
        generation: u64,
    ) -> Result<(), StoreError> {
        let reply = self
            .call(dependency, policy, "cancel", &[generation.to_string()])
            .await?;
        count_at("breaker", &reply, 0).map(|_| ())
    }

    /// The breaker as Redis holds it; writes nothing.
    ///
    /// # Errors
    /// As [`Breaker::admit`].
    pub async fn status(
        &self,
        dependency: &Dependency,
        policy: &BreakerPolicy,
    ) -> Result<BreakerStatus, StoreError> {
        status_on(&self.store, dependency, policy).await
    }
}

fn key_on(store: &RedisStore, dependency: &Dependency) -> String {
    store.breaker_key(dependency)
}

async fn call_on(
    store: &RedisStore,
    dependency: &Dependency,
    policy: &BreakerPolicy,
    op: &str,
    extra: &[String],
) -> Result<Vec<redis::Value>, StoreError> {
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let args = BreakerArgs {
        window_ms: ms(policy.window),
        failure_ratio: policy.failure_ratio,
        min_volume: policy.min_volume,
        open_ms: ms(policy.open),
        half_open_probes: policy.half_open_probes,
        close_after: policy.close_after,
        probe_timeout_ms: ms(policy.probe_timeout),
    };
    store.breaker_call(dependency, &args, op, extra).await
}

/// `dependency`'s breaker as `store` holds it (tools such as `budgetctl status`); writes
/// nothing.
///
/// # Errors
/// The store failed, passed its deadline, or answered out of contract (a key of another type:
/// [`StoreError::BadKey`]).
pub async fn status_on(
    store: &RedisStore,
    dependency: &Dependency,
    policy: &BreakerPolicy,
) -> Result<BreakerStatus, StoreError> {
    let reply = call_on(store, dependency, policy, "status", &[]).await?;
    let field = |i| count_at("breaker", &reply, i);
    let window = field(9)?.max(1);
    #[allow(clippy::cast_precision_loss)] // sliding estimates scaled by the window, < 2^53
    let estimate = |v: u64| v as f64 / window as f64;
    Ok(BreakerStatus {
        state: BreakerState::of("breaker", field(0)?)?,
        open_until_ms: field(2)?,
        probes_issued: field(3)?,
        probe_successes: field(4)?,
        changed_ms: field(5)?,
        times_opened: field(6)?,
        volume: estimate(field(7)?),
        failures: estimate(field(8)?),
        now_ms: field(10)?,
    })
}
