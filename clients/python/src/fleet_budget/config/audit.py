"""``[audit]``: read by the Rust library (how much of the override log it keeps), checked alike
here."""

from __future__ import annotations

from typing import Any

from .check import _Checker, _table, _unknown


def read_audit(c: _Checker, value: Any) -> None:
    """Checks ``[audit]``."""
    a = _table(c, "audit", value)
    _unknown(c, "audit", a, ("max_entries", "max_age_days"))
    c.int_in("audit.max_entries", a.get("max_entries"), 1, 10_000_000, 10_000)
    c.int_in("audit.max_age_days", a.get("max_age_days"), 1, 3650, 90)
