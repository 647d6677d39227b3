"""What a script replies: the two windows' counters and the allowance (Rust ``allowance.rs``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class WindowCounters:
    successes: int = 0
    first_attempts: int = 0
    retries: int = 0
    denied: int = 0


@dataclass(frozen=True)
class Control:
    """What Redis said about the policy and the operators' overrides (all false locally)."""

    conflict: bool = False  # the caller's policy differs from the one in force, which decided
    frozen: bool = False  # a freeze is in force: no retry is granted, the floor included
    overridden: bool = False  # a set override replaces the ratio and/or the floor
    # The call found the budget hash this process remembered gone (evicted, flushed, Redis
    # restarted empty) and restored what still counted (lua/README.md, "Lost budgets").
    lost: bool = False


@dataclass(frozen=True)
class BudgetSnapshot:
    window_ms: int
    window_index: int
    elapsed_ms: int
    previous_weight_ms: int
    current: WindowCounters
    previous: WindowCounters
    allowance: int
    control: Control = field(default_factory=Control)

    def estimate(self, current: int, previous: int) -> int:
        window = max(1, self.window_ms)
        return (current * self.window_ms + previous * self.previous_weight_ms) // window

    def estimates(self) -> WindowCounters:
        c, p = self.current, self.previous
        return WindowCounters(
            self.estimate(c.successes, p.successes),
            self.estimate(c.first_attempts, p.first_attempts),
            self.estimate(c.retries, p.retries),
            self.estimate(c.denied, p.denied),
        )

    def remaining(self) -> int:
        """Retries that would still be granted now (the headroom)."""
        window = max(1, self.window_ms)
        retries = self.current.retries * self.window_ms + self.previous.retries * self.previous_weight_ms
        return max(0, self.allowance * window - retries) // window
