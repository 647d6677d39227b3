"""The worker registry, written by the Python client (``fleet_budget.registry``), on a private
redis-server: a budget reports as a Python worker with the Rust library's report (v1), lists the
dependencies it decides from its fallback (a Redis ACL refusing one dependency's key), leaves on
``close()``; a forked child is a worker of its own; ``heartbeat_ms = 0`` sends nothing; the
asyncio flavour reports too. Celery's prefork pool: test_registry_celery.py."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from importlib import metadata

import redis

from fleet_budget import PROBE_INTERVAL_MS, Config, Failure, FleetBudget
from fleet_budget import aio, registry
from test_fork import in_child

REPORTS, SEEN = "fb:v1:workers:{workers}", "fb:v1:workers:{workers}:seen"


def config(heartbeat_ms: int = 100) -> Config:
    return Config.from_toml(
        f"[redis]\nheartbeat_ms = {heartbeat_ms}\ntimeout_ms = 1000\ndeposit_flush_ms = 0\n"
        '[dependencies.search]\ntasks = ["find"]\n[dependencies.mail]\ntasks = ["send"]\n')


def reports(url: str) -> dict[str, dict]:
    """Every entry of the registry: worker id -> its report (parsed)."""
    raw = redis.Redis.from_url(url).hgetall(REPORTS)
    return {k.decode(): json.loads(v) for k, v in raw.items()}


def wait_until(predicate, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_budget_reports_as_a_python_worker_and_leaves_on_close(redis_url):
    b = FleetBudget(config(), redis_url=redis_url)
    wid = b.worker_id
    assert wid is not None
    report = wait_until(lambda: reports(redis_url).get(wid), "the worker's report")
    host = registry.host_name()
    assert re.fullmatch(rf"{re.escape(host)}-{os.getpid()}-[0-9a-f]{{4}}", wid), wid
    assert report == {"v": 1, "id": wid, "host": host, "pid": os.getpid(), "lang": "python",
                      "version": metadata.version("fleet-budget"), "started_ms": report["started_ms"],
                      "interval_ms": 100, "fallback": [], "fallback_more": 0}
    assert abs(report["started_ms"] - time.time() * 1000) < 3_600_000, "the wall clock, in ms"
    state = redis.Redis.from_url(redis_url)
    assert state.zscore(SEEN, wid) is not None
    # Retention: twenty beats, at least ten minutes (as the Rust library keeps it).
    assert 0 < state.pttl(REPORTS) <= 600_000 and 0 < state.pttl(SEEN) <= 600_000
    # Decisions are made alongside, unaffected.
    assert b.on_failure("find", 1, Failure.retryable("503")).source == "fleet"
    b.close()
    assert wid not in reports(redis_url) and state.zscore(SEEN, wid) is None, "close() leaves"
    time.sleep(0.3)
    assert wid not in reports(redis_url), "and no beat lands after the leave"


def test_a_budget_refused_a_dependency_reports_it_in_fallback_while_its_heartbeat_lands(redis_url):
    """A Redis user that may write the registry but not the budget of ``search`` (NOPERM): the
    budget decides ``search`` from its fallback and says so in its report, with how long by its
    own clock; once Redis lets it decide again, the next report says that too."""
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("ACL", "SETUSER", "w", "on", ">pw", "resetkeys", "~fb:v1:workers:*", "+@all")
    now = [1_000_000]
    b = FleetBudget(config(), redis_url=redis_url.replace("redis://", "redis://w:pw@"), clock=lambda: now[0])
    wid = b.worker_id
    decision = b.on_failure("find", 1, Failure.retryable("503"))
    assert decision.source == "local_fallback" and b.in_fallback, "NOPERM on fb:v1:{search} is a store failure"
    now[0] += 1200
    assert b.fallback_dependencies() == [("search", 1200)]
    in_fallback = [{"dependency": "search", "for_ms": 1200}]  # mail was never asked
    report = wait_until(lambda: (r := reports(redis_url).get(wid)) and r["fallback"] == in_fallback and r,
                        "search in fallback for 1200 ms")
    assert report["fallback_more"] == 0 and report["lang"] == "python"
    seen = admin.zscore(SEEN, wid)
    wait_until(lambda: admin.zscore(SEEN, wid) != seen, "the next beat to land")

    admin.execute_command("ACL", "SETUSER", "w", "~fb:v1:*")
    now[0] += 2 * PROBE_INTERVAL_MS
    assert b.on_failure("find", 1, Failure.retryable("503")).source == "fleet"
    assert not b.in_fallback and b.fallback_dependencies() == []
    wait_until(lambda: reports(redis_url)[wid]["fallback"] == [], "the report without fallback")
    b.close()
    assert wid not in reports(redis_url)


def test_a_forked_child_reports_under_its_own_id_and_pid(redis_url):
    """The child is a new worker: its own id and pid, its own writer; it never writes or leaves
    the parent's entry, which stays the parent's."""
    b = FleetBudget(config(), redis_url=redis_url)
    parent_id, parent_pid = b.worker_id, os.getpid()
    wait_until(lambda: parent_id in reports(redis_url), "the parent's report")

    def child():
        wid = b.worker_id
        assert wid != parent_id and wid.startswith(f"{registry.host_name()}-{os.getpid()}-"), wid
        report = wait_until(lambda: reports(redis_url).get(wid), "the child's report")
        assert report["pid"] == os.getpid() and report["id"] == wid
        b.on_failure("find", 1, Failure.retryable("503"))
        redis.Redis.from_url(redis_url).rpush("child-ids", wid)
        b.close()

    in_child(child)
    child_id = redis.Redis.from_url(redis_url).lpop("child-ids").decode()
    everyone = reports(redis_url)
    assert child_id not in everyone, "the child left its own entry on close()"
    assert everyone[parent_id]["pid"] == parent_pid, "the parent's entry is still the parent's"
    assert set(everyone) == {parent_id}
    b.close()
    assert reports(redis_url) == {}


def test_a_forked_child_that_never_closes_leaves_at_exit(redis_url):
    """A ``multiprocessing`` child ends through ``os._exit``: it leaves on its way out (forks.py),
    gone rather than silent."""
    import multiprocessing

    b = FleetBudget(config(), redis_url=redis_url)

    def child(queue):
        queue.put(b.worker_id)
        wait_until(lambda: b.worker_id in reports(redis_url), "the child's report")

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=child, args=(queue,))
    p.start()
    child_id = queue.get(timeout=30)
    p.join(timeout=30)
    assert p.exitcode == 0
    assert child_id != b.worker_id and child_id not in reports(redis_url)
    assert b.worker_id in reports(redis_url)
    b.close()


def test_heartbeat_ms_0_sends_nothing(redis_url):
    off = FleetBudget(config(0), redis_url=redis_url)
    assert off.worker_id is None
    off.on_failure("find", 1, Failure.retryable("503"))
    on = FleetBudget(config(), redis_url=redis_url)
    wait_until(lambda: on.worker_id in reports(redis_url), "the other budget's report")
    assert set(reports(redis_url)) == {on.worker_id}, "only the budget that reports"
    off.close()
    on.close()
    assert not redis.Redis.from_url(redis_url).exists(REPORTS)


def test_the_asyncio_flavour_reports_its_fallback_and_leaves_on_close(redis_url):
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("ACL", "SETUSER", "w", "on", ">pw", "resetkeys", "~fb:v1:workers:*", "+@all")

    async def run():
        b = aio.FleetBudget(config(), redis_url=redis_url.replace("redis://", "redis://w:pw@"))
        wid = b.worker_id
        decision = await b.on_failure("find", 1, Failure.retryable("503"))
        deadline = time.monotonic() + 10
        while not (reports(redis_url).get(wid) or {}).get("fallback") and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        report = reports(redis_url).get(wid)
        await b.close()
        return wid, decision, report, reports(redis_url)

    wid, decision, report, after = asyncio.run(run())
    assert decision.source == "local_fallback"
    assert report is not None and report["lang"] == "python" and report["pid"] == os.getpid()
    assert [f["dependency"] for f in report["fallback"]] == ["search"]
    assert wid not in after, "close() leaves"


def test_the_report_keeps_to_the_script_bounds_whatever_is_in_fallback():
    reg = registry.Registry(lambda **_: None, "fb", 5000)
    reg.id = "w" * 200
    many = [(f"{i:03}" + "d" * 197, 1) for i in range(100)]
    text = reg.report(many)
    assert len(text.encode()) <= registry.MAX_REPORT_BYTES
    v = json.loads(text)
    listed = len(v["fallback"])
    assert listed > 0 and v["fallback_more"] == 100 - listed
    v = json.loads(reg.report([(f"d{i}", 1) for i in range(100)]))
    assert len(v["fallback"]) == registry.MAX_FALLBACK_LISTED and v["fallback_more"] == 36
    assert registry.sanitize(" a\u202eb\u200bc\n", 200) == "abc"
    assert len(registry.sanitize("é" * 150, 200).encode()) == 200
    assert registry.retention_ms(5000) == 600_000 and registry.retention_ms(300_000) == 6_000_000


def test_failed_beats_are_logged_once_per_run_of_failures_and_decide_nothing(redis_url, caplog):
    """A Redis user refused the registry (NOPERM, counted in Redis's ACL LOG): the beats fail,
    logged at debug once for the run; decisions are made from Redis all along (a failed beat is no
    store failure). Allowed again, the entry lands; refused again, a second run, a second line."""
    import logging

    caplog.set_level(logging.DEBUG, logger="fleet_budget")
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("ACL", "SETUSER", "w", "on", ">pw", "resetkeys", "~fb:v1:{*", "+@all")

    def refused_beats() -> int:
        return sum(int(e["count"]) for e in admin.acl_log() if e.get("object") == REPORTS)

    def failure_lines() -> int:
        return sum("worker registry heartbeat" in r.getMessage() for r in caplog.records)

    b = FleetBudget(config(), redis_url=redis_url.replace("redis://", "redis://w:pw@"))
    wait_until(lambda: refused_beats() >= 3, "three refused beats")
    assert failure_lines() == 1, "one line for the run"
    assert b.on_failure("find", 1, Failure.retryable("503")).source == "fleet" and not b.in_fallback
    admin.execute_command("ACL", "SETUSER", "w", "~fb:v1:*")
    wait_until(lambda: b.worker_id in reports(redis_url), "the entry once allowed")
    admin.execute_command("ACL", "SETUSER", "w", "resetkeys", "~fb:v1:{*")
    before = refused_beats()
    wait_until(lambda: refused_beats() >= before + 3, "three more refused beats")
    assert failure_lines() == 2, "a second run, a second line"
    assert b.fallback_dependencies() == []
    b.close()
