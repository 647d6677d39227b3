"""Shadow mode through a Celery worker as users run it: Celery's default prefork pool (no ``-P``,
two children), tests/python/celery_fleet.py on the RabbitMQ at 127.0.0.1:5672 under names of the
test's own, the budget on a private redis-server, ``enforcement = "shadow"`` in the TOML and the
budget exhausted (``ratio = 0``, floor 2). Ten jobs fail twice each: every one of their twenty
retries goes ahead (every job succeeds, nothing is dead-lettered), the eighteen the budget refused
are delivered with ``fb-shadow-denied: budget_exhausted`` and the two it granted without,
``fleet_budget_retries_would_deny_total`` scraped from each child's registry sums to eighteen, and
Redis counts them as denials (what ``budgetctl status`` shows as ``would_deny``; tests/celery_shadow.rs
reads it with budgetctl, and the operators' switch)."""

from __future__ import annotations

import os
import urllib.request
import uuid

import redis
from celery import Celery
from celery.result import ResultSet
from test_celery import BROKER, Worker, declare_dead, get_all, raw_channel, wait_for

from fleet_budget import Config, FleetBudget

JOBS, FAILS, FLOOR = 10, 2, 2


def would_deny(port: int, dependency: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as page:
        text = page.read().decode()
    series = f'fleet_budget_retries_would_deny_total{{dependency="{dependency}"}} '
    return sum(float(line.removeprefix(series)) for line in text.splitlines() if line.startswith(series))


def test_a_prefork_worker_retries_every_refusal_in_shadow_marked_and_counted(redis_url, tmp_path):
    tag = uuid.uuid4().hex[:10]
    prefix, queue = f"fbpysh{tag}", f"fbpy-shadow-{tag}"
    config = tmp_path / "fleet-budget.toml"
    config.write_text(
        f'[amqp]\nprefix = "{prefix}"\n[redis]\ntimeout_ms = 2000\n'
        f"[defaults]\nmin_allowance = {FLOOR}\nratio = 0\nwindow_secs = 86400\n"
        '[dependencies.search]\ntasks = ["shadow_index"]\nenforcement = "shadow"\n'
        "[tasks.shadow_index]\nmax_attempts = 4\nbackoff_base_ms = 10\nbackoff_cap_ms = 50\n")
    env = {**os.environ, "FB_CONFIG": str(config), "FB_CELERY_QUEUE": queue, "FLEET_BUDGET_REDIS_URL": redis_url,
           "FB_METRICS": "1"}
    conn, channel = raw_channel()
    dead = declare_dead(channel, prefix)
    worker = Worker(env, tmp_path / "worker.log", pool="prefork", concurrency=2)
    state = redis.Redis.from_url(redis_url)
    budget = FleetBudget(Config.from_path(config), redis_url=redis_url)
    try:
        wait_for(lambda: state.scard(f"{queue}:metrics") == 2, "two children serving their metrics", 60)
        client = Celery(f"client{tag}", broker=BROKER)
        client.conf.update(task_default_queue=queue, result_backend="rpc://", broker_connection_timeout=5)
        results = [client.send_task("shadow_index", (i,), {"fail": FAILS}) for i in range(JOBS)]
        assert ResultSet(results).join_native(timeout=120) == [f"indexed {i}" for i in range(JOBS)], \
            "every retry went ahead"

        seen = [line.decode().split() for line in state.lrange(f"{queue}:seen", 0, -1)]
        assert len(seen) == JOBS * (FAILS + 1), seen
        by_attempt = {a: sorted(int(job) for _, job, attempt, _ in seen if int(attempt) == a)
                      for a in range(1, FAILS + 2)}
        assert all(jobs == list(range(JOBS)) for jobs in by_attempt.values()), by_attempt
        marks = [mark for _, _, attempt, mark in seen if attempt != "1"]
        refused = JOBS * FAILS - FLOOR
        assert sorted(marks) == ["-"] * FLOOR + ["budget_exhausted"] * refused, marks
        assert all(mark == "-" for _, _, attempt, mark in seen if attempt == "1")

        ports = [int(p) for p in state.smembers(f"{queue}:metrics")]
        counted = sum(would_deny(port, "search") for port in ports)
        assert counted == refused, f"fleet_budget_retries_would_deny_total over the children: {counted}"

        def denied_in_redis():
            snapshot, source = budget.status("search")
            assert source == "fleet"
            n = snapshot.current.denied + snapshot.previous.denied
            return n if n >= refused else None

        # The deny cache's denials reach Redis with each child's deposits (every 100 ms).
        denied = wait_for(denied_in_redis, f"Redis to count the {refused} refusals", 10)
        print(f"{JOBS * FAILS} retries: {refused} refused and retried anyway, marked; would_deny over the children "
              f"{counted:.0f}; denied in Redis {denied}")
        assert get_all(channel, dead) == [], "nothing dead-lettered in shadow"
    finally:
        budget.close()
        worker.stop()
        print(worker.log.read_text(errors="replace")[-3000:])
        for name in (queue, dead):
            channel.queue_delete(name)
            channel.exchange_delete(name)
        conn.close()
