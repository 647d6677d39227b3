//! The closed loop of a replay, as numbers: whether a dependency's moves are held, and at what
//! rate they go. No I/O: `gate` reads the breaker and the budget's counters and hands them here.
//!
//! Why a closed loop: a replay paced by a fixed rate keeps sending a dependency jobs while they
//! fail again, each failure spending a retry of the budget the live fleet needs. So the rate
//! follows what the dependency does with the jobs, the way TCP follows losses (AIMD):
//!
//! - **held** while the dependency's breaker is open (its workers would only park the jobs in
//!   the delay tiers, then dead-letter them `circuit_open`), and while its budget is exhausted
//!   (the first failure would be dead-lettered at once);
//! - at most the **probe pace** while the breaker is half-open: as many moves per open period
//!   as the breaker admits probes (more would only wait in the delay tiers);
//! - **multiplicative decrease** when, over the last interval, the budget refused a retry (its
//!   `denied` counter rose), or failures (`retries` + `denied`: the failed attempts that asked
//!   for a retry) were more than `failure_share` of the outcomes (those and `successes`): the
//!   rate is cut by `decrease`, never below `min_rate`;
//! - **additive increase** otherwise: `increase` messages per second more each interval;
//! - bounded by the **budget pace**, the retries the budget could still grant (`remaining`) per
//!   second: if every job of one second of moves failed, the budget could still retry them all;
//!   and by the configured maximum (`--rate`).
//!
//! The counters are the current window's, read where `budgetctl status` reads them; a delta is
//! taken between two reads of the same window, and a window that rolled over between them
//! counts what the new window holds (the end of the old one is not seen: a delta too low, never
//! too high).

use std::time::Duration;

/// How the loop reacts (in [`super::ReplayOptions::control`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateControl {
    /// Whether the rate follows failures and the budget's headroom at all (holds on an open
    /// breaker and an exhausted budget apply either way). Off, the run keeps its fixed rate.
    pub enabled: bool,
    /// How often the rate is decided again (the interval whose deltas it reads).
    pub interval: Duration,
    /// The factor a rise cuts the rate by (above 0, below 1).
    pub decrease: f64,
    /// Messages per second added after an interval without a rise; `None`: a tenth of the
    /// ceiling, at least 1.
    pub increase: Option<f64>,
    /// The lowest rate a cut reaches (messages per second, above 0).
    pub min_rate: f64,
    /// The share of failures among an interval's outcomes above which the rate is cut (a denial
    /// cuts it whatever the share). A fleet failing less than this is not slowed by the replay.
    pub failure_share: f64,
}

impl Default for RateControl {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(1),
            decrease: 0.5,
            increase: None,
            min_rate: 0.5,
            failure_share: 0.2,
        }
    }
}

/// The budget's counters of its current window, as one read saw them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    /// Which window (`floor(server ms / window ms)`).
    pub(crate) window_index: u64,
    /// Successful jobs.
    pub(crate) successes: u64,
    /// Retries granted (failed attempts retried).
    pub(crate) retries: u64,
    /// Retries denied (failed attempts the budget refused).
    pub(crate) denied: u64,
}

/// What happened between two reads of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Delta {
    pub(crate) successes: u64,
    /// Retries granted and denied.
    pub(crate) failures: u64,
    pub(crate) denied: u64,
}

impl Counters {
    /// What happened since `earlier` (see the module documentation for a window roll).
    pub(crate) fn since(&self, earlier: &Self) -> Delta {
        let base = if self.window_index == earlier.window_index {
            *earlier
        } else {
            Self::default()
        };
        let denied = self.denied.saturating_sub(base.denied);
        Delta {
            successes: self.successes.saturating_sub(base.successes),
            failures: self.retries.saturating_sub(base.retries) + denied,
            denied,
        }
    }
}

/// The breaker as the loop needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BreakerGate {
    /// No breaker, or closed.
    Closed,
    /// Open until this server time (ms).
    Open { until_ms: u64 },
    /// Half-open (or open past its period, which half-opens at the next call): this many probes
    /// per open period.
    HalfOpen { probes: u64, open: Duration },
}

/// Why moves of a dependency are held.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldReason {
    /// Its budget has no retry left.
    BudgetExhausted,
    /// Its breaker is open, until this server time (Unix ms).
    BreakerOpen {
        /// When the open period ends (the breaker then half-opens).
        until_ms: u64,
    },
}

impl HoldReason {
    /// The wire name (`budget_exhausted`, `breaker_open`).
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::BudgetExhausted => "budget_exhausted",
            Self::BreakerOpen { .. } => "breaker_open",
        }
    }
}

/// What holds the rate below the configured maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlowReason {
    /// Cut after failures or denials rose, not yet climbed back.
    Failures,
    /// Bounded by the budget's headroom.
    BudgetPace,
    /// Bounded by the half-open breaker's probe pace.
    ProbePace,
}

impl SlowReason {
    /// The wire name (`failures`, `budget_pace`, `probe_pace`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Failures => "failures",
            Self::BudgetPace => "budget_pace",
            Self::ProbePace => "probe_pace",
        }
    }
}

/// What the loop decided for a dependency.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Gate {
    /// Hold its moves.
    Hold(HoldReason),
    /// Move at this rate (`None`: unpaced), slowed for this reason if any.
    Go {
        rate: Option<f64>,
        slowed: Option<SlowReason>,
    },
}

