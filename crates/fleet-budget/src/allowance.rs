//! The budget math: pure functions of counters, time and policy. No I/O.
//!
//! The Lua scripts in `lua/` implement exactly this arithmetic; the [`crate::store::LocalStore`]
//! and the simulator call these functions directly, and the integration tests check that both give
//! the same decisions and snapshots for the same sequence of operations.
//!
//! All estimates are kept *scaled by the window length in milliseconds* so that comparisons are
//! exact integer arithmetic in Rust and in Lua (whose numbers are doubles, exact below 2^53):
//!
//! ```text
//! elapsed      = now_ms - index × window_ms            (0 ≤ elapsed < window_ms)
//! prev_weight  = window_ms - elapsed   (sliding)  |  0   (fixed)
//! deposits_sc  = cur_deposits × window_ms + prev_deposits × prev_weight
//! retries_sc   = cur_retries  × window_ms + prev_retries  × prev_weight
//! allowance    = max(min_allowance, floor(ratio × deposits_sc / window_ms))
//! grant       ⇔ retries_sc + window_ms ≤ allowance × window_ms
//! ```

use serde::Serialize;

mod snapshot;

pub use self::snapshot::{BudgetSnapshot, Control};
use crate::policy::{BudgetPolicy, DepositBasis, WindowMode};

/// What a window counts. Denials are never counted as retries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WindowCounters {
    /// Successful jobs.
    pub successes: u64,
    /// First attempts (executions with attempt number 1).
    pub first_attempts: u64,
    /// Retries granted.
    pub retries: u64,
    /// Retries denied.
    pub denied: u64,
}

impl WindowCounters {
    /// The deposits of this window under `basis`.
    #[must_use]
    pub fn deposits(&self, basis: DepositBasis) -> u64 {
        match basis {
            DepositBasis::Success => self.successes,
            DepositBasis::Request => self.first_attempts,
        }
    }
}

/// The stored state of one dependency's budget: the current and the previous window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetState {
    /// The window length this state was counted with.
    pub window_ms: u64,
    /// Index of the current window: `floor(server_time_ms / window_ms)`.
    pub index: u64,
    /// Counters of window `index`.
    pub current: WindowCounters,
    /// Counters of window `index - 1`.
    pub previous: WindowCounters,
}

/// Which counter a deposit adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DepositKind {
    /// A successful job.
    Success,
    /// A first attempt.
    FirstAttempt,
}

impl DepositKind {
    /// The one-letter code the deposit script takes (`s` or `a`).
    #[must_use]
    pub fn script_code(self) -> &'static str {
        match self {
            Self::Success => "s",
            Self::FirstAttempt => "a",
        }
    }
}

impl BudgetState {
    /// A state with no counts, positioned at the window holding `now_ms`.
    #[must_use]
    pub fn empty(now_ms: u64, window_ms: u64) -> Self {
        let window_ms = window_ms.max(1);
        Self {
            window_ms,
            index: now_ms / window_ms,
            current: WindowCounters::default(),
            previous: WindowCounters::default(),
        }
    }

    /// Moves the state to the window holding `now_ms`.
    ///
    /// The next window shifts current into previous; a gap of two or more windows clears both; a
    /// different window length starts afresh. Time that goes backwards (a failover to a server
    /// with a slower clock) keeps the current window: counters are never un-rolled.
    pub fn roll(&mut self, now_ms: u64, window_ms: u64) {
        let window_ms = window_ms.max(1);
        if self.window_ms != window_ms {
            *self = Self::empty(now_ms, window_ms);
            return;
        }
        let index = now_ms / window_ms;
        if index == self.index.saturating_add(1) {
            self.previous = self.current;
            self.current = WindowCounters::default();
            self.index = index;
        } else if index > self.index {
            *self = Self::empty(now_ms, window_ms);
        }
    }

    /// Adds `n` to the counter of `kind` in the window holding `now_ms`.
    pub fn deposit(&mut self, now_ms: u64, window_ms: u64, kind: DepositKind, n: u64) {
        self.roll(now_ms, window_ms);
        match kind {
            DepositKind::Success => {
                self.current.successes = self.current.successes.saturating_add(n);
            }
            DepositKind::FirstAttempt => {
                self.current.first_attempts = self.current.first_attempts.saturating_add(n);
            }
        }
    }

    /// The snapshot of this state at `now_ms` under `policy`, without changing anything.
    ///
    /// The state should already be rolled to `now_ms` (see [`BudgetState::roll`]).
    #[must_use]
    pub fn snapshot(&self, now_ms: u64, policy: &BudgetPolicy) -> BudgetSnapshot {
        let window_ms = self.window_ms.max(1);
        let start = self.index.saturating_mul(window_ms);
        let elapsed_ms = now_ms.saturating_sub(start).min(window_ms - 1);
        let previous_weight_ms = match policy.mode {
            WindowMode::Sliding => window_ms - elapsed_ms,
            WindowMode::Fixed => 0,
        };
        let mut snapshot = BudgetSnapshot {
            window_ms,
            window_index: self.index,
            elapsed_ms,
            previous_weight_ms,
            current: self.current,
            previous: self.previous,
            allowance: 0,
            control: Control::default(),
        };
        snapshot.allowance = allowance(
            policy.ratio,
            policy.min_allowance,
            snapshot.deposits_scaled(policy.deposit),
            window_ms,
        );
        snapshot
    }

