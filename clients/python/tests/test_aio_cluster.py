"""The asyncio flavour on a Redis Cluster of three private masters (made with
``redis-cli --cluster create``): the budget and the concurrency budget on the master of each
dependency's slot, and a cluster that does not answer decided by the fallback."""

import asyncio
import shutil
import socket
import subprocess
import time

import pytest
import redis
from redis.cluster import RedisCluster

from fleet_budget import CONCURRENCY_CAP, SUCCEEDED, Call, Config, DeadLetter, Failure, Retry
from fleet_budget.aio import FleetBudget

from conftest import free_port


def cluster_bus_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def cluster_urls(tmp_path):
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    assert server and cli, "redis-server and redis-cli are not installed (.ci/run installs them)"
    ports: list[int] = []
    while len(ports) < 3:  # a node also listens on its port + 10000 (the cluster bus)
        port = free_port()
        if port + 10000 <= 65535 and port not in ports and cluster_bus_free(port + 10000):
            ports.append(port)
    procs = []
    for port in ports:
        d = tmp_path / str(port)
        d.mkdir()
        procs.append(subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(d), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        for port in ports:
            c = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
            for _ in range(500):
                assert all(p.poll() is None for p in procs), "a cluster node did not start"
                try:
                    c.ping()
                    break
                except redis.exceptions.ConnectionError:
                    time.sleep(0.01)
            c.close()
        made = subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
                               "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, timeout=60)
        assert made.returncode == 0, made.stdout.decode() + made.stderr.decode()
        for port in ports:
            c = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
            for _ in range(3000):
                if c.cluster("info").get("cluster_state") == "ok":
                    break
                time.sleep(0.01)
            else:
                pytest.fail(f"the cluster node {port} never said cluster_state:ok")
            c.close()
        yield [f"redis://127.0.0.1:{p}" for p in ports]
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


TOML = """
[redis]
timeout_ms = 10000
deposit_flush_ms = 0
[defaults]
min_allowance = 2
ratio = 0.5
[dependencies.search]
tasks = ["index"]
[dependencies.paid-api]
tasks = ["charge"]
[dependencies.paid-api.concurrency]
cap = 3
planned_primary = 2
min_retry_slots = 3
"""


def budget(urls, text=TOML):
    seeds = ", ".join(f'"{u}"' for u in urls)
    return FleetBudget(Config.from_toml(text.replace("[redis]", f"[redis]\ncluster_urls = [{seeds}]"), "t"))


def test_decisions_and_leases_on_the_master_of_each_slot(cluster_urls):
    async def go():
        b = budget(cluster_urls)
        for _ in range(6):
            await b.on_attempt("index", 1)
            await b.on_success("index")
        decisions = [await b.on_failure("index", 1, Failure.retryable("503")) for _ in range(4)]
        calls = [await b.admit("charge", 2) for _ in range(3)]
        refused = await b.admit("charge", 2)
        leased = [c.lease is not None for c in calls]
        seen = RedisCluster.from_url(cluster_urls[0])
        held = seen.zcard("fb:v1:{paid-api}:lr")
        for c in calls:
            await b.finish(c, SUCCEEDED)
        left = seen.zcard("fb:v1:{paid-api}:lr")
        counts = seen.hmget("fb:v1:{search}", "cs", "ca", "cr")
        seen.close()
        assert b.metrics.value("fleet_budget_store_errors_total", kind="connection") == 0
        await b.close()
        return decisions, leased, refused, held, left, counts

    decisions, leased, refused, held, left, counts = asyncio.run(go())
    assert [type(d) for d in decisions] == [Retry, Retry, Retry, DeadLetter], "allowance floor(0.5 x 6) = 3"
    assert all(d.source == "fleet" for d in decisions)
    assert leased == [True] * 3, "each retry holds a lease on the slot's master"
    assert isinstance(refused, DeadLetter) and refused.reason == CONCURRENCY_CAP
    assert (held, left) == (3, 0)
    assert counts == [b"6", b"6", b"3"]


def test_a_cluster_that_does_not_answer_is_the_fallback(dead_url):
    async def go():
        b = budget([dead_url], TOML.replace("timeout_ms = 10000", "timeout_ms = 200"))
        decision = await b.on_failure("index", 1, Failure.retryable("503"))
        call = await b.admit("charge", 2)
        errors = b.metrics.value("fleet_budget_store_errors_total", kind="connection")
        await b.close()
        return decision, call, errors

    decision, call, errors = asyncio.run(go())
    assert isinstance(decision, Retry) and decision.source == "local_fallback"
    assert isinstance(call, Call) and call.lease is None
    assert errors >= 1
