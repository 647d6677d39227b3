"""fleet_budget.celery with a real Celery worker (thread pool; every pool: test_celery_pools.py) on the RabbitMQ at 127.0.0.1:5672,
under names of its own (a queue and an ``[amqp] prefix`` per test), the budget on a private
redis-server: retries through Celery, dead letters with the Rust worker's headers, confirm before
ack, and messages Celery would drop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import amqp
import pytest
import redis
from celery import Celery
from conftest import REPO

from fleet_budget.celery import DeadLettered
from fleet_budget.dead_letters import row

BROKER = "amqp://guest:guest@127.0.0.1:5672//"


def raw_channel() -> tuple[amqp.Connection, amqp.Channel]:
    conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest", connect_timeout=5)
    conn.connect()
    return conn, conn.channel()


def declare_dead(channel: amqp.Channel, prefix: str) -> str:
    """The dead-letter exchange and queue of migrations/0001_base_topology.toml."""
    name = f"{prefix}.dead"
    channel.exchange_declare(name, "fanout", durable=True, auto_delete=False)
    channel.queue_declare(name, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"})
    channel.queue_bind(name, name, "")
    return name


def get_all(channel: amqp.Channel, queue: str) -> list[amqp.Message]:
    out = []
    while (m := channel.basic_get(queue, no_ack=True)) is not None:
        out.append(m)
    return out


def wait_for(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def assert_indexed(redis_url: str, prefix: str, letters: list[amqp.Message]) -> None:
    """The dead-letter index of ``<prefix>.dead`` counts exactly ``letters``, each under the row
    the Rust tools read back from its headers as the broker delivered them (the worker sends its
    counts within 250 ms)."""
    expected = Counter(row(m.headers) for m in letters)
    assert None not in expected, [m.headers for m in letters]
    client = redis.Redis.from_url(redis_url)

    def indexed() -> Counter:
        return Counter({k.decode(): int(v) for k, v in client.hgetall(f"fb:v1:dead-letters:{{{prefix}.dead}}").items()})

    deadline = time.monotonic() + 5
    while indexed() != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert indexed() == expected


class Worker:
    """``celery -A celery_fleet worker`` (tests/python/celery_fleet.py) as a process of its own, on
    ``pool``: ``prefork`` is Celery's default, started as the Python guide says (no ``-P``); ``options``
    are more of the worker's command-line options."""

    def __init__(self, env: dict[str, str], log: Path, pool: str = "threads", concurrency: int = 2,
                 options: tuple[str, ...] = (), name: str = "") -> None:
        self.log = log
        pool_args = [] if pool == "prefork" else ["-P", pool]
        if pool != "solo":
            pool_args += ["-c", str(concurrency)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_fleet", "worker", *pool_args, *options,
             "-Q", env["FB_CELERY_QUEUE"], "--without-heartbeat", "--without-mingle", "--without-gossip",
             "-l", "INFO", "-n", f"{name or env['FB_CELERY_QUEUE']}@%h"],
            cwd=REPO / "tests" / "python", env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self.terminate()
        self.wait()

    def terminate(self) -> None:
        """Asks for a warm shutdown (several workers stop together: each takes seconds)."""
        self.proc.send_signal(signal.SIGTERM)

    def wait(self) -> None:
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def fleet(redis_url, tmp_path):
    """A Celery worker process on a queue of its own; a budget with floor 1 and ratio 0 (one retry
    per window) under an [amqp] prefix of its own; a client app to send with."""
    tag = uuid.uuid4().hex[:10]
    prefix, queue = f"fbpy{tag}", f"fbpy-celery-{tag}"
    config = tmp_path / "fleet-budget.toml"
    config.write_text(
        f'[amqp]\nprefix = "{prefix}"\n[redis]\ndeposit_flush_ms = 0\ntimeout_ms = 2000\n'
        "[defaults]\nmin_allowance = 1\nratio = 0\nwindow_secs = 3600\n"
        '[dependencies.search]\ntasks = ["index_document"]\n'
        "[tasks.index_document]\nbackoff_base_ms = 10\nbackoff_cap_ms = 50\n")
    env = {**os.environ, "FB_CONFIG": str(config), "FB_CELERY_QUEUE": queue, "FLEET_BUDGET_REDIS_URL": redis_url}
    client = Celery(f"client{tag}", broker=BROKER)
    client.conf.update(task_default_queue=queue, result_backend="rpc://", broker_connection_timeout=5)
    conn, channel = raw_channel()
    started: list[Worker] = []

    def start() -> Worker:
        started.append(Worker(env, tmp_path / f"worker{len(started)}.log"))
        return started[-1]

    calls = lambda: int(redis.Redis.from_url(redis_url).get(f"{queue}:calls") or 0)  # noqa: E731
    yield client, start, channel, prefix, queue, calls
    for w in started:
        w.stop()
        print(w.log.read_text(errors="replace")[-4000:])
    for name in (queue, f"{prefix}.dead"):
        channel.queue_delete(name)
        channel.exchange_delete(name)
    conn.close()


