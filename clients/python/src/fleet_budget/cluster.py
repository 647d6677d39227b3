"""Redis Cluster for the budget (``redis.cluster_urls``), as the Rust ``RedisTarget::Cluster``:
every key carries its dependency as the hash tag (``<prefix>:v1:{<dependency>}``), so each script
call goes to the one master of that slot, and the scripts run unchanged.

The cluster client is made on first use, not at start: a worker whose cluster is down starts, and
decides from the fallback until a probe reaches it (the Rust store connects lazily too). Its own
retries are off (``Retry(NoBackoff(), 0)``): a call that fails reports it at once, and the
budget's probe interval decides when to try again, so a decision waits at most about one
``redis.timeout_ms``. Every failure of the cluster client is reported as a ``ConnectionError``
(a ``TimeoutError`` stays one), which the budget counts by kind and answers from its fallback.
"""

from __future__ import annotations

import threading
from typing import Any, Optional
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from .redact import redact_text


class LazyCluster:
    """The few calls the budget makes (``register_script``, ``hmget``, ``close``), on a cluster client made
    on first use from the seed ``urls``."""

    def __init__(self, urls: list[str], timeout: float) -> None:
        self._urls = urls
        self._timeout = timeout
        self._lock = threading.Lock()
        self._client: Optional[RedisCluster] = None

    def client(self) -> RedisCluster:
        with self._lock:
            if self._client is None:
                seeded, auth = seeds(self._urls)
                nodes = [ClusterNode(host, port) for host, port in seeded]
                try:
                    self._client = RedisCluster(
                        startup_nodes=nodes, socket_timeout=self._timeout, socket_connect_timeout=self._timeout,
                        retry=Retry(NoBackoff(), 0), require_full_coverage=False, **auth)
                except Exception as e:  # the seeds do not answer, or no slots are covered yet
                    raise redis.exceptions.ConnectionError(
                        f"Redis Cluster seeds did not answer: {redact_text(str(e))}") from None
            return self._client

    def register_script(self, text: str) -> "ClusterScript":
        return ClusterScript(self, text)

    def hmget(self, key: str, *fields: str) -> Any:
        """``HMGET`` on the master of ``key``'s slot (the enforcement switch, enforcement.py)."""
        try:
            return self.client().hmget(key, *fields)
        except redis.exceptions.RedisError as e:
            raise store_failure(e) from None

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class ClusterScript:
    """A script called on the master of its key's slot (EVALSHA, loaded again on NOSCRIPT)."""

    def __init__(self, owner: LazyCluster, text: str) -> None:
        self._owner = owner
        self._text = text
        self._scripts: dict[int, Any] = {}

    def __call__(self, keys: list[str], args: list[str]) -> Any:
        client = self._owner.client()
        script = self._scripts.get(id(client))
        if script is None:
            script = self._scripts[id(client)] = client.register_script(self._text)
        try:
            return script(keys=keys, args=args)
        except redis.exceptions.RedisError as e:
            raise store_failure(e) from None


def seeds(urls: list[str]) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The seed nodes (host, port) of ``redis.cluster_urls``, and the first credentials given."""
    nodes: list[tuple[str, int]] = []
    auth: dict[str, Any] = {}
    for url in urls:
        parts = urlsplit(url)
        nodes.append((parts.hostname or "127.0.0.1", parts.port or 6379))
        if parts.password and not auth:
            auth = {"username": unquote(parts.username or "") or None, "password": unquote(parts.password)}
    return nodes, auth


def store_failure(e: Exception) -> Exception:
    """What a failed cluster call is to the budget: a timeout stays one, a script's own refusal
    (a bad key: the server answered) stays a ``ResponseError``, anything else is a
    ``ConnectionError`` (a master down, a slot moving or not covered: the store failed)."""
    if isinstance(e, redis.exceptions.TimeoutError):
        return e
    if isinstance(e, (redis.exceptions.ClusterError, redis.exceptions.RedisClusterException,
                      redis.exceptions.MovedError, redis.exceptions.AskError, redis.exceptions.TryAgainError)):
        return redis.exceptions.ConnectionError(redact_text(str(e)) or type(e).__name__)
    if isinstance(e, redis.exceptions.ResponseError):
        return e
    return redis.exceptions.ConnectionError(redact_text(str(e)) or type(e).__name__)
