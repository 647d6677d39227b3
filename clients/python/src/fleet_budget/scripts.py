"""The Lua scripts of ``lua/`` as this package calls them: the texts, the arguments, the reply.

This is the one module that knows the scripts' argument lists (``lua/README.md``, "Arguments"):
when the contract changes, this file changes. The texts are copies of ``lua/*.lua`` shipped in
the package; ``tests/test_scripts.py`` fails when they differ from the repository's.
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Sequence

from .policy import BudgetPolicy
from .snapshot import BudgetSnapshot, WindowCounters

NAMES = ("spend", "deposit", "status")


class BadReply(Exception):
    """A script replied with something that is not its documented reply."""

    def __init__(self, script: str, detail: str) -> None:
        super().__init__(f"{script}.lua gave a bad reply: {detail}")
        self.script = script


def text(name: str) -> str:
    """The shipped text of ``lua/<name>.lua``."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


def policy_args(policy: BudgetPolicy) -> list[str]:
    """ratio, min_allowance, basis and mode, as every script takes them after its own."""
    return [repr(float(policy.ratio)), str(policy.min_allowance), policy.basis_code, policy.mode]


def spend_args(policy: BudgetPolicy) -> list[str]:
    return [str(policy.window_ms), *policy_args(policy)]


def status_args(policy: BudgetPolicy) -> list[str]:
    return spend_args(policy)


def deposit_args(policy: BudgetPolicy, successes: int, first_attempts: int) -> list[str]:
    return [str(policy.window_ms), str(successes), str(first_attempts), *policy_args(policy)]


def parse_reply(script: str, reply: Any) -> tuple[int, BudgetSnapshot]:
    """``granted`` (1, 0, or -1 when not a withdrawal) and the snapshot of a script's reply."""
    if not isinstance(reply, (list, tuple)):
        raise BadReply(script, f"expected an array, got {type(reply).__name__}")
    if len(reply) < 14:
        raise BadReply(script, f"expected at least 14 integers, got {len(reply)}")
    values: list[int] = []
    for i, value in enumerate(reply[:14]):
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadReply(script, f"field {i + 1} is not an integer: {value!r}")
        if i > 0 and value < 0:
            raise BadReply(script, f"field {i + 1} is negative: {value}")
        values.append(value)
    granted, allowance, index, window_ms, elapsed, weight = values[:6]
    if window_ms == 0:
        raise BadReply(script, "window_ms is 0")
    return granted, BudgetSnapshot(
        window_ms=window_ms,
        window_index=index,
        elapsed_ms=elapsed,
        previous_weight_ms=weight,
        current=WindowCounters(*values[6:10]),
        previous=WindowCounters(*values[10:14]),
        allowance=allowance,
    )


def keys(prefix: str, dependency: str) -> Sequence[str]:
    """KEYS for a dependency's budget: ``<prefix>:v1:{<dependency>}`` (lua/README.md)."""
    return [f"{prefix}:v1:{{{dependency}}}"]
