//! The pace of a replay, as numbers: whether a dependency's moves are held, and at what rate they
//! go. No I/O: `gate` reads the breaker, the freeze and the budget's counters and hands them here.
//!
//! Why the pace follows the dependency's health and not the budget's headroom: right after an
//! outage the budget's `remaining` is 0 for up to two windows (the retries the outage was granted
//! leave the sliding window slowly) while the dependency answers every call. A replay held or
//! bounded by that headroom waited out the outage's bookkeeping, not the dependency (issue 31:
//! 108 s "paused" out of 140 s for 2,000 letters). What the replay needs to know is whether the
//! jobs it moves succeed, so the pace follows the way TCP's congestion window does:
//!
//! - **held** while the dependency's breaker is open (its workers would only park the jobs in the
//!   delay tiers, then dead-letter them `circuit_open`), and while an operator froze its budget
//!   (`budget freeze`: the operator said "no more load on it");
//! - at most **the probe pace** while the breaker is half-open: as many moves per open period as
//!   the breaker admits probes (more would only wait in the delay tiers);
//! - **slow start**: a run begins at `start_rate` and **doubles** each `interval` in which the
//!   dependency's successes grew and its failures stayed at or below `failure_share` of the
//!   outcomes, up to the asked rate (`--rate`); an interval without a success keeps the rate
//!   (nothing says yet that the replayed jobs succeed);
//! - **multiplicative decrease**: an interval whose failures (`retries` + `denied`: the failed
//!   attempts that asked for a retry) were more than `failure_share` of the outcomes (those and
//!   `successes`) cuts the rate by `decrease`, never below `min_rate`; after a cut the rate climbs
//!   back by `increase` per interval in which successes grew (additive increase), not by doubling;
//! - a hold, or a half-open breaker, **starts over** from slow start: what the dependency could
//!   take before is no evidence of what it takes now.
//!
//! The retry budget still governs the replayed jobs themselves: each is a first attempt again,
//! and a failure of it asks the budget for a retry like any other job's, so a replay into a
//! dependency that still fails spends at most what the budget grants, and the rest is
//! dead-lettered again (and parked after `max_replays`).
//!
//! The counters are the current window's, read where `budgetctl status` reads them; a delta is
//! taken between two reads of the same window, and a window that rolled over between them counts
//! what the new window holds (the end of the old one is not seen: a delta too low, never too
//! high). They are fleet-wide: the live traffic's successes and failures count with the replayed
//! jobs'.

use std::time::Duration;

use fleet_budget::printable::escape_text;

/// How the pace follows the dependency (in [`super::ReplayOptions::control`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateControl {
    /// Whether the rate follows the dependency at all (holds on an open breaker and a freeze,
    /// and the probe pace, apply either way). Off, the run keeps its fixed rate.
    pub enabled: bool,
    /// How often the rate is decided again (the interval whose deltas it reads).
    pub interval: Duration,
    /// The rate a run (and a run after a hold) starts at, messages per second (above 0); the
    /// asked rate if that is lower.
    pub start_rate: f64,
    /// The factor failures cut the rate by (above 0, below 1).
    pub decrease: f64,
    /// Messages per second added, after a cut, each interval in which successes grew; `None`: a
    /// tenth of the asked rate, at least 1.
    pub increase: Option<f64>,
    /// The lowest rate a cut reaches (messages per second, above 0).
    pub min_rate: f64,
    /// The share of failures among an interval's outcomes above which the rate is cut. A fleet
    /// failing less than this is not slowed by the replay.
    pub failure_share: f64,
}

impl Default for RateControl {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(1),
            start_rate: 20.0,
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
}

impl Counters {
    /// What happened since `earlier` (see the module documentation for a window roll).
    pub(crate) fn since(&self, earlier: &Self) -> Delta {
        let base = if self.window_index == earlier.window_index {
            *earlier
        } else {
            Self::default()
        };
        Delta {
            successes: self.successes.saturating_sub(base.successes),
            failures: self.retries.saturating_sub(base.retries)
                + self.denied.saturating_sub(base.denied),
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

/// What a read of the dependency saw: its breaker, whether its budget is frozen, and its
/// budget's counters (`None`: not read from the fleet store, so they say nothing of the fleet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Health {
    pub(crate) breaker: BreakerGate,
    pub(crate) frozen: bool,
    pub(crate) counters: Option<Counters>,
}

/// Why moves of a dependency are held.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldReason {
    /// Its breaker is open, until this server time (Unix ms).
    BreakerOpen {
        /// When the open period ends (the breaker then half-opens).
        until_ms: u64,
    },
    /// An operator froze its budget (`budget freeze`).
    Frozen,
}

impl HoldReason {
    /// The wire name (`breaker_open`, `frozen`).
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::BreakerOpen { .. } => "breaker_open",
            Self::Frozen => "frozen",
        }
    }

    /// Why, in words, for progress lines (`held: breaker of search open`), the dependency's
    /// name escaped (it comes from message headers).
    #[must_use]
    pub fn describe(&self, dependency: &str) -> String {
        let d = escape_text(dependency);
        match self {
            Self::BreakerOpen { .. } => format!("held: breaker of {d} open"),
            Self::Frozen => format!("held: {d} frozen by an operator"),
        }
    }
}