/// One dependency's loop: its rate, and the counters of the last interval.
#[derive(Debug, Clone)]
pub(crate) struct Loop {
    settings: RateControl,
    /// The configured maximum (`None`: unpaced).
    max_rate: Option<f64>,
    /// The rate AIMD reached (before the ceilings of this decision).
    rate: Option<f64>,
    /// Whether `rate` is below the maximum because of a cut.
    cut: bool,
    /// The counters at the start of the current interval, and the server ms then.
    last: Option<(Counters, u64)>,
    /// Cuts made.
    pub(crate) cuts: u64,
}

impl Loop {
    pub(crate) fn new(settings: RateControl, max_rate: Option<f64>) -> Self {
        let max_rate = max_rate.filter(|r| r.is_finite() && *r > 0.0);
        Self {
            settings,
            max_rate,
            rate: max_rate,
            cut: false,
            last: None,
            cuts: 0,
        }
    }

    /// Decides from a read made at server time `now_ms`: the breaker, the budget's headroom
    /// and its counters. The rate moves once per `interval` of server time; holds and
    /// ceilings apply at every read.
    pub(crate) fn decide(
        &mut self,
        now_ms: u64,
        breaker: BreakerGate,
        remaining: u64,
        counters: Counters,
    ) -> Gate {
        if let BreakerGate::Open { until_ms } = breaker {
            return Gate::Hold(HoldReason::BreakerOpen { until_ms });
        }
        if remaining == 0 {
            return Gate::Hold(HoldReason::BudgetExhausted);
        }
        if !self.settings.enabled {
            return self.ceilinged(breaker, remaining, false);
        }
        match self.last {
            None => self.last = Some((counters, now_ms)),
            Some((before, at)) => {
                let interval = u64::try_from(self.settings.interval.as_millis()).unwrap_or(1);
                if now_ms.saturating_sub(at) >= interval.max(1) {
                    self.step(counters.since(&before), breaker, remaining);
                    self.last = Some((counters, now_ms));
                }
            }
        }
        self.ceilinged(breaker, remaining, true)
    }

    /// The highest rate allowed now: the maximum, the budget pace, the probe pace.
    fn ceiling(
        &self,
        breaker: BreakerGate,
        remaining: u64,
        paced: bool,
    ) -> (f64, Option<SlowReason>) {
        let mut ceiling = (self.max_rate.unwrap_or(f64::INFINITY), None);
        if paced {
            #[allow(clippy::cast_precision_loss)] // a headroom far below 2^53
            let budget = remaining as f64;
            if budget < ceiling.0 {
                ceiling = (budget, Some(SlowReason::BudgetPace));
            }
        }
        if let BreakerGate::HalfOpen { probes, open } = breaker {
            #[allow(clippy::cast_precision_loss)]
            let probe = probes.max(1) as f64 / open.as_secs_f64().max(0.001);
            if probe < ceiling.0 {
                ceiling = (probe, Some(SlowReason::ProbePace));
            }
        }
        ceiling
    }

    fn ceilinged(&self, breaker: BreakerGate, remaining: u64, paced: bool) -> Gate {
        let (ceiling, why) = self.ceiling(breaker, remaining, paced);
        let rate = if paced { self.rate } else { self.max_rate };
        match rate {
            Some(r) if r <= ceiling => Gate::Go {
                rate: Some(r),
                slowed: (self.cut && paced).then_some(SlowReason::Failures),
            },
            _ if ceiling.is_finite() => Gate::Go {
                rate: Some(ceiling),
                slowed: why,
            },
            _ => Gate::Go {
                rate: None,
                slowed: None,
            },
        }
    }

    /// One interval of AIMD.
    fn step(&mut self, delta: Delta, breaker: BreakerGate, remaining: u64) {
        let (ceiling, _) = self.ceiling(breaker, remaining, true);
        // Unpaced and unbounded: nothing to cut from until a ceiling appears.
        let current = self.rate.unwrap_or(ceiling);
        let rose = delta.denied > 0 || {
            #[allow(clippy::cast_precision_loss)]
            let (failures, outcomes) = (
                delta.failures as f64,
                (delta.failures + delta.successes) as f64,
            );
            delta.failures > 0 && failures > self.settings.failure_share * outcomes
        };
        let min = self.settings.min_rate.max(f64::MIN_POSITIVE);
        if rose {
            if current.is_finite() {
                let from = current.min(ceiling);
                self.rate = Some((from * self.settings.decrease).max(min.min(from)));
                self.cuts += 1;
                self.cut = true;
            }
            return;
        }
        let Some(rate) = self.rate else { return };
        let top = self.max_rate.unwrap_or(f64::INFINITY);
        let step = self
            .settings
            .increase
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or_else(|| {
                if ceiling.is_finite() {
                    (ceiling / 10.0).max(1.0)
                } else {
                    1.0
                }
            });
        // Climbing from below the ceiling, not above it: a budget pace that lowered the
        // ceiling does not let the rate grow past it unseen.
        let next = (rate.min(ceiling.max(min)) + step).min(top);
        self.rate = if next.is_finite() {
            Some(next)
        } else {
            self.max_rate
        };
        // Slowed by failures until the rate is back at its ceiling.
        self.cut = next < top.min(ceiling);
    }

    /// The rate this loop last decided (before ceilings).
    #[cfg(test)]
    pub(crate) fn rate(&self) -> Option<f64> {
        self.rate
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic, clippy::float_cmp)]
mod tests;
