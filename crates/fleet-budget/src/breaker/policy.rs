//! [`BreakerPolicy`]: when a dependency's breaker opens, how long, and how it probes.

use std::time::Duration;

/// The longest window, open period, probe timeout or wait accepted (one day).
const MAX: Duration = Duration::from_secs(86_400);

/// A dependency's circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerPolicy {
    /// The window over which results are counted (a sliding estimate over two of them).
    pub window: Duration,
    /// The share of failures, above 0 and at most 1, that opens the breaker.
    pub failure_ratio: f64,
    /// Calls in the window below which the breaker never opens.
    pub min_volume: u64,
    /// How long it stays open before probing.
    pub open: Duration,
    /// Probes admitted fleet-wide while half-open.
    pub half_open_probes: u64,
    /// Probe successes that close it (at most `half_open_probes`).
    pub close_after: u64,
    /// Probes issued this long ago without an answer are issued again (their worker died).
    pub probe_timeout: Duration,
    /// How long in all a job may wait while the breaker is open before it is dead-lettered
    /// `circuit_open`.
    pub max_wait: Duration,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(60),
            failure_ratio: 0.5,
            min_volume: 20,
            open: Duration::from_secs(30),
            half_open_probes: 3,
            close_after: 3,
            probe_timeout: Duration::from_secs(60),
            max_wait: Duration::from_secs(900),
        }
    }
}

/// A breaker policy the script cannot take.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum BreakerPolicyError {
    /// A duration out of range.
    #[error("{name} must be from 1 ms to 1 day, not {value:?}")]
    Duration {
        /// Which one.
        name: &'static str,
        /// Its value.
        value: Duration,
    },
    /// The ratio is not above 0 and at most 1.
    #[error("failure_ratio must be above 0 and at most 1, not {0}")]
    Ratio(f64),
    /// The minimum volume is 0 or above 10^9.
    #[error("min_volume must be from 1 to 10^9, not {0}")]
    MinVolume(u64),
    /// The probes are 0 or above 10^6.
    #[error("half_open_probes must be from 1 to 10^6, not {0}")]
    Probes(u64),
    /// `close_after` is 0 or above the probes.
    #[error("close_after must be from 1 to half_open_probes ({probes}), not {close_after}")]
    CloseAfter {
        /// The probes.
        probes: u64,
        /// The successes asked for.
        close_after: u64,
    },
}

impl BreakerPolicy {
    /// The policy if the script takes it.
    ///
    /// # Errors
    /// The first field out of range.
    pub fn checked(self) -> Result<Self, BreakerPolicyError> {
        for (name, value) in [
            ("window", self.window),
            ("open", self.open),
            ("probe_timeout", self.probe_timeout),
        ] {
            if value < Duration::from_millis(1) || value > MAX {
                return Err(BreakerPolicyError::Duration { name, value });
            }
        }
        if self.max_wait > MAX {
            return Err(BreakerPolicyError::Duration {
                name: "max_wait",
                value: self.max_wait,
            });
        }
        if !(self.failure_ratio > 0.0 && self.failure_ratio <= 1.0) {
            return Err(BreakerPolicyError::Ratio(self.failure_ratio));
        }
        if !(1..=1_000_000_000).contains(&self.min_volume) {
            return Err(BreakerPolicyError::MinVolume(self.min_volume));
        }
        if !(1..=1_000_000).contains(&self.half_open_probes) {
            return Err(BreakerPolicyError::Probes(self.half_open_probes));
        }
        if !(1..=self.half_open_probes).contains(&self.close_after) {
            return Err(BreakerPolicyError::CloseAfter {
                probes: self.half_open_probes,
                close_after: self.close_after,
            });
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_and_each_bound_is_checked() {
        let p = BreakerPolicy::default().checked().unwrap();
        for bad in [
            BreakerPolicy {
                failure_ratio: 0.0,
                ..p
            },
            BreakerPolicy {
                failure_ratio: f64::NAN,
                ..p
            },
            BreakerPolicy { min_volume: 0, ..p },
            BreakerPolicy {
                close_after: 4,
                ..p
            },
            BreakerPolicy {
                open: Duration::ZERO,
                ..p
            },
            BreakerPolicy {
                max_wait: Duration::from_secs(86_401),
                ..p
            },
        ] {
            assert!(bad.checked().is_err(), "{bad:?}");
        }
    }
}
