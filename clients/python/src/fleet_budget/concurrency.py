"""A dependency's fleet-wide concurrency budget (the Rust ``concurrency/``): its calls in flight,
primary and retry, held as leases in two Redis sorted sets that expire by the server's clock, so
a worker that dies loses its slots for no longer than one lease.

A retry gets a slot only while the calls in flight are below the cap *and* the retries in flight
are below the retry share, ``max(min_retry_slots, floor(max_retry_fraction × primaries in
flight))``; it never waits for one: one ``lease_acquire.lua`` call grants or refuses. Primary
calls are counted and never refused by the retry share; with ``primary_waits`` they are refused
at the cap. The scripts and their arguments are those of ``lua/README.md``, "Concurrency leases".
"""

from __future__ import annotations

import math
import os
import random
import threading
from dataclasses import dataclass
from typing import Any, Optional

from .scripts import BadReply, ratio_text

#: The longest lease (and wait) a script accepts, in seconds (one day; the Rust ``MAX_LEASE``).
MAX_LEASE_SECS = 86_400
#: The largest cap (and retry floor) the scripts accept.
MAX_CAP = 1_000_000_000

#: The dead-letter reasons of a retry refused a slot (the Rust ``Refusal::reason``).
CONCURRENCY_CAP = "concurrency_cap"
CONCURRENCY_RETRY_SHARE = "concurrency_retry_share"
#: Refusal codes of ``lease_acquire.lua`` (reply field 2) and their reasons.
REFUSALS = {1: CONCURRENCY_CAP, 2: CONCURRENCY_RETRY_SHARE}

PRIMARY = "primary"
RETRY = "retry"
#: A hedged request: drawn from the retry share (held in the retry set under an id starting
#: ``h``), counted apart.
HEDGE = "hedge"


@dataclass(frozen=True)
class ConcurrencyPolicy:
    """``[dependencies.X.concurrency]``: the cap on calls in flight, the retry share, the lease."""

    cap: int
    max_retry_fraction: float
    min_retry_slots: int = 3
    #: How long a slot is held when its holder never gives it back (longer than the call's own
    #: timeout, so that a live call never loses its slot).
    lease_ms: int = 30_000
    #: A primary call at the cap is refused (and waits) instead of only being counted.
    primary_waits: bool = False
    #: How long a primary refused at the cap may wait in all before ``concurrency_cap``.
    max_wait: float = 600.0

    @classmethod
    def derived(cls, cap: int, planned_primary: int, min_retry_slots: int = 3) -> "ConcurrencyPolicy":
        """The share ``(cap − planned_primary) / planned_primary`` (the Rust ``derived``)."""
        if not 1 <= planned_primary <= cap:
            raise ValueError(f"planned primary calls in flight must be from 1 to the cap ({cap}), "
                             f"not {planned_primary}")
        return cls(cap, (cap - planned_primary) / planned_primary, min_retry_slots).checked()

    def checked(self) -> "ConcurrencyPolicy":
        """The policy if the scripts take it; else ValueError naming the first field out of range
        (the Rust ``checked``, with its words)."""
        if not 1 <= self.cap <= MAX_CAP:
            raise ValueError(f"the concurrency cap must be from 1 to 10^9, not {self.cap}")
        f = self.max_retry_fraction
        if not (math.isfinite(f) and 0.0 <= f <= 1000.0):
            raise ValueError(f"max_retry_fraction must be a number from 0 to 1000, not {ratio_text(f)}")
        if self.min_retry_slots > MAX_CAP:
            raise ValueError(f"min_retry_slots must be at most 10^9, not {self.min_retry_slots}")
        if not 1 <= self.lease_ms <= MAX_LEASE_SECS * 1000:
            raise ValueError(f"the lease must be from 1 ms to 1 day, not {self.lease_ms} ms")
        if self.max_wait > MAX_LEASE_SECS:
            raise ValueError(f"max_wait must be at most 1 day, not {self.max_wait} s")
        return self

    def retry_slots(self, primaries: int) -> int:
        """Retry slots with ``primaries`` in flight, as the script counts them."""
        return max(self.min_retry_slots, int(min(math.floor(self.max_retry_fraction * primaries), 1e15)))


@dataclass(frozen=True)
class InFlight:
    primaries: int
    retries: int

    @property
    def retry_fraction(self) -> float:
        """Retries over primaries in flight (0 without primaries): ``fleet_budget_retry_fraction``."""
        return self.retries / self.primaries if self.primaries else 0.0


@dataclass(frozen=True)
class Lease:
    """A slot held; give it back with :meth:`Leases.release` (it expires by itself otherwise)."""

    dependency: str
    kind: str
    id: str
    expires_at_ms: int


@dataclass(frozen=True)
class Acquired:
    """One ``lease_acquire.lua`` answer: the lease, or the reason it was refused."""

    lease: Optional[Lease]
    refusal: Optional[str]
    in_flight: InFlight
    retry_slots: int


def lease_keys(prefix: str, dependency: str) -> list[str]:
    """``<prefix>:v1:{<dependency>}:lp`` and ``:lr``: the budget hash's slot (lua/README.md)."""
    base = f"{prefix}:v1:{{{dependency}}}"
    return [f"{base}:lp", f"{base}:lr"]


def acquire_args(policy: ConcurrencyPolicy, kind: str, lease_id: str) -> list[str]:
    return [
        "p" if kind == PRIMARY else "r",
        lease_id,
        str(policy.lease_ms),
        str(policy.cap),
        ratio_text(policy.max_retry_fraction),
        str(policy.min_retry_slots),
        "1" if policy.primary_waits else "0",
    ]


def counts(script: str, reply: Any, n: int) -> list[int]:
    """The first ``n`` fields of ``reply``, each a non-negative integer (the Rust ``count_at``; the
    breaker's replies follow the same rule)."""
    if not isinstance(reply, (list, tuple)):
        raise BadReply(script, f"expected an array, got {type(reply).__name__}")
    out = []
    for i in range(n):
        if i >= len(reply):
            raise BadReply(script, f"field {i + 1} is missing")
        v = reply[i]
        if not isinstance(v, int) or isinstance(v, bool):
            raise BadReply(script, f"field {i + 1} is not an integer")
        if v < 0:
            raise BadReply(script, f"field {i + 1} is negative: {v}")
        out.append(v)
    return out


def parse_acquire(reply: Any, dependency: str, policy: ConcurrencyPolicy, kind: str, lease_id: str) -> Acquired:
    granted, refusal, p, r, slots, now = counts("lease_acquire", reply, 6)
    in_flight = InFlight(p, r)
    if (granted, refusal) == (1, 0):
        return Acquired(Lease(dependency, kind, lease_id, now + policy.lease_ms), None, in_flight, slots)
    if granted == 0 and refusal in REFUSALS:
        return Acquired(None, REFUSALS[refusal], in_flight, slots)
    raise BadReply("lease_acquire", f"granted and refusal are ({granted}, {refusal})")


def parse_release(reply: Any) -> InFlight:
    _, p, r = counts("lease_release", reply, 3)
    return InFlight(p, r)


class LeaseIds:
    """This process's lease ids: a random stem and a counter, unique in the fleet (a fork gets a
    stem of its own, so that a Celery child never reuses its parent's ids)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._stem = ""
        self._n = 0

    def next(self, kind: str) -> str:
        with self._lock:
            pid = os.getpid()
            if pid != self._pid:
                self._pid, self._stem = pid, f"{pid:x}-{random.SystemRandom().getrandbits(64):016x}"
            self._n += 1
            return f"{'h' if kind == HEDGE else ''}py{self._stem}-{self._n:x}"
