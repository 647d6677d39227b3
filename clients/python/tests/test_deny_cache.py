"""Exhausted budgets answered in the process (``redis.deny_cache_ms``, deny_cache.py), threaded
and asyncio, against a private redis-server: the same rules as the Rust
``crates/fleet-budget/tests/deny_cache.rs``. No timed assertion: a denial answered in the process
must come before the staleness has passed since the last call that reached Redis, and a generous
bound only keeps a broken cache from hanging."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import redis

from fleet_budget import Config, DeadLetter, Failure, FleetBudget, Retry
from fleet_budget import aio
from fleet_budget.deny_cache import DenyCache, batch_next, next_grant_ms
from fleet_budget.snapshot import BudgetSnapshot, Control, WindowCounters

STALENESS_MS = 300

TOML = f"""
[redis]
deposit_flush_ms = 0
timeout_ms = 5000
deny_cache_ms = {STALENESS_MS}
[dependencies.search]
tasks = ["index"]
ratio = 0.5
min_allowance = 1
"""


def fail(budget: FleetBudget):
    return budget.on_failure("index", 1, Failure.retryable("503"))


def exhaust(budget: FleetBudget) -> None:
    assert isinstance(fail(budget), Retry), "the floor's one retry"
    denied = fail(budget)
    assert isinstance(denied, DeadLetter) and denied.source == "fleet"
    spends = budget.metrics.store_call_duration.labels("spend")._sum.get()
    for _ in range(50):
        d = fail(budget)
        assert isinstance(d, DeadLetter) and d.reason == "budget_exhausted" and d.source == "fleet_cache"
    assert budget.metrics.store_call_duration.labels("spend")._sum.get() == spends, "no call"
    assert budget.metrics.retries_denied_in_process.labels("search")._value.get() == 50
    assert budget.metrics.retries_denied.labels("search")._value.get() == 51, "counted as denials"


def until_granted(budget: FleetBudget, last_call_back: float) -> None:
    staleness = STALENESS_MS / 1000
    give_up = time.monotonic() + 30
    while True:
        asked = time.monotonic()
        d = fail(budget)
        if d.source == "fleet_cache":
            assert isinstance(d, DeadLetter), "the cache only denies"
            assert asked < last_call_back + staleness, "a denial stood past the staleness"
        else:
            assert d.source == "fleet", d
            if isinstance(d, Retry):
                return
            last_call_back = time.monotonic()
        assert time.monotonic() < give_up, "never granted"
        time.sleep(0.005)


def test_another_process_deposits_let_retries_through_within_the_staleness(redis_url):
    a = FleetBudget(Config.from_toml(TOML), redis_url=redis_url)
    b = FleetBudget(Config.from_toml(TOML), redis_url=redis_url)
    exhaust(a)
    before = time.monotonic()
    for _ in range(100):
        b.on_success("index")
    until_granted(a, before)
    # 100 successes at ratio 0.5: 50, or 49 when the 60-second window rolled over in between
    # (the previous window counts weighted by what is left of it: 59,967/60,000 of 50 is 49.97,
    # seen once in a clean-clone run).
    assert a.status("search")[0].allowance in (49, 50)
    a.close()
    b.close()


def test_an_operators_budget_set_raising_the_floor_lets_retries_through_within_the_staleness(redis_url):
    a = FleetBudget(Config.from_toml(TOML), redis_url=redis_url)
    exhaust(a)
    raw = redis.Redis.from_url(redis_url)
    override = (Path(__file__).resolve().parents[3] / "lua" / "override.lua").read_text()
    before = time.monotonic()
    raw.eval(override, 1, "fb:v1:{search}", "set", 3_600_000, "ops", "test", "", 20)
    until_granted(a, before)
    snap = a.status("search")[0]
    assert snap.control.overridden and snap.allowance == 20
    a.close()


def test_this_process_flushing_deposits_forgets_the_denial_at_once(redis_url):
    a = FleetBudget(Config.from_toml(TOML), redis_url=redis_url)
    exhaust(a)
    for _ in range(10):
        a.on_success("index")
    d = fail(a)
    assert isinstance(d, Retry) and d.source == "fleet", "0.5 x 10 = 5: room for one more"
    a.close()


def test_32_threads_on_an_exhausted_budget_never_get_a_grant(redis_url):
    toml = TOML.replace("min_allowance = 1", "min_allowance = 10").replace(f"deny_cache_ms = {STALENESS_MS}", "")
    budgets = [FleetBudget(Config.from_toml(toml), redis_url=redis_url) for _ in range(2)]
    granted = [0] * 32

    def work(i: int) -> None:
        for _ in range(200):
            granted[i] += isinstance(fail(budgets[i % 2]), Retry)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == 10, "the floor, exactly"
    raw = redis.Redis.from_url(redis_url)
    cr, cd = (int(v) for v in raw.hmget("fb:v1:{search}", "cr", "cd"))
    in_process = sum(b.metrics.retries_denied_in_process.labels("search")._value.get() for b in budgets)
    # Without coalescing (deposit_flush_ms = 0) the denials answered in the process wait for the
    # flush of close().
    assert cr == 10 and cd + in_process == 32 * 200 - 10, "every request counted once"
    assert in_process > 0
    for b in budgets:
        b.close()
    assert int(raw.hget("fb:v1:{search}", "cd")) == 32 * 200 - 10, "closed: Redis counts every denial"


def test_after_a_flush_redis_counts_every_denial_those_answered_in_the_process_too(redis_url):
    """Issue 31, item 5 (the Rust test of the same name): workers with the deny cache on, an
    exhausted budget; before their flush Redis holds only the denials it made, after it every
    denial of the fleet, in the counter ``status.lua`` reads (threaded and asyncio alike)."""
    toml = (TOML.replace("deposit_flush_ms = 0", "deposit_flush_ms = 10000")
            .replace(f"deny_cache_ms = {STALENESS_MS}", "deny_cache_ms = 10000")
            .replace("min_allowance = 1", "min_allowance = 2\nwindow_secs = 86400"))
    budgets = [FleetBudget(Config.from_toml(toml), redis_url=redis_url) for _ in range(2)]
    outcomes: list[object] = []

    def work(i: int) -> None:
        for _ in range(50):
            outcomes.append(fail(budgets[i % 2]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    raw = redis.Redis.from_url(redis_url)

    async def rest() -> None:
        a = aio.FleetBudget(Config.from_toml(toml), redis_url=redis_url)
        outcomes.extend([await a.on_failure("index", 1, Failure.retryable("503")) for _ in range(20)])
        dead = [d for d in outcomes if isinstance(d, DeadLetter)]
        assert len(outcomes) - len(dead) == 2, "the floor"
        assert all(d.reason == "budget_exhausted" for d in dead)
        in_process = sum(int(b.metrics.retries_denied_in_process.labels("search")._value.get())
                         for b in [*budgets, a])
        assert in_process > len(dead) // 2
        assert int(raw.hget("fb:v1:{search}", "cd")) == len(dead) - in_process, "before: Redis's own"
        for b in budgets:
            b.flush()
        await a.flush()
        assert int(raw.hget("fb:v1:{search}", "cd")) == len(dead), "after: every denial"
        # Denials alone make no room: still denied.
        assert isinstance(fail(budgets[0]), DeadLetter)
        for b in budgets:
            b.close()
        await a.close()
        assert int(raw.hget("fb:v1:{search}", "cd")) == len(dead) + 1

    asyncio.run(rest())


def test_the_asyncio_flavour_keeps_denials_alike(redis_url):
    async def run():
        a = aio.FleetBudget(Config.from_toml(TOML), redis_url=redis_url)
        sources = [(await a.on_failure("index", 1, Failure.retryable("503"))).source for _ in range(5)]
        results = await asyncio.gather(*(a.on_failure("index", 1, Failure.retryable("503")) for _ in range(32)))
        await a.on_success("index")
        after = await a.on_failure("index", 1, Failure.retryable("503"))
        await a.close()
        return sources, results, after

    sources, results, after = asyncio.run(run())
    assert sources == ["fleet", "fleet", "fleet_cache", "fleet_cache", "fleet_cache"]
    assert all(isinstance(r, DeadLetter) and r.source == "fleet_cache" for r in results)
    assert after.source == "fleet", "its own deposit reached Redis: asked again"


def test_the_reply_field_and_the_cache_rules():
    base = [0, 1, 7, 1000, 5, 995] + [0] * 8 + [0, 0, 0]
    assert next_grant_ms("spend", base + [250]) == 250
    assert next_grant_ms("spend", base + [-1]) is None
    assert next_grant_ms("spend", base) == 0, "an older script: ask again"
    conflict = base[:14] + [1, 0, 0] + ["0.2", 10, "s", "sliding"]
    assert next_grant_ms("spend", conflict + [7]) == 7
    assert [batch_next(40, 3, k) for k in range(5)] == [0, 0, 40, 40, 40]
    now = [100.0]
    cache = DenyCache(100, clock=lambda: now[0])
    snap = BudgetSnapshot(1000, 1, 5, 995, WindowCounters(), WindowCounters(), 1)
    cache.remember("d", 0, 100.0, False, snap, 30)
    assert cache.lookup("d")[0] is snap
    now[0] = 100.031
    assert cache.lookup("d")[0] is None, "its next grant has come"
    cache.remember("d", 0, 100.031, False, snap, None)
    now[0] = 100.13
    assert cache.lookup("d")[0] is snap
    now[0] = 100.131
    assert cache.lookup("d")[0] is None, "the staleness has passed"
    cache.remember("d", 0, now[0], True, snap, 500)
    assert cache.lookup("d")[0] is None, "a grant is not kept"
    _, epoch = cache.lookup("d")
    cache.forget("d")
    cache.remember("d", epoch, now[0], False, snap, None)
    assert cache.lookup("d")[0] is None, "a reply to a call sent before a flush"
    _, epoch = cache.lookup("d")
    cache.remember("d", epoch, now[0], False, snap, None)
    cache.seen("d", Control(frozen=True))
    assert cache.lookup("d")[0] is None, "another override state"
    off = DenyCache(0)
    off.remember("d", 0, time.monotonic(), False, snap, None)
    assert off.lookup("d") == (None, 0)
