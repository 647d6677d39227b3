"""rediss:// from the Python client with the Rust library's keys (redis.tls_ca_file, ...,
FLEET_BUDGET_REDIS_CA_FILE), against a private redis-server with a TLS port and certificates
made here; a wrong CA or host name is refused, never connected without verification."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import redis

from fleet_budget import Config, FleetBudget
from fleet_budget.config import ConfigError

from conftest import free_port


def _openssl(cwd, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(cwd, name: str) -> None:
    _openssl(cwd, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", f"{name}.key", "-out", f"{name}.pem")


@pytest.fixture
def tls_server(tmp_path):
    assert shutil.which("openssl"), "openssl is not installed (.ci/run installs it)"
    _ca(tmp_path, "ca")
    _ca(tmp_path, "other")
    (tmp_path / "server.ext").write_text(
        "basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _openssl(tmp_path, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-subj", "/CN=localhost", "-keyout", "server.key", "-out", "server.csr")
    _openssl(tmp_path, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.pem")
    port, tls_port = free_port(), free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--dir", str(tmp_path), "--tls-port", str(tls_port),
         "--tls-cert-file", str(tmp_path / "server.pem"), "--tls-key-file", str(tmp_path / "server.key"),
         "--tls-ca-cert-file", str(tmp_path / "ca.pem"), "--tls-auth-clients", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    plain = redis.Redis(port=port, socket_timeout=1)
    for _ in range(500):
        try:
            plain.ping()
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.01)
    yield tmp_path, tls_port
    plain.close()
    proc.kill()
    proc.wait(timeout=10)


def test_rediss_with_the_configured_ca_and_the_env_override(tls_server):
    pki, port = tls_server
    text = f'[redis]\nurl = "rediss://localhost:{port}"\ntimeout_ms = 2000\ntls_ca_file = "{pki / "ca.pem"}"\n'
    budget = FleetBudget(Config.from_toml(text), seed=1)
    try:
        assert budget._redis.ping()
        budget.on_success("search")
        budget.flush()
    finally:
        budget.close()
    config = Config.from_toml(f'[redis]\nurl = "rediss://localhost:{port}"\ntimeout_ms = 2000\n')
    config.apply_env({"FLEET_BUDGET_REDIS_CA_FILE": str(pki / "ca.pem")})
    assert config.redis.client_kwargs()["ssl_ca_certs"] == str(pki / "ca.pem")
    budget = FleetBudget(config, seed=1)
    try:
        assert budget._redis.ping()
    finally:
        budget.close()


@pytest.mark.parametrize("host, ca", [("localhost", "other.pem"), ("127.0.0.1", "ca.pem")])
def test_a_wrong_ca_or_host_name_is_refused(tls_server, host, ca):
    pki, port = tls_server
    text = f'[redis]\nurl = "rediss://{host}:{port}"\ntimeout_ms = 2000\ntls_ca_file = "{pki / ca}"\n'
    budget = FleetBudget(Config.from_toml(text), seed=1)
    try:
        with pytest.raises(redis.exceptions.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            budget._redis.ping()
    finally:
        budget.close()


def test_tls_settings_are_checked():
    with pytest.raises(ConfigError, match="redis.tls_cert_file and redis.tls_key_file"):
        Config.from_toml('[redis]\ntls_cert_file = "c.pem"\n')
    with pytest.raises(ConfigError, match="redis.url"):
        Config.from_toml('[redis]\nurl = "rediss://h:1/#insecure"\n')
    with pytest.raises(ConfigError, match="not be encrypted"):
        FleetBudget(Config.from_toml('[redis]\nurl = "redis://h:1"\ntls_ca_file = "ca.pem"\n'))
