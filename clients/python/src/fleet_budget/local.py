"""The budget arithmetic in the process: the fallback when Redis does not answer. The same
operations, in the same order, as ``lua/src/shared`` and the Rust ``allowance.rs``."""

from __future__ import annotations

import threading
import time
from typing import Callable

from .policy import BudgetPolicy
from .snapshot import BudgetSnapshot, WindowCounters


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _State:
    __slots__ = ("window", "index", "cur", "prev")

    def __init__(self, now: int, window: int) -> None:
        self.window = window
        self.index = now // window
        self.cur = [0, 0, 0, 0]
        self.prev = [0, 0, 0, 0]

    def roll(self, now: int, window: int) -> None:
        idx = now // window
        if window != self.window:
            self.window, self.index = window, idx
            self.cur, self.prev = [0, 0, 0, 0], [0, 0, 0, 0]
        elif idx == self.index + 1:
            self.prev, self.cur, self.index = self.cur, [0, 0, 0, 0], idx
        elif idx > self.index:
            self.index = idx
            self.cur, self.prev = [0, 0, 0, 0], [0, 0, 0, 0]

    def snapshot(self, now: int, policy: BudgetPolicy) -> tuple[BudgetSnapshot, int]:
        window = self.window
        elapsed = min(max(now - self.index * window, 0), window - 1)
        pw = window - elapsed if policy.mode == "sliding" else 0
        d = 1 if policy.basis_code == "a" else 0
        deposits_sc = self.cur[d] * window + self.prev[d] * pw
        allowance = max(policy.min_allowance, int(policy.ratio * deposits_sc / window))
        snap = BudgetSnapshot(
            window_ms=window,
            window_index=self.index,
            elapsed_ms=elapsed,
            previous_weight_ms=pw,
            current=WindowCounters(*self.cur),
            previous=WindowCounters(*self.prev),
            allowance=allowance,
        )
        return snap, pw


class LocalStore:
    """Budgets kept in this process, by dependency; idle ones are dropped after two windows."""

    def __init__(self, clock: Callable[[], int] = _now_ms) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, _State] = {}
        self._next_sweep = 0

    def _state(self, dependency: str, window: int, now: int) -> _State:
        if now >= self._next_sweep:
            self._next_sweep = now + 1000
            self._states = {
                k: s for k, s in self._states.items() if now // s.window <= s.index + 1
            }
        state = self._states.get(dependency)
        if state is None:
            state = self._states[dependency] = _State(now, window)
        state.roll(now, window)
        return state

    def deposit(self, dependency: str, policy: BudgetPolicy, successes: int, first_attempts: int) -> BudgetSnapshot:
        with self._lock:
            now = self._clock()
            state = self._state(dependency, policy.window_ms, now)
            state.cur[0] += successes
            state.cur[1] += first_attempts
            return state.snapshot(now, policy)[0]

    def withdraw(self, dependency: str, policy: BudgetPolicy) -> tuple[bool, BudgetSnapshot]:
        with self._lock:
            now = self._clock()
            state = self._state(dependency, policy.window_ms, now)
            snap, pw = state.snapshot(now, policy)
            window = state.window
            granted = state.cur[2] * window + state.prev[2] * pw + window <= snap.allowance * window
            state.cur[2 if granted else 3] += 1
            return granted, state.snapshot(now, policy)[0]

    def status(self, dependency: str, policy: BudgetPolicy) -> BudgetSnapshot:
        with self._lock:
            now = self._clock()
            return self._state(dependency, policy.window_ms, now).snapshot(now, policy)[0]
