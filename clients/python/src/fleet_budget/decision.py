"""Failures and decisions (the Rust ``decision.rs``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from .snapshot import BudgetSnapshot

#: Why a job was dead-lettered, as the ``fb-reason`` header and the metrics spell it.
NON_RETRYABLE = "non_retryable"
ATTEMPTS_EXHAUSTED = "attempts_exhausted"
BUDGET_EXHAUSTED = "budget_exhausted"
#: An operator froze the dependency's retries (``budgetctl budget freeze``).
BUDGET_FROZEN = "budget_frozen"
#: The job would wait longer than its task's ``max_delay`` (a ``Retry-After`` past it). No budget
#: spent.
DELAY_EXCEEDED = "delay_exceeded"

#: A dependency's rate budget has the last word (the default; the Rust ``Enforcement::Enforce``).
ENFORCE = "enforce"
#: A refusal of the dependency's budget (``budget_exhausted``) is counted as a denial and retried
#: anyway, the :class:`Retry` saying so (the Rust ``Enforcement::Shadow``).
SHADOW = "shadow"
ENFORCEMENTS = (ENFORCE, SHADOW)


@dataclass(frozen=True)
class Failure:
    """How a job failed: ``retryable``, ``non_retryable``, ``retry_after`` or ``poison``."""

    kind: str
    message: str
    cls: str = "error"
    retry_after: Optional[float] = None

    @classmethod
    def retryable(cls, error: object) -> "Failure":
        return cls("retryable", str(error))

    @classmethod
    def non_retryable(cls, error: object) -> "Failure":
        return cls("non_retryable", str(error))

    @classmethod
    def after(cls, seconds: float, error: object) -> "Failure":
        """Retryable, not before ``seconds`` (a ``Retry-After``)."""
        return cls("retry_after", str(error), retry_after=max(0.0, float(seconds)))

    @classmethod
    def poison(cls, error: object) -> "Failure":
        return cls("poison", str(error), cls="poison")

    def with_class(self, name: str) -> "Failure":
        return Failure(self.kind, self.message, name, self.retry_after)

    @property
    def is_retryable(self) -> bool:
        return self.kind in ("retryable", "retry_after")


@dataclass(frozen=True)
class Retry:
    """Retry after ``delay`` seconds as attempt ``next_attempt``. ``shadow_denied``: the dependency
    is in shadow and its budget refused this retry for that reason (``budget_exhausted``):
    enforcement would have dead-lettered the job; None when the budget granted it."""

    dependency: str
    delay: float
    next_attempt: int
    snapshot: BudgetSnapshot
    source: str
    shadow_denied: Optional[str] = None


@dataclass(frozen=True)
class DeadLetter:
    """Give up: ``reason`` is one of the constants above; ``snapshot`` when the budget was asked."""

    dependency: str
    reason: str
    snapshot: Optional[BudgetSnapshot]
    source: str


Decision = Union[Retry, DeadLetter]
