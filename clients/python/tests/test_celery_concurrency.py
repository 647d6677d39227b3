"""The concurrency budget and the circuit breaker in fleet_budget.celery, with a real Celery worker
process (tests/python/celery_fleet.py) on the RabbitMQ at 127.0.0.1:5672 under names of its own
and the budget on a private redis-server: a job whose dependency's breaker is open is not
executed and waits without spending an attempt (then runs as a probe, or is dead-lettered
`circuit_open` past its limit); a retry refused a slot is dead-lettered with the concurrency
reason."""

from __future__ import annotations

import os
import uuid

import pytest
import redis
from celery import Celery
from conftest import free_port
from test_celery import BROKER, Worker, declare_dead, get_all, raw_channel, wait_for

from fleet_budget import FAILED, SUCCEEDED, Call, Config, FleetBudget
from fleet_budget.celery import DeadLettered

BASE = ("[redis]\ndeposit_flush_ms = 0\ntimeout_ms = 2000\n"
        "[defaults]\nmin_allowance = 1\nratio = 0\nwindow_secs = 3600\n"
        "[tasks.index_document]\nbackoff_base_ms = 10\nbackoff_cap_ms = 50\n")


@pytest.fixture
def celery_fleet(redis_url, tmp_path):
    """start(sections) -> (client app, channel, dead-letter queue, queue, calls(), local budget):
    a Celery worker process on a queue of its own with ``sections`` added to the configuration,
    ready to take jobs, and a FleetBudget of the test process on the same configuration."""
    tag = uuid.uuid4().hex[:10]
    prefix, queue = f"fbpyc{tag}", f"fbpyc-celery-{tag}"
    conn, channel = raw_channel()
    workers, budgets = [], []

    def start(sections: str):
        config = tmp_path / "fleet-budget.toml"
        config.write_text(f'[amqp]\nprefix = "{prefix}"\n' + BASE + sections)
        env = {**os.environ, "FB_CONFIG": str(config), "FB_CELERY_QUEUE": queue, "FLEET_BUDGET_REDIS_URL": redis_url,
               "FB_UPSTREAM": f"127.0.0.1:{free_port()}"}
        dead = declare_dead(channel, prefix)
        worker = Worker(env, tmp_path / "worker.log")
        workers.append(worker)
        wait_for(lambda: b" ready." in worker.log.read_bytes(), "the worker to be ready", 60)
        client = Celery(f"client{tag}", broker=BROKER)
        client.conf.update(task_default_queue=queue, result_backend="rpc://", broker_connection_timeout=5)
        budget = FleetBudget(Config.from_path(config), redis_url=redis_url, group_commit=False)
        budgets.append(budget)
        calls = lambda: int(redis.Redis.from_url(redis_url).get(f"{queue}:calls") or 0)  # noqa: E731
        return client, channel, dead, queue, calls, budget

    yield start
    for b in budgets:
        b.close()
    for w in workers:
        w.stop()
        print(w.log.read_text(errors="replace")[-4000:])
    for name in (queue, f"{prefix}.dead"):
        channel.queue_delete(name)
        channel.exchange_delete(name)
    conn.close()


def open_breaker(budget: FleetBudget, task: str, failures: int = 2) -> None:
    for _ in range(failures):
        call = budget.admit(task, 1)
        assert isinstance(call, Call) and call.judged
        budget.finish(call, FAILED)
    assert budget.breaker_status(budget.dependency(task)).state == "open"


