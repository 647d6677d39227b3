"""Shadow mode (issue 34) against a private redis-server: the decision and the counters as in
enforcement, a refused retry retried anyway and marked, the operators' switch followed within the
deny cache's staleness, a freeze kept, and ``enforcement`` checked as the Rust library checks it."""

import asyncio
import time

import pytest
import redis

from fleet_budget import BUDGET_EXHAUSTED, BUDGET_FROZEN, Config, DeadLetter, Failure, FleetBudget, Retry
from fleet_budget.aio import FleetBudget as AsyncFleetBudget
from fleet_budget.config import ConfigError

TOML = """
[redis]
deposit_flush_ms = 0
deny_cache_ms = 100
[defaults]
min_allowance = 2
window_secs = 86400
[dependencies.shadowed]
tasks = ["shadowed"]
enforcement = "shadow"
[dependencies.enforced]
tasks = ["enforced"]
"""


def budget(url, text=TOML):
    return FleetBudget(Config.from_toml(text), redis_url=url, seed=7)


def fail(b, task):
    return b.on_failure(task, 1, Failure.retryable("503"))


def test_a_refusal_in_shadow_is_retried_marked_and_counted_as_enforcement_counts_it(redis_url):
    b = budget(redis_url)
    shadow = [fail(b, "shadowed") for _ in range(6)]
    enforced = [fail(b, "enforced") for _ in range(6)]
    assert all(isinstance(d, Retry) for d in shadow)
    assert [d.shadow_denied for d in shadow] == [None, None] + [BUDGET_EXHAUSTED] * 4
    assert [isinstance(d, DeadLetter) for d in enforced] == [False, False] + [True] * 4
    assert b.metrics.value("fleet_budget_retries_would_deny_total", dependency="shadowed") == 4
    assert b.metrics.value("fleet_budget_retries_denied_total", dependency="shadowed") == 4
    assert b.metrics.value("fleet_budget_retries_would_deny_total", dependency="enforced") == 0
    b.flush()
    raw = redis.Redis.from_url(redis_url)
    # The same counters: Redis counts shadow's refusals as denials, as enforcement's.
    assert raw.hget("fb:v1:{shadowed}", "cd") == raw.hget("fb:v1:{enforced}", "cd") == b"4"
    b.close()


def test_the_switch_is_followed_within_the_staleness_and_a_freeze_holds(redis_url):
    b = budget(redis_url)
    raw = redis.Redis.from_url(redis_url)
    for _ in range(2):
        fail(b, "enforced")
    assert isinstance(fail(b, "enforced"), DeadLetter)
    # What `budgetctl budget shadow enforced --for 1h` writes.
    raw.hset("fb:v1:enforcement:{enforced}", mapping={"m": "shadow", "a": "ops", "y": "watch", "t": 1})
    raw.pexpire("fb:v1:enforcement:{enforced}", 3_600_000)
    time.sleep(0.15)
    assert fail(b, "enforced").shadow_denied == BUDGET_EXHAUSTED
    raw.delete("fb:v1:enforcement:{enforced}")
    time.sleep(0.15)
    assert isinstance(fail(b, "enforced"), DeadLetter)
    # A freeze is an order: it holds in shadow.
    raw.hset("fb:v1:{shadowed}", mapping={"fu": 2**50, "fa": "ops", "fy": "incident", "ft": 1})
    d = fail(b, "shadowed")
    assert isinstance(d, DeadLetter) and d.reason == BUDGET_FROZEN
    b.close()


def test_the_asyncio_flavour_shadows_too(redis_url):
    async def run():
        b = AsyncFleetBudget(Config.from_toml(TOML), redis_url=redis_url, seed=7)
        decisions = [await b.on_failure("shadowed", 1, Failure.retryable("503")) for _ in range(4)]
        await b.close()
        return decisions

    decisions = asyncio.run(run())
    assert all(isinstance(d, Retry) for d in decisions)
    assert [d.shadow_denied for d in decisions] == [None, None, BUDGET_EXHAUSTED, BUDGET_EXHAUSTED]


@pytest.mark.parametrize("text,key", [
    ('[defaults]\nenforcement = "dry-run"\n', "defaults.enforcement"),
    ('[dependencies.search]\nenforcement = "off"\n', "dependencies.search.enforcement"),
    ("[defaults]\nenforcement = 1\n", "defaults.enforcement"),
])
def test_enforcement_is_checked_with_the_key_named(text, key):
    with pytest.raises(ConfigError) as e:
        Config.from_toml(text)
    assert key in str(e.value)


def test_enforcement_defaults_to_enforce_and_sections_override_it():
    c = Config.from_toml('[defaults]\nenforcement = "shadow"\n[dependencies.a]\nenforcement = "enforce"\n')
    assert c.enforcement_of("a") == "enforce" and c.enforcement_of("b") == "shadow"
    assert Config.from_toml("").enforcement_of("b") == "enforce"
