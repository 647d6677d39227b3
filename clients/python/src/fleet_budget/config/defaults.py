"""``[defaults]`` and the keys every budget and ceiling section shares: the rate budget's policy
(window, ratio, floor, deposit basis, mode), the backoff and ``max_delay_secs``."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from .check import _Checker, _table, _unknown
from ..policy import Backoff, BudgetPolicy, TaskCeiling

MAX_WINDOW_SECS = 86_400



#: Longest ``max_delay_secs`` accepted: a week (the Rust ``MAX_DELAY_SECS``).
MAX_DELAY_SECS = 7 * 86_400

_POLICY_KEYS = ("window_secs", "ratio", "min_allowance", "deposit", "mode")


def read_defaults(c: _Checker, value: Any) -> tuple[BudgetPolicy, TaskCeiling]:
    """``[defaults]``: the policy of a dependency that sets none, and the ceiling of a task that
    sets none."""
    d = _table(c, "defaults", value)
    _unknown(c, "defaults", d, (*_POLICY_KEYS, "max_attempts", "backoff_base_ms", "backoff_cap_ms",
                                "max_delay_secs", "enforcement"))
    defaults = _policy(c, "defaults", d, BudgetPolicy())
    ceiling = TaskCeiling(
        max_attempts=c.int_in("defaults.max_attempts", d.get("max_attempts"), 1, 1000, 5),
        backoff=_backoff(c, "defaults", d, Backoff()),
        max_delay=_max_delay(c, "defaults", d),
    )
    return defaults, ceiling


def _max_delay(c: _Checker, at: str, t: Mapping[str, Any]) -> Optional[float]:
    """The section's ``max_delay_secs`` when given and in range (the Rust ``max_delay``)."""
    secs = c.int_in(f"{at}.max_delay_secs", t.get("max_delay_secs"), 1, MAX_DELAY_SECS, 0)
    return float(secs) if secs > 0 else None



def _policy(c: _Checker, at: str, t: Mapping[str, Any], base: BudgetPolicy) -> BudgetPolicy:
    return BudgetPolicy(
        window_ms=1000 * c.int_in(f"{at}.window_secs", t.get("window_secs"), 1, MAX_WINDOW_SECS,
                                  max(1, base.window_ms // 1000)),
        ratio=c.ratio(f"{at}.ratio", t.get("ratio"), base.ratio),
        min_allowance=c.int_in(f"{at}.min_allowance", t.get("min_allowance"), 0, 1_000_000_000, base.min_allowance),
        deposit=c.choice(f"{at}.deposit", t.get("deposit"), ("success", "request"), base.deposit),
        mode=c.choice(f"{at}.mode", t.get("mode"), ("sliding", "fixed"), base.mode),
    )



def _backoff(c: _Checker, at: str, t: Mapping[str, Any], default: Backoff) -> Backoff:
    day = 86_400_000
    base = c.int_in(f"{at}.backoff_base_ms", t.get("backoff_base_ms"), 1, day, round(default.base * 1000))
    cap = c.int_in(f"{at}.backoff_cap_ms", t.get("backoff_cap_ms"), 1, day, round(default.cap * 1000))
    if cap < base:
        c.problem(f"{at}.backoff_cap_ms", cap, f"must be at least backoff_base_ms ({base})")
    return Backoff(base=base / 1000, factor=default.factor, cap=cap / 1000)
