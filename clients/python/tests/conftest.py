"""A private redis-server per test that asks for one (never the shared 6379)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis

REPO = Path(__file__).resolve().parents[3]


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
