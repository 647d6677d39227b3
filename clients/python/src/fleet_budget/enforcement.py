"""Which enforcement a dependency is held to now (the Rust ``budget/enforcement.rs``): its
configured ``enforcement``, unless an operator switched it (``budgetctl budget shadow|enforce``,
kept in ``<prefix>:v1:enforcement:{<dependency>}``, which expires with the switch).

Asked only when the budget refuses a retry, the one moment shadow and enforcement differ. The
switch is read at most once per staleness per dependency (``redis.deny_cache_ms``, or 100 ms with
the deny cache off), so a switch reaches every worker within it: what a read answered is kept for
the staleness from when it was asked, not from when the answer came (an answer that took long may
predate a switch written meanwhile). While Redis does not answer, the last switch read stands
(none read: the configuration)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Awaitable, Callable, Optional

import redis

from .decision import ENFORCEMENTS

log = logging.getLogger("fleet_budget")

#: The staleness without a deny cache (ms).
STALENESS_WITHOUT_CACHE_MS = 100


def switch_key(prefix: str, dependency: str) -> str:
    """The key of ``dependency``'s switch (the Rust ``keys::enforcement_key``)."""
    return f"{prefix}:v1:enforcement:{{{dependency}}}"


def _mode(reply: Any) -> Optional[str]:
    """The mode of an ``HMGET key m`` reply: a mode this client knows, else None (no switch, or
    one written by hand: the configuration decides)."""
    value = reply[0] if isinstance(reply, (list, tuple)) and reply else None
    if isinstance(value, bytes):
        value = value[:16].decode("utf-8", "replace")
    return value if value in ENFORCEMENTS else None


class EnforcementInForce:
    """The enforcement in force per dependency; bounded by the dependencies refused."""

    def __init__(self, config: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        deny_cache_ms = config.redis.deny_cache_ms
        self._staleness = (deny_cache_ms if deny_cache_ms > 0 else STALENESS_WITHOUT_CACHE_MS) / 1000
        self._clock = clock
        self._lock = threading.Lock()
        # dependency -> (when read, the switch's mode or None)
        self._read: dict[str, tuple[float, Optional[str]]] = {}

    def _kept(self, dependency: str) -> tuple[bool, Optional[str]]:
        with self._lock:
            at, mode = self._read.get(dependency, (None, None))
        return at is not None and self._clock() - at < self._staleness, mode

    def _learn(self, dependency: str, asked: float, mode: Optional[str]) -> str:
        """Keeps ``mode``, what a read asked at ``asked`` answered, for the staleness from then.
        A failed read keeps the last one read from the failure on: one read per staleness, however
        long Redis takes to fail."""
        with self._lock:
            self._read[dependency] = (asked, mode)
        return mode or self._config.enforcement_of(dependency)

    def of(self, dependency: str, client: Any) -> str:
        """``dependency``'s enforcement now, its switch read with ``client`` when stale."""
        fresh, mode = self._kept(dependency)
        if fresh:
            return mode or self._config.enforcement_of(dependency)
        asked = self._clock()
        try:
            mode = _mode(client.hmget(switch_key(self._config.redis.key_prefix, dependency), "m"))
        except redis.exceptions.RedisError as e:
            log.debug("enforcement switch of %s not read (%s); the last one read stands", dependency, e)
            asked = self._clock()
        return self._learn(dependency, asked, mode)

    async def of_async(self, dependency: str, client: Any) -> str:
        """:meth:`of` with an asyncio client."""
        fresh, mode = self._kept(dependency)
        if fresh:
            return mode or self._config.enforcement_of(dependency)
        asked = self._clock()
        try:
            reply: Awaitable[Any] = client.hmget(switch_key(self._config.redis.key_prefix, dependency), "m")
            mode = _mode(await reply)
        except redis.exceptions.RedisError as e:
            log.debug("enforcement switch of %s not read (%s); the last one read stands", dependency, e)
            asked = self._clock()
        return self._learn(dependency, asked, mode)
