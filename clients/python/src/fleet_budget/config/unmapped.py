"""``[unmapped_tasks]``: what a task no ``[dependencies.*]`` section names spends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .check import _Checker, _debug_str, _unknown, _wrong_type
from ..policy import BudgetPolicy

#: Most unmapped names that may get a budget of their own (the Rust ``MAX_OWN_BUDGETS``).
MAX_OWN_BUDGETS = 100_000

#: Unmapped names given a budget of their own by default, per process.
DEFAULT_MAX_OWN_BUDGETS = 100

#: The budget shared by unmapped names past ``max_own_budgets`` (the Rust ``OVERFLOW_DEPENDENCY``).
OVERFLOW_DEPENDENCY = "unmapped"


@dataclass(frozen=True)
class UnmappedTasks:
    """``[unmapped_tasks]``: what a task no ``[dependencies.*]`` section names spends.
    ``own_budget``: its own budget for the first ``max_own_budgets`` names a process meets, the
    shared ``unmapped`` budget for later ones; ``share``: ``dependency``'s budget; ``reject``: the
    task is refused (:class:`fleet_budget.UnmappedTask`)."""

    policy: str = "own_budget"
    max_own_budgets: int = DEFAULT_MAX_OWN_BUDGETS
    dependency: Optional[str] = None



def _unmapped(c: _Checker, t: Mapping[str, Any], policies: Mapping[str, BudgetPolicy]) -> UnmappedTasks:
    """``[unmapped_tasks]``: ``share`` must name a ``[dependencies.*]`` section, so that a typo does
    not quietly make a budget of its own; each key goes only with its policy."""
    _unknown(c, "unmapped_tasks", t, ("policy", "dependency", "max_own_budgets"))
    policy = c.choice("unmapped_tasks.policy", t.get("policy"), ("own_budget", "share", "reject"), "own_budget")
    dependency = t.get("dependency")
    if dependency is not None and not isinstance(dependency, str):
        raise _wrong_type("unmapped_tasks.dependency", dependency, "a string")
    own = t.get("max_own_budgets")
    if own is not None and (isinstance(own, bool) or not isinstance(own, int)):
        raise _wrong_type("unmapped_tasks.max_own_budgets", own, "an integer")
    if policy != "share" and dependency is not None:
        c.problem("unmapped_tasks.dependency", _debug_str(dependency), 'goes only with policy = "share"')
    if policy != "own_budget" and own is not None:
        c.problem("unmapped_tasks.max_own_budgets", own, 'goes only with policy = "own_budget"')
    if policy == "reject":
        return UnmappedTasks("reject", 0, None)
    if policy == "own_budget":
        n = c.int_in("unmapped_tasks.max_own_budgets", own, 0, MAX_OWN_BUDGETS, DEFAULT_MAX_OWN_BUDGETS)
        return UnmappedTasks("own_budget", n, None)
    if dependency is not None and dependency in policies:
        return UnmappedTasks("share", 0, dependency)
    named = ", ".join(sorted(policies)) or "there is none"
    c.problem("unmapped_tasks.dependency", "none" if dependency is None else _debug_str(dependency),
              f'policy = "share" needs the name of a [dependencies.*] section ({named})')
    return UnmappedTasks()
