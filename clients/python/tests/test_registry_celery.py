"""The worker registry with a real Celery worker on the prefork pool (Celery's default, started
with no ``-P`` as docs/guides/python.md says; tests/python/celery_fleet.py), on the RabbitMQ at
127.0.0.1:5672 under a queue of its own, the budget on a private redis-server: each pool child is
a worker in the registry under its own id and pid, the main process (which runs no task) is not,
a child that ran a job reports the same id, and at shutdown every entry leaves."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import redis
from celery import Celery
from test_celery import BROKER, Worker, raw_channel, wait_for
from test_registry import reports

CHILDREN = 3


def parent_of(pid: int) -> int:
    """The parent pid of a live process (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rpartition(")")[2].split()[1])


def test_every_prefork_child_reports_under_its_own_id_and_the_parent_does_not(redis_url, tmp_path):
    tag = uuid.uuid4().hex[:10]
    prefix, queue = f"fbpyreg{tag}", f"fbpy-registry-{tag}"
    config = tmp_path / "fleet-budget.toml"
    config.write_text(
        f'[amqp]\nprefix = "{prefix}"\n[redis]\nheartbeat_ms = 100\ntimeout_ms = 2000\n'
        '[dependencies.search]\ntasks = ["index_document"]\n')
    env = {**os.environ, "FB_CONFIG": str(config), "FB_CELERY_QUEUE": queue, "FLEET_BUDGET_REDIS_URL": redis_url}
    worker = Worker(env, tmp_path / "worker.log", pool="prefork", concurrency=CHILDREN)
    conn, channel = raw_channel()
    try:
        wait_for(lambda: b" ready." in worker.log.read_bytes(), "the worker to be ready", 60)
        main = worker.proc.pid

        def children_only():
            everyone = reports(redis_url)
            pids = {r["pid"] for r in everyone.values()}
            if len(everyone) == CHILDREN and len(pids) == CHILDREN and all(parent_of(p) == main for p in pids):
                return everyone
            return None

        everyone = wait_for(children_only, f"{CHILDREN} entries, one per pool child, none of the main process", 30)
        assert all(r["lang"] == "python" and r["id"] == wid and wid.split("-")[-2] == str(r["pid"])
                   for wid, r in everyone.items()), everyone

        # A job runs in one of the children: it is decided there, under the same entry.
        client = Celery(f"client{tag}", broker=BROKER)
        client.conf.update(task_default_queue=queue, result_backend="rpc://", broker_connection_timeout=5)
        assert client.send_task("index_document", (1,)).get(timeout=60) == "indexed 1"
        ran = {int(p.split()[0]) for p in redis.Redis.from_url(redis_url).smembers(f"{queue}:pids")}
        assert ran <= {r["pid"] for r in everyone.values()}, "the job ran in a child that reports"
        assert set(reports(redis_url)) == set(everyone), "the same workers, no new entry"
    finally:
        worker.terminate()
        worker.wait()
        print(worker.log.read_text(errors="replace")[-3000:])
        channel.queue_delete(queue)
        conn.close()
    wait_for(lambda: reports(redis_url) == {}, "every child to leave at shutdown", 30)
