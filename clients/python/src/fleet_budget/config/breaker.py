"""``[dependencies.X.breaker]``: a dependency's circuit breaker, resolved once the policies are
known (its half-open probes are spent from the rate budget's floor)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from .check import _Checker, _unknown, _wrong_type
from .names import dependency_name_problem
from ..breaker import BreakerPolicy
from ..policy import BudgetPolicy


def read_breakers(c: _Checker, pending: list[tuple[str, str, dict[str, Any]]],
                  policies: Mapping[str, BudgetPolicy], defaults: BudgetPolicy) -> dict[str, BreakerPolicy]:
    """The breakers of ``pending`` (name, key, table) as :func:`read_dependencies` found them."""
    breakers: dict[str, BreakerPolicy] = {}
    # Resolved once the policies are known: half-open probes are spent from the rate budget's floor.
    for name, at, t in pending:
        if dependency_name_problem(name):
            continue
        breaker = _breaker(c, f"{at}.breaker", t, policies.get(name, defaults).min_allowance)
        if breaker is not None:
            breakers[name] = breaker
    return breakers


def _breaker(c: _Checker, at: str, t: Mapping[str, Any], floor: int) -> Optional[BreakerPolicy]:
    """``[dependencies.X.breaker]`` as the Rust ``RawBreaker::resolve`` reads it: every key optional,
    at most ``floor`` (the rate budget's ``min_allowance``) half-open probes."""
    ints = ("min_volume", "window_secs", "open_secs", "half_open_probes", "close_after", "probe_timeout_secs",
            "max_wait_secs")
    _unknown(c, at, t, ("failure_ratio", *ints))
    for key in ints:
        if key in t and (isinstance(t[key], bool) or not isinstance(t[key], int)):
            raise _wrong_type(f"{at}.{key}", t[key], "an integer")
    ratio = t.get("failure_ratio", 0.5)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        raise _wrong_type(f"{at}.failure_ratio", ratio, "a number")
    before = len(c.problems)
    d = BreakerPolicy()
    window = c.int_in(f"{at}.window_secs", t.get("window_secs"), 1, 86_400, d.window_ms // 1000)
    open_secs = c.int_in(f"{at}.open_secs", t.get("open_secs"), 1, 86_400, d.open_ms // 1000)
    probe_timeout = c.int_in(f"{at}.probe_timeout_secs", t.get("probe_timeout_secs"), 1, 86_400,
                             d.probe_timeout_ms // 1000)
    max_wait = c.int_in(f"{at}.max_wait_secs", t.get("max_wait_secs"), 0, 86_400, int(d.max_wait))
    if not (math.isfinite(ratio) and 0.0 < ratio <= 1.0):
        c.problem(f"{at}.failure_ratio", f"{float(ratio):g}", "must be a number above 0 and at most 1")
    min_volume = c.int_in(f"{at}.min_volume", t.get("min_volume"), 1, 1_000_000_000, 20)
    probes = c.int_in(f"{at}.half_open_probes", t.get("half_open_probes"), 1, 1_000_000, 3)
    if probes > floor:
        c.problem(f"{at}.half_open_probes", probes,
                  f"probes are spent from the rate budget's floor: at most min_allowance ({floor})")
    close_after = t.get("close_after", probes)
    if not 1 <= close_after <= probes:
        c.problem(f"{at}.close_after", close_after, f"must be an integer from 1 to half_open_probes ({probes})")
    if len(c.problems) > before:
        return None
    try:
        return BreakerPolicy(window * 1000, float(ratio), min_volume, open_secs * 1000, probes, close_after,
                             probe_timeout * 1000, float(max_wait)).checked()
    except ValueError as e:
        c.problem(at, "the section", str(e))
        return None
