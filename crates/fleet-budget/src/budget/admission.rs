//! Admission of one call to a dependency: whether an execution may run now, and what it holds
//! while it runs.
//!
//! The rate budget ([`FleetBudget::on_failure`]) decides whether a failed job *may* retry; the
//! retry runs later, after its delay. The concurrency budget is about the moment of the call:
//! a retry needs a slot when it runs, not when it was granted. So every execution asks
//! [`FleetBudget::admit`] just before its handler runs, and gives the [`Call`] back to
//! [`FleetBudget::finish`] when the handler returns:
//!
//! - a dependency without a `[dependencies.X.concurrency]` section: always [`Admission::Run`],
//!   nothing held;
//! - a first attempt (a primary call): a primary lease, counted and never refused by the retry
//!   share; at the cap it is refused only when `primary_waits = true`, and then
//!   [`Admission::Wait`] ([`Hold::PrimaryAtCap`]): the worker sends it to wait in a delay tier
//!   without spending an attempt, and asks again when it comes back; once it has been held for
//!   the policy's `max_wait` in all it is dead-lettered `concurrency_cap` instead;
//! - a retry (attempt ≥ 2): a retry lease, granted at once or refused at once, never waited for
//!   (a retry queued for a slot is a second queue inside a degraded dependency): a refusal is
//!   [`Admission::DeadLetter`] with `concurrency_cap` or `concurrency_retry_share`. The rate
//!   budget it spent when it was granted is not given back.
//!
//! Before the slot, the dependency's circuit breaker (`[dependencies.X.breaker]`,
//! [`crate::breaker`]) is asked: closed → go on; open, or half-open with every probe out →
//! [`Admission::Wait`] ([`Hold::CircuitOpen`]: the job waits in a delay tier without running or
//! spending an attempt, and is dead-lettered `circuit_open` once held for the breaker's
//! `max_wait` in all); half-open with a probe left → the call is a probe, one retry of the rate
//! budget's floor (a probe the rate budget refuses is given back and the job waits). The result
//! given to [`FleetBudget::finish`] feeds the breaker: a success, a retryable failure, or an
//! inconclusive end (a non-retryable failure, which says nothing about the dependency's health).
//!
//! When Redis does not answer, the call runs without a lease (counted nowhere) and without a
//! breaker: the rate budget (and its fallback) still bounds retries, and a dead store must not
//! stop primary traffic.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;

#[cfg(doc)]
use super::FleetBudget;
use super::decide::{Jitter, dead_letter};
use super::health::Health;
use super::rate::RateBudget;
use crate::breaker::{Breaker, BreakerPolicy, Decided, Verdict};
use crate::concurrency::{ConcurrencyBudget, ConcurrencyPolicy, Lease, LeaseKind};
use crate::decision::{BudgetSource, DeadLetterReason, Decision};
use crate::dependency::Dependency;
use crate::metrics::Metrics;
use crate::policy::BudgetPolicy;

/// Whether an execution may run now.
#[derive(Debug)]
#[must_use = "a Run holds a slot: give it back to FleetBudget::finish"]
pub enum Admission {
    /// Run it; give the [`Call`] back to [`FleetBudget::finish`] when it returns.
    Run(Call),
    /// Do not run it yet and do not count an attempt: let it wait (in a delay tier) and ask
    /// again.
    Wait(Hold),
    /// Do not run it: dead-letter it with this decision (a retry refused by the concurrency
    /// budget).
    DeadLetter(Decision),
}

/// Why an execution waits instead of running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Hold {
    /// A primary call found the dependency at its concurrency cap and the policy says primaries
    /// wait (`primary_waits = true`).
    PrimaryAtCap,
    /// The dependency's circuit breaker is open, or half-open with every probe out.
    CircuitOpen {
        /// When to ask again: the rest of the open period, or of the job's limit if shorter
        /// (at least 1 s, jittered up to a quarter more so that the held jobs do not all come
        /// back at once).
        retry_in: Duration,
    },
}

impl Hold {
    /// The wire name (`primary_at_cap`, `circuit_open`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PrimaryAtCap => "primary_at_cap",
            Self::CircuitOpen { .. } => "circuit_open",
        }
    }

    /// How long a held job waits before it asks again.
    #[must_use]
    pub fn pause(self) -> Duration {
        match self {
            Self::PrimaryAtCap => Duration::from_secs(1),
            Self::CircuitOpen { retry_in } => retry_in,
        }
    }
}

/// How an admitted call ended, for the circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// It succeeded.
    Succeeded,
    /// It failed in a way that may be the dependency's (a retryable failure, a panic).
    Failed,
    /// It ended without saying anything about the dependency (a non-retryable failure: bad
    /// input), or did not run.
    Inconclusive,
}

/// An admitted execution: the dependency and the slot it holds, if any.
#[derive(Debug)]
#[must_use = "give the call back to FleetBudget::finish"]
pub struct Call {
    dependency: Dependency,
    lease: Option<Lease>,
    /// Whether the breaker admitted it (its result is then reported to the breaker).
    judged: bool,
    /// The generation of the half-open probe it is, if it is one.
    probe: Option<u64>,
}

