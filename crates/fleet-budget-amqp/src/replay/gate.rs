//! The I/O around the pace (`control`): before a move, read its dependency's breaker and budget
//! (the freeze and the current window's counters; not its `remaining`, see `control`), let the
//! loop decide, and wait while it holds. A fresh "go" is trusted for `budget_cache`; while held,
//! the breaker and the budget are read again every `budget_poll`.
//!
//! A breaker or budget that cannot be read does not hold the run (as the worker's admission
//! goes on when the breaker does not answer): the breaker counts as closed, with a warning, and
//! a budget answered from its fallback says nothing of the fleet, so the rate stays where it
//! was.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fleet_budget::breaker::{Breaker, BreakerPolicy, BreakerState};
use fleet_budget::printable::escape_text;
use fleet_budget::store::RedisStore;
use fleet_budget::{BudgetSource, Config, Dependency, StoreError};
use tokio::time::Instant;

use super::Replayer;
use super::control::{BreakerGate, Counters, Gate, Health, HoldReason, Loop, Pace};
use super::handle::Stop;
use super::report::{Held, Rate, ReplayProgress};
use super::select::ReplayOptions;

/// The breakers a replay reads: where they are kept, and the policy of each dependency that has
/// one (`[dependencies.X.breaker]`).
#[derive(Debug, Clone)]
pub struct Breakers {
    breaker: Breaker,
    policies: BTreeMap<Dependency, BreakerPolicy>,
}

impl Breakers {
    /// The breakers kept by `breaker` (its Redis), with these policies.
    #[must_use]
    pub fn new(breaker: Breaker, policies: BTreeMap<Dependency, BreakerPolicy>) -> Self {
        Self { breaker, policies }
    }

    /// The breakers `config` configures (`[dependencies.X.breaker]`), read from its Redis;
    /// `None` when no dependency has one.
    ///
    /// # Errors
    /// The Redis URL cannot be parsed.
    pub fn from_config(config: &Config) -> Result<Option<Self>, StoreError> {
        if config.breakers.is_empty() {
            return Ok(None);
        }
        let store = Arc::new(RedisStore::from_settings(&config.redis)?);
        Ok(Some(Self::new(
            Breaker::new(store),
            config.breakers.clone(),
        )))
    }

    /// What `dependency`'s breaker says about moves now.
    async fn gate(&self, dependency: &Dependency) -> BreakerGate {
        let Some(policy) = self.policies.get(dependency) else {
            return BreakerGate::Closed;
        };
        match self.breaker.status(dependency, policy).await {
            Ok(s) => match s.state {
                BreakerState::Open if s.now_ms < s.open_until_ms => BreakerGate::Open {
                    until_ms: s.open_until_ms,
                },
                // An open breaker past its period half-opens at the next call.
                BreakerState::Open | BreakerState::HalfOpen => BreakerGate::HalfOpen {
                    probes: policy.half_open_probes,
                    open: policy.open,
                },
                BreakerState::Closed => BreakerGate::Closed,
            },
            Err(e) => {
                tracing::warn!(dependency = %dependency, error = %e, "breaker not read; the replay goes on as if it were closed");
                BreakerGate::Closed
            }
        }
    }
}

/// When a loop last said "go", at what rate (`None`: unpaced) and why.
type Fresh = Option<(Instant, Option<f64>, Pace)>;

/// The loops of a run, one per dependency, and when each last said "go".
pub(super) struct Gates {
    loops: HashMap<String, (Loop, Fresh)>,
    /// When the run's moves began to be paced (for [`super::ReplayReport::reached_rate`]).
    pub(super) started: Instant,
}

impl Default for Gates {
    fn default() -> Self {
        Self {
            loops: HashMap::new(),
            started: Instant::now(),
        }
    }
}

/// What waiting at the gate came to.
#[derive(Debug, Default)]
pub(super) struct Passed {
    /// Time held on a frozen budget.
    pub(super) frozen: Duration,
    /// Time held on an open breaker.
    pub(super) held: Duration,
    /// The rate to move at (`None`: unpaced).
    pub(super) rate: Option<f64>,
    /// Why that rate (`None`: no loop: no budget and no breakers).
    pub(super) pace: Option<Pace>,
    /// The run was cancelled while waiting: do not move.
    pub(super) cancelled: bool,
}

