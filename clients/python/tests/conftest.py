"""A private redis-server per test that asks for one (never the shared 6379). Run by
scripts/test-python-package against the installed wheel, with ``FLEET_BUDGET_INSTALLED_AT`` (its
site-packages): the session refuses to start if ``fleet_budget`` is imported from anywhere else,
such as the source tree."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis

REPO = Path(__file__).resolve().parents[3]


def pytest_sessionstart(session):
    installed_at = os.environ.get("FLEET_BUDGET_INSTALLED_AT")
    if installed_at:
        import fleet_budget

        where = Path(fleet_budget.__file__).resolve()
        if not where.is_relative_to(Path(installed_at).resolve()):
            raise pytest.UsageError(f"fleet_budget is imported from {where}, not from the installed {installed_at}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
    server = shutil.which("redis-server")
    assert server, "redis-server is not installed (.ci/run installs it)"
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}"
    client = redis.Redis.from_url(url, socket_timeout=1)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.01)
    else:
        proc.kill()
        pytest.fail("redis-server did not start")
    yield url
    client.close()
    proc.kill()
    proc.wait(timeout=10)


@pytest.fixture
def dead_url():
    """A URL nothing listens on."""
    return f"redis://127.0.0.1:{free_port()}"
