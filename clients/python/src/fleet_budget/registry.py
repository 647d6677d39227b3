"""The worker registry, written (the Rust ``budget/heartbeat.rs``): every ``redis.heartbeat_ms``
(default 5 s; 0 is off) a budget sends this worker's report with ``lua/heartbeat.lua``, so that
tools (the incident console, ``fleet_budget::control::workers``) see the Python workers beside the
Rust ones, and which dependencies each decides from its fallback (:meth:`FleetBudget.in_fallback`,
which only the worker's own metrics show otherwise).

The registry never affects a decision: a beat that fails is not a store failure (no dependency
goes into the fallback for it), is logged at debug once per run of failures, and waits no longer
than any store call (``redis.timeout_ms``, the client's socket timeouts). The writer holds the
budget only weakly: once the budget is gone it sends a ``leave`` and ends, as :meth:`close` does,
so the worker is gone from the registry rather than silent. A process that is killed, or cut off
from Redis, cannot say so: its entry stops being refreshed, and readers call it silent after three
beats.

A forked child is a new worker (``forks.py``): its own id, pid and writer; the parent's entry is
the parent's, never written or left from the child. A Celery prefork parent, which runs no task,
leaves once its pool is up (``fleet_budget.celery``): the pool shows one worker per child.

The report is the Rust library's, version 1, with ``"lang":"python"``; at most
:data:`MAX_REPORT_BYTES`, the script's bound::

    {"v":1,"id":"web-1-4242-9f3a","host":"web-1","pid":4242,"lang":"python","version":"0.2.0",
     "started_ms":1764950000000,"interval_ms":5000,
     "fallback":[{"dependency":"search","for_ms":1200}],"fallback_more":0}
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import threading
import time
import weakref
from importlib import metadata
from typing import Any, Callable, Optional, Sequence

from . import scripts
from .config.names import _is_unsafe_char
from .redact import redact_text

log = logging.getLogger("fleet_budget")

#: The version of the report's JSON.
REPORT_VERSION = 1
#: The largest report ``lua/heartbeat.lua`` takes.
MAX_REPORT_BYTES = 4096
#: The longest worker id ``lua/heartbeat.lua`` takes.
MAX_WORKER_ID_BYTES = 200
#: Dependencies in fallback listed in one report, at most.
MAX_FALLBACK_LISTED = 64
#: The longest host name kept in a worker id (the pid and a random suffix follow it).
MAX_HOST_BYTES = 160

_MIN_RETENTION_MS, _MAX_RETENTION_MS = 600_000, 7 * 24 * 3600 * 1000


def retention_ms(interval_ms: int) -> int:
    """How long a worker that stopped beating stays in the registry: twenty beats, and at least
    ten minutes, so an incident's silent workers are still listed while someone looks."""
    return min(max(interval_ms * 20, _MIN_RETENTION_MS), _MAX_RETENTION_MS)


def sanitize(text: str, max_bytes: int) -> str:
    """``text`` without whitespace and the characters names may not hold, cut to ``max_bytes``
    (UTF-8) at a character boundary: as the Rust library makes ids and host names."""
    out: list[str] = []
    size = 0
    for c in text:
        # A lone surrogate (from a name read with errors="surrogateescape") is not UTF-8.
        if c.isspace() or _is_unsafe_char(c) or 0xD800 <= ord(c) <= 0xDFFF:
            continue
        n = len(c.encode("utf-8"))
        if size + n > max_bytes:
            break
        out.append(c)
        size += n
    return "".join(out)


def host_name() -> str:
    """This host's name, from ``/proc/sys/kernel/hostname`` or ``$HOSTNAME``, sanitized, at most
    :data:`MAX_HOST_BYTES`; ``unknown-host`` when nothing is left."""
    raw = ""
    try:
        with open("/proc/sys/kernel/hostname", encoding="utf-8", errors="replace") as f:
            raw = f.read(4096)
    except OSError:
        pass
    if not raw.strip():
        raw = os.environ.get("HOSTNAME", "")
    return sanitize(raw, MAX_HOST_BYTES) or "unknown-host"


