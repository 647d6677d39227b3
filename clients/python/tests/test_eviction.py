"""A budget hash lost in Redis mid-window, and Redis's memory full: the same rules as the Rust
``crates/fleet-budget/tests/eviction.rs`` (lua/README.md, "Lost budgets"), threaded and asyncio,
against a private redis-server. The freeze this worker saw comes back after ``FLUSHALL``, the
window's retries too (no grant past the floor), the loss is counted once per call that found it;
under ``noeviction`` with memory full the decisions come from the fallback, counted as ``oom``,
and Redis decides again once memory frees. (The eviction itself, under ``allkeys-lru`` with a
cache filling memory, is ``tests/python_client.rs``'s
``python_restores_a_freeze_under_allkeys_lru_as_rust_does``.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis

from fleet_budget import Config, Failure, FleetBudget, Retry
from fleet_budget import aio

FLOOR = 10
TOML = f"""
[redis]
deposit_flush_ms = 0
timeout_ms = 5000
deny_cache_ms = 0
[dependencies.search]
tasks = ["index"]
window_secs = 600
min_allowance = {FLOOR}
[dependencies.mail]
tasks = ["send"]
window_secs = 600
min_allowance = {FLOOR}
"""
OVERRIDE = (Path(__file__).resolve().parents[3] / "lua" / "override.lua").read_text()


def granted(budget: FleetBudget, task: str, n: int) -> int:
    return sum(isinstance(budget.on_failure(task, 1, Failure.retryable("503")), Retry) for _ in range(n))


def freeze(raw: redis.Redis) -> None:
    raw.eval(OVERRIDE, 1, "fb:v1:{mail}", "freeze", 3_600_000, "ops", "incident")


def test_a_flushall_loses_neither_the_freeze_nor_the_window_s_retries(redis_url):
    raw = redis.Redis.from_url(redis_url)
    freeze(raw)
    budget = FleetBudget(Config.from_toml(TOML), redis_url=redis_url)
    assert granted(budget, "send", 1) == 0, "frozen"
    assert granted(budget, "index", 11) == FLOOR
    assert raw.pttl("fb:v1:{mail}") == -1, "no TTL while an override is in force"
    raw.flushall()
    assert granted(budget, "send", 20) == 0, "the freeze is restored from this worker's memory"
    assert granted(budget, "index", 20) == 0, "the window's retries too"
    assert raw.hget("fb:v1:{mail}", "fu") is not None
    assert raw.hget("fb:v1:{search}", "cr") == str(FLOOR).encode()
    m = budget.metrics
    assert m.value("fleet_budget_budget_lost_total", dependency="mail") == 1
    assert m.value("fleet_budget_budget_lost_total", dependency="search") == 1
    budget.close()


def test_a_worker_that_remembers_nothing_is_served_as_before(redis_url):
    """A new process (or one older than 0.2.0) restores nothing: the documented limit."""
    raw = redis.Redis.from_url(redis_url)
    freeze(raw)
    first = FleetBudget(Config.from_toml(TOML), redis_url=redis_url)
    assert granted(first, "send", 1) == 0
    raw.flushall()
    fresh = FleetBudget(Config.from_toml(TOML), redis_url=redis_url)
    assert granted(fresh, "send", 20) == FLOOR
    assert fresh.metrics.value("fleet_budget_budget_lost_total", dependency="mail") == 0
    first.close()
    fresh.close()


def test_the_asyncio_flavour_restores_alike(redis_url):
    async def run() -> None:
        raw = redis.Redis.from_url(redis_url)
        freeze(raw)
        budget = aio.FleetBudget(Config.from_toml(TOML), redis_url=redis_url)
        fail = Failure.retryable("503")
        assert not isinstance(await budget.on_failure("send", 1, fail), Retry)
        assert sum([isinstance(await budget.on_failure("index", 1, fail), Retry) for _ in range(11)]) == FLOOR
        raw.flushall()
        assert sum([isinstance(await budget.on_failure("send", 1, fail), Retry) for _ in range(20)]) == 0
        assert sum([isinstance(await budget.on_failure("index", 1, fail), Retry) for _ in range(20)]) == 0
        assert budget.metrics.value("fleet_budget_budget_lost_total", dependency="search") == 1
        await budget.close()

    asyncio.run(run())


def test_full_memory_decides_from_the_fallback_named_oom_and_comes_back(redis_url):
    raw = redis.Redis.from_url(redis_url)
    freeze(raw)
    budget = FleetBudget(Config.from_toml(TOML), redis_url=redis_url)
    assert granted(budget, "send", 1) == 0
    assert granted(budget, "index", 3) == 3
    raw.config_set("maxmemory-policy", "noeviction")
    used = int(raw.info("memory")["used_memory"])
    raw.config_set("maxmemory", max(1, used - 256 * 1024) if used > 512 * 1024 else 1)
    decisions = [budget.on_failure("index", 1, Failure.retryable("503")) for _ in range(20)]
    assert all(d.source == "local_fallback" for d in decisions), [d.source for d in decisions]
    assert sum(isinstance(d, Retry) for d in decisions) <= FLOOR, "the local budget's floor"
    assert granted(budget, "send", 20) == 0, "the freeze this worker saw holds in the fallback"
    m = budget.metrics
    assert m.value("fleet_budget_store_errors_total", kind="oom") >= 1
    assert m.value("fleet_budget_store_errors_total", kind="server") == 0
    assert raw.hget("fb:v1:{search}", "cr") == b"3", "nothing written while memory is full"
    raw.config_set("maxmemory", 0)
    for _ in range(2000):  # at most one probe per 200 ms: Redis decides again within a few
        d = budget.on_failure("send", 1, Failure.retryable("503"))
        if d.source == "fleet":
            break
        __import__("time").sleep(0.01)
    assert d.source == "fleet" and not isinstance(d, Retry)
    budget.close()


def test_a_breaker_lost_while_open_is_counted(redis_url):
    """An open breaker has no TTL (out of volatile-*'s reach); lost anyway (FLUSHALL, allkeys-*)
    it comes back closed, and a worker that saw it open says so (``to="lost"``), as in Rust."""
    from fleet_budget import FAILED, SUCCEEDED
    from fleet_budget.admission import Call, Hold

    raw = redis.Redis.from_url(redis_url)
    toml = ("[redis]\nheartbeat_ms = 0\n[dependencies.search]\ntasks = [\"index\"]\n"
            "[dependencies.search.breaker]\nmin_volume = 4\nfailure_ratio = 0.5\nopen_secs = 3600\n")
    budget = FleetBudget(Config.from_toml(toml), redis_url=redis_url)
    for _ in range(4):
        call = budget.admit("index", 1)
        assert isinstance(call, Call)
        budget.finish(call, FAILED)
    assert isinstance(budget.admit("index", 1), Hold), "open"
    assert raw.pttl("fb:v1:{search}:cb") == -1, "no TTL while open"
    raw.flushall()
    after = budget.admit("index", 1)
    assert isinstance(after, Call), "closed again"
    assert budget.metrics.value("fleet_budget_breaker_transitions_total", dependency="search", to="lost") == 1
    budget.finish(after, SUCCEEDED)
    budget.close()


def test_a_lease_lost_before_its_expiry_is_counted(redis_url):
    from fleet_budget import SUCCEEDED
    from fleet_budget.admission import Call

    raw = redis.Redis.from_url(redis_url)
    toml = ("[redis]\nheartbeat_ms = 0\n[dependencies.paid-api]\ntasks = [\"charge\"]\n"
            "[dependencies.paid-api.concurrency]\ncap = 6\nplanned_primary = 6\nlease_secs = 600\n")
    budget = FleetBudget(Config.from_toml(toml), redis_url=redis_url)
    kept = budget.admit("charge", 1)
    assert isinstance(kept, Call)
    budget.finish(kept, SUCCEEDED)
    assert budget.metrics.value("fleet_budget_leases_lost_total", dependency="paid-api") == 0
    held = [budget.admit("charge", 1) for _ in range(2)]
    raw.flushall()
    for call in held:
        budget.finish(call, SUCCEEDED)
    assert budget.metrics.value("fleet_budget_leases_lost_total", dependency="paid-api") == 2
    budget.close()
