//! [`FleetBudgetBuilder`]: a [`FleetBudget`] from parts (tests, the simulator, custom stores,
//! a clock of one's own).

use std::sync::Arc;
use std::time::Duration;

use super::admission::AdmissionControl;
use super::coalesce::{Coalescer, CoalescerParts};
use super::decide::Jitter;
use super::deny_cache::DenyCache;
use super::enforcement::EnforcementInForce;
use super::health::Health;
use super::heartbeat::{self, Registry};
use super::rate::RateBudget;
use super::route::{Policies, Routes};
use super::{FleetBudget, Inner};
use crate::breaker::Breaker;
use crate::clock::{Clock, CoarseClock};
use crate::concurrency::ConcurrencyBudget;
use crate::config::Config;
use crate::control::DeadLetterIndex;
use crate::metrics::{Metrics, TimedStore};
use crate::store::{BudgetStore, LocalStore, RedisStore};

/// Builds a [`FleetBudget`] from parts (tests, the simulator, custom stores).
#[derive(Debug)]
pub struct FleetBudgetBuilder {
    config: Config,
    fleet: Option<Arc<dyn BudgetStore>>,
    leases: Option<ConcurrencyBudget>,
    breaker: Option<Breaker>,
    local: Option<LocalStore>,
    clock: Option<Arc<dyn Clock>>,
    metrics: Option<Metrics>,
    seed: Option<u64>,
    registry: Option<Arc<RedisStore>>,
    worker_id: Option<String>,
    dead_letters: Option<DeadLetterIndex>,
    switches: Option<Arc<RedisStore>>,
}

impl FleetBudgetBuilder {
    /// Uses `store` as the fleet-wide store (otherwise the budget is local only).
    #[must_use]
    pub fn fleet_store(mut self, store: Arc<dyn BudgetStore>) -> Self {
        self.fleet = Some(store);
        self
    }

    /// Keeps the leases of the concurrency budgets (`[dependencies.X.concurrency]`) in `leases`
    /// (without it, calls in flight are not counted).
    #[must_use]
    pub fn leases(mut self, leases: ConcurrencyBudget) -> Self {
        self.leases = Some(leases);
        self
    }

    /// Keeps the circuit breakers (`[dependencies.X.breaker]`) in `breaker` (without it, no
    /// breaker is consulted).
    #[must_use]
    pub fn breakers(mut self, breaker: Breaker) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// Uses `local` as the in-process store (the budget when local only, else the fallback).
    /// Without [`FleetBudgetBuilder::clock`], the budget then keeps time with `local`'s clock.
    #[must_use]
    pub fn local_store(mut self, local: LocalStore) -> Self {
        self.local = Some(local);
        self
    }

