"""The ``fb-*`` headers of the Rust worker (``crates/fleet-budget-amqp/src/headers``): the names,
how values are read, and the dead-letter record, so that ``budgetctl dlq`` and ``budgetctl replay``
read a dead letter written by Python as one written by Rust.

Text goes out as AMQP long strings and integers as 64-bit integers, as the Rust ``set_str`` and
``set_u64`` write them; integers are read from any width or from decimal text, as ``get_u64``
reads them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .redact import error_text
from .snapshot import BudgetSnapshot

#: Number of the execution this delivery is (1 = first; absent means 1). Reset by replay.
ATTEMPT = "fb-attempt"
#: How many times the message has been replayed from the dead-letter queue (absent means 0).
REPLAYS = "fb-replays"
TASK = "fb-task"
DEPENDENCY = "fb-dependency"
REASON = "fb-reason"
ORIGINAL_EXCHANGE = "fb-original-exchange"
ORIGINAL_ROUTING_KEY = "fb-original-routing-key"
ORIGINAL_QUEUE = "fb-original-queue"
ATTEMPTS = "fb-attempts"
FIRST_FAILURE_MS = "fb-first-failure-ms"
DEAD_LETTERED_MS = "fb-dead-lettered-ms"
ERROR_CLASS = "fb-error-class"
ERROR = "fb-error"
BUDGET_ALLOWANCE = "fb-budget-allowance"
BUDGET_RETRIES = "fb-budget-retries"
BUDGET_WINDOW_MS = "fb-budget-window-ms"
BUDGET_WINDOW_INDEX = "fb-budget-window-index"
BUDGET_SOURCE = "fb-budget-source"
#: On a retry its dependency's budget refused while in shadow: the reason enforcement would have
#: dead-lettered it (``budget_exhausted``); absent on a retry the budget granted.
SHADOW_DENIED = "fb-shadow-denied"
REPLAYED_MS = "fb-replayed-ms"
#: Why a job waits without running (``primary_at_cap``, ``circuit_open``): set while the budget's
#: ``admit`` holds it, removed once it runs (the Rust ``HOLD_REASON``).
HOLD_REASON = "fb-hold-reason"
#: When the job was first held without running (Unix ms), kept across its holds and removed once
#: it runs: a job held longer than its limit in all is dead-lettered (the Rust ``HELD_SINCE_MS``).
HELD_SINCE_MS = "fb-held-since-ms"
#: Headers that say a job is being held; never carried past the execution that runs it.
HOLD_HEADERS = (HOLD_REASON, HELD_SINCE_MS)

#: Headers that describe one dead-lettering (the Rust ``DEAD_LETTER_HEADERS``, less the retry
#: tiers' headers that a Celery job never carries): never copied onto a retry.
DEAD_LETTER_HEADERS = (REASON, DEPENDENCY, ATTEMPTS, DEAD_LETTERED_MS, ERROR_CLASS, ERROR,
                       BUDGET_ALLOWANCE, BUDGET_RETRIES, BUDGET_WINDOW_MS, BUDGET_WINDOW_INDEX, BUDGET_SOURCE)

_U64_MAX = 2**64 - 1
_I64_MAX = 2**63 - 1


class HeaderError(ValueError):
    """A header of this contract is present but cannot be read; names it (the Rust ``HeaderError``)."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"header {name}: {problem}")
        self.name = name
        self.problem = problem


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def get_u64(headers: Optional[Mapping[str, Any]], name: str) -> Optional[int]:
    """An unsigned integer header: any integer width, or decimal text; None when absent."""
    if not headers or name not in headers or headers[name] is None:
        return None
    value = headers[name]
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise HeaderError(name, "is not UTF-8 text") from None
    if isinstance(value, bool) or isinstance(value, float):
        raise HeaderError(name, f"expected an unsigned integer, got {value!r:.40}")
    if isinstance(value, str):
        text = value.strip()
        if not text.isascii() or not text.isdigit():
            raise HeaderError(name, f"expected an unsigned integer, got {value!r:.40}")
        value = int(text)
    if not isinstance(value, int):
        raise HeaderError(name, f"expected an unsigned integer, got {type(value).__name__}")
    if not 0 <= value <= _U64_MAX:
        raise HeaderError(name, f"{value} is out of range")
    return value


def get_str(headers: Optional[Mapping[str, Any]], name: str) -> Optional[str]:
    if not headers or name not in headers or headers[name] is None:
        return None
    value = headers[name]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise HeaderError(name, "is not UTF-8 text") from None
    if not isinstance(value, str):
        raise HeaderError(name, f"expected text, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class JobHeaders:
    """What a worker reads before running a job: the replays so far, where it was first
    published, the first failure of this life of the job."""

    replays: int = 0
    original_exchange: Optional[str] = None
    original_routing_key: Optional[str] = None
    first_failure_ms: Optional[int] = None
    #: When the job was first held without running, if it is being held (Unix ms).
    held_since_ms: Optional[int] = None

    @classmethod
    def parse(cls, headers: Optional[Mapping[str, Any]]) -> "JobHeaders":
        """Raises :class:`HeaderError` naming the first malformed header."""
        replays = get_u64(headers, REPLAYS) or 0
        if replays > 2**32 - 1:
            raise HeaderError(REPLAYS, f"{replays} is out of range")
        return cls(
            replays=replays,
            original_exchange=get_str(headers, ORIGINAL_EXCHANGE),
            original_routing_key=get_str(headers, ORIGINAL_ROUTING_KEY),
            first_failure_ms=get_u64(headers, FIRST_FAILURE_MS),
            held_since_ms=get_u64(headers, HELD_SINCE_MS),
        )


@dataclass(frozen=True)
class DeadLetterRecord:
    """Everything a dead-lettered message says about why and where from (the Rust record)."""

    task: str
    dependency: str
    reason: str
    original_exchange: str
    original_routing_key: str
    original_queue: str
    attempts: int
    first_failure_ms: int
    dead_lettered_ms: int
    error_class: str
    error: str
    snapshot: Optional[BudgetSnapshot]
    source: Optional[str]
    replays: int

    def headers(self) -> dict[str, Any]:
        """The ``fb-*`` headers, the error text redacted and truncated."""
        out: dict[str, Any] = {
            TASK: self.task,
            DEPENDENCY: self.dependency,
            REASON: self.reason,
            ORIGINAL_EXCHANGE: self.original_exchange,
            ORIGINAL_ROUTING_KEY: self.original_routing_key,
            ORIGINAL_QUEUE: self.original_queue,
            ATTEMPTS: _u64(self.attempts),
            FIRST_FAILURE_MS: _u64(self.first_failure_ms),
            DEAD_LETTERED_MS: _u64(self.dead_lettered_ms),
            ERROR_CLASS: self.error_class,
            ERROR: error_text(self.error),
            REPLAYS: _u64(self.replays),
        }
        if self.snapshot is not None:
            s = self.snapshot
            out[BUDGET_ALLOWANCE] = _u64(s.allowance)
            out[BUDGET_RETRIES] = _u64(s.estimates().retries)
            out[BUDGET_WINDOW_MS] = _u64(s.window_ms)
            out[BUDGET_WINDOW_INDEX] = _u64(s.window_index)
        if self.source is not None:
            out[BUDGET_SOURCE] = self.source
        return out


def _u64(value: int) -> int:
    """As the Rust ``set_u64`` writes it: a signed 64-bit integer, saturated."""
    return max(0, min(int(value), _I64_MAX))