def send(client, *args, **kwargs):
    return client.send_task("index_document", args, kwargs)


def test_granted_retries_run_through_celery_and_a_denial_is_dead_lettered_with_the_rust_headers(fleet, redis_url):
    client, start, channel, prefix, queue, calls = fleet
    dead = declare_dead(channel, prefix)
    start()
    # One retry granted (the floor): attempt 2 succeeds.
    assert send(client, 1, fail=1).get(timeout=30) == "indexed 1"
    # The next failure is denied: dead-lettered, and the caller sees why.
    result = send(client, 2, fail=5, error="GET https://bob:hunter2@search/x: 503")
    with pytest.raises(DeadLettered) as denied:
        result.get(timeout=30, propagate=True)
    assert denied.value.reason == "budget_exhausted" and "hunter2" not in str(denied.value)
    # Not retryable: dead-lettered at once, the budget not asked.
    with pytest.raises(DeadLettered):
        send(client, 3, fail=-1).get(timeout=30, propagate=True)
    counters = redis.Redis.from_url(redis_url).hmget("fb:v1:{search}", "ca", "cs", "cr", "cd")
    assert [int(v) for v in counters] == [3, 1, 1, 1], "3 first attempts, 1 success, 1 retry, 1 denial"
    letters = get_all(channel, dead)
    assert len(letters) == 2, [m.headers for m in letters]
    by_reason = {m.headers["fb-reason"]: m for m in letters}
    m = by_reason["budget_exhausted"]
    hd = m.headers
    assert hd["fb-task"] == "index_document" and hd["fb-dependency"] == "search"
    # Celery sends to a direct queue through the default exchange, routing key = the queue.
    assert hd["fb-original-exchange"] == "" and hd["fb-original-routing-key"] == queue
    assert hd["fb-original-queue"] == queue
    assert hd["fb-attempts"] == 1 and hd["fb-budget-source"] == "fleet"
    assert hd["fb-budget-allowance"] == 1 and hd["fb-budget-retries"] == 1
    assert hd["fb-budget-window-ms"] == 3_600_000 and hd["fb-replays"] == 0
    assert hd["fb-error-class"] == "Unavailable"
    assert "hunter2" not in hd["fb-error"] and "bob:***@search" in hd["fb-error"], hd["fb-error"]
    assert hd["fb-dead-lettered-ms"] >= hd["fb-first-failure-ms"] > 0
    # Celery's protocol 2, ready to run again: task, id, retries 0, the body as sent.
    assert hd["task"] == "index_document" and hd["id"] == result.id and hd["retries"] == 0
    assert hd["eta"] is None and hd["expires"] is None
    assert m.properties["message_id"] == result.id and m.properties["correlation_id"] == result.id
    assert m.properties["content_type"] == "application/json" and m.properties["delivery_mode"] == 2
    args, kwargs, embed = json.loads(m.body)
    assert args == [2] and kwargs == {"fail": 5, "error": "GET https://bob:hunter2@search/x: 503"}
    assert set(embed) == {"callbacks", "errbacks", "chain", "chord"}
    n = by_reason["non_retryable"].headers
    assert n["fb-error-class"] == "BadRequest" and n["fb-budget-source"] == "not_consulted"
    assert "fb-budget-allowance" not in n
    assert_indexed(redis_url, prefix, letters)