    /// Keeps time with `clock`: the probe interval of a failing store, the age of pending
    /// deposits, and the windows of the in-process store made by the builder (a store given to
    /// [`FleetBudgetBuilder::local_store`] keeps its own). Default: the store's clock if one was
    /// given, else [`CoarseClock`]. Tests give a [`crate::clock::ManualClock`] and move it.
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Registers metrics on the application's registry instead of a private one.
    #[must_use]
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Reports this worker in the worker registry of `store` every `redis.heartbeat_ms` (0:
    /// never): which dependencies it decides from its fallback, for the console
    /// ([`heartbeat`](super::heartbeat)). [`FleetBudget::from_config`] gives its fleet store.
    #[must_use]
    pub fn worker_registry(mut self, store: Arc<RedisStore>) -> Self {
        self.registry = Some(store);
        self
    }

    /// Counts what this worker dead-letters and parks in `index`, so that tools read the
    /// dead-letter queues' contents without reading the queues
    /// ([`crate::control::dead_letters`]). [`FleetBudget::from_config`] gives its fleet store's.
    #[must_use]
    pub fn dead_letter_index(mut self, index: DeadLetterIndex) -> Self {
        self.dead_letters = Some(index);
        self
    }

    /// Reads operators' switches between shadow and enforcement
    /// (`budgetctl budget shadow|enforce`, [`crate::control::enforcement`]) in `store` when a
    /// budget refuses a retry; without it, each dependency's configured `enforcement` decides.
    /// [`FleetBudget::from_config`] gives its fleet store.
    #[must_use]
    pub fn enforcement_switches(mut self, store: Arc<RedisStore>) -> Self {
        self.switches = Some(store);
        self
    }

    /// The id this worker reports under (default `{host}-{pid}-{4 random hex}`): whitespace
    /// and the characters the printable rules refuse are left out, and it is cut at 200 bytes;
    /// an id with nothing left keeps the default. Unique in the fleet, or two workers share
    /// one entry.
    #[must_use]
    pub fn worker_id(mut self, id: &str) -> Self {
        self.worker_id = heartbeat::worker_id(id);
        self
    }

    /// Seeds the backoff jitter (deterministic tests and simulations).
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Builds the budget. Inside a Tokio runtime, with a fleet store and a non-zero
    /// `redis.deposit_flush`, a background task flushes coalesced deposits; otherwise every
    /// deposit is recorded with its own store call. Inside a Tokio runtime, with a worker
    /// registry and a non-zero `redis.heartbeat_ms`, another reports the worker there.
    #[must_use]
    pub fn build(self) -> FleetBudget {
        let c = self.config;
        let in_runtime = tokio::runtime::Handle::try_current().is_ok();
        let coalesce = self.fleet.is_some() && !c.redis.deposit_flush.is_zero() && in_runtime;
        let registry = self
            .registry
            .filter(|_| in_runtime && !c.redis.heartbeat.is_zero())
            .map(|store| Arc::new(Registry::new(store, self.worker_id, c.redis.heartbeat)));
        let clock = match (self.clock, &self.local) {
            (Some(clock), _) => clock,
            (None, Some(local)) => local.clock().clone(),
            (None, None) => Arc::new(CoarseClock),
        };
        let local = self
            .local
            .unwrap_or_else(|| LocalStore::with_clock(clock.clone()));
        let metrics = self.metrics.unwrap_or_default();
        for dependency in c.policies.keys() {
            metrics.healthy(dependency);
        }
        // Every call to the fleet store is timed (fleet_budget_store_call_duration_seconds).
        let fleet = self
            .fleet
            .map(|store| Arc::new(TimedStore::new(store, metrics.clone())) as Arc<dyn BudgetStore>);
        let policies = Arc::new(Policies::new(&c));
        let health = Arc::new(Health::new(
            clock.clone(),
            c.redis.fallback,
            local.clone(),
            metrics.clone(),
        ));
        let denials = Arc::new(DenyCache::new(c.redis.deny_cache));
        let deposits = Arc::new(Coalescer::new(CoalescerParts {
            fleet: fleet.clone(),
            local: local.clone(),
            policies: policies.clone(),
            health: health.clone(),
            denials: denials.clone(),
            metrics: metrics.clone(),
            clock,
            flush_interval: if coalesce {
                c.redis.deposit_flush
            } else {
                Duration::ZERO
            },
            flush_count: c.redis.deposit_flush_count,
        }));
        let jitter = Arc::new(Jitter::new(self.seed));
        let inner = Arc::new(Inner {
            routes: Routes::new(&c),
            rate: RateBudget {
                fleet,
                local,
                health: health.clone(),
                denials,
                deposits: deposits.clone(),
            },
            admission: AdmissionControl {
                concurrency: c.concurrency,
                leases: self.leases,
                breakers: c.breakers,
                breaker: self.breaker,
                health: health.clone(),
                metrics: metrics.clone(),
                jitter: jitter.clone(),
            },
            enforcement: EnforcementInForce::new(c.enforcement, self.switches, c.redis.deny_cache),
            policies,
            health,
            deposits,
            jitter,
            metrics,
            registry: registry.clone(),
            dead_letters: self.dead_letters,
        });
        inner.deposits.start_flusher();
        if let Some(registry) = registry {
            tokio::spawn(heartbeat::heartbeat(Arc::downgrade(&inner), registry));
        }
        FleetBudget { inner }
    }
}

impl FleetBudget {
    /// A builder over `config` (local only until a fleet store is given).
    #[must_use]
    pub fn builder(config: &Config) -> FleetBudgetBuilder {
        FleetBudgetBuilder {
            config: config.clone(),
            fleet: None,
            leases: None,
            breaker: None,
            local: None,
            clock: None,
            metrics: None,
            seed: None,
            registry: None,
            worker_id: None,
            dead_letters: None,
            switches: None,
        }
    }
}
