//! A dependency's past, read back: the incidents in it, its healthy retry fraction, and the
//! budget its own traffic recommends (`budgetctl tune`, `budgetctl incident report`).
//!
//! Pure arithmetic over series the caller fetched (from Prometheus, one sample per step): no
//! I/O, no clock. The rules, each with the evidence [`recommend`] reports beside its number:
//!
//! 1. **Retry fraction** of a step: retries asked (granted + denied) over deposits (successes, or
//!    first attempts under `deposit = "request"`). Retries with no deposit at all is an infinite
//!    fraction (the dependency failed every call); a step with neither has no traffic.
//! 2. **Incidents**: stretches of at least [`Rules::min_incident_steps`] steps where the retry
//!    fraction stayed above a threshold or the breaker was not closed, gaps of up to
//!    [`Rules::merge_gap_steps`] steps joined. A first pass takes twice the median fraction as
//!    the threshold (robust while incidents cover less than half the steps); the incidents
//!    reported are those above the recommended ratio.
//! 3. **Healthy retry fraction**: the [`Rules::healthy_percentile`] (p99) of the fraction over
//!    the steps with traffic outside the first pass's incidents and the step on either side of
//!    each, breaker closed.
//! 4. **Ratio**: [`Rules::margin`] (1.5) times the healthy fraction, rounded up to two
//!    significant digits (so between 1.5 and 1.6 times it), within 0.01 and 10.
//! 5. **`min_allowance`**: what the quiet windows needed: the p99, over healthy steps whose
//!    budget window overlaps no incident, of the retries of the budget window ending there that
//!    the ratio alone would not have granted (`retries − ratio × deposits` over `window_secs`),
//!    rounded up, and at least 1 (a probe).
//! 6. **Recovery window**: the [`Rules::incident_percentile`] (p95) of the incidents' durations,
//!    rounded up to a second; the attempts follow from the task's backoff
//!    ([`fleet_budget::ceiling::Schedule::for_window`], what `budgetctl plan` computes).
//! 7. **Check**: the healthy steps the recommended ratio would have denied retries in, and the
//!    shadow counter (`fleet_budget_retries_would_deny_total`) when the fleet exports it.

use std::time::Duration;

use fleet_budget::ceiling::{Backoff, Schedule};
use serde::Serialize;

/// One step of a dependency's history: what happened in the step ending at `at_ms`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// The end of the step, Unix milliseconds.
    pub at_ms: u64,
    /// Deposits in the step (successes, or first attempts under `deposit = "request"`).
    pub deposits: f64,
    /// Retries asked in the step (granted + denied).
    pub retries: f64,
    /// Retries the budget denied in the step.
    pub denied: f64,
    /// The breaker was open or half-open at the step's end.
    pub breaker_open: bool,
    /// Deposits in the budget window (`window_secs`) ending at `at_ms`.
    pub window_deposits: f64,
    /// Retries asked in the budget window ending at `at_ms`.
    pub window_retries: f64,
    /// Retries shadow mode counted as "enforcement would deny" in the step; `None` when the
    /// fleet exports no such counter.
    pub would_deny: Option<f64>,
}

impl Sample {
    /// The retry fraction of the step: `None` without traffic, infinite for retries without a
    /// deposit.
    #[must_use]
    pub fn fraction(&self) -> Option<f64> {
        if self.deposits > 0.0 {
            Some(self.retries / self.deposits)
        } else if self.retries > 0.0 {
            Some(f64::INFINITY)
        } else {
            None
        }
    }
}

/// The constants of the rules (the module's documentation says what each does).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rules {
    /// The ratio is this many times the healthy retry fraction.
    pub margin: f64,
    /// The percentile of the healthy steps' retry fraction the margin is applied to.
    pub healthy_percentile: f64,
    /// The percentile of the incidents' durations the recovery window is.
    pub incident_percentile: f64,
    /// The shortest run of steps above the threshold that is an incident.
    pub min_incident_steps: usize,
    /// Gaps of at most this many steps inside an incident do not split it.
    pub merge_gap_steps: usize,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            margin: 1.5,
            healthy_percentile: 0.99,
            incident_percentile: 0.95,
            min_incident_steps: 2,
            merge_gap_steps: 1,
        }
    }
}