def package_version() -> str:
    """The installed ``fleet-budget`` package's version (``unknown`` when it is not installed)."""
    try:
        return metadata.version("fleet-budget")
    except metadata.PackageNotFoundError:
        return "unknown"


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Registry:
    """One worker's entry: its id and report, and the calls that write or remove it. A new one
    is made in every forked child (a new worker). Thread-safe: a lock is held across each call,
    so no beat lands after the leave."""

    def __init__(self, script: Callable[..., Any], prefix: str, interval_ms: int) -> None:
        self.script = script
        self.keys: Sequence[str] = scripts.workers_keys(prefix)
        self.host = host_name()
        self.pid = os.getpid()
        # From os.urandom: children of one parent never draw the same suffix.
        self.id = f"{self.host}-{self.pid}-{secrets.token_hex(2)}"
        self.started_ms = _wall_ms()
        self.interval_ms = interval_ms
        self.retention_ms = retention_ms(interval_ms)
        self.lock = threading.Lock()
        self.left = False
        self.failing = False
        #: Set by :meth:`leave`: wakes the writer thread to end.
        self.stop = threading.Event()
        _writers.add(self)

    def report(self, fallback: Sequence[tuple[str, int]]) -> str:
        """The report for the dependencies in fallback now (name order, each with how long in ms):
        the list is cut at :data:`MAX_FALLBACK_LISTED` or where the report would pass
        :data:`MAX_REPORT_BYTES`, and ``fallback_more`` counts those left out."""
        head = _dumps({"v": REPORT_VERSION, "id": self.id, "host": self.host, "pid": self.pid,
                       "lang": "python", "version": _VERSION, "started_ms": self.started_ms,
                       "interval_ms": self.interval_ms})[:-1]  # the closing brace: the list follows
        # Room for the list, with some for the closing fields (the Rust library's arithmetic).
        room = MAX_REPORT_BYTES - (_size(head) + 64)
        entries: list[str] = []
        size = 1  # "["
        for dependency, for_ms in fallback:
            entry = _dumps({"dependency": dependency, "for_ms": max(0, int(for_ms))})
            if len(entries) == MAX_FALLBACK_LISTED or size + _size(entry) + 2 > room:
                break
            size += _size(entry) + (1 if entries else 0)
            entries.append(entry)
        more = len(fallback) - len(entries)
        return f'{head},"fallback":[{",".join(entries)}],"fallback_more":{more}}}'

    def beat(self, report: str) -> None:
        """One beat, unless the worker left. Errors are logged, never raised (see the module)."""
        with self.lock:
            if self.left:
                return
            self._note(self._call(scripts.beat_args(self.id, report, self.retention_ms)))

    def leave(self) -> None:
        """Takes the worker out of the registry; beats after this are not sent."""
        with self.lock:
            if self.left:
                return
            self.left = True
            self.stop.set()
            if self.pid == os.getpid():  # a parent's entry is never left from a forked child
                self._note(self._call(scripts.leave_args(self.id)))

    def _call(self, args: list[str]) -> Optional[BaseException]:
        try:
            self.script(keys=self.keys, args=args)
        except Exception as e:  # anything at all: the registry never affects a decision
            return e
        return None

    def _note(self, error: Optional[BaseException]) -> None:
        if error is None:
            self.failing = False
        elif not self.failing:
            self.failing = True
            log.debug("worker registry heartbeat of %s failed (decisions are unaffected): %s", self.id,
                      redact_text(str(error)) or type(error).__name__)


def run(budget: "weakref.ReferenceType[Any]", registry: Registry) -> None:
    """The writer thread: a beat at once, then every interval, until the budget is gone (then a
    leave) or the worker left."""
    while not registry.stop.is_set():
        strong = budget()
        if strong is None:
            registry.leave()
            return
        try:
            report = registry.report(strong.fallback_dependencies())
        except Exception:  # the writer must outlive any one failure
            log.exception("fleet budget: the worker registry report failed")
            report = None
        del strong
        if report is not None:
            registry.beat(report)
        registry.stop.wait(registry.interval_ms / 1000)


class AsyncRegistry(Registry):
    """:class:`Registry` for the asyncio flavour: the same report, its calls awaited, an
    ``asyncio.Lock`` (made in the loop of the first call) held across each."""

    def __init__(self, script: Callable[..., Any], prefix: str, interval_ms: int) -> None:
        super().__init__(script, prefix, interval_ms)
        self.alock: Optional[asyncio.Lock] = None

    def _lock(self) -> asyncio.Lock:
        if self.alock is None:
            self.alock = asyncio.Lock()
        return self.alock

    async def beat_async(self, report: str) -> None:
        async with self._lock():
            if self.left:
                return
            self._note(await self._call_async(scripts.beat_args(self.id, report, self.retention_ms)))

    async def leave_async(self) -> None:
        async with self._lock():
            if self.left:
                return
            self.left = True
            self.stop.set()
            if self.pid == os.getpid():
                self._note(await self._call_async(scripts.leave_args(self.id)))

    async def _call_async(self, args: list[str]) -> Optional[BaseException]:
        try:
            await self.script(keys=self.keys, args=args)
        except Exception as e:  # anything at all: the registry never affects a decision
            return e
        return None


def raise_if_cancelled() -> None:
    """Raises ``CancelledError`` when the running task was asked to stop but a call swallowed the
    cancellation (the task's ``cancelling()`` count stays up): a loop task that went on would
    hold ``asyncio.run`` in its shutdown forever, as it held a CI run's test of the asyncio
    flavour (the registry's writer calling Redis every beat, 30 minutes after the cancel)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def run_async(budget: "weakref.ReferenceType[Any]", registry: AsyncRegistry) -> None:
    """:func:`run` as an asyncio task."""
    while not registry.stop.is_set():
        raise_if_cancelled()
        strong = budget()
        if strong is None:
            await registry.leave_async()
            return
        try:
            report: Optional[str] = registry.report(strong.fallback_dependencies())
        except Exception:  # the writer must outlive any one failure
            log.exception("fleet budget: the worker registry report failed")
            report = None
        del strong
        if report is not None:
            await registry.beat_async(report)
        await asyncio.sleep(registry.interval_ms / 1000)


def leave_all() -> None:
    """Every worker of this process leaves the registry (a Celery prefork parent, whose pool's
    children are the workers). The asyncio flavour's leave on ``close()``, in their loop."""
    for registry in list(_writers):
        if registry.pid == os.getpid() and not isinstance(registry, AsyncRegistry):
            registry.leave()


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


_VERSION = package_version()
_writers: "weakref.WeakSet[Registry]" = weakref.WeakSet()