    /// Asks for one retry at `now_ms`: rolls the window, decides, and counts the retry or the
    /// denial. Returns whether it was granted and the snapshot after counting.
    pub fn try_spend(&mut self, now_ms: u64, policy: &BudgetPolicy) -> (bool, BudgetSnapshot) {
        self.roll(now_ms, policy.window_ms());
        let mut snapshot = self.snapshot(now_ms, policy);
        let granted = grants(&snapshot);
        if granted {
            self.current.retries = self.current.retries.saturating_add(1);
        } else {
            self.current.denied = self.current.denied.saturating_add(1);
        }
        // The allowance depends on deposits only: the counters are all that changed.
        snapshot.current = self.current;
        (granted, snapshot)
    }
}

/// `max(min_allowance, floor(ratio × deposits_scaled / window_ms))`, computed in the same order of
/// floating-point operations as the Lua scripts so both give the same integer.
#[must_use]
pub fn allowance(ratio: f64, min_allowance: u64, deposits_scaled: u128, window_ms: u64) -> u64 {
    // u128 → f64 is a software routine; through u64 it is one instruction, same rounding.
    #[allow(clippy::cast_precision_loss)]
    let deposits = match u64::try_from(deposits_scaled) {
        Ok(small) => small as f64,
        Err(_) => deposits_scaled as f64,
    };
    #[allow(clippy::cast_precision_loss)]
    let earned = (ratio * deposits / window_ms.max(1) as f64).floor();
    max_u64(min_allowance, f64_to_u64(earned))
}

/// Whether one more retry fits: `retries_est + 1 <= allowance`, in scaled integers.
#[must_use]
pub fn grants(snapshot: &BudgetSnapshot) -> bool {
    let window = u128::from(snapshot.window_ms);
    snapshot.retries_scaled() + window <= u128::from(snapshot.allowance) * window
}

/// Milliseconds from the snapshot's instant until one more retry could be granted if nothing
/// changed meanwhile (no deposit, no spend, no override or policy change): `Some(0)` when one
/// would be granted now, `None` when none ever would (a floor of 0 and no deposits left).
///
/// Without new deposits the estimates only decay, so the allowance can only fall: this is the
/// first millisecond at which the retries estimate, decaying with the previous window's weight
/// and then rolling with the windows, fits the allowance as it is now. Exact while the allowance
/// holds (a budget at its floor: a retry storm); never later than the true instant, so a caller
/// that refuses retries until then refuses none the budget would grant. `lua/README.md`,
/// "Reply", field `next_grant_ms`: `shared/next_grant.lua` computes the same, operation for
/// operation (it also stops at the end of a freeze or a set override, which this snapshot of the
/// local store never has).
#[must_use]
pub fn next_grant_in_ms(snapshot: &BudgetSnapshot) -> Option<u64> {
    let window = u128::from(snapshot.window_ms.max(1));
    let elapsed = u128::from(snapshot.elapsed_ms);
    let weight = u128::from(snapshot.previous_weight_ms);
    let (cur, prev) = (
        u128::from(snapshot.current.retries),
        u128::from(snapshot.previous.retries),
    );
    let allowance = u128::from(snapshot.allowance);
    if cur * window + prev * weight + window <= allowance * window {
        return Some(0);
    }
    let k = allowance.checked_sub(1)?;
    let ms = |v: u128| Some(u64::try_from(v).unwrap_or(u64::MAX));
    // This window: the previous one's weight falls 1 per ms, and with it its retries.
    if weight > 0 && prev > 0 && k >= cur {
        let y = (k - cur) * window / prev;
        if y >= 1 {
            return ms(window.saturating_sub(y).saturating_sub(elapsed));
        }
    }
    if weight == 0 || cur <= k {
        // The next window, from its start (fixed mode: it starts empty).
        return ms(window.saturating_sub(elapsed));
    }
    // The next window, where this one's retries decay in turn; else the one after (empty).
    let y = k * window / cur;
    ms((2 * window).saturating_sub(y).saturating_sub(elapsed))
}

fn max_u64(a: u64, b: u64) -> u64 {
    if a > b { a } else { b }
}

/// Converts a non-negative, floored float to `u64`, saturating; NaN gives 0.
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]
fn f64_to_u64(x: f64) -> u64 {
    if x.is_nan() || x <= 0.0 {
        0
    } else if x >= u64::MAX as f64 {
        u64::MAX
    } else {
        x as u64
    }
}

#[cfg(test)]
mod tests;
