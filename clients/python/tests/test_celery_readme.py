"""The Celery block of clients/python/README.md, run as written: a real Celery worker (solo pool)
on the RabbitMQ at 127.0.0.1:5672 under a queue of its own, the budget on a private redis-server.
``search`` is the dependency, here one that fails a given number of times."""

import importlib
import re
import sys
import uuid
from pathlib import Path

import pytest
import redis

import celery  # noqa: F401  (tests/python/requirements.txt)
from celery.contrib.testing.worker import start_worker  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"

SEARCH = '''
class Unavailable(Exception):
    pass

failures_left = 0
calls = 0

def index(doc_id):
    global failures_left, calls
    calls += 1
    if failures_left > 0:
        failures_left -= 1
        raise Unavailable("search is browning out")
    return f"indexed {doc_id}"
'''


def celery_block() -> str:
    text = README.read_text()
    section = text[text.index("## Celery"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def tasks(tmp_path, redis_url, monkeypatch):
    (tmp_path / "search.py").write_text(SEARCH)
    (tmp_path / "tasks.py").write_text(celery_block())
    (tmp_path / "fleet-budget.toml").write_text(
        "[redis]\ndeposit_flush_ms = 0\n[defaults]\nmin_allowance = 2\nratio = 0\n"
        "[tasks.index_document]\nbackoff_base_ms = 10\nbackoff_cap_ms = 50\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FLEET_BUDGET_REDIS_URL", redis_url)
    for name in ("tasks", "search"):
        sys.modules.pop(name, None)
    module = importlib.import_module("tasks")
    queue = f"fb-test-celery-{uuid.uuid4().hex[:12]}"
    module.app.conf.update(task_default_queue=queue, result_backend="rpc://",
                           broker_connection_timeout=5, worker_hijack_root_logger=False)
    yield module, importlib.import_module("search")
    module.budget.close()
    with module.app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)
    for name in ("tasks", "search"):
        sys.modules.pop(name, None)


def test_the_readme_celery_task_retries_within_the_budget(tasks, redis_url):
    module, search = tasks
    counters = redis.Redis.from_url(redis_url)
    with start_worker(module.app, pool="threads", concurrency=1, perform_ping_check=False, shutdown_timeout=20):
        # Two failures, two retries granted (the floor is 2), then the third attempt succeeds.
        search.failures_left = 2
        assert module.index_document.delay(7).get(timeout=30) == "indexed 7"
        assert search.calls == 3
        h = counters.hmget("fb:v1:{index_document}", "ca", "cs", "cr", "cd")
        assert [int(v) for v in h] == [1, 1, 2, 0], "one first attempt, attempts 2 and 3 are retries"
        # The budget is spent: the next failure is denied and the task fails.
        search.failures_left = 1
        with pytest.raises(search.Unavailable):
            module.index_document.delay(8).get(timeout=30, propagate=True)
        assert counters.hget("fb:v1:{index_document}", "cd") == b"1"
