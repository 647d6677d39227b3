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


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with equal jitter, in seconds."""

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

    def delay(self, failed_attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Half the nominal delay plus up to the other half at random; at least ``retry_after``."""
        half = self.nominal(failed_attempt) / 2
        jittered = half + half * rng.random()
        if retry_after is not None and retry_after > jittered:
            return retry_after
        return jittered

    def attempts_for_recovery_window(self, recovery_secs: float) -> int:
        covered = 0.0
        for n in range(1, 1001):
            covered += self.nominal(n)
            if covered >= recovery_secs:
                return n
        return 1000


@dataclass(frozen=True)
class TaskCeiling:
    max_attempts: int = 5
    backoff: Backoff = field(default_factory=Backoff)
