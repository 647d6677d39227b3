"""A FleetBudget in a forked child (``os.fork``, ``multiprocessing``), on a private redis-server and
the RabbitMQ at 127.0.0.1:5672: the child sends its own deposits (by its own flusher, within
``deposit_flush_ms``, and when it ends) and never its parent's; it has its own connections and
metrics; a fork while other threads hold the client's locks, a connection or a call in flight
cannot deadlock the child or make it share a socket. Every child is bounded by a timeout."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
import traceback
import uuid

import amqp
import kombu
import pytest
import redis
from prometheus_client import CollectorRegistry

from fleet_budget import Config, Failure, FleetBudget, Metrics, Retry
from fleet_budget.publish import ConfirmedPublisher

BROKER = "amqp://guest:guest@127.0.0.1:5672//"
TOML = """
[redis]
deposit_flush_ms = {flush_ms}
timeout_ms = 5000
[defaults]
min_allowance = 10
window_secs = 3600
[dependencies.search]
tasks = ["index_document"]
"""
#: How long a child may take before the test calls it deadlocked.
CHILD_TIMEOUT = 30.0


def budget(url: str, flush_ms: int, **kw) -> FleetBudget:
    return FleetBudget(Config.from_toml(TOML.format(flush_ms=flush_ms)), redis_url=url, **kw)


def counters(url: str) -> tuple[int, int, int]:
    """Successes, first attempts and retries of ``search`` in Redis (both windows)."""
    h = redis.Redis.from_url(url).hgetall("fb:v1:{search}")
    return tuple(int(h.get(c, 0)) + int(h.get(p, 0)) for c, p in ((b"cs", b"ps"), (b"ca", b"pa"), (b"cr", b"pr")))


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def in_child(body) -> None:
    """Runs ``body()`` in a child of ``os.fork``, which leaves with ``os._exit`` (no atexit, as a
    Celery prefork child); fails the test if it raises or has not ended within CHILD_TIMEOUT."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + CHILD_TIMEOUT
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0, "the child failed (its traceback is above)"
            return
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the child did not end within {CHILD_TIMEOUT} s: deadlocked")


def test_a_forked_child_flushes_its_own_deposits_and_never_its_parents(redis_url):
    b = budget(redis_url, flush_ms=1000)
    for _ in range(5):
        b.on_success("index_document")
    assert b.pending_deposits() == 5, "the parent's, not yet flushed at the fork"

    def child():
        assert b.pending_deposits() == 0, "the parent's pending deposits are the parent's to send"
        for _ in range(3):
            b.on_attempt("index_document", 1)
            b.on_success("index_document")
        # No flush() and no close(): the child's own flusher sends them within deposit_flush_ms.
        # Drained is not yet sent: the flusher takes the pending counts, then calls Redis.
        assert wait_until(lambda: counters(redis_url)[1] == 3), "the child's flusher never ran"
        assert b.pending_deposits() == 0
        # The child's metrics count the child's work only.
        assert b.metrics.value("fleet_budget_successes_total", dependency="search") == 3

    in_child(child)
    assert b.metrics.value("fleet_budget_successes_total", dependency="search") == 5
    assert b.close() == 0
    assert counters(redis_url) == (8, 3, 0), "5 of the parent's and 3 of the child's, each sent once"


def test_a_child_that_exits_sends_what_it_counted(redis_url):
    """``multiprocessing`` children end through ``os._exit``, atexit not run: their deposits are
    sent on the way out, though the flush interval (10 s) has not come."""
    global _budget
    b = _budget = budget(redis_url, flush_ms=10_000)
    ctx = multiprocessing.get_context("fork")
    # Each child's first job waits at the barrier until all three children have one: without it,
    # on a loaded machine one child could take all 30 jobs before the others start, and the test
    # would not see several children each send their own deposits.
    barrier = ctx.Barrier(3)
    with ctx.Pool(3, initializer=_meet_at, initargs=(barrier,)) as pool:
        pids = set(pool.map(_one_job, range(30), chunksize=1))
        pool.close()
        pool.join()
    assert len(pids) == 3 and os.getpid() not in pids
    process = ctx.Process(target=_one_job, args=(0,))
    process.start()
    process.join(CHILD_TIMEOUT)
    assert process.exitcode == 0
    assert wait_until(lambda: counters(redis_url) == (31, 31, 0)), counters(redis_url)
    assert b.pending_deposits() == 0 and b.close() == 0


_budget: FleetBudget
#: Set in a pool child by ``_meet_at``: the barrier its first job waits at (None elsewhere).
_barrier = None


def _meet_at(barrier) -> None:
    global _barrier
    _barrier = barrier


def _one_job(_: int) -> int:
    """A job in a ``multiprocessing`` child, on the budget it inherited from the test."""
    global _barrier
    if _barrier is not None:
        barrier, _barrier = _barrier, None
        barrier.wait(timeout=CHILD_TIMEOUT)
    _budget.on_attempt("index_document", 1)
    _budget.on_success("index_document")
    return os.getpid()


@pytest.fixture
def confirm_exchange():
    """A fanout exchange and queue of the test's own on the RabbitMQ at 127.0.0.1:5672."""
    name = f"fbpy-fork-{uuid.uuid4().hex[:10]}"
    conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest", connect_timeout=5)
    conn.connect()
    channel = conn.channel()
    channel.exchange_declare(name, "fanout", durable=False, auto_delete=False)
    channel.queue_declare(name, durable=False, auto_delete=False)
    channel.queue_bind(name, name, "")
    yield name, lambda: channel.queue_declare(name, passive=True).message_count
    channel.queue_delete(name)
    channel.exchange_delete(name)
    conn.close()