/// Why a moving run's rate is what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pace {
    /// Slow start: below the asked rate, doubling each interval while the dependency's
    /// successes grow.
    Starting,
    /// Slow start, not doubled in the last interval: no success was counted in it (nobody
    /// consumed the moved jobs yet, or the dependency is slow to answer).
    AwaitingSuccess,
    /// At the asked rate.
    AtRate,
    /// Cut in the last interval: this many failures were more than the failure share.
    Slowed {
        /// Failed attempts (retries granted and denied) counted in that interval.
        failures: u64,
    },
    /// Climbing back after a cut, by `increase` each interval in which successes grew.
    Recovering,
    /// Bounded by the half-open breaker's probe pace.
    ProbePace,
    /// Below the asked rate and kept there: the budget was not read from the fleet store
    /// (Redis did not answer, or the budget is local), so nothing says how the jobs fare.
    Unread,
    /// No rate asked: moves go as fast as the run can send them.
    Unpaced,
}

impl Pace {
    /// The wire name (`starting`, `awaiting_success`, `at_rate`, `slowed`, `recovering`,
    /// `probe_pace`, `unread`, `unpaced`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::AwaitingSuccess => "awaiting_success",
            Self::AtRate => "at_rate",
            Self::Slowed { .. } => "slowed",
            Self::Recovering => "recovering",
            Self::ProbePace => "probe_pace",
            Self::Unread => "unread",
            Self::Unpaced => "unpaced",
        }
    }

    /// Why, in words, for progress lines.
    #[must_use]
    pub fn describe(self) -> String {
        match self {
            Self::Starting => "starting: doubling while replayed jobs succeed".to_owned(),
            Self::AwaitingSuccess => {
                "starting: waiting for replayed jobs to succeed before doubling".to_owned()
            }
            Self::AtRate => "at the asked rate".to_owned(),
            Self::Slowed { failures } => format!("slowed: {failures} failures in the last window"),
            Self::Recovering => "recovering: climbing back while replayed jobs succeed".to_owned(),
            Self::ProbePace => "half-open breaker: at its probe pace".to_owned(),
            Self::Unread => "kept: the budget's counters were not read from Redis".to_owned(),
            Self::Unpaced => "unpaced".to_owned(),
        }
    }
}

/// What the loop decided for a dependency.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Gate {
    /// Hold its moves.
    Hold(HoldReason),
    /// Move at this rate (`None`: unpaced), for this reason.
    Go { rate: Option<f64>, pace: Pace },
}

/// One dependency's loop: its rate, why, and the counters at the start of the interval.
#[derive(Debug, Clone)]
pub(crate) struct Loop {
    settings: RateControl,
    /// The asked rate (`None`: unpaced).
    max_rate: Option<f64>,
    /// The rate the loop reached (paced runs only; before the probe pace).
    rate: f64,
    /// Why `rate` is what it is.
    pace: Pace,
    /// Cut since the last start over: climbing additively, not by doubling.
    cut: bool,
    /// The counters at the start of the current interval, and the server ms then.
    last: Option<(Counters, u64)>,
    /// The last read had no counters of the fleet.
    unread: bool,
    /// Cuts made.
    pub(crate) cuts: u64,
}

impl Loop {
    pub(crate) fn new(settings: RateControl, max_rate: Option<f64>) -> Self {
        let max_rate = max_rate.filter(|r| r.is_finite() && *r > 0.0);
        let mut l = Self {
            settings,
            max_rate,
            rate: 0.0,
            pace: Pace::Unpaced,
            cut: false,
            last: None,
            unread: false,
            cuts: 0,
        };
        l.start_over();
        l
    }

