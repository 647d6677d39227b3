"""The Redis settings that drop budgets silently, logged once when a budget starts (risks.py),
on private redis-servers: an eviction policy and no persistence named, noeviction with AOF not."""

from __future__ import annotations

import logging
import pathlib
import shutil
import subprocess
import time

import pytest
import redis

from fleet_budget import FleetBudget
from fleet_budget.risks import acl_user, read_redis_risks

from conftest import free_port


@pytest.fixture
def server(tmp_path, request):
    port = free_port()
    args = [shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", str(tmp_path), *request.param]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}"
    client = redis.Redis.from_url(url, socket_timeout=1)
    for _ in range(500):
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.01)
    yield url
    client.close()
    proc.kill()
    proc.wait(timeout=10)


def _risk_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Redis risk")]


@pytest.mark.parametrize("server", [["--maxmemory-policy", "allkeys-lru"]], indirect=True)
def test_an_eviction_policy_and_no_persistence_are_logged_once_at_start(server, caplog):
    caplog.set_level(logging.INFO, logger="fleet_budget")
    budget = FleetBudget(redis_url=server)
    try:
        for _ in range(300):
            if len(_risk_lines(caplog)) >= 2:
                break
            time.sleep(0.05)
        lines = _risk_lines(caplog)
        print(lines)
        assert sum("maxmemory-policy allkeys-lru" in line for line in lines) == 1, lines
        assert sum("RDB off" in line for line in lines) == 1, lines
        assert all("budgetctl doctor" in line for line in lines), lines
    finally:
        budget.close()


@pytest.mark.parametrize("server", [["--maxmemory-policy", "noeviction", "--appendonly", "yes"]],
                         indirect=True)
def test_noeviction_with_aof_is_no_risk(server):
    client = redis.Redis.from_url(server, socket_timeout=1)
    try:
        states = {check: state for check, state, *_ in read_redis_risks(client)}
    finally:
        client.close()
    assert states == {"maxmemory_policy": "ok", "persistence": "ok"}


def test_an_acl_user_is_read_from_the_url():
    assert acl_user("redis://fleet-worker:pw@h:6379/0") == "fleet-worker"
    assert acl_user("redis://:pw@h:6379") is None
    assert acl_user("redis://default:pw@h") is None


_README = pathlib.Path(__file__).resolve().parents[3] / "lua" / "README.md"


def _documented_users(password: str) -> list[list[str]]:
    lines = [line.split() for line in _README.read_text().splitlines()
             if line.startswith("ACL SETUSER ")]
    return [[f">{password}" if w == ">CHANGE-ME" else w for w in line] for line in lines]


@pytest.mark.parametrize("server", [["--maxmemory-policy", "allkeys-lru"]], indirect=True)
def test_the_worker_user_reads_the_policy_with_its_rights_and_acl_log_stays_empty(server, caplog):
    caplog.set_level(logging.INFO, logger="fleet_budget")
    admin = redis.Redis.from_url(server, socket_timeout=1)
    try:
        for user in _documented_users("risks-pw"):
            assert admin.execute_command(*user[0:]) in (b"OK", "OK", True), user
        admin.execute_command("ACL", "LOG", "RESET")
        url = server.replace("redis://", "redis://fleet-worker:risks-pw@")
        budget = FleetBudget(redis_url=url, key_prefix="fb")
        try:
            for _ in range(300):
                if _risk_lines(caplog):
                    break
                time.sleep(0.05)
        finally:
            budget.close()
        lines = [r.getMessage() for r in caplog.records if "Redis" in r.getMessage()]
        print(lines)
        assert sum("maxmemory-policy allkeys-lru" in line and "INFO memory" in line
                   for line in _risk_lines(caplog)) == 1, lines
        assert any("AOF off (INFO persistence)" in line for line in lines), lines
        assert not any("risks-pw" in line for line in lines), lines
        assert admin.execute_command("ACL", "LOG") == [], "nothing may be refused"
    finally:
        admin.close()


@pytest.mark.parametrize("server", [["--maxmemory-policy", "allkeys-lru"]], indirect=True)
def test_a_user_without_info_is_told_what_to_grant(server):
    admin = redis.Redis.from_url(server, socket_timeout=1)
    try:
        worker = next(u for u in _documented_users("risks-pw") if u[2] == "fleet-worker")
        admin.execute_command(*[w for w in worker if not w.startswith("+info|")])
        url = server.replace("redis://", "redis://fleet-worker:risks-pw@")
        client = redis.Redis.from_url(url, socket_timeout=1)
        try:
            risks = read_redis_risks(client, config=False)
        finally:
            client.close()
        print(risks)
        assert [state for _, state, *_ in risks] == ["not_checked", "not_checked"]
        assert all("+info|memory +info|persistence" in found for _, _, found, *_ in risks), risks
    finally:
        admin.close()


@pytest.mark.parametrize("server", [["--maxmemory-policy", "volatile-lru"]], indirect=True)
def test_the_asyncio_budget_logs_them_too(server, caplog):
    import asyncio

    from fleet_budget.aio import FleetBudget as AsyncFleetBudget

    caplog.set_level(logging.INFO, logger="fleet_budget")

    async def main() -> list[str]:
        budget = AsyncFleetBudget(redis_url=server)
        try:
            for _ in range(300):
                if len(_risk_lines(caplog)) >= 2:
                    break
                await asyncio.sleep(0.05)
            return _risk_lines(caplog)
        finally:
            await budget.close()

    lines = asyncio.run(main())
    assert sum("maxmemory-policy volatile-lru" in line for line in lines) == 1, lines
