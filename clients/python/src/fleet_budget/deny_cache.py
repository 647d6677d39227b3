"""Exhausted budgets answered in the process, as the Rust ``budget/deny_cache.rs`` does it.

A denial from Redis says how long it stands at least: ``next_grant_ms``, the last field of a
spend script's reply (``lua/README.md``, "When a retry could next be granted"). Until the first of

- that instant, counted from when the call was *sent* (never after the server's instant);
- ``redis.deny_cache_ms`` after the call was sent (the staleness; 0 turns this off);
- this process's deposits for the dependency reaching Redis (a flush);
- a reply for the dependency that shows headroom, or another override state (a ``status`` read),

the dependency's requests are denied here without a call, with the source ``fleet_cache``. Only
denials are answered here, so nothing is granted that the fleet budget would refuse; a retry that
another process's deposits (or an operator's ``budget set``) just made possible may be denied for
at most the staleness. A reply to a call sent before the entry was forgotten is not kept: each
dependency has an epoch, bumped when its entry is forgotten.

Redis never sees a denial answered here: the budget counts it with its pending deposits and sends
it with the next flush (``deposits.py``, ``deposit.lua``'s ARGV 8), so that the fleet's denial
count in Redis includes it within one flush interval.

One entry per dependency asked: bounded by the configuration (and ``max_own_budgets``). The lock
is a ``threading.Lock`` held for a dict lookup, never across an ``await``: the same object serves
the threaded and the asyncio client.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from .scripts import BadReply
from .snapshot import BudgetSnapshot, Control

#: The decision's ``source`` (the Rust ``BudgetSource::FleetCache``).
SOURCE = "fleet_cache"


def next_grant_ms(script: str, reply: Any) -> Optional[int]:
    """A spend reply's last field: ms until one more spend could be granted if nothing changed
    (``None``: never without a change). It follows the 17 fields, or the policy in force (fields
    18 to 21) on a conflict; a reply without it (a script older than the field) says ``0``: ask
    again."""
    at = 21 if len(reply) >= 21 else 17
    if len(reply) <= at:
        return 0
    value = reply[at]
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadReply(script, f"field {at + 1} (next_grant_ms) is not an integer: {value!r:.100}")
    if value == -1:
        return None
    if value < 0:
        raise BadReply(script, f"field {at + 1} (next_grant_ms) is {value}")
    return value


def batch_next(next_ms: Optional[int], granted: int, k: int) -> Optional[int]:
    """Request ``k``'s (0-based) wait in a batch that granted ``granted`` with the wait
    ``next_ms`` after it: a grant before the last left room (0); the last grant and the denials saw
    the retries as they are after the batch (the Rust ``batch_answer``)."""
    return 0 if k + 1 < granted else next_ms


class DenyCache:
    """Denials of the fleet store that still stand, by dependency. ``clock``: seconds, monotonic."""

    def __init__(self, staleness_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._staleness = max(0, staleness_ms) / 1000
        self._clock = clock
        self._lock = threading.Lock()
        # dependency -> [epoch, until (seconds) or None, snapshot or None]
        self._slots: dict[str, list[Any]] = {}

    @property
    def on(self) -> bool:
        return self._staleness > 0

    def now(self) -> float:
        """When a call is sent (what :meth:`remember` takes)."""
        return self._clock()

    def lookup(self, dependency: str) -> tuple[Optional[BudgetSnapshot], int]:
        """The snapshot of a denial that still stands (``None`` when there is none), and the epoch
        under which to remember the store's answer."""
        if not self.on:
            return None, 0
        with self._lock:
            slot = self._slots.get(dependency)
            if slot is None:
                return None, 0
            if slot[1] is not None and self._clock() < slot[1]:
                return slot[2], slot[0]
            return None, slot[0]

    def remember(self, dependency: str, epoch: int, sent: float, granted: bool,
                 snapshot: BudgetSnapshot, next_ms: Optional[int]) -> None:
        """What the store answered to a call sent at ``sent`` under ``epoch``: a denial with a wait
        is kept until then (at most the staleness); room now forgets any denial kept; a grant that
        used the last of the budget is not kept (the next request asks, and its denial is)."""
        if not self.on:
            return
        if next_ms == 0:
            self._room(dependency)
            return
        if granted:
            return
        until = sent + self._staleness
        if next_ms is not None:
            until = min(until, sent + next_ms / 1000)
        if until <= self._clock():
            return
        with self._lock:
            slot = self._slots.setdefault(dependency, [0, None, None])
            if slot[0] == epoch:
                slot[1], slot[2] = until, snapshot

    def forget(self, dependency: str) -> None:
        """This process's deposits reached the store, or the budget changed: any denial kept is
        forgotten, and any reply to a call sent before now is not kept."""
        if not self.on:
            return
        with self._lock:
            slot = self._slots.get(dependency)
            if slot is not None:
                slot[0] += 1
                slot[1] = slot[2] = None

    def seen(self, dependency: str, control: Control) -> None:
        """A fresh reply's override state: another than the kept denial's forgets it."""
        if not self.on:
            return
        with self._lock:
            slot = self._slots.get(dependency)
            if slot is not None and slot[2] is not None and slot[2].control != control:
                slot[0] += 1
                slot[1] = slot[2] = None

    def _room(self, dependency: str) -> None:
        with self._lock:
            slot = self._slots.get(dependency)
            if slot is not None and slot[2] is not None:
                slot[0] += 1
                slot[1] = slot[2] = None
