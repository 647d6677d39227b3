//! The pace of a replay run: sends spaced `1 / rate` apart, each move first held at the gate
//! (breaker, freeze, the rate the dependency's health decided: `control`).

use std::time::Duration;

use tokio::time::Instant;

use super::Replayer;
use super::control::Pace;
use super::gate::Gates;
use super::handle::Stop;
use super::report::{Rate, ReplayProgress, ReplayReport};
use super::select::ReplayOptions;

/// Spaces sends `1 / rate` apart on a fixed schedule (late sends catch up, up to one second).
pub(super) struct Pacer {
    interval: Option<Duration>,
    next: Instant,
}

impl Pacer {
    pub(super) fn new(rate: Option<f64>) -> Self {
        Self {
            interval: Self::interval(rate),
            next: Instant::now(),
        }
    }

    fn interval(rate: Option<f64>) -> Option<Duration> {
        rate.filter(|r| r.is_finite() && *r > 0.0)
            .and_then(|r| Duration::try_from_secs_f64(1.0 / r).ok())
    }

    /// Moves on at `rate` from the next send (the closed loop changed it). A slower rate also
    /// pushes back a send already scheduled at the faster one.
    pub(super) fn set_rate(&mut self, rate: Option<f64>) {
        let interval = Self::interval(rate);
        if interval == self.interval {
            return;
        }
        if let (Some(old), Some(new)) = (self.interval, interval)
            && new > old
        {
            self.next += new - old;
        }
        self.interval = interval;
    }

    /// How long the next send waits for its turn at the current rate (zero without a rate).
    pub(super) fn ahead(&self) -> Duration {
        if self.interval.is_none() {
            return Duration::ZERO;
        }
        self.next.saturating_duration_since(Instant::now())
    }

    pub(super) fn reset(&mut self) {
        self.next = Instant::now();
    }

    /// Waits for the next send's turn. Cancel-safe: dropped before its turn, the turn is not
    /// spent.
    pub(super) async fn wait(&mut self) {
        let Some(interval) = self.interval else {
            return;
        };
        let now = Instant::now();
        if self.next > now {
            tokio::time::sleep_until(self.next).await;
        } else if now.duration_since(self.next) > Duration::from_secs(1) {
            self.next = now;
        }
        self.next += interval;
    }
}

impl Replayer {
    /// Holds a move of `dependency` at the gate (breaker, freeze, pace) and then for its turn at
    /// the rate decided; `false` when the run was cancelled meanwhile (do not move).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn pace(
        &self,
        dependency: &str,
        options: &ReplayOptions,
        (gates, pacer): (&mut Gates, &mut Pacer),
        report: &mut ReplayReport,
        p: &mut ReplayProgress,
        progress: &mut (impl FnMut(&ReplayProgress) + Send),
        stop: &mut Stop,
    ) -> bool {
        let passed = self
            .pass_gate(dependency, options, gates, p, progress, stop)
            .await;
        report.held_frozen += passed.frozen;
        report.held_breaker += passed.held;
        if passed.cancelled {
            return false;
        }
        if !(passed.frozen + passed.held).is_zero() {
            pacer.reset();
        }
        pacer.set_rate(passed.rate);
        let waited = tokio::select! {
            () = pacer.wait() => true,
            () = stop.requested() => false,
        };
        if waited && let Some(rate) = passed.rate.and_then(Rate::new) {
            report.lowest_rate = Some(
                report
                    .lowest_rate
                    .map_or(rate, |l| if rate < l { rate } else { l }),
            );
            report.highest_rate = Some(
                report
                    .highest_rate
                    .map_or(rate, |h| if rate > h { rate } else { h }),
            );
            // At the asked rate: decided so by the loop, or no loop (no budget, no breakers).
            let at_rate = matches!(passed.pace, None | Some(Pace::AtRate));
            if at_rate && report.reached_rate.is_none() {
                report.reached_rate = Some(gates.started.elapsed());
            }
        }
        waited
    }
}