impl Call {
    /// The dependency called.
    #[must_use]
    pub fn dependency(&self) -> &Dependency {
        &self.dependency
    }

    /// The concurrency slot held, if the dependency has a concurrency budget and Redis answered.
    #[must_use]
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// Whether it is a probe of a half-open circuit breaker.
    #[must_use]
    pub fn is_probe(&self) -> bool {
        self.probe.is_some()
    }

    fn unjudged(dependency: Dependency) -> Self {
        Self {
            dependency,
            lease: None,
            judged: false,
            probe: None,
        }
    }
}

/// The admission of calls: the concurrency budgets' leases and the circuit breakers, each
/// where the fleet store's Redis keeps them.
#[derive(Debug)]
pub(super) struct AdmissionControl {
    /// Concurrency budgets by dependency (`[dependencies.X.concurrency]`).
    pub(super) concurrency: BTreeMap<Dependency, ConcurrencyPolicy>,
    /// Where leases are kept: the fleet store's Redis, when there is one.
    pub(super) leases: Option<ConcurrencyBudget>,
    /// Circuit breakers by dependency (`[dependencies.X.breaker]`).
    pub(super) breakers: BTreeMap<Dependency, BreakerPolicy>,
    /// Where breakers are kept: the fleet store's Redis, when there is one.
    pub(super) breaker: Option<Breaker>,
    pub(super) health: Arc<Health>,
    pub(super) metrics: Metrics,
    /// The jitter of held jobs' returns.
    pub(super) jitter: Arc<Jitter>,
}

impl AdmissionControl {
    /// Whether execution `attempt` of a job of `dependency` may run now (see the module
    /// documentation); a half-open breaker's probe spends one retry of `rate` under `policy`.
    pub(super) async fn admit(
        &self,
        dependency: Dependency,
        attempt: u32,
        held_for: Option<Duration>,
        rate: &RateBudget,
        policy: &BudgetPolicy,
    ) -> Admission {
        let mut call = Call::unjudged(dependency);
        if let Some(held) = self.judge(&mut call, held_for, rate, policy).await {
            return held;
        }
        let dependency = call.dependency.clone();
        let (Some(policy), Some(leases)) = (self.concurrency.get(&dependency), &self.leases) else {
            return Admission::Run(call);
        };
        if !self.health.should_try(&dependency) {
            return Admission::Run(call);
        }
        let kind = if attempt <= 1 {
            LeaseKind::Primary
        } else {
            LeaseKind::Retry
        };
        let result = leases.acquire(&dependency, policy, kind).await;
        self.health.record(&dependency, &result);
        let acquired = match result {
            Ok(acquired) => acquired,
            Err(e) => {
                tracing::debug!(error = %e, dependency = %dependency, "no lease; the call runs uncounted");
                return Admission::Run(call);
            }
        };
        self.metrics.in_flight(&dependency, acquired.in_flight);
        let refusal = match acquired.lease {
            Ok(lease) => {
                call.lease = Some(lease);
                return Admission::Run(call);
            }
            Err(refusal) => refusal,
        };
        // Not run: a probe it was is given back for another call to make.
        self.finish(call, CallOutcome::Inconclusive).await;
        if kind == LeaseKind::Primary && held_for.unwrap_or_default() < policy.max_wait {
            Admission::Wait(Hold::PrimaryAtCap)
        } else {
            Admission::DeadLetter(dead_letter(
                &self.metrics,
                dependency,
                refusal.dead_letter_reason(),
                None,
                BudgetSource::Fleet,
            ))
        }
    }

    /// Asks `call`'s dependency's breaker, if it has one: `None` to go on (`call` marked as
    /// judged, and as a probe when it is one), else the admission of a held job.
    async fn judge(
        &self,
        call: &mut Call,
        held_for: Option<Duration>,
        rate: &RateBudget,
        rate_policy: &BudgetPolicy,
    ) -> Option<Admission> {
        let dependency = call.dependency.clone();
        let (Some(policy), Some(breaker)) = (self.breakers.get(&dependency), &self.breaker) else {
            return None;
        };
        if !self.health.should_try(&dependency) {
            return None;
        }
        let result = breaker.admit(&dependency, policy).await;
        self.health.record(&dependency, &result);
        let decided = match result {
            Ok(decided) => decided,
            Err(e) => {
                tracing::debug!(error = %e, dependency = %dependency, "breaker not consulted; the call runs");
                return None;
            }
        };
        self.breaker_seen(&dependency, &decided);
        match decided.verdict {
            Verdict::Run => {
                call.judged = true;
                None
            }
            Verdict::Probe { generation } => {
                // A probe is one retry of the rate budget, which the floor grants however the
                // dependency fails.
                let (withdrawal, _) = rate.withdraw(&dependency, rate_policy).await;
                if withdrawal.granted {
                    call.judged = true;
                    call.probe = Some(generation);
                    return None;
                }
                if let Err(e) = breaker.cancel(&dependency, policy, generation).await {
                    tracing::debug!(error = %e, dependency = %dependency, "probe not given back; it is reissued after the probe timeout");
                }
                Some(self.held_by_breaker(dependency, policy, &decided, held_for))
            }
            Verdict::Wait => Some(self.held_by_breaker(dependency, policy, &decided, held_for)),
        }
    }