def test_a_retried_job_carries_its_first_failure_and_a_denial_after_retries_counts_the_attempts(fleet):
    client, start, channel, prefix, queue, calls = fleet
    dead = declare_dead(channel, prefix)
    start()
    with pytest.raises(DeadLettered):
        send(client, 4, fail=5).get(timeout=30, propagate=True)
    (m,) = get_all(channel, dead)
    hd = m.headers
    assert hd["fb-reason"] == "budget_exhausted" and hd["fb-attempts"] == 2, "attempt 1 retried, attempt 2 denied"
    assert hd["retries"] == 0, "the dead letter starts its next life at attempt 1"
    assert hd["fb-first-failure-ms"] < hd["fb-dead-lettered-ms"]
    assert calls() == 2


def test_an_unconfirmed_dead_letter_is_not_acked_and_the_job_comes_back(fleet, redis_url):
    """No dead-letter exchange: the copy is refused, the job is requeued and runs again; once the
    exchange exists, it is dead-lettered. Nothing is lost."""
    client, start, channel, prefix, queue, calls = fleet
    start()
    send(client, 5, fail=-1)
    wait_for(lambda: calls() >= 3, "the job to come back twice")
    dead = declare_dead(channel, prefix)
    letters = wait_for(lambda: get_all(channel, dead), "the dead letter")
    assert [m.headers["fb-reason"] for m in letters] == ["non_retryable"]
    wait_for(lambda: channel.queue_declare(queue, passive=True).message_count == 0, "the queue to drain")
    # Counted once: the copies the broker refused were not.
    assert_indexed(redis_url, prefix, letters)


def test_messages_celery_would_drop_are_dead_lettered(fleet, redis_url):
    """A body that cannot be decoded, an unknown task, a malformed fb-* header or Celery retries
    header: non_retryable dead letters (classes poison, unknown_task, malformed_header)."""
    client, start, channel, prefix, queue, calls = fleet
    dead = declare_dead(channel, prefix)
    channel.queue_declare(queue, durable=True, auto_delete=False)
    headers = {"lang": "py", "task": "index_document", "id": "garbage-1", "retries": 0}
    body = json.dumps([[1], {}, {}]).encode()
    for raw, extra in [(b"\xff{not json", {}), (body, {"task": "no_such_task", "id": "u-1"}),
                       (body, {"id": "m-1", "fb-replays": "many"}), (body, {"id": "r-1", "retries": "x"})]:
        channel.basic_publish(amqp.Message(raw, content_type="application/json", content_encoding="utf-8",
                                           application_headers={**headers, **extra}),
                              exchange="", routing_key=queue)
    start()
    letters: list[amqp.Message] = []
    while len(letters) < 4:
        letters += wait_for(lambda: get_all(channel, dead), "dead letters")
    by_class = {(m.headers["fb-error-class"], m.headers["id"]): m for m in letters}
    assert set(by_class) == {("poison", "garbage-1"), ("unknown_task", "u-1"), ("malformed_header", "m-1"),
                             ("malformed_header", "r-1")}, by_class
    by_class = {k[0] if k[1] != "r-1" else "retries": m for k, m in by_class.items()}
    assert "retries" in by_class["retries"].headers["fb-error"]
    assert by_class["poison"].body == b"\xff{not json", "the body as it came"
    assert by_class["poison"].headers["fb-dependency"] == "search"
    assert by_class["unknown_task"].headers["fb-dependency"] == "no_such_task"
    assert "fb-replays" in by_class["malformed_header"].headers["fb-error"]
    for m in letters:
        assert m.headers["fb-reason"] == "non_retryable" and m.headers["fb-original-routing-key"] == queue
    assert calls() == 0, "none of them ran the task"
    assert_indexed(redis_url, prefix, letters)
