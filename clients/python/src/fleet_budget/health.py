"""The fleet store's health, per dependency (the Rust ``budget/health.rs``): a dependency whose
store call failed is decided by the fallback and probed again once per :data:`PROBE_INTERVAL_MS`;
the freezes and open breakers Redis last showed, which hold while it fails; ``error_kind`` labels
a failure in the metrics. :class:`StoreHealth` owns all of it; :class:`fleet_budget.FleetBudget`
holds one (a new one in a forked child)."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

import redis

from . import breaker as cb
from . import scripts
from .group_commit import GroupTimeout
from .redact import redact_url

log = logging.getLogger("fleet_budget")

#: How often a dependency whose store calls failed is tried again (the Rust ``PROBE_INTERVAL``).
PROBE_INTERVAL_MS = 200


def error_kind(error: BaseException) -> str:
    """The ``kind`` label of a failed store call: timeout, connection, oom (Redis's memory is
    full: ``OOM command not allowed ...`` under ``maxmemory-policy noeviction``), server,
    bad_reply, bad_key."""
    if isinstance(error, (redis.exceptions.TimeoutError, GroupTimeout)):
        return "timeout"
    if isinstance(error, redis.exceptions.ConnectionError):
        return "connection"
    if isinstance(error, redis.exceptions.ResponseError) and (
            isinstance(error, getattr(redis.exceptions, "OutOfMemoryError", ()))
            or "OOM command not allowed" in str(error)):
        return "oom"
    if isinstance(error, scripts.BadReply):
        return "bad_reply"
    if isinstance(error, redis.exceptions.ResponseError) and _is_key_refusal(str(error)):
        return "bad_key"
    return "server"


#: How the scripts refuse a key written by someone else (the Rust ``key_refusal`` and
#: ``refused_key``): ``fleet-budget: key <key> is not a budget hash ...`` and the like.
_KEY_REFUSALS = (" is not a budget hash", " is not a breaker hash", " is not a lease set", " field ")


def _is_key_refusal(text: str) -> bool:
    rest = text.removeprefix("fleet-budget: ")
    return rest != text and rest.startswith("key ") and any(m in rest for m in _KEY_REFUSALS)


class StoreHealth:
    """Which dependencies the fallback decides now, and since when; the freezes and open breakers
    Redis last showed. Thread-safe."""

    def __init__(self, clock: Callable[[], int], metrics: Any, fallback: str) -> None:
        self._clock = clock
        self._metrics = metrics
        self._fallback = fallback
        self._lock = threading.Lock()
        # Degraded dependency -> when the store may next be probed for it (clock ms).
        self._degraded: dict[str, int] = {}
        # When each dependency's fallback episode started (clock ms), for the worker registry.
        self._fallback_since: dict[str, int] = {}
        # Dependencies Redis last answered frozen -> when that freeze ends (clock ms): the
        # fallback grants nothing for them until then (the Rust ``Health::saw``).
        self._freezes: dict[str, int] = {}
        # Dependencies whose breaker this process last saw open -> when it half-opens (server ms).
        self._open_breakers: dict[str, int] = {}
        self._oom_logged = False

    @property
    def in_fallback(self) -> bool:
        with self._lock:
            return bool(self._degraded)

    def episodes(self) -> list[tuple[str, int]]:
        """The dependencies whose decisions come from the fallback now, each with how long it has
        been (ms of the clock; 0 when the clock went back since), in name order."""
        with self._lock:
            since = dict(self._fallback_since)
        now = self._clock()
        return [(dependency, max(0, now - start)) for dependency, start in sorted(since.items())]

    def should_try(self, dependency: str) -> bool:
        """Whether to call the store for ``dependency``: always when healthy; when degraded, one
        caller per probe interval (a clock set back by more than one opens the probe at once)."""
        with self._lock:
            next_probe = self._degraded.get(dependency)
            if next_probe is None:
                return True
            now = self._clock()
            if now >= next_probe or next_probe > now + PROBE_INTERVAL_MS:
                self._degraded[dependency] = now + PROBE_INTERVAL_MS
                return True
            return False

    def ok(self, dependency: str) -> None:
        """The store answered for ``dependency``: out of the fallback."""
        with self._lock:
            if self._degraded.pop(dependency, None) is None:
                return
            self._fallback_since.pop(dependency, None)
            left = len(self._degraded)
            if left == 0:
                self._oom_logged = False
        self._metrics.fallback_dependencies.set(left)
        self._metrics.fallback_active.labels(dependency).set(0)
        if left == 0:
            log.info("fleet budget store answers again; leaving fallback")

    def failed(self, dependency: str, error: BaseException) -> None:
        """A store call for ``dependency`` failed (counted by kind): into the fallback until a
        probe succeeds."""
        kind = error_kind(error)
        self._metrics.store_errors.labels(kind).inc()
        with self._lock:
            log_oom = kind == "oom" and not self._oom_logged
            if log_oom:
                self._oom_logged = True  # one line per outage, not one per call (reset on recovery)
            new = dependency not in self._degraded
            now = self._clock()
            self._degraded[dependency] = now + PROBE_INTERVAL_MS
            if new:  # the episode starts: what the worker registry reports its length from
                self._fallback_since[dependency] = now
            count = len(self._degraded)
        if log_oom:
            log.error("Redis refuses the budget's writes for %s: its memory is full (maxmemory reached "
                      "under maxmemory-policy noeviction; reason oom). Retry decisions come from the "
                      "fallback %s until it frees memory; counted in fleet_budget_store_errors_total"
                      "{kind=\"oom\"}", dependency, self._fallback)
        if new:
            self._metrics.fallback_dependencies.set(count)
            self._metrics.fallback_active.labels(dependency).set(1)
            if count == 1:
                log.warning("fleet budget store failed for %s (%s); entering fallback %s",
                            dependency, redact_url(str(error)), self._fallback)

    def saw(self, dependency: str, at: int, frozen: bool, wait: Optional[int]) -> None:
        """Remembers whether Redis's answer for ``dependency``, asked at clock ms ``at``, showed a
        freeze in force and until when (while frozen the wait is the freeze's remaining time;
        never, without an end, is an hour at a time)."""
        with self._lock:
            if frozen:
                self._freezes[dependency] = at + (wait if wait is not None else 3_600_000)
            else:
                self._freezes.pop(dependency, None)

    def frozen(self, dependency: str) -> bool:
        """Whether Redis's last answer for ``dependency`` showed a freeze not ended by the clock."""
        with self._lock:
            until = self._freezes.get(dependency, 0)
        return until > self._clock()

    def breaker_lost(self, dependency: str, decided: cb.Decided) -> bool:
        """Remembers the breaker state seen for ``dependency`` and says whether it shows the
        breaker this process last saw open closed before its open period ended without this call
        closing it: its key was lost (an open breaker only closes through half-open)."""
        with self._lock:
            until = self._open_breakers.get(dependency, 0)
            lost = decided.state == cb.CLOSED and not decided.changed and until > decided.now_ms
            if decided.state == cb.OPEN:
                self._open_breakers[dependency] = decided.open_until_ms
            else:
                self._open_breakers.pop(dependency, None)
        return lost
