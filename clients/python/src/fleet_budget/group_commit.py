"""Group commit of withdrawals, as the Rust ``store/redis/group_commit.rs`` does it: while a decision for
a dependency is in flight from this process, the decisions that arrive for the same dependency wait
for it, and then go together as one ``spend_many.lua`` call (at most ``max_batch``), whose answer
to each is what that many ``spend.lua`` calls in a row at that instant would give
(:func:`batch_answer`). A lone decision never waits and is one ``spend.lua`` call.

The next batch is the first ``max_batch`` callers in line (first come, first in, and answered in
that order), led by the one with the most time left: the latest to arrive, since all callers share
one deadline length. Led by the oldest, a batch whose leader woke past its own deadline was not
sent at all, and every caller of it got :class:`GroupTimeout` though the later ones had time left.

Every caller waits at most ``deadline`` seconds from its arrival for its turn: one still queued
then gives up and is never sent, and so is one whose deadline has passed when its batch is formed
or sent; one whose batch is in flight gets :class:`GroupTimeout` (the budget answers it from the
fallback, as for a call that timed out) and its request, sent once, is counted at most once. A
caller woken to lead past its own deadline does not send: the batch goes to the next in line. The
call itself is bounded by the connection's timeout.
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

# A ticket's states: queued; in the next batch, not sent yet; in a batch in flight; leading a batch;
# answered; gone (gave up, or let go unsent past its deadline).
_WAITING, _PICKED, _SENT, _LEAD, _DONE, _GAVE_UP = range(6)


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
    __slots__ = ("deadline", "state", "batch", "answer", "error", "event")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
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
    """The protocol, for any ``send(n) -> list of n answers`` (one call to the store). ``clock``
    (seconds, monotonic) is for tests that move time."""

    def __init__(self, deadline: float, max_batch: int = DEFAULT_MAX_BATCH,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.deadline = deadline
        self.max_batch = max(1, max_batch)
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}

    def withdraw(self, dependency: str, send: Callable[[int], list[Answer]]) -> Answer:
        me = _Ticket(self._clock() + self.deadline)
        with self._lock:
            group = self._groups.setdefault(dependency, _Group())
            if group.busy:
                group.queue.append(me)
            else:
                group.busy = True
                me.state = _LEAD
                me.batch = [me]
            leading = me.state == _LEAD
        if not leading:
            me.event.wait(max(0.0, me.deadline - self._clock()))
            with self._lock:
                if me.state in (_WAITING, _PICKED, _GAVE_UP):  # never sent
                    if me.state == _WAITING:
                        group.queue.remove(me)
                    me.state = _GAVE_UP
                    raise GroupTimeout(f"{dependency}: no turn within the deadline; not sent")
                if me.state == _SENT:  # in a batch in flight: its answer comes too late
                    me.state = _GAVE_UP
                    raise GroupTimeout(f"{dependency}: the batch was not answered within the deadline")
                if me.state == _LEAD and self._clock() >= me.deadline:
                    # Woken to lead past its own deadline: the batch goes to the next in line.
                    me.state = _GAVE_UP
                    self._hand_off(group, [t for t in me.batch if t is not me])
                    raise GroupTimeout(f"{dependency}: the lead came after the deadline; not sent")
        if me.state == _LEAD:
            self._lead(group, me, send)
        if me.error is not None:
            raise me.error
        assert me.answer is not None
        return me.answer

    def _lead(self, group: _Group, me: _Ticket, send: Callable[[int], list[Answer]]) -> None:
        with self._lock:
            # Those that gave up, or whose deadline passed, since the batch was formed: not sent.
            now = self._clock()
            batch = []
            for t in me.batch:
                if t is me:
                    batch.append(t)
                elif t.state == _PICKED and now < t.deadline:
                    t.state = _SENT
                    batch.append(t)
                elif t.state == _PICKED:
                    t.state = _GAVE_UP
                    t.event.set()
        try:
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
            self._hand_off(group, [])

    def _hand_off(self, group: _Group, returned: list[_Ticket]) -> None:
        """Under the lock, the group's call over: the next batch is the first ``max_batch``
        callers in line with time left (``returned``, a batch never sent, first), led by the one
        with the latest deadline (the latest to arrive), its own request last; those past their
        deadline are let go unsent. With none, the group is free."""
        line = [t for t in returned if t.state == _PICKED] + group.queue
        now = self._clock()
        nxt: list[_Ticket] = []
        taken = 0
        for t in line:
            if len(nxt) == self.max_batch:
                break
            taken += 1
            if now < t.deadline:
                nxt.append(t)
            else:
                t.state = _GAVE_UP
                t.event.set()
        group.queue = line[taken:]
        for t in group.queue:
            t.state = _WAITING
        if not nxt:
            group.busy = False
            return
        at = max(range(len(nxt)), key=lambda i: (nxt[i].deadline, i))
        leader = nxt.pop(at)
        for t in nxt:
            t.state = _PICKED
        leader.state = _LEAD
        leader.batch = [*nxt, leader]
        leader.event.set()
