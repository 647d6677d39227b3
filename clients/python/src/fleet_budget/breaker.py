"""A dependency's fleet-wide circuit breaker (the Rust ``breaker/``), one ``breaker.lua`` call per
decision on ``<prefix>:v1:{<dependency>}:cb``, so each change of state is made by exactly one call
fleet-wide, whichever language makes it:

- **closed**: calls run; their results are counted over a sliding window; a failure that makes
  failures ≥ ``failure_ratio`` of at least ``min_volume`` calls opens it;
- **open** for ``open_secs``: no call runs; jobs wait in the delay tiers without spending an
  attempt, up to ``max_wait_secs``, then are dead-lettered ``circuit_open``;
- **half-open**: exactly ``half_open_probes`` calls go out fleet-wide as probes, each one retry of
  the rate budget's floor; ``close_after`` probe successes close it, one probe failure reopens it.
  Probes that never report (their worker died) are issued again after ``probe_timeout_secs``.

Contract: ``lua/README.md``, "Circuit breaker".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from .concurrency import counts
from .scripts import BadReply, ratio_text

#: The longest window, open period, probe timeout or wait accepted, in seconds (one day).
MAX_SECS = 86_400
#: The dead-letter reason of a job held past the breaker's ``max_wait``.
CIRCUIT_OPEN = "circuit_open"

#: States by the script's code, as the metrics (``to``) and ``budgetctl status`` spell them.
STATES = {0: "closed", 1: "open", 2: "half_open"}
CLOSED, OPEN, HALF_OPEN = 0, 1, 2

#: ``admit`` verdicts.
RUN, PROBE, WAIT = 0, 1, 2


@dataclass(frozen=True)
class BreakerPolicy:
    """``[dependencies.X.breaker]``; durations in milliseconds (``max_wait`` in seconds)."""

    window_ms: int = 60_000
    failure_ratio: float = 0.5
    min_volume: int = 20
    open_ms: int = 30_000
    half_open_probes: int = 3
    close_after: int = 3
    probe_timeout_ms: int = 60_000
    max_wait: float = 900.0

    def checked(self) -> "BreakerPolicy":
        """The policy if the script takes it; else ValueError naming the first field out of range
        (the Rust ``checked``)."""
        for name, ms in (("window", self.window_ms), ("open", self.open_ms), ("probe_timeout", self.probe_timeout_ms)):
            if not 1 <= ms <= MAX_SECS * 1000:
                raise ValueError(f"{name} must be from 1 ms to 1 day, not {ms} ms")
        if self.max_wait > MAX_SECS:
            raise ValueError(f"max_wait must be from 1 ms to 1 day, not {self.max_wait} s")
        r = self.failure_ratio
        if not (math.isfinite(r) and 0.0 < r <= 1.0):
            raise ValueError(f"failure_ratio must be above 0 and at most 1, not {r}")
        if not 1 <= self.min_volume <= 1_000_000_000:
            raise ValueError(f"min_volume must be from 1 to 10^9, not {self.min_volume}")
        if not 1 <= self.half_open_probes <= 1_000_000:
            raise ValueError(f"half_open_probes must be from 1 to 10^6, not {self.half_open_probes}")
        if not 1 <= self.close_after <= self.half_open_probes:
            raise ValueError(f"close_after must be from 1 to half_open_probes ({self.half_open_probes}), "
                             f"not {self.close_after}")
        return self


@dataclass(frozen=True)
class Decided:
    """An ``admit`` or ``record`` answer: the verdict (``RUN`` for record), the state after the
    call, whether this call changed it, when an open breaker half-opens, the server's time."""

    verdict: int
    state: int
    generation: int
    changed: bool
    open_until_ms: int
    now_ms: int

    @property
    def state_name(self) -> str:
        return STATES[self.state]


@dataclass(frozen=True)
class BreakerStatus:
    state: str
    open_until_ms: int
    probes_issued: int
    probe_successes: int
    changed_ms: int
    times_opened: int
    volume: float
    failures: float
    now_ms: int


def breaker_key(prefix: str, dependency: str) -> list[str]:
    return [f"{prefix}:v1:{{{dependency}}}:cb"]


def args(policy: BreakerPolicy, op: str, *extra: str) -> list[str]:
    return [op, str(policy.window_ms), ratio_text(policy.failure_ratio), str(policy.min_volume),
            str(policy.open_ms), str(policy.half_open_probes), str(policy.close_after),
            str(policy.probe_timeout_ms), *extra]


def record_args(policy: BreakerPolicy, success: bool, probe: Optional[int]) -> list[str]:
    return args(policy, "record", "s" if success else "f", str(probe or 0))


def _state(code: int) -> int:
    if code not in STATES:
        raise BadReply("breaker", f"state {code} is not 0, 1 or 2")
    return code


def parse_admit(reply: Any) -> Decided:
    verdict, state, g, ou, changed, now = counts("breaker", reply, 6)
    if verdict not in (RUN, PROBE, WAIT):
        raise BadReply("breaker", f"verdict {verdict} is not 0, 1 or 2")
    return Decided(verdict, _state(state), g, changed == 1, ou, now)


def parse_record(reply: Any) -> Decided:
    state, g, ou, changed, now = counts("breaker", reply, 5)
    return Decided(RUN, _state(state), g, changed == 1, ou, now)


def parse_cancel(reply: Any) -> None:
    counts("breaker", reply, 1)


def parse_status(reply: Any) -> BreakerStatus:
    f = counts("breaker", reply, 11)
    window = max(1, f[9])
    return BreakerStatus(STATES[_state(f[0])], f[2], f[3], f[4], f[5], f[6], f[7] / window, f[8] / window, f[10])
