"""``[tasks.*]``: each task's ceiling (a class, a number of attempts, or a recovery window), its
backoff and ``max_delay_secs``."""

from __future__ import annotations

from typing import Any, Mapping

from .check import _Checker, _quoted, _table, _toml_key, _unknown
from .defaults import _backoff, _max_delay
from .names import dependency_name_problem
from .unmapped import UnmappedTasks
from ..policy import CLASS_MAX_ATTEMPTS, TaskCeiling


def read_tasks(c: _Checker, value: Any, tasks: Mapping[str, str], unmapped: UnmappedTasks,
               default_ceiling: TaskCeiling) -> dict[str, TaskCeiling]:
    """The ceilings of ``[tasks.*]``, by task."""
    ceilings: dict[str, TaskCeiling] = {}
    for task, t in _table(c, "tasks", value).items():
        at = f"tasks.{_toml_key(task)}"
        t = _table(c, at, t)
        _unknown(c, at, t, ("class", "max_attempts", "recovery_window_secs", "backoff_base_ms", "backoff_cap_ms",
                            "max_delay_secs"))
        if task not in tasks and unmapped.policy == "own_budget":
            # An unmapped task is its own dependency, so its name must be a valid one.
            wrong = dependency_name_problem(task)
            if wrong:
                c.problem(at, _quoted(task), wrong)
        if sum(k in t for k in ("class", "max_attempts", "recovery_window_secs")) > 1:
            c.problem(at, "class, max_attempts and recovery_window_secs", "set at most one of them")
        backoff = _backoff(c, at, t, default_ceiling.backoff)
        max_delay = _max_delay(c, at, t)
        if max_delay is None:
            max_delay = default_ceiling.max_delay
        window = None
        if "class" in t:
            cls = c.choice(f"{at}.class", t["class"], tuple(CLASS_MAX_ATTEMPTS), "")
            max_attempts = CLASS_MAX_ATTEMPTS.get(cls, default_ceiling.max_attempts)
        elif "max_attempts" in t:
            max_attempts = c.int_in(f"{at}.max_attempts", t["max_attempts"], 1, 1000, 5)
        elif "recovery_window_secs" in t:
            secs = c.int_in(f"{at}.recovery_window_secs", t["recovery_window_secs"], 1, 7 * 86_400, 60)
            max_attempts = backoff.attempts_for_recovery_window(secs)
            window = float(secs)
        else:
            max_attempts = default_ceiling.max_attempts
        ceilings[task] = TaskCeiling(max_attempts=max_attempts, backoff=backoff, recovery_window=window,
                                           max_delay=max_delay)
    return ceilings
