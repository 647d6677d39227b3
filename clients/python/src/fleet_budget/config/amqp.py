"""``[amqp]``: the section of the Rust worker. This client reads only what the Celery integration
needs (``prefix``: the topology's names, ``<prefix>.dead`` its dead-letter exchange; ``url`` or
``urls``: the broker's nodes), checked as
the Rust library checks it; the other keys are the worker's and are not read. Everything this
client reads of ``[amqp]`` is read here."""

from __future__ import annotations

from typing import Any, Optional

from .check import _Checker, _wrong_type
from .. import brokers
from .names import _code_point, _is_unsafe_char


def read_amqp_prefix(c: _Checker, amqp: Any) -> Optional[str]:
    """``amqp.prefix`` when set and valid; ``None`` when unset (the default stands) or refused (a
    problem recorded in ``c``)."""
    if not (isinstance(amqp, dict) and "prefix" in amqp):
        return None
    prefix = amqp["prefix"]
    if not isinstance(prefix, str):
        raise _wrong_type("amqp.prefix", prefix, "a string")
    # The Rust check: nothing in the topology's names may print as something it is not.
    rule = ("must be 1 to 100 bytes without spaces, control, bidirectional control or invisible "
            "characters, not starting with `amq.`")
    bad = next((ch for ch in prefix if ch.isspace() or _is_unsafe_char(ch)), None)
    if bad is not None:
        c.problem("amqp.prefix", repr(prefix), f"contains {_code_point(bad)}; {rule}")
    elif not 1 <= len(prefix.encode("utf-8")) <= 100 or prefix.startswith("amq."):
        c.problem("amqp.prefix", repr(prefix), rule)
    else:
        return prefix
    return None


def read_amqp_urls(c: _Checker, amqp: Any) -> tuple[str, ...]:
    """``amqp.url`` or ``amqp.urls``: the broker's nodes (``fleet_budget.brokers``), checked as the
    Rust library checks them; empty when neither is set (Celery's own ``broker_url`` stands)."""
    return brokers.from_section(amqp if isinstance(amqp, dict) else {}, c.problem)
