//! What a replay reports: where it stands while it runs ([`ReplayProgress`], to the progress
//! callback, the copies' accounting and the pauses) and how it ended ([`ReplayReport`]). Apart
//! from the run's loop, which fills them, so that the parts of a run count without importing
//! the loop.

use std::time::Duration;

use super::control::{HoldReason, Pace};

/// Where a replay stands; passed to the progress callback after every message, on holds and
/// when the rate changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayProgress {
    /// Messages in the dead-letter queue when the run started (the bound).
    pub total: u64,
    /// Messages read so far.
    pub seen: u64,
    /// Counts so far (see [`ReplayReport`]).
    pub moved: u64,
    /// Parked so far.
    pub parked: u64,
    /// Skipped so far.
    pub skipped: u64,
    /// Failed so far.
    pub failed: u64,
    /// Dropped so far: an interrupted run had moved them already (see [`ReplayReport`]).
    pub already_moved: u64,
    /// The dependency the run is waiting for, while held (its breaker open, or its budget
    /// frozen: `held` says which).
    pub paused_on: Option<String>,
    /// Why the run is waiting, while held.
    pub held: Option<Held>,
    /// The rate moves go at now (messages per second; `None`: unpaced, or nothing decided
    /// yet).
    pub rate: Option<Rate>,
    /// Why `rate` is what it is (`None`: nothing decided yet).
    pub pace: Option<Pace>,
    /// Times the rate was cut after failures rose.
    pub slowdowns: u64,
}

impl ReplayProgress {
    /// How long the messages not yet read take at the current rate (`None`: held, unpaced, or
    /// nothing decided yet). Skipped messages go faster than that: an upper bound for a
    /// filtered run.
    #[must_use]
    pub fn eta(&self) -> Option<Duration> {
        if self.held.is_some() || self.pace.is_none() {
            return None;
        }
        let rate = self.rate?;
        #[allow(clippy::cast_precision_loss)] // counts far below 2^53
        let left = self.total.saturating_sub(self.seen) as f64;
        Duration::try_from_secs_f64(left / rate.per_sec()).ok()
    }

    /// Where the pace stands, in words, for a progress line: why nothing moves (`held: breaker of
    /// search open`), or the rate, why it is what it is, and the ETA (`2000.0/s, at the asked
    /// rate, ETA 12s`). Names from message headers are escaped.
    #[must_use]
    pub fn pace_text(&self) -> String {
        if let Some(held) = &self.held {
            return held.reason.describe(&held.dependency);
        }
        // Nothing decided yet: the rate asked is not the rate moves go at.
        let Some(pace) = self.pace else {
            return String::new();
        };
        let Some(rate) = self.rate else {
            return pace.describe();
        };
        let mut text = format!("{:.1}/s, {}", rate.per_sec(), pace.describe());
        if let Some(eta) = self.eta() {
            text.push_str(", ETA ");
            text.push_str(&eta_text(eta));
        }
        text
    }
}

/// `45s`, `3m05s`, `2h10m`.
fn eta_text(eta: Duration) -> String {
    let s = eta.as_secs_f64().ceil();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // finite, above 0
    let s = s as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// A held run: which dependency, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The dependency whose moves wait.
    pub dependency: String,
    /// Why.
    pub reason: HoldReason,
}

/// A rate in messages per second: always finite and above 0 (so it compares, and a report
/// holding one can be `Eq`).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Rate(f64);

impl Eq for Rate {}

impl Rate {
    /// `per_sec` if it is finite and above 0.
    #[must_use]
    pub fn new(per_sec: f64) -> Option<Self> {
        (per_sec.is_finite() && per_sec > 0.0).then_some(Self(per_sec))
    }

    /// Messages per second.
    #[must_use]
    pub fn per_sec(self) -> f64 {
        self.0
    }
}

/// What a replay took out of its source queue for one dependency × reason × error class ×
/// minute, as the
/// dead-letter index counted it (a run without an index has none).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupMoves {
    /// The dependency.
    pub dependency: String,
    /// Why they had been dead-lettered (or parked).
    pub reason: String,
    /// Their error class (empty when none).
    pub error_class: String,
    /// The minute they were dead-lettered in (Unix ms / 60,000; 0 when unknown).
    pub minute: u64,
    /// Taken out of the source queue (moved back to work, parked, or dropped as already
    /// moved).
    pub out: u64,
    /// Of those, parked.
    pub parked: u64,
}

