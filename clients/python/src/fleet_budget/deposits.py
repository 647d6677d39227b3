"""Deposits of :class:`fleet_budget.FleetBudget` (the Rust ``budget/coalesce.rs``, its group
commit and ``flush``): counted in the process, coalesced per dependency and sent by a flusher (one
``deposit.lua`` call per dependency), kept for a later flush when a dead connection refused them,
dropped when older than their window.

The denials the deny cache answered (source ``fleet_cache``) go with them, as the Rust
``Coalescer`` sends them: Redis never saw those, and counts them with its own denials
(``deposit.lua``'s ARGV 8), so that ``budgetctl status`` shows every denial of the fleet. They do
not hurry the flusher, and a flush of denials alone does not forget a denial kept in the process.

:class:`Deposits` owns the pending entries, their lock, the flusher and the deposit script; the
budget hands each count to it. Its store call is written once, as steps (``admission.py``'s
:data:`~fleet_budget.admission.Step`): the synchronous budget drives them, with a flusher thread;
the asyncio flavour awaits them, with a flusher task of its own."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

import redis

from . import scripts
from .admission import Steps, drive
from .memory import Memory, remember

log = logging.getLogger("fleet_budget")

#: What :meth:`Deposits.take` hands out: dependency, successes, first attempts, denials.
Batch = list[tuple[str, int, int, int]]


class Deposits:
    """The deposits (and the deny cache's denials) counted in this process and not yet in Redis,
    per dependency: ``[successes, first attempts, first counted at (ms), denied]``. Thread-safe. A
    forked child makes a new one (the parent sends what it counted)."""

    def __init__(self, client: Any, config: Any, clock: Callable[[], int], metrics: Any, health: Any, local: Any,
                 denials: Any, memory: Memory, *, threaded: bool = True) -> None:
        self._config = config
        self._clock = clock
        self._metrics = metrics
        self._health = health
        self._local = local
        self._denials = denials
        self._memory = memory
        self._script = metrics.timed("deposit", client.register_script(scripts.text("deposit")))
        self._pending: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        #: How often the flusher sends (ms); 0: each deposit is sent as it is counted.
        self.flush_ms: int = config.redis.deposit_flush_ms
        # Set when enough is pending to send now, and to stop the flusher.
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._flusher: Optional[threading.Thread] = None
        # The flusher thread starts with the first deposit counted (in a forked child too, where
        # the parent's thread does not exist; a Celery prefork parent, which runs no task, has
        # none); the asyncio flavour runs a task of its own instead.
        self._armed = threaded and self.flush_ms > 0

    @property
    def closed(self) -> bool:
        """Whether :meth:`stop` was called: nothing is flushed by the flusher after it."""
        return self._closed.is_set()

    def pending(self) -> int:
        """The deposits counted and not yet sent."""
        with self._lock:
            return sum(e[0] + e[1] for e in self._pending.values())

    def count(self, dependency: str, successes: int, first_attempts: int) -> Optional[tuple[int, int, int]]:
        """Counts deposits locally and, when coalescing, as pending (None). Without coalescing,
        what to send now: these deposits with what is pending for the dependency (kept from a
        failed call, or denials answered in the process), as the Rust ``deposit_now`` sends them."""
        policy = self._config.policy(dependency)
        self._local.deposit(dependency, policy, successes, first_attempts)
        if self.flush_ms == 0 and self._health.should_try(dependency):
            with self._lock:
                kept = self._pending.pop(dependency, None)
            if kept is None or self._clock() - kept[2] > policy.window_ms:
                return successes, first_attempts, 0
            return successes + kept[0], first_attempts + kept[1], kept[3]
        with self._lock:
            entry = self._pending.setdefault(dependency, [0, 0, self._clock(), 0])
            entry[0] += successes
            entry[1] += first_attempts
            total = sum(e[0] + e[1] for e in self._pending.values())
            self._start_flusher()
        self._metrics.deposits_pending.set(total)
        if total >= self._config.redis.deposit_flush_count:
            self._wake.set()
        return None

    def count_denied(self, dependency: str) -> None:
        """Counts a denial the deny cache answered, to be sent with the dependency's next flush
        (Redis did not see it). Without coalescing it waits for a flush or the close."""
        with self._lock:
            entry = self._pending.setdefault(dependency, [0, 0, self._clock(), 0])
            entry[3] += 1
            self._start_flusher()

    def hurried(self) -> bool:
        """Whether enough is pending to send now (for a flusher that does not wait on it, the
        asyncio flavour's); the request is consumed."""
        if not self._wake.is_set():
            return False
        self._wake.clear()
        return True

    def take(self) -> Batch:
        """What a flush sends: the pending deposits and denials younger than their window."""
        with self._lock:
            batch, self._pending = self._pending, {}
        now = self._clock()
        # Older than a window: dropped, never credited all at once to the current window.
        return [(d, s, a, n) for d, (s, a, since, n) in batch.items()
                if now - since <= self._config.policy(d).window_ms]

    def send_steps(self, dependency: str, successes: int, first_attempts: int, denied: int = 0) -> Steps[bool]:
        """One ``deposit.lua`` call for ``dependency``; whether Redis took it. Refused by a dead
        connection, the counts are kept for a later flush."""
        policy = self._config.policy(dependency)
        key = scripts.keys(self._config.redis.key_prefix, dependency)
        try:
            args = scripts.deposit_args(policy, successes, first_attempts, denied, self._memory.args(key[0]))
            reply = yield lambda: self._script(keys=key, args=args)
            remember(self._memory, self._metrics, key[0], "deposit", dependency, reply, policy)
        except (redis.exceptions.RedisError, scripts.BadReply) as e:
            self._failed(dependency, successes, first_attempts, e, denied)
            return False
        self._health.ok(dependency)
        self._sent(dependency, successes, first_attempts)
        return True

    def send(self, dependency: str, successes: int, first_attempts: int, denied: int = 0) -> bool:
        """:meth:`send_steps` with a blocking call."""
        return drive(self.send_steps(dependency, successes, first_attempts, denied))

    def flush(self) -> None:
        """Sends the coalesced deposits now (one ``deposit.lua`` call per dependency)."""
        for dependency, s, a, n in self.take():
            self.send(dependency, s, a, n)
        self.set_pending_gauge()

    def set_pending_gauge(self) -> None:
        self._metrics.deposits_pending.set(self.pending())

    def stop(self) -> None:
        """Stops the flusher (after the flush it is in, if any; at most 5 s)."""
        with self._lock:
            self._armed = False
        self._closed.set()
        self._wake.set()
        if self._flusher is not None:
            self._flusher.join(timeout=5)

    def report_unsent(self) -> int:
        """The deposits left unsent at the close, logged: they are lost, the safe direction."""
        unsent = self.pending()
        if unsent:
            log.warning("fleet budget closed with %d deposits not sent (Redis did not take them); "
                        "they are lost, which can only make the fleet's allowance smaller", unsent)
        return unsent

    def _sent(self, dependency: str, successes: int, first_attempts: int) -> None:
        """Deposits reached Redis: a denial kept may not stand. Denials alone make no room."""
        if successes or first_attempts:
            self._denials.forget(dependency)

    def _failed(self, dependency: str, successes: int, first_attempts: int, e: BaseException,
                denied: int = 0) -> None:
        self._health.failed(dependency, e)
        if isinstance(e, redis.exceptions.ConnectionError) and not isinstance(e, redis.exceptions.TimeoutError):
            # Refused by a dead connection: kept for a later flush. A call past its deadline
            # usually reached Redis: not sent again (lua/README.md, "Coalesced deposits").
            with self._lock:
                entry = self._pending.setdefault(dependency, [0, 0, self._clock(), 0])
                entry[0] += successes
                entry[1] += first_attempts
                entry[3] += denied
        else:
            self._sent(dependency, successes, first_attempts)  # most likely counted all the same

    def _start_flusher(self) -> None:
        """Starts the armed flusher thread (under the lock)."""
        if self._armed:
            self._armed = False
            self._flusher = threading.Thread(target=self._flush_loop, name="fleet-budget-flush", daemon=True)
            self._flusher.start()

    def _flush_loop(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self.flush_ms / 1000)
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                self.flush()
            except Exception:  # the flusher must outlive any one failure
                log.exception("fleet budget: flushing deposits failed")
