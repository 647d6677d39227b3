//! The budget policy of one dependency: how allowance is earned and how windows are measured.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What earns retry allowance.
///
/// `Success` (the default) deposits one unit per successful job: during an outage nothing succeeds,
/// so the allowance shrinks to the floor exactly when the dependency is failing. `Request` deposits
/// one unit per first attempt (the Finagle / gRPC style): allowance follows offered load, so a fully
/// failing dependency keeps `ratio × traffic` retries. Choose `Request` when a success is rare by
/// nature (long jobs, batch work) and you still want retries proportional to demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DepositBasis {
    /// One deposit per successful job.
    #[default]
    Success,
    /// One deposit per first attempt of a job.
    Request,
}

impl DepositBasis {
    /// The one-letter code the Lua scripts take (`s` or `a`), see `lua/README.md`.
    #[must_use]
    pub fn script_code(self) -> &'static str {
        match self {
            Self::Success => "s",
            Self::Request => "a",
        }
    }

    /// The name used in configuration and output.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Request => "request",
        }
    }
}

/// How counters of past windows count towards the current decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowMode {
    /// Current window plus the previous one weighted by the part of it still inside the last
    /// `window`: no allowance cliff at window boundaries (the default).
    #[default]
    Sliding,
    /// Current window only: allowance drops to the floor at every boundary. For comparison.
    Fixed,
}

impl WindowMode {
    /// The name the Lua scripts and configuration use (`sliding` or `fixed`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sliding => "sliding",
            Self::Fixed => "fixed",
        }
    }
}

/// The retry budget policy of one dependency.
///
/// `allowance = max(min_allowance, floor(ratio × deposits_est))`; a retry is granted iff
/// `retries_est + 1 <= allowance`. See `docs/semantics` and [`crate::allowance`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetPolicy {
    /// Length of one counting window (default 60 s). Window `i` covers server time
    /// `[i × window, (i + 1) × window)`.
    pub window: Duration,
    /// Retries allowed per deposit (default 0.2: retries may be at most 20% of successes).
    pub ratio: f64,
    /// Retries always allowed per window, whatever the traffic (default 10), so that the probe
    /// that discovers recovery is not dead-lettered.
    pub min_allowance: u64,
    /// What earns allowance (default [`DepositBasis::Success`]).
    pub deposit: DepositBasis,
    /// Sliding (default) or fixed windows.
    pub mode: WindowMode,
}

impl Default for BudgetPolicy {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(60),
            ratio: 0.2,
            min_allowance: 10,
            deposit: DepositBasis::Success,
            mode: WindowMode::Sliding,
        }
    }
}

impl BudgetPolicy {
    /// The window length in whole milliseconds, at least 1.
    #[must_use]
    pub fn window_ms(&self) -> u64 {
        u64::try_from(self.window.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}