/// The outcome of a replay. `matched = moved + parked_looping + uncertain + already_moved +
/// failed`; `seen = moved + parked + skipped + failed + already_moved`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Messages in the dead-letter queue at the start.
    pub total: u64,
    /// Messages read.
    pub seen: u64,
    /// Messages that matched the filter.
    pub matched: u64,
    /// Republished to their original exchange and acked.
    pub moved: u64,
    /// Moved to the parked queue (looping or malformed).
    pub parked: u64,
    /// Of which malformed.
    pub malformed: u64,
    /// Not matching the filter; left in the dead-letter queue.
    pub skipped: u64,
    /// Copy not confirmed; left in the dead-letter queue.
    pub failed: u64,
    /// Dropped, not copied: an earlier run that was cut off had moved them (its copy confirmed,
    /// its original not yet acked). See `fleet_budget::control::ReplayMoves`.
    pub already_moved: u64,
    /// Of `parked`: an earlier run that was cut off had sent a copy of them and never seen the
    /// broker's answer, so whether their job ran cannot be told. Parked with that reason, for an
    /// operator to decide: never copied a second time, never dropped.
    pub in_doubt: u64,
    /// Time spent held while a dependency's budget was frozen by an operator.
    pub held_frozen: Duration,
    /// Time spent held while a dependency's breaker was open.
    pub held_breaker: Duration,
    /// Times the rate was cut after failures rose.
    pub slowdowns: u64,
    /// The lowest rate moves went at (`None`: unpaced throughout, or nothing moved).
    pub lowest_rate: Option<Rate>,
    /// The highest rate moves went at (`None`: unpaced throughout, or nothing moved).
    pub highest_rate: Option<Rate>,
    /// How long after the run started a move first went at the asked rate (`None`: never, or
    /// unpaced).
    pub reached_rate: Option<Duration>,
    /// The run was cancelled ([`super::ReplayHandle::cancel`]): it stopped reading, and what it
    /// had not moved stays in the queue.
    pub cancelled: bool,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Of the messages the run left in the source queue (`total` less `moved` and `parked`),
    /// how many the broker did not count ready yet when the run returned: it waits for them up
    /// to `idle_timeout` (see the `end` module). 0 unless another consumer reads the queue or the
    /// broker is slow; meanwhile the queue's depth reads that much short.
    pub not_ready: u64,
    /// What it took out of the source queue, by dependency × reason × error class (empty
    /// without a dead-letter index).
    pub by_group: Vec<GroupMoves>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn moving(rate: f64, pace: Pace) -> ReplayProgress {
        ReplayProgress {
            total: 40_000,
            seen: 4_000,
            rate: Rate::new(rate),
            pace: Some(pace),
            ..ReplayProgress::default()
        }
    }

    #[test]
    fn the_line_says_the_rate_why_and_the_time_left_at_it() {
        assert_eq!(
            moving(2000.0, Pace::AtRate).pace_text(),
            "2000.0/s, at the asked rate, ETA 18s"
        );
        assert_eq!(
            moving(40.0, Pace::Starting).pace_text(),
            "40.0/s, starting: doubling while replayed jobs succeed, ETA 15m00s"
        );
        assert_eq!(
            moving(1.0, Pace::Slowed { failures: 7 }).pace_text(),
            "1.0/s, slowed: 7 failures in the last window, ETA 10h00m"
        );
    }

    #[test]
    fn held_or_undecided_says_no_rate_and_no_eta() {
        let held = ReplayProgress {
            held: Some(Held {
                dependency: "search".to_owned(),
                reason: HoldReason::BreakerOpen { until_ms: 1 },
            }),
            ..moving(2000.0, Pace::AtRate)
        };
        assert_eq!(held.pace_text(), "held: breaker of search open");
        assert_eq!(held.eta(), None);
        // The asked rate before the first decision is not what moves go at.
        let undecided = ReplayProgress {
            pace: None,
            ..moving(2000.0, Pace::AtRate)
        };
        assert_eq!(undecided.pace_text(), "");
        assert_eq!(undecided.eta(), None);
        let unpaced = ReplayProgress {
            rate: None,
            ..moving(1.0, Pace::Unpaced)
        };
        assert_eq!(unpaced.pace_text(), "unpaced");
    }
}
