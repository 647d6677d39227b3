"""The concurrency budget and the circuit breaker in the asyncio flavour, against a private
redis-server: the synchronous client's steps (admission.py), each store call awaited on
redis.asyncio, with the same keys, reasons and metrics (test_concurrency.py tests the same with
threads)."""

import asyncio
import os
import signal

import pytest
import redis

from fleet_budget import (CIRCUIT_OPEN, CONCURRENCY_CAP, CONCURRENCY_RETRY_SHARE, FAILED, INCONCLUSIVE, SUCCEEDED,
                          Call, Config, DeadLetter, Hold)
from fleet_budget.aio import FleetBudget

CONFIG = """
[dependencies.paid-api]
tasks = ["charge"]
min_allowance = 10
[dependencies.paid-api.concurrency]
cap = 5
planned_primary = 4
min_retry_slots = 1
[dependencies.search]
tasks = ["index"]
[dependencies.search.breaker]
failure_ratio = 0.5
min_volume = 4
open_secs = 30
half_open_probes = 2
max_wait_secs = 60
"""


def budget(url, text=CONFIG, timeout_ms=10_000):
    # A long timeout but where one is tested: the machine is shared, and a connection not made in
    # 50 ms (the default) would run the call uncounted, the fallback, not what most tests test.
    return FleetBudget(Config.from_toml(f"[redis]\ntimeout_ms = {timeout_ms}\n{text}", "t.toml"), redis_url=url)


def run(coro):
    return asyncio.run(coro)


def test_the_sections_are_obeyed(redis_url):
    async def go():
        b = budget(redis_url)
        assert isinstance(await b.admit("charge", 1), Call)
        await b.close()

    run(go())


def test_many_tasks_together_never_hold_more_than_the_cap(redis_url):
    text = CONFIG.replace("cap = 5", "cap = 6").replace(
        "min_retry_slots = 1", "min_retry_slots = 6")
    held, most, refusals, granted = [0], [0], [], [0]

    async def worker(b, watch):
        for _ in range(25):
            c = await b.admit("charge", 2)
            if isinstance(c, Call):
                assert c.lease is not None, "Redis answers: every call run holds a lease"
                held[0] += 1
                granted[0] += 1
                most[0] = max(most[0], held[0], await watch.zcard("fb:v1:{paid-api}:lr"))
                await asyncio.sleep(0)  # let the others ask while it is held
                held[0] -= 1
                await b.finish(c, SUCCEEDED)
            else:
                refusals.append(c.reason)

    async def go():
        # Two budgets (two connection pools, as two workers) and 16 tasks each.
        budgets = [budget(redis_url, text), budget(redis_url, text)]
        watch = redis.asyncio.Redis.from_url(redis_url)
        await asyncio.gather(*(worker(b, watch) for b in budgets for _ in range(16)))
        left = await watch.zcard("fb:v1:{paid-api}:lr")
        await watch.aclose()
        for b in budgets:
            await b.close()
        return left

    left = run(go())
    assert 1 <= most[0] <= 6, most
    assert refusals and set(refusals) == {CONCURRENCY_CAP}, "contended, refused only at the cap"
    assert granted[0] + len(refusals) == 2 * 16 * 25 and left == 0


