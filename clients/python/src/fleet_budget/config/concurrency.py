"""``[dependencies.X.concurrency]``: a dependency's concurrency budget."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from .check import _Checker, _unknown, _wrong_type
from ..concurrency import MAX_CAP, ConcurrencyPolicy

_CONCURRENCY_INTS = ("cap", "planned_primary", "min_retry_slots", "lease_secs", "max_wait_secs")


def _concurrency(c: _Checker, at: str, t: Mapping[str, Any]) -> Optional[ConcurrencyPolicy]:
    """``[dependencies.X.concurrency]`` as the Rust ``RawConcurrency::resolve`` reads it: every
    problem named, the share derived from ``planned_primary`` unless ``max_retry_fraction`` is given."""
    _unknown(c, at, t, (*_CONCURRENCY_INTS, "max_retry_fraction", "primary_waits"))
    for key in _CONCURRENCY_INTS:
        if key in t and (isinstance(t[key], bool) or not isinstance(t[key], int)):
            raise _wrong_type(f"{at}.{key}", t[key], "an integer")
    fraction = t.get("max_retry_fraction")
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))):
        raise _wrong_type(f"{at}.max_retry_fraction", fraction, "a number")
    waits = t.get("primary_waits", False)
    if not isinstance(waits, bool):
        raise _wrong_type(f"{at}.primary_waits", waits, "a boolean")
    before = len(c.problems)
    if "cap" not in t:
        c.problem(f"{at}.cap", "missing", "a concurrency section needs cap (calls in flight the dependency accepts)")
        return None
    cap = c.int_in(f"{at}.cap", t["cap"], 1, MAX_CAP, 1)
    planned = t.get("planned_primary")
    if planned is not None and not 1 <= planned <= cap:
        c.problem(f"{at}.planned_primary", planned, f"must be an integer from 1 to the cap ({cap})")
    elif planned is None and fraction is None:
        c.problem(f"{at}.planned_primary", "missing", "needed to derive max_retry_fraction = (cap - planned_primary) "
                  "/ planned_primary; give it or max_retry_fraction")
    min_slots = c.int_in(f"{at}.min_retry_slots", t.get("min_retry_slots"), 0, MAX_CAP, 3)
    lease = c.int_in(f"{at}.lease_secs", t.get("lease_secs"), 1, 86_400, 30)
    max_wait = c.int_in(f"{at}.max_wait_secs", t.get("max_wait_secs"), 0, 86_400, 600)
    if fraction is not None and not (math.isfinite(fraction) and 0.0 <= fraction <= 1000.0):
        c.problem(f"{at}.max_retry_fraction", f"{float(fraction):g}", "must be a number from 0 to 1000")
    if len(c.problems) > before:
        return None
    if fraction is None:
        fraction = (cap - planned) / planned
    try:
        return ConcurrencyPolicy(cap, float(fraction), min_slots, lease * 1000, waits, float(max_wait)).checked()
    except ValueError as e:
        # A share derived past what the scripts take (cap 5000, planned_primary 1): named here.
        c.problem(at, "the section", str(e))
        return None
