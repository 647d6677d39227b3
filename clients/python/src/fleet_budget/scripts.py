"""The Lua scripts of ``lua/`` as this package calls them: the texts, the arguments, the reply.

This is the one module that knows the scripts' argument lists (``lua/README.md``, "Arguments"):
when the contract changes, this file changes. The texts are copies of ``lua/*.lua`` shipped in
the package; ``clients/python/tests/test_scripts.py`` fails when they differ from the repository's.
"""

from __future__ import annotations

from decimal import Decimal
from importlib import resources
from typing import Any, Sequence

from .policy import BudgetPolicy
from .snapshot import BudgetSnapshot, Control, WindowCounters

NAMES = ("spend", "spend_many", "spend_batch", "deposit", "status", "lease_acquire", "lease_release", "breaker",
         "heartbeat")


class BadReply(Exception):
    """A script replied with something that is not its documented reply."""

    def __init__(self, script: str, detail: str) -> None:
        super().__init__(f"{script}.lua gave a bad reply: {detail}")
        self.script = script


def text(name: str) -> str:
    """The shipped text of ``lua/<name>.lua``."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


def ratio_text(ratio: float) -> str:
    """The ratio as the Rust library sends it (``f64``'s ``Display``: the shortest round-trip
    digits, no exponent, no ``.0``). The scripts compare the number but keep the text of the
    policy in force (``budgetctl status`` shows it): both languages write the same one."""
    text = format(Decimal(repr(float(ratio))), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def policy_args(policy: BudgetPolicy) -> list[str]:
    """ratio, min_allowance, basis and mode, as every script takes them after its own."""
    return [ratio_text(policy.ratio), str(policy.min_allowance), policy.basis_code, policy.mode]


def spend_args(policy: BudgetPolicy, memory: Sequence[str] = ()) -> list[str]:
    """``spend.lua``: window_ms, the policy, then (since 0.2.0) this process's memory of the hash
    (``memory.Memory.args``: birth, state), when given."""
    return [str(policy.window_ms), *policy_args(policy), *memory]


def spend_many_args(policy: BudgetPolicy, n: int, memory: Sequence[str] = ()) -> list[str]:
    """``spend_many.lua``: window_ms, n (1 to 10,000), then the policy, then the memory."""
    return [str(policy.window_ms), str(n), *policy_args(policy), *memory]


def status_args(policy: BudgetPolicy) -> list[str]:
    return spend_args(policy)


def deposit_args(policy: BudgetPolicy, successes: int, first_attempts: int, denied: int = 0,
                 memory: Sequence[str] = ()) -> list[str]:
    """``deposit.lua``'s arguments; ``denied``, the denials answered in the process (the deny
    cache), as ARGV 8 (since 0.2.0), then the memory of the hash (ARGV 9 and 10) when given;
    without either, the call of older callers."""
    args = [str(policy.window_ms), str(successes), str(first_attempts), *policy_args(policy)]
    if denied > 0 or memory:
        args.append(str(min(denied, 999_999_999_999_999)))
    args.extend(memory)
    return args


def parse_reply(script: str, reply: Any, caller: BudgetPolicy) -> tuple[int, BudgetSnapshot, BudgetPolicy]:
    """``granted`` (1, 0, or -1 when not a withdrawal), the snapshot and the policy in force, from
    the reply every script starts with (``lua/README.md``, "Reply"): 17 fields, then the policy in
    force (fields 18 to 21) when it is not ``caller``'s, the policy the call sent."""
    if not isinstance(reply, (list, tuple)):
        raise BadReply(script, f"expected an array, got {type(reply).__name__}")
    if len(reply) < 17:
        raise BadReply(script, f"expected at least 17 fields, got {len(reply)}")
    values: list[int] = []
    for i in range(17):
        value = reply[i]
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadReply(script, f"field {i + 1} is not an integer: {value!r:.100}")
        if i > 0 and value < 0:
            raise BadReply(script, f"field {i + 1} is negative: {value}")
        values.append(value)
    granted, allowance, index, window_ms, elapsed, weight = values[:6]
    if window_ms == 0:
        raise BadReply(script, "window_ms is 0")
    if len(reply) >= 21:
        in_force = _policy_in_force(script, reply, window_ms)
    elif values[14] == 1:
        raise BadReply(script, f"a conflict without the policy in force ({len(reply)} fields)")
    elif window_ms != caller.window_ms:
        raise BadReply(script, f"window_ms is {window_ms}, not the caller's {caller.window_ms}, without a conflict")
    else:
        in_force = caller
    snapshot = BudgetSnapshot(
        window_ms=window_ms,
        window_index=index,
        elapsed_ms=elapsed,
        previous_weight_ms=weight,
        current=WindowCounters(*values[6:10]),
        previous=WindowCounters(*values[10:14]),
        allowance=allowance,
        control=Control(conflict=values[14] == 1, frozen=values[15] == 1, overridden=values[16] == 1),
    )
    return granted, snapshot, in_force


def _policy_in_force(script: str, reply: Sequence[Any], window_ms: int) -> BudgetPolicy:
    """The policy in force, fields 18 to 21 of a reply (with ``window_ms``, field 4)."""
    floor = reply[18]
    if not isinstance(floor, int) or isinstance(floor, bool):
        raise BadReply(script, f"field 19 is not an integer: {floor!r:.100}")
    if floor < 0:
        raise BadReply(script, f"field 19 is negative: {floor}")
    texts: list[str] = []
    for i in (17, 19, 20):
        value = reply[i]
        if isinstance(value, bytes):
            value = value[:1024].decode("utf-8", "replace")
        if not isinstance(value, str):
            raise BadReply(script, f"field {i + 1} is not text: {value!r:.100}")
        texts.append(value)
    try:
        ratio = float(texts[0])
    except ValueError:
        ratio = -1.0
    if not ratio >= 0.0 or ratio == float("inf"):
        raise BadReply(script, f"ratio is not a number >= 0: {texts[0]!r:.100}")
    if texts[1] not in ("s", "a"):
        raise BadReply(script, f"basis is {texts[1]!r:.100}")
    if texts[2] not in ("sliding", "fixed"):
        raise BadReply(script, f"mode is {texts[2]!r:.100}")
    return BudgetPolicy(
        window_ms=window_ms,
        ratio=ratio,
        min_allowance=floor,
        deposit="request" if texts[1] == "a" else "success",
        mode=texts[2],
    )


def keys(prefix: str, dependency: str) -> Sequence[str]:
    """KEYS for a dependency's budget: ``<prefix>:v1:{<dependency>}`` (lua/README.md)."""
    return [f"{prefix}:v1:{{{dependency}}}"]


def workers_keys(prefix: str) -> Sequence[str]:
    """KEYS of ``heartbeat.lua``: the worker registry's hash and sorted set (lua/README.md,
    "Worker registry"), one slot by the tag ``{workers}``."""
    reports = f"{prefix}:v1:workers:{{workers}}"
    return [reports, f"{reports}:seen"]


def beat_args(worker_id: str, report: str, retention_ms: int) -> list[str]:
    """``heartbeat.lua`` beat: the action, the worker id, the report (JSON), the retention."""
    return ["beat", worker_id, report, str(retention_ms)]


def leave_args(worker_id: str) -> list[str]:
    """``heartbeat.lua`` leave: the action and the worker id."""
    return ["leave", worker_id]