def test_refusal_reasons_and_metrics(redis_url):
    async def go():
        b = budget(redis_url)
        held = [await b.admit("charge", 1) for _ in range(4)]
        assert all(isinstance(c, Call) and c.lease is not None for c in held)
        retry = await b.admit("charge", 2)
        assert isinstance(retry, Call) and retry.lease.kind == "retry"
        refused = await b.admit("charge", 3)
        assert isinstance(refused, DeadLetter) and refused.reason == CONCURRENCY_CAP and refused.source == "fleet"
        extra = await b.admit("charge", 1)
        assert isinstance(extra, Call) and extra.lease is not None, "primaries counted, never refused"
        m = b.metrics
        assert m.value("fleet_budget_calls_in_flight", dependency="paid-api", kind="primary") == 5
        assert m.value("fleet_budget_calls_in_flight", dependency="paid-api", kind="retry") == 1
        assert m.value("fleet_budget_retry_fraction", dependency="paid-api") == pytest.approx(0.2)
        for c in (extra, held.pop(), held.pop()):
            await b.finish(c, SUCCEEDED)
        refused = await b.admit("charge", 2)
        assert isinstance(refused, DeadLetter) and refused.reason == CONCURRENCY_RETRY_SHARE
        await b.finish(retry, FAILED)
        again = await b.admit("charge", 2)
        assert isinstance(again, Call) and again.lease is not None
        assert m.value("fleet_budget_dead_letters_total", dependency="paid-api", reason=CONCURRENCY_CAP) == 1
        assert m.value("fleet_budget_dead_letters_total", dependency="paid-api", reason=CONCURRENCY_RETRY_SHARE) == 1
        for c in (*held, again):
            await b.finish(c, SUCCEEDED)
        await b.close()

    run(go())
    assert not redis.Redis.from_url(redis_url).exists("fb:v1:{paid-api}:lp", "fb:v1:{paid-api}:lr")


def test_a_primary_at_the_cap_waits_when_told_then_is_dead_lettered(redis_url):
    text = CONFIG.replace("min_retry_slots = 1", "min_retry_slots = 1\nprimary_waits = true\nmax_wait_secs = 60")

    async def go():
        b = budget(redis_url, text)
        calls = [await b.admit("charge", 1) for _ in range(5)]
        assert all(isinstance(c, Call) for c in calls)
        assert await b.admit("charge", 1) == Hold("primary_at_cap", 1.0)
        late = await b.admit("charge", 1, held_for=60)
        assert isinstance(late, DeadLetter) and late.reason == CONCURRENCY_CAP
        for c in calls:
            await b.finish(c, SUCCEEDED)
        await b.close()

    run(go())


async def open_breaker(b):
    for _ in range(4):
        c = await b.admit("index", 1)
        assert isinstance(c, Call) and c.judged
        await b.finish(c, FAILED)


def test_the_breaker_opens_holds_probes_and_closes(redis_url):
    async def go():
        b = budget(redis_url)
        m = b.metrics
        await open_breaker(b)
        assert m.value("fleet_budget_breaker_transitions_total", dependency="search", to="open") == 1
        status = await b.breaker_status("search")
        assert status.state == "open" and status.times_opened == 1
        hold = await b.admit("index", 3, held_for=10)
        assert isinstance(hold, Hold) and hold.reason == CIRCUIT_OPEN and 25 <= hold.pause <= 30 * 1.25
        assert m.value("fleet_budget_breaker_state", dependency="search") == 1
        late = await b.admit("index", 3, held_for=60)
        assert isinstance(late, DeadLetter) and late.reason == CIRCUIT_OPEN
        redis.Redis.from_url(redis_url).hset("fb:v1:{search}:cb", "ou", 1)  # the open period ends
        # Half-open: two probes fleet-wide, asked for by three tasks at once.
        answers = await asyncio.gather(*(b.admit("index", 1) for _ in range(3)))
        probes = [a for a in answers if isinstance(a, Call)]
        assert len(probes) == 2 and all(p.is_probe for p in probes)
        assert [a.reason for a in answers if isinstance(a, Hold)] == [CIRCUIT_OPEN]
        assert m.value("fleet_budget_breaker_transitions_total", dependency="search", to="half_open") == 1
        await b.finish(probes[1], INCONCLUSIVE)  # given back for another call to make
        p3 = await b.admit("index", 1)
        assert isinstance(p3, Call) and p3.is_probe
        await b.finish(probes[0], SUCCEEDED)
        await b.finish(p3, SUCCEEDED)
        assert (await b.breaker_status("search")).state == "closed"
        assert m.value("fleet_budget_breaker_transitions_total", dependency="search", to="closed") == 1
        assert m.value("fleet_budget_breaker_state", dependency="search") == 0
        await b.close()

    run(go())