def test_a_job_is_held_while_the_breaker_is_open_then_runs_as_its_probe(celery_fleet, redis_url, tmp_path):
    client, channel, dead, queue, calls, budget = celery_fleet(
        '[dependencies.search]\ntasks = ["index_document"]\n'
        "[dependencies.search.breaker]\nmin_volume = 2\nopen_secs = 5\nhalf_open_probes = 1\nmax_wait_secs = 60\n")
    open_breaker(budget, "index_document")
    result = client.send_task("index_document", (7,))
    assert result.get(timeout=60) == "indexed 7"
    assert calls() == 1, "not executed while open; once, as the probe, after"
    # Held first (Celery logs the hold as a retry), with its attempt unchanged.
    assert b"held: circuit_open" in (tmp_path / "worker.log").read_bytes()
    # Ran as its first attempt (a first-attempt deposit, Celery's retries 0): waiting spent none.
    r = redis.Redis.from_url(redis_url)
    assert [int(v or 0) for v in r.hmget("fb:v1:{search}", "ca", "cr")] == [1, 1], "1 first attempt, 1 probe"
    assert budget.breaker_status("search").state == "closed", "the probe's success closed it"
    assert not get_all(channel, dead)


def test_a_job_held_past_the_breakers_limit_is_dead_lettered_circuit_open(celery_fleet):
    client, channel, dead, queue, calls, budget = celery_fleet(
        '[dependencies.search]\ntasks = ["index_document"]\n'
        "[dependencies.search.breaker]\nmin_volume = 2\nopen_secs = 3600\nhalf_open_probes = 1\nmax_wait_secs = 2\n")
    open_breaker(budget, "index_document")
    result = client.send_task("index_document", (8,))
    with pytest.raises(DeadLettered) as e:
        result.get(timeout=60, propagate=True)
    assert e.value.reason == "circuit_open"
    (m,) = wait_for(lambda: get_all(channel, dead), "the dead letter")
    hd = m.headers
    assert hd["fb-reason"] == "circuit_open" and hd["fb-attempts"] == 1 and hd["retries"] == 0
    assert hd["fb-dependency"] == "search" and hd["fb-error-class"] == "circuit_open"
    assert "fb-held-since-ms" not in hd and "fb-hold-reason" not in hd
    assert calls() == 0, "never executed"


def test_a_retry_refused_a_slot_is_dead_lettered_with_the_concurrency_reason(celery_fleet, redis_url):
    client, channel, dead, queue, calls, budget = celery_fleet(
        '[dependencies.search]\ntasks = ["index_document"]\n'
        "[dependencies.search.concurrency]\ncap = 2\nplanned_primary = 1\nmin_retry_slots = 1\nlease_secs = 120\n")
    # Two primaries in flight elsewhere in the fleet: the cap is reached.
    held = [budget.admit("index_document", 1) for _ in range(2)]
    assert all(isinstance(c, Call) and c.lease is not None for c in held)
    result = client.send_task("index_document", (9,), {"fail": 1})
    with pytest.raises(DeadLettered) as e:
        result.get(timeout=60, propagate=True)
    assert e.value.reason == "concurrency_cap"
    (m,) = wait_for(lambda: get_all(channel, dead), "the dead letter")
    hd = m.headers
    assert hd["fb-reason"] == "concurrency_cap" and hd["fb-attempts"] == 2, "attempt 1 ran, its retry was refused"
    assert hd["fb-error-class"] == "concurrency_cap" and hd["fb-budget-source"] == "fleet"
    assert calls() == 1, "the primary ran (counted past the cap), the retry did not"
    r = redis.Redis.from_url(redis_url)
    assert int(r.hget("fb:v1:{search}", "cr") or 0) == 1, "the rate budget granted it; the slot refused it"
    assert r.zcard("fb:v1:{search}:lp") == 2 and r.zcard("fb:v1:{search}:lr") == 0, "the worker gave its slot back"
    for c in held:
        budget.finish(c, SUCCEEDED)


def test_a_hold_that_seems_to_start_in_the_future_counts_from_now():
    # A producer's fb-held-since-ms far ahead would otherwise keep a job held for ever while the
    # breaker stays open (its hold never seeming to start), as in Rust's `held_since`.
    from fleet_budget.celery import held_since_ms

    assert held_since_ms(2**64 - 1, 50_000) == 50_000
    assert held_since_ms(60_000, 50_000) == 50_000
    assert held_since_ms(40_000, 50_000) == 40_000
    assert held_since_ms(None, 50_000) is None
