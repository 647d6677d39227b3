"""Group commit of withdrawals, as the Rust ``store/group_commit.rs`` does it: while a decision for
a dependency is in flight from this process, the decisions that arrive for the same dependency wait
for it, and then go together as one ``spend_many.lua`` call (at most ``max_batch``), whose answer
to each is what that many ``spend.lua`` calls in a row at that instant would give
(:func:`batch_answer`). A lone decision never waits and is one ``spend.lua`` call.

Every caller waits at most ``deadline`` seconds from its arrival for its turn: one still queued
then gives up and is never sent; one whose batch is in flight gets :class:`GroupTimeout` (the
budget answers it from the fallback, as for a call that timed out) and its request, sent once, is
counted at most once. A batch whose leader wakes past its own deadline is not sent at all: its
callers get :class:`GroupTimeout`. The call itself is bounded by the connection's timeout.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Optional

from .scripts import BadReply
from .snapshot import BudgetSnapshot

#: Decisions sent together at most (the Rust ``DEFAULT_MAX_BATCH``).
DEFAULT_MAX_BATCH = 64

Answer = tuple[bool, BudgetSnapshot]

_WAITING, _PICKED, _LEAD, _DONE, _GAVE_UP = range(5)


class GroupTimeout(Exception):
    """The caller's deadline passed before its batch was answered."""


def batch_answer(snapshot: BudgetSnapshot, n: int, granted: int, k: int) -> Answer:
    """The answer to request ``k`` (0-based) of a ``spend_many.lua`` call of ``n`` that granted
    ``granted``: the first ``granted`` are granted; each sees the counters as the ``spend.lua``
    call in its place would have left them (lua/README.md, "Deciding several requests")."""
    denied = n - granted
    retries_before = snapshot.current.retries - granted
    denied_before = snapshot.current.denied - denied
    if denied < 0 or retries_before < 0 or denied_before < 0:
        raise BadReply("spend_many", f"{granted} granted of {n} with counters {snapshot.current}")
    seen = k + 1
    current = dataclasses.replace(snapshot.current, retries=retries_before + min(seen, granted),
                                  denied=denied_before + min(max(0, seen - granted), denied))
    return k < granted, dataclasses.replace(snapshot, current=current)


class _Ticket:
    __slots__ = ("arrived", "state", "batch", "answer", "error", "event")

    def __init__(self, arrived: float) -> None:
        self.arrived = arrived
        self.state = _WAITING
        self.batch: list[_Ticket] = []
        self.answer: Optional[Answer] = None
        self.error: Optional[BaseException] = None
        self.event = threading.Event()


class _Group:
    __slots__ = ("busy", "queue")

    def __init__(self) -> None:
        self.busy = False
        self.queue: list[_Ticket] = []


class GroupCommit:
    """The protocol, for any ``send(n) -> list of n answers`` (one call to the store)."""

    def __init__(self, deadline: float, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self.deadline = deadline
        self.max_batch = max(1, max_batch)
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}

    def withdraw(self, dependency: str, send: Callable[[int], list[Answer]]) -> Answer:
        me = _Ticket(time.monotonic())
        with self._lock:
            group = self._groups.setdefault(dependency, _Group())
            if not group.busy:
                group.busy = True
                me.state = _LEAD
                me.batch = [me]
            else:
                group.queue.append(me)
        if me.state != _LEAD:
            me.event.wait(max(0.0, me.arrived + self.deadline - time.monotonic()))
            with self._lock:
                if me.state == _WAITING:  # never picked: never sent
                    group.queue.remove(me)
                    me.state = _GAVE_UP
                    raise GroupTimeout(f"{dependency}: no turn within the deadline")
                if me.state == _PICKED:  # in a batch in flight: its answer comes too late
                    me.state = _GAVE_UP
                    raise GroupTimeout(f"{dependency}: the batch was not answered within the deadline")
        if me.state == _LEAD:
            self._lead(dependency, group, me, send)
        if me.error is not None:
            raise me.error
        assert me.answer is not None
        return me.answer

    def _lead(self, dependency: str, group: _Group, me: _Ticket, send: Callable[[int], list[Answer]]) -> None:
        batch = me.batch
        try:
            if time.monotonic() > me.arrived + self.deadline:
                raise GroupTimeout(f"{dependency}: the batch's turn came after the deadline; not sent")
            answers = send(len(batch))
            if len(answers) != len(batch):
                raise BadReply("spend_many", f"{len(answers)} answers for {len(batch)} requests")
            error: Optional[BaseException] = None
        except BaseException as e:  # every caller of the batch gets the failure (the fallback answers)
            answers, error = [], e
        with self._lock:
            for i, t in enumerate(batch):
                if t.state == _GAVE_UP:
                    continue
                t.state = _DONE
                t.answer = answers[i] if error is None else None
                t.error = error
                t.event.set()
            # The next batch: those waiting now, led by the first of them.
            if group.queue:
                nxt, group.queue = group.queue[: self.max_batch], group.queue[self.max_batch:]
                for t in nxt:
                    t.state = _PICKED
                nxt[0].state = _LEAD
                nxt[0].batch = nxt
                nxt[0].event.set()
            else:
                group.busy = False
