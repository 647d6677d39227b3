"""The asyncio flavour against a private redis-server: the same decisions and budget."""

import asyncio

import redis

from fleet_budget import BUDGET_EXHAUSTED, Config, DeadLetter, Failure, Retry
from fleet_budget.aio import FleetBudget

TOML = """
[defaults]
min_allowance = 2
ratio = 0.5
[dependencies.search]
tasks = ["index_document"]
"""


def test_the_asyncio_flavour_decides_and_deposits(redis_url):
    async def run():
        b = FleetBudget(Config.from_toml("[redis]\ndeposit_flush_ms = 0\n" + TOML), redis_url=redis_url, seed=3)
        for _ in range(6):
            await b.on_attempt("index_document", 1)
            await b.on_success("index_document")
        decisions = [await b.on_failure("index_document", 1, Failure.retryable("503")) for _ in range(4)]
        snap, source = await b.status("search")
        await b.close()
        return decisions, snap, source

    decisions, snap, source = asyncio.run(run())
    assert [type(d) for d in decisions] == [Retry, Retry, Retry, DeadLetter], "allowance floor(0.5 x 6) = 3"
    assert decisions[3].reason == BUDGET_EXHAUSTED and source == "fleet"
    assert (snap.current.successes, snap.current.first_attempts, snap.current.retries) == (6, 6, 3)


def test_coalesced_deposits_reach_redis_by_the_flusher_and_close(redis_url, dead_url):
    async def run():
        b = FleetBudget(Config.from_toml("[redis]\ndeposit_flush_ms = 10000\n" + TOML), redis_url=redis_url)
        for _ in range(5):
            await b.on_success("index_document")
        pending = b.pending_deposits()
        await b.close()
        d = FleetBudget(Config.from_toml(TOML), redis_url=dead_url)
        decision = await d.on_failure("index_document", 1, Failure.retryable("503"))
        await d.close()
        return pending, decision

    pending, decision = asyncio.run(run())
    assert pending == 5
    assert redis.Redis.from_url(redis_url).hget("fb:v1:{search}", "cs") == b"5"
    assert isinstance(decision, Retry) and decision.source == "local_fallback"