def test_a_probe_failure_reopens_it(redis_url):
    async def go():
        b = budget(redis_url)
        await open_breaker(b)
        redis.Redis.from_url(redis_url).hset("fb:v1:{search}:cb", "ou", 1)
        probe = await b.admit("index", 2)
        assert isinstance(probe, Call) and probe.is_probe
        await b.finish(probe, FAILED)
        status = await b.breaker_status("search")
        assert status.state == "open" and status.times_opened == 2
        await b.close()

    run(go())


def test_hedges_draw_on_the_retry_share_and_the_budget(redis_url):
    async def go():
        b = budget(redis_url)
        calls = [await b.admit("charge", 1) for _ in range(4)]
        hedge = await b.try_hedge("charge")
        assert isinstance(hedge, Call) and hedge.lease.id.startswith("h")
        assert await b.try_hedge("charge") is None, "the share (1) is spent"
        m = b.metrics
        assert m.value("fleet_budget_hedges_total", dependency="paid-api", outcome="granted") == 1
        assert m.value("fleet_budget_hedges_total", dependency="paid-api", outcome="refused") == 1
        assert m.value("fleet_budget_retries_granted_total", dependency="paid-api") == 0
        for c in (*calls, hedge):
            await b.finish(c, SUCCEEDED)
        await b.close()

    run(go())


def test_without_redis_calls_run_uncounted(dead_url):
    async def go():
        b = budget(dead_url)
        c = await b.admit("charge", 2)
        assert isinstance(c, Call) and c.lease is None
        await b.finish(c, FAILED)
        c = await b.admit("index", 1)
        assert isinstance(c, Call) and not c.judged
        await b.finish(c, FAILED)
        assert b.metrics.value("fleet_budget_store_errors_total", kind="connection") >= 1
        assert b.metrics.value("fleet_budget_fallback_active", dependency="paid-api") == 1
        await b.close()

    run(go())


def test_a_redis_that_stops_answering_is_a_timeout_and_the_call_runs(redis_url):
    # A server that accepts and never answers (stopped): each call ends at `timeout_ms`.
    pid = redis.Redis.from_url(redis_url).info("server")["process_id"]

    async def go():
        b = budget(redis_url, timeout_ms=200)
        first = await b.admit("charge", 2)
        assert isinstance(first, Call) and first.lease is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            # wait_for only keeps a regression from hanging the suite; it is not the bound tested.
            c = await asyncio.wait_for(b.admit("charge", 2), 60)
            assert isinstance(c, Call) and c.lease is None
            j = await asyncio.wait_for(b.admit("index", 1), 60)
            assert isinstance(j, Call) and not j.judged
            await asyncio.wait_for(b.finish(first, SUCCEEDED), 60)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert b.metrics.value("fleet_budget_store_errors_total", kind="timeout") >= 2
        await b.close()

    run(go())


def test_a_lease_set_or_breaker_of_another_type_is_a_bad_key_and_the_call_runs(redis_url):
    r = redis.Redis.from_url(redis_url)
    r.set("fb:v1:{paid-api}:lr", "not a set")
    r.set("fb:v1:{search}:cb", "not a hash")

    async def go():
        b = budget(redis_url)
        c = await b.admit("charge", 2)
        assert isinstance(c, Call) and c.lease is None, "run uncounted, as when Redis fails"
        c2 = await b.admit("index", 1)
        assert isinstance(c2, Call) and not c2.judged
        assert b.metrics.value("fleet_budget_store_errors_total", kind="bad_key") == 2
        await b.close()

    run(go())
    assert r.get("fb:v1:{paid-api}:lr") == b"not a set", "nothing written"
