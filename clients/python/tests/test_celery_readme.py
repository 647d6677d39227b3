"""The Celery blocks of docs/guides/python.md ("Celery in five lines") and clients/python/README.md
("Celery"), run as written: the block is ``tasks.py``, ``search`` is a stub dependency that fails a
given number of times, ``celery -A tasks worker`` runs it as a process on the RabbitMQ at
127.0.0.1:5672 (the compose stack's port) on Celery's default pool (prefork) as the guide says, the
budget on a private redis-server with its deposits coalesced (the default ``deposit_flush_ms``).
The test's own ``fleet-budget.toml`` gives the names of its own (an ``[amqp] prefix``, a Celery
queue) so that tests running at the same time never meet."""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import amqp
import pytest
import redis

from conftest import REPO
from fleet_budget.celery import DeadLettered

SEARCH = '''
import redis, os

class Unavailable(Exception):
    pass

_state = redis.Redis.from_url(os.environ["FLEET_BUDGET_REDIS_URL"])

def index(doc_id):
    """Fails while the key search:failures is above 0 (one failure per call)."""
    _state.incr("search:calls")
    if _state.decr("search:failures") >= 0:
        raise Unavailable("search is browning out")
    return f"indexed {doc_id}"
'''

BLOCKS = [(REPO / "docs/guides/python.md", "## Celery in five lines"), (REPO / "clients/python/README.md", "## Celery")]


def celery_block(readme: Path, heading: str) -> str:
    text = readme.read_text()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(params=BLOCKS, ids=["python-guide", "clients-python-README"])
def readme_app(request, tmp_path, redis_url, monkeypatch):
    readme, heading = request.param
    tag = uuid.uuid4().hex[:10]
    prefix, queue = f"fbpyreadme{tag}", f"fbpy-readme-{tag}"
    (tmp_path / "search.py").write_text(SEARCH)
    (tmp_path / "tasks.py").write_text(
        celery_block(readme, heading)
        # The queue is the test's own; everything else as written.
        + f"\napp.conf.update(task_default_queue={queue!r}, result_backend='rpc://', broker_connection_timeout=5)\n")
    (tmp_path / "fleet-budget.toml").write_text(
        f'[amqp]\nprefix = "{prefix}"\n[redis]\ntimeout_ms = 2000\n'
        "[defaults]\nmin_allowance = 2\nratio = 0\n"
        "[tasks.index_document]\nbackoff_base_ms = 10\nbackoff_cap_ms = 50\n")
    env = {**os.environ, "FLEET_BUDGET_REDIS_URL": redis_url, "PYTHONPATH": str(tmp_path)}
    conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest", connect_timeout=5)
    conn.connect()
    channel = conn.channel()
    dead = f"{prefix}.dead"
    channel.exchange_declare(dead, "fanout", durable=True, auto_delete=False)
    channel.queue_declare(dead, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"})
    channel.queue_bind(dead, dead, "")
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-c", "2", "-Q", queue,
         "--without-heartbeat", "--without-mingle", "--without-gossip", "-n", f"{queue}@%h"],
        cwd=tmp_path, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FLEET_BUDGET_REDIS_URL", redis_url)
    for name in ("tasks", "search"):
        sys.modules.pop(name, None)
    module = importlib.import_module("tasks")
    yield module, channel, dead, queue
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(timeout=10)
    print(log.read_text(errors="replace")[-4000:])
    module.budget.close()
    for name in (queue, dead):
        channel.queue_delete(name)
        channel.exchange_delete(name)
    conn.close()
    for name in ("tasks", "search"):
        sys.modules.pop(name, None)


def test_the_readme_celery_block_retries_within_the_budget_and_dead_letters_the_rest(readme_app, redis_url):
    module, channel, dead, queue = readme_app
    counters = redis.Redis.from_url(redis_url)
    # Two failures, two retries granted (the floor is 2), then the third attempt succeeds.
    counters.set("search:failures", 2)
    assert module.index_document.delay(7).get(timeout=60) == "indexed 7"
    assert int(counters.get("search:calls")) == 3
    # Coalesced deposits: the prefork child sends them within deposit_flush_ms (100 ms).
    deadline = time.monotonic() + 10
    while [int(v or 0) for v in counters.hmget("fb:v1:{index_document}", "ca", "cs", "cr", "cd")] != [1, 1, 2, 0]:
        assert time.monotonic() < deadline, counters.hgetall("fb:v1:{index_document}")
        time.sleep(0.02)
    # The budget is spent: the next failure is denied and the job is dead-lettered.
    counters.set("search:failures", 1)
    result = module.index_document.delay(8)
    with pytest.raises(DeadLettered) as denied:
        result.get(timeout=60, propagate=True)
    assert denied.value.reason == "budget_exhausted"
    assert counters.hget("fb:v1:{index_document}", "cd") == b"1"
    deadline = time.monotonic() + 30
    while (m := channel.basic_get(dead, no_ack=True)) is None:
        assert time.monotonic() < deadline, "no dead letter"
        time.sleep(0.05)
    assert m.headers["fb-reason"] == "budget_exhausted" and m.headers["fb-task"] == "index_document"
    assert m.headers["id"] == result.id and m.headers["fb-original-routing-key"] == queue
