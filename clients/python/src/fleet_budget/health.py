"""The fleet store's health, per dependency, in :class:`fleet_budget.FleetBudget`: a dependency
whose store call failed is decided by the fallback and probed again once per
:data:`PROBE_INTERVAL_MS`; ``error_kind`` labels the failure in the metrics."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis

from . import scripts
from .group_commit import GroupTimeout
from .redact import redact_url

if TYPE_CHECKING:
    from .budget import FleetBudget

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
    """The fallback bookkeeping of :class:`fleet_budget.FleetBudget`."""

    @property
    def in_fallback(self: "FleetBudget") -> bool:
        with self._health_lock:
            return bool(self._degraded)

    def fallback_dependencies(self: "FleetBudget") -> list[tuple[str, int]]:
        """The dependencies whose decisions come from the fallback now, each with how long it has
        been (ms of the budget's clock; 0 when the clock went back since), in name order: what the
        worker registry reports (the Rust ``fallback_dependencies``)."""
        with self._health_lock:
            since = dict(self._fallback_since)
        now = self._clock()
        return [(dependency, max(0, now - start)) for dependency, start in sorted(since.items())]

    # Health: a dependency whose store call failed is decided by the fallback, and probed again
    # once per PROBE_INTERVAL_MS.

    def _should_try(self: "FleetBudget", dependency: str) -> bool:
        with self._health_lock:
            next_probe = self._degraded.get(dependency)
            if next_probe is None:
                return True
            now = self._clock()
            if now >= next_probe or next_probe > now + PROBE_INTERVAL_MS:
                self._degraded[dependency] = now + PROBE_INTERVAL_MS
                return True
            return False

    def _ok(self: "FleetBudget", dependency: str) -> None:
        with self._health_lock:
            if self._degraded.pop(dependency, None) is None:
                return
            self._fallback_since.pop(dependency, None)
            left = len(self._degraded)
        self.metrics.fallback_dependencies.set(left)
        self.metrics.fallback_active.labels(dependency).set(0)
        if left == 0:
            self._oom_logged = False
            log.info("fleet budget store answers again; leaving fallback")

    def _failed(self: "FleetBudget", dependency: str, error: BaseException) -> None:
        kind = error_kind(error)
        self.metrics.store_errors.labels(kind).inc()
        if kind == "oom" and not self._oom_logged:
            self._oom_logged = True  # one line per outage, not one per call (reset on recovery)
            log.error("Redis refuses the budget's writes for %s: its memory is full (maxmemory reached "
                      "under maxmemory-policy noeviction; reason oom). Retry decisions come from the "
                      "fallback %s until it frees memory; counted in fleet_budget_store_errors_total"
                      "{kind=\"oom\"}", dependency, self.config.redis.fallback)
        with self._health_lock:
            new = dependency not in self._degraded
            now = self._clock()
            self._degraded[dependency] = now + PROBE_INTERVAL_MS
            if new:  # the episode starts: what the worker registry reports its length from
                self._fallback_since[dependency] = now
            count = len(self._degraded)
        if new:
            self.metrics.fallback_dependencies.set(count)
            self.metrics.fallback_active.labels(dependency).set(1)
            if count == 1:
                log.warning("fleet budget store failed for %s (%s); entering fallback %s",
                            dependency, redact_url(str(error)), self.config.redis.fallback)
