"""The decision order of the contract (``docs/semantics.md``; the Rust ``budget/decide.rs``), as
functions of the failure, the task's ceiling and the rate budget's withdrawal, with no I/O: not
retryable, out of attempts, a wait past ``max_delay`` (each before any budget is spent), then the
dependency's budget; a granted retry gets its delay from the ceiling. A refusal a dependency in
shadow lets through (:func:`shadows`) is retried as if granted, and counted as one enforcement
would have denied. :class:`fleet_budget.FleetBudget` (and its asyncio flavour) asks the budget
between :func:`before_budget` and :func:`after_budget`, and the enforcement in force only when
:func:`refusal` says ``budget_exhausted``, the one answer shadow changes."""

from __future__ import annotations

import random
import threading
from typing import Any, Callable, Optional, TypeVar

from .decision import (ATTEMPTS_EXHAUSTED, BUDGET_EXHAUSTED, BUDGET_FROZEN, DELAY_EXCEEDED, NON_RETRYABLE, SHADOW,
                       DeadLetter, Decision, Failure, Retry)
from .deny_cache import SOURCE as FLEET_CACHE
from .policy import TaskCeiling
from .snapshot import BudgetSnapshot

T = TypeVar("T")

#: The source of a fallback's answer that consulted no budget (``deny`` or ``allow``).
BLIND = "blind"


class Jitter:
    """The jitter of delays and holds: one generator behind a lock, seedable for deterministic
    tests (the Rust ``Jitter``). A forked child makes a new one, unseeded: children of one parent
    would otherwise draw the same jitter, and retry together."""

    def __init__(self, seed: Optional[int] = None) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def draw(self, draw: Callable[[random.Random], T]) -> T:
        """Runs ``draw`` with the generator."""
        with self._lock:
            return draw(self._rng)


def before_budget(failure: Failure, ceiling: TaskCeiling, attempt: int,
                  since_first_failure: Optional[float]) -> Optional[str]:
    """Why a failure is dead-lettered before any budget is asked, if it is: not retryable, the
    ceiling reached (``attempt`` ≥ ``max_attempts``, or the recovery window passed), or a
    ``Retry-After`` longer than the ceiling's ``max_delay``."""
    if not failure.is_retryable:
        return NON_RETRYABLE
    if ceiling.exhausted(attempt, since_first_failure):
        return ATTEMPTS_EXHAUSTED
    # A wait the dependency asks for past `max_delay` is refused before any budget is spent:
    # honouring it would hold the job for longer than anyone agreed to wait.
    if failure.retry_after is not None and not ceiling.allows_wait(failure.retry_after):
        return DELAY_EXCEEDED
    return None


def refusal(granted: bool, snapshot: BudgetSnapshot) -> Optional[str]:
    """Why the budget's answer dead-letters the job, if it does: a refusal while frozen is
    ``budget_frozen``, any other ``budget_exhausted``."""
    if granted:
        return None
    return BUDGET_FROZEN if snapshot.control.frozen else BUDGET_EXHAUSTED


def shadowable(reason: Optional[str], source: str) -> bool:
    """Whether a refusal for ``reason`` from ``source`` is one shadow lets through, so that the
    enforcement in force is worth asking: a budget exhausted, as the fleet store, the deny cache or
    the ``local`` fallback found it. A freeze is an operator's order, not an observation, and
    holds; so does the ``deny`` fallback's refusal while Redis fails (source ``blind``): the
    machinery's, not the budget's (docs/semantics.md, "Shadow mode")."""
    return reason == BUDGET_EXHAUSTED and source != BLIND


def shadows(reason: Optional[str], source: str, enforcement: Optional[str]) -> bool:
    """Whether a refusal for ``reason`` from ``source`` is retried anyway under ``enforcement``:
    in shadow, one :func:`shadowable` is."""
    return enforcement == SHADOW and shadowable(reason, source)


def dead_letter(metrics: Any, dependency: str, reason: str, snapshot: Optional[BudgetSnapshot],
                source: str) -> DeadLetter:
    """The decision to dead-letter a job of ``dependency`` for ``reason``, counted in ``metrics``."""
    metrics.dead_letters.labels(dependency, reason).inc()
    return DeadLetter(dependency, reason, snapshot, source)


def after_budget(metrics: Any, jitter: Jitter, dependency: str, ceiling: TaskCeiling, attempt: int,
                 failure: Failure, granted: bool, snapshot: BudgetSnapshot, source: str,
                 since_first_failure: Optional[float], shadow: bool) -> Decision:
    """The decision once the budget answered (``granted``, ``snapshot``, from ``source``), counted
    in ``metrics``: a refusal dead-letters the job, unless ``shadow`` (:func:`shadows` said so),
    when it is retried anyway, the :class:`Retry` saying why enforcement would have refused it,
    counted in ``fleet_budget_retries_would_deny_total``; a retry's delay comes from the ceiling."""
    (metrics.retries_granted if granted else metrics.retries_denied).labels(dependency).inc()
    if source == FLEET_CACHE:  # the denial its call saw: the gauges have it, no conflict to count
        metrics.retries_denied_in_process.labels(dependency).inc()
    else:
        metrics.snapshot(dependency, snapshot)
    reason = refusal(granted, snapshot)
    if reason is not None:
        if not (shadow and shadowable(reason, source)):
            return dead_letter(metrics, dependency, reason, snapshot, source)
        metrics.retries_would_deny.labels(dependency).inc()
    delay = jitter.draw(lambda rng: ceiling.delay(attempt, since_first_failure, failure.retry_after, rng))
    return Retry(dependency, delay, attempt + 1, snapshot, source, reason)
