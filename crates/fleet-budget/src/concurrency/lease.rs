//! [`ConcurrencyBudget`]: taking and giving back slots, one atomic script call each (made by
//! the store, `store/redis/leases.rs`); here what to ask and what the answer means.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::policy::ConcurrencyPolicy;
use crate::decision::DeadLetterReason;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::store::{LeaseArgs, RedisStore, count_at};

/// Which kind of call a slot is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseKind {
    /// A first attempt: counted, refused only at the cap when primaries wait.
    Primary,
    /// A retry: needs room under the cap and in the retry share.
    Retry,
    /// A hedged request: amplification like a retry, so it draws from the same retry share and
    /// cap (it is held in the retry set, under an id starting `h`); told apart here so that
    /// callers count it apart.
    Hedge,
}

impl LeaseKind {
    fn code(self) -> &'static str {
        match self {
            Self::Primary => "p",
            Self::Retry | Self::Hedge => "r",
        }
    }
}

/// Why a slot was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The calls in flight are at the cap.
    Cap,
    /// The retries in flight fill the retry share.
    RetryShare,
}

impl Refusal {
    /// The dead-letter reason of a retry refused for this: `concurrency_cap` or
    /// `concurrency_retry_share` (the rate budget's is `budget_exhausted`).
    #[must_use]
    pub fn reason(self) -> &'static str {
        match self {
            Self::Cap => "concurrency_cap",
            Self::RetryShare => "concurrency_retry_share",
        }
    }

    /// The same, as a [`DeadLetterReason`].
    #[must_use]
    pub fn dead_letter_reason(self) -> DeadLetterReason {
        match self {
            Self::Cap => DeadLetterReason::ConcurrencyCap,
            Self::RetryShare => DeadLetterReason::ConcurrencyRetryShare,
        }
    }
}

/// Calls in flight fleet-wide, as the script saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    /// Primary calls holding a lease.
    pub primaries: u64,
    /// Retries holding a lease.
    pub retries: u64,
}

/// A slot held. Give it back with [`ConcurrencyBudget::release`]; if its holder dies, it expires
/// one lease after it was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The dependency.
    pub dependency: Dependency,
    /// Primary or retry.
    pub kind: LeaseKind,
    /// The lease id, unique in the fleet.
    pub id: String,
    /// Server ms at which the lease expires.
    pub expires_at_ms: u64,
}

/// The answer to one acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    /// The slot, or why there is none.
    pub lease: Result<Lease, Refusal>,
    /// Calls in flight after the call.
    pub in_flight: InFlight,
    /// Retry slots with the primaries in flight before the call.
    pub retry_slots: u64,
}

/// Concurrency budgets in Redis, next to the rate budgets of the same store (same prefix, same
/// hash tag: `<prefix>:v1:{<dependency>}:lp` and `:lr`).
#[derive(Debug, Clone)]
pub struct ConcurrencyBudget {
    store: Arc<RedisStore>,
    /// This process's lease ids: a random stem and a counter.
    stem: String,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

impl ConcurrencyBudget {
    /// Concurrency budgets on `store`.
    #[must_use]
    pub fn new(store: Arc<RedisStore>) -> Self {
        let stem = format!("{:x}-{:016x}", std::process::id(), rand::random::<u64>());
        Self { store, stem }
    }

    /// The two lease sets of `dependency`: primary, retry.
    #[must_use]
    pub fn keys(&self, dependency: &Dependency) -> [String; 2] {
        self.store.lease_keys(dependency)
    }

    /// Asks for one slot of `kind`: granted or refused at once, never waiting.
    ///
    /// # Errors
    /// The store failed, passed its deadline, or answered out of contract; a lease set of
    /// another type (written by hand) is [`StoreError::BadKey`] naming it, and nothing is
    /// written.
    pub async fn acquire(
        &self,
        dependency: &Dependency,
        policy: &ConcurrencyPolicy,
        kind: LeaseKind,
    ) -> Result<Acquired, StoreError> {
        let id = format!(
            "{}{}-{:x}",
            if kind == LeaseKind::Hedge { "h" } else { "" },
            self.stem,
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let args = LeaseArgs {
            kind: kind.code(),
            id: &id,
            lease_ms: u64::try_from(policy.lease.as_millis()).unwrap_or(u64::MAX),
            cap: policy.cap,
            max_retry_fraction: policy.max_retry_fraction,
            min_retry_slots: policy.min_retry_slots,
            primary_waits: policy.primary_waits,
        };
        let reply = self.store.lease_acquire(dependency, &args).await?;
        let field = |i| count_at("lease_acquire", &reply, i);
        let (granted, refusal) = (field(0)?, field(1)?);
        let in_flight = InFlight {
            primaries: field(2)?,
            retries: field(3)?,
        };
        let (retry_slots, now) = (field(4)?, field(5)?);
        let lease = match (granted, refusal) {
            (1, 0) => Ok(Lease {
                dependency: dependency.clone(),
                kind,
                id,
                expires_at_ms: now
                    .saturating_add(u64::try_from(policy.lease.as_millis()).unwrap_or(u64::MAX)),
            }),
            (0, 1) => Err(Refusal::Cap),
            (0, 2) => Err(Refusal::RetryShare),
            other => {
                return Err(StoreError::BadReply {
                    script: "lease_acquire",
                    detail: format!("granted and refusal are {other:?}"),
                });
            }
        };
        Ok(Acquired {
            lease,
            in_flight,
            retry_slots,
        })
    }

    /// Asks for a hedge's slot: granted only while a retry would be (same cap, same share),
    /// never waiting. A hedge refused here is simply not sent.
    ///
    /// # Errors
    /// As [`ConcurrencyBudget::acquire`].
    pub async fn try_hedge(
        &self,
        dependency: &Dependency,
        policy: &ConcurrencyPolicy,
    ) -> Result<Acquired, StoreError> {
        self.acquire(dependency, policy, LeaseKind::Hedge).await
    }

    /// Gives `lease` back. Harmless if it already expired.
    ///
    /// # Errors
    /// The store failed, passed its deadline, or answered out of contract. The slot then comes
    /// back when the lease expires.
    pub async fn release(&self, lease: &Lease) -> Result<InFlight, StoreError> {
        Ok(self.release_checked(lease).await?.0)
    }

    /// [`ConcurrencyBudget::release`], and whether the lease was lost: not in Redis any more
    /// though it had not expired by the server's clock (its set evicted by a
    /// `maxmemory-policy`, flushed, or Redis restarted empty), so its slot was free for others
    /// meanwhile (`docs/semantics.md`, "Lost budgets").
    ///
    /// # Errors
    /// As [`ConcurrencyBudget::release`].
    pub async fn release_checked(&self, lease: &Lease) -> Result<(InFlight, bool), StoreError> {
        let reply = self
            .store
            .lease_release(&lease.dependency, &lease.id)
            .await?;
        let field = |i| count_at("lease_release", &reply, i);
        // The server's ms, field 4 since 0.2.0 (a script without it says nothing).
        let lost = field(0)? == 0 && reply.len() > 3 && field(3)? < lease.expires_at_ms;
        Ok((
            InFlight {
                primaries: field(1)?,
                retries: field(2)?,
            },
            lost,
        ))
    }
}
