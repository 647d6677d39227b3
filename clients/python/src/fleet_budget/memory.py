"""What this process remembers of each budget hash it called (``lua/README.md``, "Lost budgets";
the Rust ``store/redis/memory.rs``): the hash's birth, the overrides in force and the counters as
its last reply showed them. The budget scripts take it as two optional arguments and, when the
hash is gone (evicted under a ``maxmemory-policy``, ``FLUSHALL``, a restart without persistence)
or is another one (another birth), restore what still counts before deciding, and say so
(``lost``).

One entry per budget key this process called: bounded by the dependencies of the configuration,
and by :data:`MAX_REMEMBERED` whatever happens."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any, Sequence

from . import scripts
from .scripts import BadReply
from .snapshot import BudgetSnapshot, WindowCounters

#: The most budget keys remembered; keys past it are called without memory (as before 0.2.0).
MAX_REMEMBERED = 100_000
#: How many fields the scripts append for a caller that sent its memory.
MEMORY_FIELDS = 6


@dataclass(frozen=True)
class HashState:
    """What a reply said of the hash, beyond the budget: the fields a caller with memory gets."""

    birth: int = 0  # server ms the hash was created
    freeze_until: int = 0  # when the freeze in force ends (server ms; 0 none)
    set_until: int = 0  # when the set override ends (server ms; 0 none)
    set_ratio: str = ""  # the set override's ratio, as text ("" absent)
    set_min: str = ""  # the set override's floor, as text ("" absent)
    lost: bool = False  # the call found the hash this process remembered gone, and restored it


def _counters(c: WindowCounters) -> tuple[int, int, int, int]:
    return c.successes, c.first_attempts, c.retries, c.denied


class Memory:
    """Per budget key, what this process last saw (thread-safe)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[HashState, BudgetSnapshot]] = {}
        self._lock = threading.Lock()

    def args(self, key: str) -> list[str]:
        """The two arguments the scripts take after their own: the birth last seen (``""``: none)
        and ``fu,su,sr,sm,w,i,cs,ca,cr,cd,ps,pa,pr,pd``."""
        with self._lock:
            seen = self._seen.get(key)
        if seen is None:
            return ["", ""]
        state, snap = seen
        fields = [state.freeze_until, state.set_until, state.set_ratio, state.set_min, snap.window_ms,
                  snap.window_index, *_counters(snap.current), *_counters(snap.previous)]
        return [str(state.birth), ",".join(str(f) for f in fields)]

    def learn(self, key: str, state: HashState, snapshot: BudgetSnapshot) -> None:
        """Remembers ``key`` as the reply showed it."""
        with self._lock:
            if len(self._seen) < MAX_REMEMBERED or key in self._seen:
                self._seen[key] = (replace(state, lost=False), snapshot)

    def clear(self) -> None:
        """Forgets everything: the next calls restore nothing (a forked child starts anew)."""
        with self._lock:
            self._seen = {}


def split(script: str, reply: Any) -> tuple[Sequence[Any], HashState]:
    """A reply to a caller that sent its memory: the reply as it was, and what the six fields after
    it say (``lua/README.md``, "Lost budgets")."""
    if not isinstance(reply, (list, tuple)) or len(reply) < 17 + MEMORY_FIELDS:
        size = len(reply) if isinstance(reply, (list, tuple)) else type(reply).__name__
        raise BadReply(script, f"{size} fields, without the memory fields")
    at = len(reply) - MEMORY_FIELDS

    def count(i: int) -> int:
        value = reply[i]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadReply(script, f"field {i + 1} is not an integer >= 0: {value!r:.100}")
        return value

    def text(i: int) -> str:
        value = reply[i]
        if isinstance(value, bytes):
            value = value[:1024].decode("utf-8", "replace")
        # Sent back as one of the memory's comma-separated fields: at most 32 printable
        # characters, no comma (the scripts check the number itself).
        if not isinstance(value, str) or len(value) > 32 or any(not ("!" <= c <= "~") or c == "," for c in value):
            raise BadReply(script, f"field {i + 1} is not a number: {value!r:.100}")
        return value

    state = HashState(birth=count(at), freeze_until=count(at + 1), set_until=count(at + 2),
                      set_ratio=text(at + 3), set_min=text(at + 4), lost=count(at + 5) == 1)
    return reply[:at], state


def remember(memory: Memory, metrics: Any, key: str, script: str, dependency: str, reply: Any,
             policy: Any) -> tuple[int, BudgetSnapshot, Sequence[Any]]:
    """Decodes the reply of a budget script called with ``memory`` of the hash ``key`` (the six
    fields after the reply as it was), remembers what it says, and marks the snapshot ``lost``
    (counted in ``metrics``, logged once per dependency per window) when the call found the hash
    it remembered gone. Returns granted, the snapshot and the reply as it was."""
    base, state = split(script, reply)
    granted, snapshot, _ = scripts.parse_reply(script, base, policy)
    memory.learn(key, state, snapshot)
    if state.lost:
        snapshot = replace(snapshot, control=replace(snapshot.control, lost=True))
        metrics.budget_lost_seen(dependency, snapshot)
    return granted, snapshot, base