/// The smallest ratio recommended (a dependency that never retried while healthy).
pub const MIN_RATIO: f64 = 0.01;
/// The largest ratio the configuration accepts.
pub const MAX_RATIO: f64 = 10.0;

/// A stretch of steps where the retry fraction stayed above the threshold or the breaker was
/// not closed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Incident {
    /// Start (the beginning of its first step), Unix milliseconds.
    pub start_ms: u64,
    /// End (the end of its last step), Unix milliseconds.
    pub end_ms: u64,
    /// `end_ms - start_ms`.
    pub duration_ms: u64,
    /// The highest finite retry fraction in it (`None` when every step had retries without a
    /// deposit).
    pub peak_fraction: Option<f64>,
    /// Steps in it with no deposit at all (every call failing).
    pub steps_without_deposits: usize,
    /// Steps in it with the breaker open or half-open.
    pub breaker_open_steps: usize,
    /// Retries asked and denied in it.
    pub retries: f64,
    /// Retries denied in it.
    pub denied: f64,
}

/// The incidents of `samples` (one per step of `step_ms`, in time order) above `threshold`.
#[must_use]
pub fn incidents(samples: &[Sample], step_ms: u64, threshold: f64, rules: &Rules) -> Vec<Incident> {
    let above: Vec<bool> = samples
        .iter()
        .map(|s| s.breaker_open || s.fraction().is_some_and(|f| f > threshold))
        .collect();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < above.len() {
        if !above.get(i).copied().unwrap_or(false) {
            i += 1;
            continue;
        }
        let start = i;
        while above.get(i + 1).copied().unwrap_or(false) {
            i += 1;
        }
        match runs.last_mut() {
            Some(last) if start - last.1 - 1 <= rules.merge_gap_steps => last.1 = i,
            _ => runs.push((start, i)),
        }
        i += 1;
    }
    runs.into_iter()
        .filter(|(a, b)| b - a + 1 >= rules.min_incident_steps.max(1))
        .filter_map(|(a, b)| {
            let steps = samples.get(a..=b)?;
            let first = steps.first()?;
            let last = steps.last()?;
            let start_ms = first.at_ms.saturating_sub(step_ms);
            Some(Incident {
                start_ms,
                end_ms: last.at_ms,
                duration_ms: last.at_ms - start_ms.min(last.at_ms),
                peak_fraction: steps
                    .iter()
                    .filter_map(Sample::fraction)
                    .filter(|f| f.is_finite())
                    .reduce(f64::max),
                steps_without_deposits: steps
                    .iter()
                    .filter(|s| s.deposits <= 0.0 && s.retries > 0.0)
                    .count(),
                breaker_open_steps: steps.iter().filter(|s| s.breaker_open).count(),
                retries: steps.iter().map(|s| s.retries).sum(),
                denied: steps.iter().map(|s| s.denied).sum(),
            })
        })
        .collect()
}

/// The nearest-rank percentile `p` (0 < p ≤ 1) of `values`; `None` when empty.
#[must_use]
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    // Nearest rank: the smallest value with at least p of the values at or below it.
    let rank = usize::try_from(whole(p.clamp(0.0, 1.0) * n as f64)).unwrap_or(n);
    sorted.get(rank.clamp(1, n) - 1).copied()
}

/// `x` rounded up to a whole number, 0 for what is negative or not a number, `u64::MAX` past it.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // clamped first; `as` saturates
#[must_use]
pub fn whole(x: f64) -> u64 {
    if x.is_nan() || x <= 0.0 {
        0
    } else {
        x.ceil().min(u64::MAX as f64) as u64
    }
}

/// `x` rounded up to two significant digits (`0.0734` → `0.074`).
#[must_use]
pub fn round_up_2sig(x: f64) -> f64 {
    if !(x.is_finite() && x > 0.0) {
        return x;
    }
    // The decimal exponent: within ±324 for a finite positive x.
    let floor = x.log10().floor();
    let magnitude = i32::try_from(whole(floor.abs())).unwrap_or(400);
    let exponent = if floor < 0.0 { -magnitude } else { magnitude };
    let scale = 10f64.powi(1 - exponent);
    // The division by a power of ten can leave 0.07400000000000001; trim what is below
    // the second digit's precision before rounding up.
    let scaled = (x * scale * 1e9).round() / 1e9;
    scaled.ceil() / scale
}

