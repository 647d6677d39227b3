"""What a forked child does with the objects it inherits (Celery's prefork pool, ``multiprocessing``
with the ``fork`` start method, ``os.fork``).

Why: a child of ``fork`` is a copy of its parent's memory with one thread, the one that forked.
The parent's other threads are gone, but whatever they held is copied as it was: a lock another
thread held at that instant stays held for ever in the child, deposits the parent had counted and
not yet sent are in the child's buffer too, the Redis and AMQP sockets are the parent's, and the
deposit flusher thread does not exist. Left alone, a Celery prefork child deadlocks on the first
such lock, or sends its parent's deposits a second time, or (the usual case) never sends its own:
the fleet's allowance stayed at its floor.

So every object that holds such state registers here, and in the child, before any other code of
the child runs (``os.register_at_fork``), each one starts again as a new process's object would:
fresh locks, nothing pending, its own connections (the parent's sockets are dropped, never closed
or written to from the child), its own metrics, the flusher started again by the child's first
deposit. The parent is untouched.

A child can also end without running ``atexit`` (``multiprocessing`` and Celery's prefork pool leave
through ``os._exit``): :func:`before_exit` flushes every live budget, and runs at interpreter exit,
at the end of a ``multiprocessing`` child, and on Celery's ``worker_process_shutdown`` (connected
by ``fleet_budget.celery``).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import weakref
from typing import Protocol

log = logging.getLogger("fleet_budget")


class ForkAware(Protocol):
    def _after_fork_in_child(self) -> None: ...


class Flushable(Protocol):
    def _before_exit(self) -> None: ...


_in_child: "weakref.WeakSet[ForkAware]" = weakref.WeakSet()
_at_exit: "weakref.WeakSet[Flushable]" = weakref.WeakSet()


def register(obj: ForkAware) -> None:
    """``obj._after_fork_in_child()`` runs in every child forked from now on."""
    _in_child.add(obj)


def flush_at_exit(obj: Flushable) -> None:
    """``obj._before_exit()`` runs when this process (or a child forked from it) ends."""
    _at_exit.add(obj)


def before_exit() -> None:
    """Flushes every live budget of this process; for a process about to end."""
    for obj in list(_at_exit):
        try:
            obj._before_exit()
        except Exception:  # one budget's failure must not keep the others from flushing
            log.exception("fleet budget: flushing deposits at exit failed")


def _after_fork_in_child() -> None:
    for obj in list(_in_child):
        try:
            obj._after_fork_in_child()
        except Exception:  # a fork hook that raises is only printed; say which object failed
            log.exception("fleet budget: resetting %s after a fork failed", type(obj).__name__)


class _MultiprocessingChild:
    """A ``multiprocessing`` child clears the finalizers it inherits and ends with ``os._exit``,
    after running the finalizers registered in it: one is registered in each child, by the
    after-fork hook that ``multiprocessing`` runs at the child's start."""

    def __init__(self) -> None:
        multiprocessing.util.register_after_fork(self, _MultiprocessingChild._started)

    @staticmethod
    def _started(_: object) -> None:
        multiprocessing.util.Finalize(None, before_exit, exitpriority=10)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(before_exit)
_multiprocessing_child = _MultiprocessingChild()
