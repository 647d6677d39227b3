"""Every Celery pool through a brownout and its recovery: prefork (Celery's default, started with no
``-P`` as docs/guides/python.md says, ``--concurrency 3``, one of the two workers also with
``--max-tasks-per-child``), threads and solo. Two workers (tests/python/celery_fleet.py) on the
RabbitMQ at 127.0.0.1:5672 under names of the test's own, the budget on a private redis-server,
deposits coalesced (``deposit_flush_ms = 100``, the default). In each pool the retries stay within
the floor during the brownout and the refused jobs are dead-lettered (the publisher works in
every process); after the recovery every success and first attempt has reached Redis, read with
the ``status`` script, and the allowance is ``ratio × successes``: the retries it grants are
spent by the next failures."""

from __future__ import annotations

import os
import uuid

import pytest
import redis
from celery import Celery
from celery.result import ResultSet
from test_celery import BROKER, Worker, assert_indexed, declare_dead, get_all, raw_channel, wait_for

from fleet_budget import Config, FleetBudget
from fleet_budget.celery import DeadLettered

FLOOR, RATIO = 4, 0.5
BROWNOUT, RECOVERY, AFTER = 20, 40, 10

POOLS = {
    # Two prefork workers, three children each; the second replaces its children every 3 tasks
    # (they leave through os._exit: what they counted is flushed on worker_process_shutdown).
    "prefork": [("prefork", ()), ("prefork", ("--max-tasks-per-child", "3"))],
    "threads": [("threads", ()), ("threads", ())],
    "solo": [("solo", ()), ("solo", ())],
}


@pytest.fixture(params=sorted(POOLS))
def pool_fleet(request, redis_url, tmp_path):
    pool = request.param
    tag = uuid.uuid4().hex[:10]
    prefix, queue = f"fbpypool{tag}", f"fbpy-pool-{tag}"
    config = tmp_path / "fleet-budget.toml"
    config.write_text(
        f'[amqp]\nprefix = "{prefix}"\n[redis]\ndeposit_flush_ms = 100\ntimeout_ms = 2000\n'
        f"[defaults]\nmin_allowance = {FLOOR}\nratio = {RATIO}\nwindow_secs = 3600\n"
        '[dependencies.search]\ntasks = ["index_document"]\n'
        "[tasks.index_document]\nmax_attempts = 3\nbackoff_base_ms = 10\nbackoff_cap_ms = 50\n")
    env = {**os.environ, "FB_CONFIG": str(config), "FB_CELERY_QUEUE": queue, "FLEET_BUDGET_REDIS_URL": redis_url}
    conn, channel = raw_channel()
    dead = declare_dead(channel, prefix)
    workers = [Worker(env, tmp_path / f"worker{i}.log", pool=kind, concurrency=3, options=options,
                      name=f"{queue}-{i}")
               for i, (kind, options) in enumerate(POOLS[pool])]
    for w in workers:
        wait_for(lambda: b" ready." in w.log.read_bytes(), "the worker to be ready", 60)
    client = Celery(f"client{tag}", broker=BROKER)
    client.conf.update(task_default_queue=queue, result_backend="rpc://", broker_connection_timeout=5)
    budget = FleetBudget(Config.from_path(config), redis_url=redis_url)
    yield pool, workers, client, channel, dead, queue, budget
    budget.close()
    for w in workers:
        w.terminate()
    for w in workers:
        w.wait()
        print(w.log.read_text(errors="replace")[-3000:])
    for name in (queue, dead):
        channel.queue_delete(name)
        channel.exchange_delete(name)
    conn.close()


def run_all(client, n: int, **kwargs) -> list:
    """``n`` jobs of ``index_document``, each one's result or exception."""
    results = [client.send_task("index_document", (i,), kwargs) for i in range(n)]
    return ResultSet(results).join_native(timeout=120, propagate=False)


def test_every_pool_sends_its_deposits_and_earns_allowance_after_a_brownout(pool_fleet, redis_url):
    pool, workers, client, channel, dead, queue, budget = pool_fleet
    state = redis.Redis.from_url(redis_url)

    def status():
        snapshot, source = budget.status("search")
        assert source == "fleet"
        return snapshot

    # The brownout: every execution fails. Retries stay within the floor, the rest is dead-lettered.
    outcomes = run_all(client, BROWNOUT, fail=100)
    assert all(isinstance(o, DeadLettered) for o in outcomes), outcomes
    letters: list = []
    while len(letters) < BROWNOUT:
        letters += wait_for(lambda: get_all(channel, dead), "the rest of the dead letters")
    assert len(letters) == BROWNOUT
    # Every pool counts them in the dead-letter index (a child replaced by --max-tasks-per-child
    # sends its counts before it leaves).
    assert_indexed(redis_url, dead.removesuffix(".dead"), letters)
    snap = status()
    retries = snap.current.retries + snap.previous.retries
    assert retries == FLOOR, "no success yet: the floor and no more"

    # The recovery: every job succeeds, and every process's deposits reach Redis.
    assert run_all(client, RECOVERY) == [f"indexed {i}" for i in range(RECOVERY)]
    def settled():
        s = status()
        total = (s.current.successes + s.previous.successes, s.current.first_attempts + s.previous.first_attempts)
        return s if total == (RECOVERY, BROWNOUT + RECOVERY) else None

    snap = wait_for(settled, f"{RECOVERY} successes and {BROWNOUT + RECOVERY} first attempts in Redis "
                    "(short: a worker's deposits were never sent)", 20)
    deposits_sc = snap.current.successes * snap.window_ms + snap.previous.successes * snap.previous_weight_ms
    assert snap.allowance == max(FLOOR, int(RATIO * deposits_sc / snap.window_ms))
    assert snap.allowance > FLOOR + AFTER, "the allowance grew with the successes"

    # The allowance is spent: each of the next jobs fails once, and each is granted its retry.
    assert run_all(client, AFTER, fail=1) == [f"indexed {i}" for i in range(AFTER)]
    snap = status()
    assert snap.current.retries + snap.previous.retries == FLOOR + AFTER

    ran = [tuple(map(int, p.split())) for p in state.smembers(f"{queue}:pids")]
    first, second = workers[0].proc.pid, workers[1].proc.pid
    if pool == "prefork":
        children = {parent: {pid for pid, p in ran if p == parent} for parent in (first, second)}
        assert {p for _, p in ran} == {first, second}, "prefork: every task ran in a child of a worker"
        assert len(children[first]) <= 3 and len(children[second]) > 3, \
            "the second worker's children were replaced (--max-tasks-per-child), the first's were not"
    else:
        assert {pid for pid, _ in ran} == {first, second}, f"{pool}: the tasks ran in the workers themselves"