/// What the ceiling is to become.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WindowAdvice {
    /// The recommended `recovery_window_secs`.
    pub recovery_window_secs: u64,
    /// The p95 of the incidents' durations it comes from, milliseconds.
    pub incident_p95_ms: u64,
    /// Executions (the first included) that window takes with the task's backoff: the
    /// `max_attempts` to configure for a ceiling by count.
    pub max_attempts: u32,
    /// When the last of them runs after the first failure, milliseconds.
    pub last_attempt_ms: u64,
}

/// What low-traffic windows needed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FloorEvidence {
    /// Healthy steps whose budget window had more retries than the ratio alone grants.
    pub windows_short: usize,
    /// The p99 of what those windows lacked (0 when none did).
    pub needed_p99: f64,
    /// The most any lacked.
    pub needed_max: f64,
}

/// The shadow counter over the range.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ShadowEvidence {
    /// Retries enforcement would have denied, over the whole range.
    pub would_deny: f64,
    /// Of those, in healthy steps.
    pub would_deny_healthy: f64,
}

/// A dependency's recommendation and the evidence behind each number.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendation {
    /// Steps in the range, with traffic, and healthy (with traffic, outside the first pass's
    /// incidents, breaker closed).
    pub steps: usize,
    /// Steps with traffic.
    pub steps_with_traffic: usize,
    /// Healthy steps.
    pub healthy_steps: usize,
    /// The median retry fraction of the steps with traffic, the first pass's threshold is twice
    /// it.
    pub median_fraction: f64,
    /// The healthy retry fraction (p99 over healthy steps).
    pub healthy_fraction: f64,
    /// The mean healthy retry fraction (retries over deposits of the healthy steps).
    pub healthy_mean_fraction: f64,
    /// The recommended ratio.
    pub ratio: f64,
    /// `ratio / healthy_fraction` (`None` when the healthy fraction is 0).
    pub margin: Option<f64>,
    /// The recommended `min_allowance`.
    pub min_allowance: u64,
    /// What low-traffic windows needed.
    pub floor: FloorEvidence,
    /// The incidents above the recommended ratio.
    pub incidents: Vec<Incident>,
    /// The ceiling, when there was an incident.
    pub window: Option<WindowAdvice>,
    /// Healthy steps whose fraction was above the recommended ratio (it would have denied
    /// retries in them).
    pub healthy_steps_above_ratio: usize,
    /// The shadow counter, `None` when the fleet exports none ("no shadow data").
    pub shadow: Option<ShadowEvidence>,
}

/// Why no recommendation could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoRecommendation {
    /// No step had traffic.
    #[error("no traffic in the range (no deposit and no retry in any step)")]
    NoTraffic,
    /// Every step with traffic was in an incident.
    #[error("no healthy step: every step with traffic was part of an incident")]
    NoHealthyStep,
}