    fn held_by_breaker(
        &self,
        dependency: Dependency,
        policy: &BreakerPolicy,
        decided: &Decided,
        held_for: Option<Duration>,
    ) -> Admission {
        let held = held_for.unwrap_or_default();
        if held >= policy.max_wait {
            return Admission::DeadLetter(dead_letter(
                &self.metrics,
                dependency,
                DeadLetterReason::CircuitOpen,
                None,
                BudgetSource::Fleet,
            ));
        }
        // Back when the open period ends, or when its limit does if that comes first.
        let rest = Duration::from_millis(decided.open_until_ms.saturating_sub(decided.now_ms))
            .min(policy.max_wait - held)
            .max(Duration::from_secs(1));
        let jitter = self.jitter.draw(|rng| rng.random_range(1.0..=1.25));
        Admission::Wait(Hold::CircuitOpen {
            retry_in: rest.mul_f64(jitter),
        })
    }

    /// Logs and counts a change of a breaker's state (made by this call, so once fleet-wide),
    /// and a breaker lost while open (`to = "lost"`), and shows the state seen.
    fn breaker_seen(&self, dependency: &Dependency, decided: &Decided) {
        let metrics = &self.metrics;
        metrics.breaker_state(dependency, decided.state.code());
        if self.health.breaker_lost(dependency, decided) {
            metrics.breaker_transition(dependency, "lost");
            tracing::warn!(
                dependency = %dependency,
                "circuit breaker found closed before its open period ended: its key was lost in \
                 Redis (evicted by a maxmemory-policy, FLUSHALL, or a restart without \
                 persistence); it opens again after min_volume calls; counted in \
                 fleet_budget_breaker_transitions_total{{to=\"lost\"}}"
            );
        }
        if decided.changed {
            metrics.breaker_transition(dependency, decided.state.as_str());
            tracing::warn!(
                dependency = %dependency,
                state = decided.state.as_str(),
                open_until_ms = decided.open_until_ms,
                "circuit breaker changed state"
            );
        }
    }

    /// A hedged request to `dependency`: a slot of the retry share (with a concurrency budget)
    /// and one retry of `rate` under `policy`, granted or refused at once (see
    /// [`FleetBudget::try_hedge`]).
    pub(super) async fn try_hedge(
        &self,
        dependency: Dependency,
        rate: &RateBudget,
        policy: &BudgetPolicy,
    ) -> Option<Call> {
        let mut call = Call::unjudged(dependency.clone());
        if let Some(concurrency) = self.concurrency.get(&dependency) {
            let Some(leases) = &self.leases else {
                self.metrics.hedge(&dependency, false);
                return None;
            };
            let result = leases.try_hedge(&dependency, concurrency).await;
            self.health.record(&dependency, &result);
            let Ok(acquired) = result else {
                self.metrics.hedge(&dependency, false);
                return None;
            };
            self.metrics.in_flight(&dependency, acquired.in_flight);
            let Ok(lease) = acquired.lease else {
                self.metrics.hedge(&dependency, false);
                return None;
            };
            call.lease = Some(lease);
        }
        let (withdrawal, _) = rate.withdraw(&dependency, policy).await;
        self.metrics.hedge(&dependency, withdrawal.granted);
        if withdrawal.granted {
            Some(call)
        } else {
            self.finish(call, CallOutcome::Inconclusive).await;
            None
        }
    }

    /// See [`FleetBudget::finish`].
    pub(super) async fn finish(&self, call: Call, outcome: CallOutcome) {
        if let (Some(lease), Some(leases)) = (&call.lease, &self.leases) {
            let result = leases.release_checked(lease).await;
            self.health.record(&call.dependency, &result);
            match result {
                Ok((in_flight, lost)) => {
                    self.metrics.in_flight(&call.dependency, in_flight);
                    if lost {
                        self.metrics.lease_lost(&call.dependency);
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, dependency = %call.dependency, "lease not released; it expires by itself");
                }
            }
        }
        let (true, Some(policy), Some(breaker)) = (
            call.judged,
            self.breakers.get(&call.dependency),
            &self.breaker,
        ) else {
            return;
        };
        let dependency = &call.dependency;
        let result = match (outcome, call.probe) {
            (CallOutcome::Inconclusive, None) => return,
            (CallOutcome::Inconclusive, Some(generation)) => breaker
                .cancel(dependency, policy, generation)
                .await
                .map(|()| None),
            (outcome, probe) => breaker
                .record(dependency, policy, outcome == CallOutcome::Succeeded, probe)
                .await
                .map(Some),
        };
        self.health.record(dependency, &result);
        match result {
            Ok(Some(decided)) => self.breaker_seen(dependency, &decided),
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %e, dependency = %dependency, "call result not reported to the breaker");
            }
        }
    }
}