def test_a_fork_while_other_threads_hold_the_locks_deadlocks_nothing(redis_url, confirm_exchange):
    """A parent's thread holds every lock of the budget, its group commit, its metrics and the
    dead-letter publisher (mid-publish) when the process forks: the child decides, deposits,
    batches, publishes with a confirm and closes; the parent, its locks released, goes on on its
    own connections, undisturbed by the child."""
    exchange, published = confirm_exchange
    b = budget(redis_url, flush_ms=100)
    publisher = ConfirmedPublisher(lambda: kombu.Connection(BROKER), timeout=5)
    publisher.publish(exchange, "", b"parent-1", {}, {})  # the parent's connection is open
    b.on_success("index_document")
    assert wait_until(lambda: b.pending_deposits() == 0), "the parent's flusher runs"
    locks = [b._deposits._lock, b._health._lock, b._own_lock, b._jitter._lock, b.local._lock, b._group._lock,
             b._admission._lease_ids._lock, b._denials._lock, b._enforcement._lock, b.metrics._lock, b.metrics.registry._lock, publisher._lock,
             b.metrics.successes.labels("search")._value._lock]
    held, release = threading.Event(), threading.Event()

    def hold():
        for lock in locks:
            lock.acquire()
        held.set()
        release.wait()
        for lock in locks:
            lock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)

    def child():
        b.on_attempt("index_document", 1)
        decisions: list = []
        threads = [threading.Thread(target=lambda: decisions.append(
            b.on_failure("index_document", 1, Failure.retryable("503")))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [type(d) for d in decisions] == [Retry] * 8 and {d.source for d in decisions} == {"fleet"}
        b.on_success("index_document")
        publisher.publish(exchange, "", b"child", {}, {})
        publisher.close()
        assert b.close() == 0

    try:
        in_child(child)
    finally:
        release.set()
        holder.join()
    assert counters(redis_url) == (2, 1, 8), "the parent's success; the child's first attempt, 8 retries, success"
    publisher.publish(exchange, "", b"parent-2", {}, {})  # the child left the parent's socket alone
    publisher.close()
    assert wait_until(lambda: published() == 3)
    b.on_success("index_document")
    assert b.close() == 0 and counters(redis_url) == (3, 1, 8)


def test_a_fork_in_the_middle_of_a_flush_shares_no_socket(redis_url):
    """The parent's flush is in flight (the server paused) when the process forks: the parent's
    call is answered to the parent, the child's on a connection of its own, each counted once."""
    b = budget(redis_url, flush_ms=10_000)
    b.on_success("index_document")
    b.flush()  # the script loaded, the parent's connection open
    admin = redis.Redis.from_url(redis_url)
    sent = threading.Event()
    deposit = b._deposits._script

    def deposit_then_note(*args, **kwargs):
        sent.set()
        return deposit(*args, **kwargs)

    b._deposits._script = deposit_then_note
    for _ in range(5):
        b.on_success("index_document")
    admin.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
    flushing = threading.Thread(target=b.flush)
    flushing.start()
    assert sent.wait(10)
    time.sleep(0.2)  # the call is on the wire, waiting for the paused server

    def child():
        assert b.pending_deposits() == 0
        for _ in range(3):
            b.on_success("index_document")
        b.flush()
        assert b.pending_deposits() == 0 and not b.in_fallback
        assert b.close() == 0

    in_child(child)
    flushing.join(10)
    assert b.pending_deposits() == 0 and not b.in_fallback, "the parent's call was answered to the parent"
    assert b.close() == 0
    assert counters(redis_url) == (9, 0, 0), "1 + 5 of the parent's, 3 of the child's"


def test_the_asyncio_flavour_in_a_forked_child(redis_url):
    """The asyncio budget, used by the parent in an event loop, then by a forked child in a loop
    of its own: the child's calls go on a client of its own, its deposits by its own flusher."""
    from fleet_budget.aio import FleetBudget as AsyncBudget

    b = AsyncBudget(Config.from_toml(TOML.format(flush_ms=100)), redis_url=redis_url)

    async def parent():
        await b.on_success("index_document")
        await b.flush()
        return await b.status("search")

    assert asyncio.run(parent())[1] == "fleet"

    def child():
        async def run():
            await b.on_attempt("index_document", 1)
            for _ in range(3):
                await b.on_success("index_document")
            decision = await b.on_failure("index_document", 1, Failure.retryable("503"))
            assert isinstance(decision, Retry) and decision.source == "fleet", decision
            for _ in range(500):  # the flusher is a task of this loop: wait in the loop
                if counters(redis_url)[0] == 4:
                    break
                await asyncio.sleep(0.02)
            assert counters(redis_url)[0] == 4, "the child's flusher never ran"
            assert await b.close() == 0

        asyncio.run(run())

    in_child(child)
    assert counters(redis_url) == (4, 1, 1)


def test_a_registry_that_was_passed_in_holds_the_childs_metrics_in_the_child(redis_url):
    registry = CollectorRegistry()
    b = budget(redis_url, flush_ms=100, metrics=Metrics(registry))
    b.on_success("index_document")
    parents = b.metrics

    def child():
        assert b.metrics is not parents and b.metrics.registry is registry
        b.on_success("index_document")
        b.on_success("index_document")
        assert registry.get_sample_value("fleet_budget_successes_total", {"dependency": "search"}) == 2
        assert b.close() == 0

    in_child(child)
    assert registry.get_sample_value("fleet_budget_successes_total", {"dependency": "search"}) == 1
    assert b.close() == 0 and counters(redis_url)[0] == 3
