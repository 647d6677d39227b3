"""Deposits of :class:`fleet_budget.FleetBudget`: counted in the process, coalesced per dependency
and sent by a flusher thread (one ``deposit.lua`` call per dependency), kept for a later flush when
a dead connection refused them, dropped when older than their window (the Rust group commit and
``flush``).

The denials the deny cache answered (source ``fleet_cache``) go with them, as the Rust
``budget/coalesce.rs`` sends them: Redis never saw those, and counts them with its own denials
(``deposit.lua``'s ARGV 8), so that ``budgetctl status`` shows every denial of the fleet. They do
not hurry the flusher, and a flush of denials alone does not forget a denial kept in the process.
Pending entries are ``[successes, first attempts, first counted at (ms), denied]``."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Optional

import redis

from . import scripts

if TYPE_CHECKING:
    from .budget import FleetBudget

log = logging.getLogger("fleet_budget")


class DepositSteps:
    """The deposit side of :class:`fleet_budget.FleetBudget`."""

    def pending_deposits(self: "FleetBudget") -> int:
        with self._pending_lock:
            return sum(e[0] + e[1] for e in self._pending.values())

    def flush(self: "FleetBudget") -> None:
        """Send the coalesced deposits now (one ``deposit.lua`` call per dependency)."""
        for dependency, s, a, n in self._take_pending():
            self._send_deposit(dependency, s, a, n)
        self._set_pending_gauge()

    def _take_pending(self: "FleetBudget") -> list[tuple[str, int, int, int]]:
        """What :meth:`flush` sends: the pending deposits and denials younger than their window."""
        with self._pending_lock:
            batch, self._pending = self._pending, {}
        now = self._clock()
        # Older than a window: dropped, never credited all at once to the current window.
        return [(d, s, a, n) for d, (s, a, since, n) in batch.items() if now - since <= self.config.policy(d).window_ms]

    def _report_unsent(self: "FleetBudget") -> int:
        unsent = self.pending_deposits()
        if unsent:
            log.warning("fleet budget closed with %d deposits not sent (Redis did not take them); "
                        "they are lost, which can only make the fleet's allowance smaller", unsent)
        return unsent

    # Deposits.

    def _count(self: "FleetBudget", dependency: str, successes: int,
               first_attempts: int) -> Optional[tuple[int, int, int]]:
        """Counts deposits locally and, when coalescing, as pending (None). Without coalescing,
        what to send now: these deposits with what is pending for the dependency (kept from a
        failed call, or denials answered in the process), as the Rust ``deposit_now`` sends them."""
        policy = self.config.policy(dependency)
        self.local.deposit(dependency, policy, successes, first_attempts)
        if self._flush_ms == 0 and self._health.should_try(dependency):
            with self._pending_lock:
                kept = self._pending.pop(dependency, None)
            if kept is None or self._clock() - kept[2] > policy.window_ms:
                return successes, first_attempts, 0
            return successes + kept[0], first_attempts + kept[1], kept[3]
        with self._pending_lock:
            entry = self._pending.setdefault(dependency, [0, 0, self._clock(), 0])
            entry[0] += successes
            entry[1] += first_attempts
            total = sum(e[0] + e[1] for e in self._pending.values())
            self._start_flush_thread()
        self.metrics.deposits_pending.set(total)
        if total >= self.config.redis.deposit_flush_count:
            self._wake.set()
        return None

    def _count_denied(self: "FleetBudget", dependency: str) -> None:
        """Counts a denial the deny cache answered, to be sent with the dependency's next flush
        (Redis did not see it). Without coalescing it waits for :meth:`flush` or :meth:`close`."""
        with self._pending_lock:
            entry = self._pending.setdefault(dependency, [0, 0, self._clock(), 0])
            entry[3] += 1
            self._start_flush_thread()

    def _start_flush_thread(self: "FleetBudget") -> None:
        """Starts the armed flusher thread (under ``_pending_lock``)."""
        if self._flusher_armed:
            self._flusher_armed = False
            self._flusher = threading.Thread(target=self._flush_loop, name="fleet-budget-flush", daemon=True)
            self._flusher.start()

    def _send_deposit(self: "FleetBudget", dependency: str, successes: int, first_attempts: int,
                      denied: int = 0) -> bool:
        policy = self.config.policy(dependency)
        try:
            memory = self._memory_args(dependency)
            reply = self._deposit(keys=scripts.keys(self.config.redis.key_prefix, dependency),
                                  args=scripts.deposit_args(policy, successes, first_attempts, denied, memory))
            self._remembered("deposit", dependency, reply, policy)
        except (redis.exceptions.RedisError, scripts.BadReply) as e:
            self._deposit_failed(dependency, successes, first_attempts, e, denied)
            return False
        self._health.ok(dependency)
        self._deposited(dependency, successes, first_attempts)
        return True

    def _deposited(self: "FleetBudget", dependency: str, successes: int, first_attempts: int) -> None:
        """Deposits reached Redis: a denial kept may not stand. Denials alone make no room."""
        if successes or first_attempts:
            self._denials.forget(dependency)

    def _deposit_failed(self: "FleetBudget", dependency: str, successes: int, first_attempts: int, e: BaseException,
                        denied: int = 0) -> None:
        self._health.failed(dependency, e)
        if isinstance(e, redis.exceptions.ConnectionError) and not isinstance(e, redis.exceptions.TimeoutError):
            # Refused by a dead connection: kept for a later flush. A call past its deadline
            # usually reached Redis: not sent again (lua/README.md, "Coalesced deposits").
            with self._pending_lock:
                entry = self._pending.setdefault(dependency, [0, 0, self._clock(), 0])
                entry[0] += successes
                entry[1] += first_attempts
                entry[3] += denied
        else:
            self._deposited(dependency, successes, first_attempts)  # most likely counted all the same

    def _set_pending_gauge(self: "FleetBudget") -> None:
        self.metrics.deposits_pending.set(self.pending_deposits())

    def _flush_loop(self: "FleetBudget") -> None:
        while not self._closed.is_set():
            self._wake.wait(self._flush_ms / 1000)
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                self.flush()
            except Exception:  # the flusher must outlive any one failure
                log.exception("fleet budget: flushing deposits failed")