/// The recommendation for one dependency from its samples (one per `step_ms`, in time order),
/// its budget window (`window_ms`), and the backoff of its tasks.
///
/// # Errors
/// No traffic, or no healthy step to measure the healthy fraction on.
pub fn recommend(
    samples: &[Sample],
    step_ms: u64,
    window_ms: u64,
    backoff: &Backoff,
    rules: &Rules,
) -> Result<Recommendation, NoRecommendation> {
    let fractions: Vec<f64> = samples.iter().filter_map(Sample::fraction).collect();
    let median = percentile(&fractions, 0.5).ok_or(NoRecommendation::NoTraffic)?;
    let first_pass = incidents(samples, step_ms, (2.0 * median).max(MIN_RATIO), rules);
    // The steps on either side of an incident are left out too: an incident's edges are known
    // to within a step, and the retries still waiting when it ends land in the next one.
    let in_incident = |s: &Sample| {
        first_pass
            .iter()
            .any(|i| s.at_ms > i.start_ms.saturating_sub(step_ms) && s.at_ms <= i.end_ms + step_ms)
    };
    let healthy: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.fraction().is_some() && !s.breaker_open && !in_incident(s))
        .collect();
    let healthy_fractions: Vec<f64> = healthy.iter().filter_map(|s| s.fraction()).collect();
    let healthy_fraction = percentile(&healthy_fractions, rules.healthy_percentile)
        .ok_or(NoRecommendation::NoHealthyStep)?;
    let (retries, deposits) = healthy
        .iter()
        .fold((0.0, 0.0), |(r, d), s| (r + s.retries, d + s.deposits));
    let ratio = round_up_2sig(rules.margin * healthy_fraction).clamp(MIN_RATIO, MAX_RATIO);

    // A budget window is longer than a step: one ending shortly after an incident holds the
    // incident's retries, which are not what quiet traffic needs.
    let needed: Vec<f64> = healthy
        .iter()
        .filter(|s| {
            let from = s.at_ms.saturating_sub(window_ms);
            first_pass
                .iter()
                .all(|i| i.end_ms <= from || i.start_ms >= s.at_ms)
        })
        .map(|s| (s.window_retries - ratio * s.window_deposits).max(0.0))
        .collect();
    let needed_p99 = percentile(&needed, rules.healthy_percentile).unwrap_or(0.0);
    let floor = FloorEvidence {
        windows_short: needed.iter().filter(|n| **n > 0.0).count(),
        needed_p99,
        needed_max: needed.iter().copied().fold(0.0, f64::max),
    };
    let min_allowance = whole(needed_p99).max(1);

    let found = incidents(samples, step_ms, ratio, rules);
    let durations: Vec<f64> = found.iter().map(|i| i.duration_ms as f64).collect();
    let window = percentile(&durations, rules.incident_percentile).map(|p95| {
        let secs = whole(p95 / 1000.0).max(1);
        let schedule = Schedule::for_window(backoff, Duration::from_secs(secs));
        WindowAdvice {
            recovery_window_secs: secs,
            incident_p95_ms: whole(p95),
            max_attempts: schedule.max_attempts(),
            last_attempt_ms: u64::try_from(schedule.span().as_millis()).unwrap_or(u64::MAX),
        }
    });
    let shadow = samples
        .iter()
        .any(|s| s.would_deny.is_some())
        .then(|| ShadowEvidence {
            would_deny: samples.iter().filter_map(|s| s.would_deny).sum(),
            would_deny_healthy: healthy.iter().filter_map(|s| s.would_deny).sum(),
        });
    Ok(Recommendation {
        steps: samples.len(),
        steps_with_traffic: fractions.len(),
        healthy_steps: healthy.len(),
        median_fraction: median,
        healthy_fraction,
        healthy_mean_fraction: if deposits > 0.0 {
            retries / deposits
        } else {
            0.0
        },
        ratio,
        margin: (healthy_fraction > 0.0).then(|| ratio / healthy_fraction),
        min_allowance,
        floor,
        incidents: found,
        window,
        healthy_steps_above_ratio: healthy_fractions.iter().filter(|f| **f > ratio).count(),
        shadow,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEP: u64 = 2000;

    /// A history of `steps` healthy steps at fraction `f` (100 deposits each), with the steps
    /// in `outages` (index ranges) failing every call.
    fn history(steps: usize, f: f64, outages: &[std::ops::Range<usize>]) -> Vec<Sample> {
        (0..steps)
            .map(|i| {
                let out = outages.iter().any(|r| r.contains(&i));
                let (deposits, retries) = if out { (0.0, 50.0) } else { (100.0, 100.0 * f) };
                Sample {
                    at_ms: 1_000_000 + (i as u64 + 1) * STEP,
                    deposits,
                    retries,
                    denied: 0.0,
                    breaker_open: false,
                    window_deposits: deposits * 30.0,
                    window_retries: retries * 30.0,
                    would_deny: None,
                }
            })
            .collect()
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&[3.0], 0.95), Some(3.0));
        assert_eq!(percentile(&[10.0, 20.0, 30.0, 40.0], 0.95), Some(40.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn rounding_up_keeps_two_significant_digits() {
        assert_eq!(round_up_2sig(0.0734), 0.074);
        assert_eq!(round_up_2sig(0.074), 0.074);
        assert_eq!(round_up_2sig(1.51), 1.6);
        assert_eq!(round_up_2sig(12.01), 13.0);
    }

    #[test]
    fn the_ratio_has_its_margin_over_the_healthy_fraction_and_incidents_give_the_window() {
        // Incidents of 10, 14, 20 and 30 steps' worth of seconds (2 s steps).
        let outages = [20..25, 60..67, 100..110, 150..165];
        let samples = history(200, 0.1, &outages);
        let r = recommend(
            &samples,
            STEP,
            60_000,
            &Backoff::default(),
            &Rules::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!((r.healthy_fraction - 0.1).abs() < 1e-9, "{r:?}");
        assert!(
            (1.2..=2.0).contains(&(r.ratio / r.healthy_fraction)),
            "{r:?}"
        );
        assert_eq!(r.incidents.len(), 4, "{r:?}");
        let durations: Vec<u64> = r.incidents.iter().map(|i| i.duration_ms).collect();
        assert_eq!(durations, [10_000, 14_000, 20_000, 30_000]);
        let window = r.window.unwrap_or_else(|| panic!("no window: {r:?}"));
        assert_eq!(window.recovery_window_secs, 30);
        let plan = Schedule::for_window(&Backoff::default(), Duration::from_secs(30));
        assert_eq!(window.max_attempts, plan.max_attempts());
        assert_eq!(r.healthy_steps, 200 - 5 - 7 - 10 - 15 - 4 * 2);
        assert_eq!(r.healthy_steps_above_ratio, 0);
        assert_eq!(r.min_allowance, 1, "busy windows need no floor: {r:?}");
        assert_eq!(r.shadow, None);
    }

    #[test]
    fn quiet_windows_set_the_floor() {
        let mut samples = history(100, 0.1, &[]);
        for s in samples.iter_mut().skip(50).take(10) {
            // A quiet stretch: 3 deposits and 2 retries a step, 12 retries a budget window more
            // than 0.15 × 30 deposits grants.
            s.deposits = 3.0;
            s.retries = 0.3;
            s.window_deposits = 30.0;
            s.window_retries = 16.5;
        }
        let r = recommend(
            &samples,
            STEP,
            60_000,
            &Backoff::default(),
            &Rules::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.floor.windows_short, 10, "{r:?}");
        assert_eq!(r.min_allowance, 12, "{r:?}");
    }

    #[test]
    fn a_stretch_of_open_breaker_is_an_incident_and_short_blips_are_not() {
        let mut samples = history(60, 0.05, &[]);
        // One step at 10 times the fraction: noise, not an incident.
        if let Some(s) = samples.get_mut(10) {
            s.retries = 50.0;
        }
        for s in samples.iter_mut().skip(30).take(4) {
            s.breaker_open = true;
        }
        let r = recommend(
            &samples,
            STEP,
            60_000,
            &Backoff::default(),
            &Rules::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.incidents.len(), 1, "{r:?}");
        assert_eq!(r.incidents.first().map(|i| i.breaker_open_steps), Some(4));
        // The blip is healthy evidence: one step in 54 is more than 1%, so it is the p99.
        assert!(r.healthy_fraction > 0.05, "{r:?}");
    }

    #[test]
    fn shadow_counts_and_no_traffic_are_reported() {
        let mut samples = history(30, 0.1, &[]);
        for s in &mut samples {
            s.would_deny = Some(1.0);
        }
        let r = recommend(
            &samples,
            STEP,
            60_000,
            &Backoff::default(),
            &Rules::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            r.shadow,
            Some(ShadowEvidence {
                would_deny: 30.0,
                would_deny_healthy: 30.0
            })
        );
        let quiet = vec![Sample::default(); 5];
        assert_eq!(
            recommend(&quiet, STEP, 60_000, &Backoff::default(), &Rules::default()),
            Err(NoRecommendation::NoTraffic)
        );
    }
}
