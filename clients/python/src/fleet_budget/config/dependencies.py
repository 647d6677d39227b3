"""``[dependencies.*]``: each dependency's rate budget, the tasks mapped to it (a task spends
exactly one dependency's budget), its concurrency budget, and its breaker (resolved later)."""

from __future__ import annotations

from typing import Any

from .check import _Checker, _quoted, _table, _toml_key, _unknown, _wrong_type
from .concurrency import _concurrency
from .defaults import _POLICY_KEYS, _policy
from .names import _code_point, _is_unsafe_char, dependency_name_problem
from ..concurrency import ConcurrencyPolicy
from ..policy import BudgetPolicy


def read_dependencies(c: _Checker, value: Any, defaults: BudgetPolicy, policies: dict[str, BudgetPolicy],
                      mapped: dict[str, str], budgets: dict[str, ConcurrencyPolicy]
                      ) -> list[tuple[str, str, dict[str, Any]]]:
    """Fills ``policies``, ``mapped`` (task to dependency) and ``budgets`` (the concurrency budgets) from ``[dependencies.*]``; returns the breaker
    tables (name, key, table) for :func:`read_breakers`."""
    breakers: list[tuple[str, str, dict[str, Any]]] = []
    for name, dep in _table(c, "dependencies", value).items():
        at = f"dependencies.{_toml_key(name)}"
        dep = _table(c, at, dep)
        _unknown(c, at, dep, ("tasks", *_POLICY_KEYS, "concurrency", "breaker", "enforcement"))
        wrong = dependency_name_problem(name)
        if "concurrency" in dep:
            concurrency = _concurrency(c, f"{at}.concurrency", _table(c, f"{at}.concurrency", dep["concurrency"]))
            if concurrency is not None and not wrong:
                budgets[name] = concurrency
        if "breaker" in dep:
            breakers.append((name, at, _table(c, f"{at}.breaker", dep["breaker"])))
        if wrong:
            c.problem(at, _quoted(name), wrong)
        policy = _policy(c, at, dep, defaults)
        if wrong:
            continue
        policies[name] = policy
        tasks = dep.get("tasks", [])
        if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
            raise _wrong_type(f"{at}.tasks", tasks, "a list of task names")
        for i, task in enumerate(tasks):
            key = f"{at}.tasks[{i}]"
            unsafe = next((ch for ch in task if _is_unsafe_char(ch)), None)
            if not task:
                c.problem(key, '""', "a task name must not be empty")
            elif unsafe is not None:
                c.problem(key, _quoted(task), f"contains {_code_point(unsafe)}; a task name holds no control, "
                          "bidirectional control or invisible characters")
            elif task in mapped:
                first = mapped[task]
                c.problem(key, repr(task), "is listed twice in this dependency" if first == name else
                          f"is already mapped to dependency {first!r}; a task spends exactly one dependency's budget")
            else:
                mapped[task] = name
    return breakers
