"""Shadow mode (docs/semantics.md, "Shadow mode") where the fleet meets it: an operators' switch
reaching every forked process of a worker within the deny cache's staleness, both ways; and, while
Redis does not answer, a ``deny`` fallback's refusal holding (a refusal of the machinery, not an
observation) while a ``local`` fallback's refusal of an exhausted budget is shadowed like Redis's.
Private redis-servers; the processes are ``os.fork`` children of a process that made the budget,
as a Celery prefork pool's are."""

from __future__ import annotations

import asyncio
import json
import os
import time
import traceback

import redis

from fleet_budget import BUDGET_EXHAUSTED, Config, DeadLetter, Failure, FleetBudget, Retry
from fleet_budget.aio import FleetBudget as AsyncFleetBudget

#: The deny cache's staleness in these tests (ms), and so the switch's.
STALE_MS = 200
#: Forked processes deciding at once.
PROCESSES = 4

FLEET = f"""
[redis]
deny_cache_ms = {STALE_MS}
[defaults]
ratio = 0.0
min_allowance = 0
window_secs = 86400
[dependencies.search]
tasks = ["index_document"]
"""


def decide_until(b: FleetBudget, until: float, out: int) -> None:
    """In a forked child: decides on failures of ``index_document`` until ``until`` (monotonic
    seconds), then writes each decision's start and end (monotonic seconds, the same clock in
    every process) and whether it was a shadowed retry to ``out`` as JSON, and closes the budget."""
    seen = []
    while time.monotonic() < until:
        started = time.monotonic()
        d = b.on_failure("index_document", 1, Failure.retryable("503"))
        ended = time.monotonic()
        if isinstance(d, Retry):
            assert d.shadow_denied == BUDGET_EXHAUSTED, d
            seen.append((started, ended, True))
        else:
            assert d.reason == BUDGET_EXHAUSTED, d
            seen.append((started, ended, False))
        time.sleep(0.003)
    assert b.close() == 0
    with os.fdopen(out, "w") as f:
        json.dump(seen, f)


def test_a_switch_reaches_every_forked_process_within_the_staleness_both_ways(redis_url):
    """Four children of one budget decide on an exhausted budget while an operator switches the
    dependency to shadow (as ``budgetctl budget shadow search`` writes it), then back (the switch
    removed: its configuration, enforce). In every child, every decision that starts a staleness
    after a switch was written follows it (however the machine schedules them: a switch read is
    kept for the staleness from when it was asked); every decision that ended before the first
    switch was sent is enforced."""
    b = FleetBudget(Config.from_toml(FLEET), redis_url=redis_url)
    raw = redis.Redis.from_url(redis_url)
    key = "fb:v1:enforcement:{search}"
    stale = STALE_MS / 1000
    start = time.monotonic()
    shadow_from, enforce_from, until = start + 1.0, start + 2.5, start + 4.0
    children = []
    for _ in range(PROCESSES):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.close(read)
                decide_until(b, until, write)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(write)
        children.append((pid, read))

    time.sleep(max(0.0, shadow_from - time.monotonic()))
    sending_shadow = time.monotonic()
    raw.hset(key, mapping={"m": "shadow", "a": "ops", "y": "watch before enforcing", "t": 1})
    raw.pexpire(key, 3_600_000)
    shadowed_at = time.monotonic()  # written by now
    time.sleep(max(0.0, enforce_from - time.monotonic()))
    sending_enforce = time.monotonic()
    raw.delete(key)
    enforced_at = time.monotonic()

    for pid, read in children:
        with os.fdopen(read) as f:
            seen = json.load(f)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, f"child {pid} failed"
        before = [s for _, end, s in seen if end < sending_shadow]
        in_shadow = [s for start, end, s in seen if start >= shadowed_at + stale and end < sending_enforce]
        after = [s for start, _, s in seen if start >= enforced_at + stale]
        assert before and in_shadow and after, f"child {pid} decided in every period: {len(seen)}"
        assert not any(before), f"child {pid}: enforced before the switch"
        assert all(in_shadow), f"child {pid}: a decision a staleness after the switch to shadow was enforced"
        assert not any(after), f"child {pid}: a decision a staleness after the switch back was shadowed"
        first = min(start for start, _, s in seen if s) - shadowed_at
        last = max(start for start, _, s in seen if s) - enforced_at
        print(f"child {pid}: {len(seen)} decisions; shadow from {first * 1000:.0f} ms after the switch, "
              f"the last shadowed {last * 1000:.0f} ms after the switch back (staleness {STALE_MS} ms)")
    assert b.close() == 0


FALLBACK = """
[redis]
fallback = "{mode}"
timeout_ms = 200
[defaults]
ratio = 0.0
min_allowance = 1
enforcement = "shadow"
[dependencies.search]
tasks = ["index_document"]
"""


def test_a_deny_fallback_holds_in_shadow_and_a_local_one_is_shadowed(dead_url):
    """Redis does not answer: a ``deny`` fallback refuses every retry, and shadow does not let
    those through (``budget_exhausted``, source ``blind``, nothing counted as would-deny; the
    asyncio flavour alike); the
    ``local`` fallback's budget grants its floor and its refusals are retried in shadow, marked."""
    deny = FleetBudget(Config.from_toml(FALLBACK.format(mode="deny")), redis_url=dead_url)
    decisions = [deny.on_failure("index_document", 1, Failure.retryable("503")) for _ in range(3)]
    assert all(isinstance(d, DeadLetter) and d.reason == BUDGET_EXHAUSTED and d.source == "blind"
               for d in decisions), decisions
    assert deny.metrics.value("fleet_budget_retries_would_deny_total", dependency="search") == 0
    deny.close()

    async def in_asyncio():
        b = AsyncFleetBudget(Config.from_toml(FALLBACK.format(mode="deny")), redis_url=dead_url)
        d = await b.on_failure("index_document", 1, Failure.retryable("503"))
        await b.close()
        return d

    d = asyncio.run(in_asyncio())
    assert isinstance(d, DeadLetter) and d.reason == BUDGET_EXHAUSTED and d.source == "blind", d

    local = FleetBudget(Config.from_toml(FALLBACK.format(mode="local")), redis_url=dead_url)
    decisions = [local.on_failure("index_document", 1, Failure.retryable("503")) for _ in range(3)]
    assert all(isinstance(d, Retry) and d.source == "local_fallback" for d in decisions), decisions
    assert [d.shadow_denied for d in decisions] == [None, BUDGET_EXHAUSTED, BUDGET_EXHAUSTED]
    assert local.metrics.value("fleet_budget_retries_would_deny_total", dependency="search") == 2
    local.close()
