"""A dependency's budget policy, and a task's ceiling and backoff (the Rust ``policy.rs`` and
``ceiling.rs``)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

#: Attempts per job class (the contract, docs/semantics.md).
CLASS_MAX_ATTEMPTS = {"idempotent": 8, "metered": 4, "paid": 2, "side_effect": 1, "batch": 2}


@dataclass(frozen=True)
class BudgetPolicy:
    """window, ratio, floor, what counts as a deposit (``success`` | ``request``), mode."""

    window_ms: int = 60_000
    ratio: float = 0.2
    min_allowance: int = 10
    deposit: str = "success"
    mode: str = "sliding"

    @property
    def basis_code(self) -> str:
        return "a" if self.deposit == "request" else "s"


#: The range a jittered delay is drawn from, as fractions of the nominal (centred jitter).
JITTER_LOW = 0.75
JITTER_HIGH = 1.25
#: No task runs more executions than this, whatever its ceiling (the Rust ``MAX_ATTEMPTS``).
MAX_ATTEMPTS = 1000
#: The ``max_delay`` of tasks that set none: the longest default retry tier, 1,024 s (the Rust
#: ``DEFAULT_MAX_DELAY``), or twice the task's backoff cap when that is longer.
DEFAULT_MAX_DELAY_SECS = 1024


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with centred jitter and a cap, in seconds (the Rust ``backoff.rs``)."""

    base: float = 2.0
    factor: float = 2.0
    cap: float = 600.0

    def nominal(self, failed_attempt: int) -> float:
        exponent = max(0, failed_attempt - 1)
        try:
            secs = self.base * self.factor**exponent
        except OverflowError:
            return self.cap
        if secs != secs or secs >= self.cap:
            return self.cap
        return max(0.0, secs)

    @staticmethod
    def jitter(nominal: float, rng: random.Random) -> float:
        """Uniform in ``[3n/4, 5n/4]``: spread over half the nominal, mean the nominal."""
        return nominal * (JITTER_LOW + (JITTER_HIGH - JITTER_LOW) * rng.random())

    def delay(self, failed_attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """The nominal delay with centred jitter; at least ``retry_after``."""
        jittered = self.jitter(self.nominal(failed_attempt), rng)
        if retry_after is not None and retry_after > jittered:
            return retry_after
        return jittered

    def attempts_for_recovery_window(self, recovery_secs: float) -> int:
        """Executions of the nominal schedule whose last attempt runs when the window ends (the
        Rust ``Schedule::for_window``): 60 s → 6, 900 s → 10, 4 h → 32 with the defaults."""
        attempts, at = 1, 0.0
        for failed in range(1, MAX_ATTEMPTS):
            delay = delay_within_window(self, failed, at, recovery_secs, self.nominal(failed))
            if delay is None:
                break
            at += delay
            attempts += 1
        return attempts


def delay_within_window(backoff: Backoff, failed_attempt: int, elapsed: float, window: float,
                        drawn: float) -> float | None:
    """The delay after ``failed_attempt`` failed ``elapsed`` seconds after the job's first failure,
    when its retries end ``window`` after that failure; None when the window has passed. A delay
    that would end past the window, or leave less than half the next nominal delay, ends at it."""
    remaining = window - elapsed
    if remaining <= 0:
        return None
    if drawn >= remaining:
        return remaining
    if remaining - drawn < backoff.nominal(failed_attempt + 1) / 2:
        return remaining
    return drawn


@dataclass(frozen=True)
class TaskCeiling:
    """A task's attempt ceiling: a count, or a recovery window (seconds) since the first failure;
    and ``max_delay`` (seconds), the longest the job may wait before its next execution: backoff
    delays are capped at it, and a longer ``Retry-After`` dead-letters the job ``delay_exceeded``
    (None: unbounded; ``Config.ceiling`` fills in the default)."""

    max_attempts: int = 5
    backoff: Backoff = field(default_factory=Backoff)
    recovery_window: float | None = None
    max_delay: float | None = None

    def allows_wait(self, wait: float) -> bool:
        """Whether the job may wait ``wait`` seconds before its next execution."""
        return self.max_delay is None or wait <= self.max_delay

    def exhausted(self, failed_attempt: int, since_first_failure: float | None) -> bool:
        if self.recovery_window is not None and since_first_failure is not None:
            return since_first_failure >= self.recovery_window or failed_attempt >= MAX_ATTEMPTS
        return failed_attempt >= self.max_attempts

    def delay(self, failed_attempt: int, since_first_failure: float | None, retry_after: float | None,
              rng: random.Random) -> float:
        """The jittered delay, fitted to the recovery window when the time since the first failure
        is known, and at most ``max_delay``; a ``Retry-After`` is a lower bound, even past the
        window (one past ``max_delay`` is refused before the budget is asked: :meth:`allows_wait`)."""
        drawn = Backoff.jitter(self.backoff.nominal(failed_attempt), rng)
        fitted = drawn
        if self.recovery_window is not None and since_first_failure is not None:
            within = delay_within_window(self.backoff, failed_attempt, since_first_failure,
                                         self.recovery_window, drawn)
            fitted = drawn if within is None else within
        if self.max_delay is not None:
            fitted = min(fitted, self.max_delay)
        if retry_after is not None and retry_after > fitted:
            return retry_after
        return fitted