impl Replayer {
    /// Waits while `dependency`'s moves are held; returns the time held and the rate to move at.
    pub(super) async fn pass_gate(
        &self,
        dependency: &str,
        options: &ReplayOptions,
        gates: &mut Gates,
        p: &mut ReplayProgress,
        progress: &mut (impl FnMut(&ReplayProgress) + Send),
        stop: &mut Stop,
    ) -> Passed {
        let mut passed = Passed {
            rate: options.rate,
            ..Passed::default()
        };
        let Ok(dep) = Dependency::new(dependency) else {
            return passed;
        };
        if self.budget.is_none() && self.breakers.is_none() {
            // Nothing to follow: the asked rate throughout.
            p.pace = Some(if passed.rate.is_some() {
                Pace::AtRate
            } else {
                Pace::Unpaced
            });
            return passed;
        }
        let (control, fresh) = gates
            .loops
            .entry(dependency.to_owned())
            .or_insert_with(|| (Loop::new(options.control, options.rate), None));
        if let Some((at, rate, pace)) = fresh
            && at.elapsed() < options.budget_cache
        {
            passed.rate = *rate;
            passed.pace = Some(*pace);
            return passed;
        }
        loop {
            let cuts = control.cuts;
            let gate = self.read_gate(&dep, control).await;
            let cut = control.cuts.saturating_sub(cuts);
            p.slowdowns += cut;
            let reason = match gate {
                Gate::Go { rate, pace } => {
                    *fresh = Some((Instant::now(), rate, pace));
                    passed.pace = Some(pace);
                    let (rate, was) = (rate.and_then(Rate::new), p.rate);
                    let changed = rate != was || Some(pace) != p.pace || cut > 0;
                    p.rate = rate;
                    p.pace = Some(pace);
                    if let Some(held) = p.held.take() {
                        p.paused_on = None;
                        tracing::info!(dependency = %escape_text(dependency), after = held.reason.as_str(), "replay resumes");
                        progress(p);
                    } else if changed {
                        progress(p);
                    }
                    passed.rate = rate.map(Rate::per_sec);
                    return passed;
                }
                Gate::Hold(reason) => reason,
            };
            let held = Held {
                dependency: dependency.to_owned(),
                reason: reason.clone(),
            };
            if p.held.as_ref() != Some(&held) {
                tracing::info!(dependency = %escape_text(dependency), why = reason.as_str(), "replay held");
                p.paused_on = Some(dependency.to_owned());
                p.held = Some(held);
                progress(p);
            }
            let waited = Instant::now();
            let cancelled = tokio::select! {
                () = tokio::time::sleep(options.budget_poll) => false,
                () = stop.requested() => true,
            };
            match reason {
                HoldReason::Frozen => passed.frozen += waited.elapsed(),
                HoldReason::BreakerOpen { .. } => passed.held += waited.elapsed(),
            }
            if cancelled {
                passed.cancelled = true;
                return passed;
            }
        }
    }

    /// Reads the breaker and the budget of `dependency`, and lets its loop decide.
    async fn read_gate(&self, dependency: &Dependency, control: &mut Loop) -> Gate {
        let breaker = match &self.breakers {
            Some(b) => b.gate(dependency).await,
            None => BreakerGate::Closed,
        };
        let (health, now_ms) = match &self.budget {
            Some(budget) => {
                let (s, source) = budget.status(dependency).await;
                let now_ms = s.window_index.saturating_mul(s.window_ms) + s.elapsed_ms;
                let fleet = matches!(source, BudgetSource::Fleet);
                let counters = fleet.then_some(Counters {
                    window_index: s.window_index,
                    successes: s.current.successes,
                    retries: s.current.retries,
                    denied: s.current.denied,
                });
                let health = Health {
                    breaker,
                    frozen: s.control.frozen,
                    counters,
                };
                (health, now_ms)
            }
            None => (
                Health {
                    breaker,
                    frozen: false,
                    counters: None,
                },
                fleet_budget::clock::now_ms(),
            ),
        };
        control.decide(now_ms, health)
    }
}