    /// Slow start again, from `start_rate` (the asked rate if lower).
    fn start_over(&mut self) {
        self.last = None;
        self.cut = false;
        let Some(max) = self.max_rate else {
            self.pace = Pace::Unpaced;
            return;
        };
        if !self.settings.enabled {
            (self.rate, self.pace) = (max, Pace::AtRate);
            return;
        }
        let start = Some(self.settings.start_rate)
            .filter(|r| r.is_finite() && *r > 0.0)
            .unwrap_or(1.0);
        (self.rate, self.pace) = if start >= max {
            (max, Pace::AtRate)
        } else {
            (start, Pace::Starting)
        };
    }

    /// Decides from a read made at server time `now_ms`. The rate moves once per `interval` of
    /// server time; holds and the probe pace apply at every read.
    pub(crate) fn decide(&mut self, now_ms: u64, health: Health) -> Gate {
        let hold = match health.breaker {
            BreakerGate::Open { until_ms } => Some(HoldReason::BreakerOpen { until_ms }),
            _ if health.frozen => Some(HoldReason::Frozen),
            _ => None,
        };
        if let Some(reason) = hold {
            self.start_over();
            return Gate::Hold(reason);
        }
        let probe = match health.breaker {
            BreakerGate::HalfOpen { probes, open } => {
                #[allow(clippy::cast_precision_loss)] // a handful of probes
                let probe = probes.max(1) as f64 / open.as_secs_f64().max(0.001);
                // Probes succeeding say little of the load the dependency takes: start over
                // once it closes.
                self.start_over();
                Some(probe)
            }
            _ => None,
        };
        if probe.is_none() && self.settings.enabled && self.max_rate.is_some() {
            self.follow(now_ms, health.counters);
        }
        let (rate, pace) = match self.max_rate {
            Some(_) if self.unread && self.pace != Pace::AtRate => (Some(self.rate), Pace::Unread),
            Some(_) => (Some(self.rate), self.pace),
            None => (None, Pace::Unpaced),
        };
        match probe {
            Some(p) if rate.is_none_or(|r| p < r) => Gate::Go {
                rate: Some(p),
                pace: Pace::ProbePace,
            },
            _ => Gate::Go { rate, pace },
        }
    }

    /// Steps the rate when an interval has passed since the last step.
    fn follow(&mut self, now_ms: u64, counters: Option<Counters>) {
        self.unread = counters.is_none();
        let Some(counters) = counters else {
            // Nothing read from the fleet: nothing to follow; the next read starts an interval.
            self.last = None;
            return;
        };
        match self.last {
            None => self.last = Some((counters, now_ms)),
            Some((before, at)) => {
                let interval = u64::try_from(self.settings.interval.as_millis()).unwrap_or(1);
                if now_ms.saturating_sub(at) >= interval.max(1) {
                    self.step(counters.since(&before));
                    self.last = Some((counters, now_ms));
                }
            }
        }
    }

    /// One interval: cut on failures, grow on successes, keep otherwise.
    fn step(&mut self, delta: Delta) {
        let Some(max) = self.max_rate else { return };
        #[allow(clippy::cast_precision_loss)] // counts far below 2^53
        let (failures, outcomes) = (
            delta.failures as f64,
            (delta.failures + delta.successes) as f64,
        );
        if delta.failures > 0 && failures > self.settings.failure_share * outcomes {
            let min = self.settings.min_rate.max(f64::MIN_POSITIVE);
            self.rate = (self.rate * self.settings.decrease).max(min.min(self.rate));
            self.pace = Pace::Slowed {
                failures: delta.failures,
            };
            self.cut = true;
            self.cuts += 1;
            return;
        }
        if delta.successes == 0 {
            // Nothing says the moved jobs succeed: keep the rate.
            self.pace = match self.pace {
                Pace::Starting | Pace::AwaitingSuccess => Pace::AwaitingSuccess,
                Pace::Slowed { .. } | Pace::Recovering => Pace::Recovering,
                other => other,
            };
            return;
        }
        let next = if self.cut {
            let step = self
                .settings
                .increase
                .filter(|s| s.is_finite() && *s > 0.0)
                .unwrap_or((max / 10.0).max(1.0));
            self.rate + step
        } else {
            self.rate * 2.0
        };
        self.rate = next.min(max);
        self.pace = if self.rate >= max {
            Pace::AtRate
        } else if self.cut {
            Pace::Recovering
        } else {
            Pace::Starting
        };
    }

    /// The rate this loop last decided (before the probe pace).
    #[cfg(test)]
    pub(crate) fn rate(&self) -> f64 {
        self.rate
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic, clippy::float_cmp)]
mod tests;
