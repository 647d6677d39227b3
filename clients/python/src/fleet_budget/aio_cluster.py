"""Redis Cluster for the asyncio flavour (``redis.cluster_urls``): ``cluster.py``'s rules on
``redis.asyncio.cluster``. Every key carries its dependency as the hash tag, so each script call
goes to the one master of that slot. The client is made on first use, so a worker whose cluster is
down starts and decides from the fallback; its own retries are off, so a failed call reports at
once (each connection and each reply bounded by ``redis.timeout_ms``); every failure of the
cluster client is reported as a ``ConnectionError`` (a ``TimeoutError`` stays one)."""

from __future__ import annotations

import asyncio
from typing import Any, Optional

import redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .cluster import seeds, store_failure
from .redact import redact_text


class AsyncLazyCluster:
    """The few calls the budget makes (``register_script``, ``aclose``), on an asyncio cluster
    client made on first use from the seed ``urls``."""

    def __init__(self, urls: list[str], timeout: float) -> None:
        self._urls = urls
        self._timeout = timeout
        self._lock: Optional[asyncio.Lock] = None
        self._client: Optional[RedisCluster] = None

    async def client(self) -> RedisCluster:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._client is None:
                nodes, auth = seeds(self._urls)
                client = RedisCluster(
                    startup_nodes=[ClusterNode(host, port) for host, port in nodes],
                    socket_timeout=self._timeout, socket_connect_timeout=self._timeout,
                    retry=Retry(NoBackoff(), 0),
                    require_full_coverage=False, **auth)
                try:
                    # Each seed is tried once, each connection and reply bounded by the timeout.
                    await asyncio.wait_for(client.initialize(), self._timeout * (len(nodes) + 1))
                except Exception as e:  # the seeds do not answer, or no slots are covered yet
                    await client.aclose()
                    raise redis.exceptions.ConnectionError(
                        f"Redis Cluster seeds did not answer: {redact_text(str(e)) or type(e).__name__}") from None
                self._client = client
            return self._client

    def register_script(self, text: str) -> "AsyncClusterScript":
        return AsyncClusterScript(self, text)

    async def hmget(self, key: str, *fields: str) -> Any:
        """``HMGET`` on the master of ``key``'s slot (the enforcement switch, enforcement.py)."""
        client = await self.client()
        try:
            return await client.hmget(key, *fields)
        except redis.exceptions.RedisError as e:
            raise store_failure(e) from None

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


class AsyncClusterScript:
    """A script called on the master of its key's slot (EVALSHA, loaded again on NOSCRIPT)."""

    def __init__(self, owner: AsyncLazyCluster, text: str) -> None:
        self._owner = owner
        self._text = text
        self._scripts: dict[int, Any] = {}

    async def __call__(self, keys: list[str], args: list[str]) -> Any:
        client = await self._owner.client()
        script = self._scripts.get(id(client))
        if script is None:
            script = self._scripts[id(client)] = client.register_script(self._text)
        try:
            return await script(keys=keys, args=args)
        except redis.exceptions.RedisError as e:
            raise store_failure(e) from None
        except TimeoutError:  # asyncio's, from a bound of the client's own
            raise redis.exceptions.TimeoutError("Redis Cluster call timed out") from None
        except OSError as e:
            raise redis.exceptions.ConnectionError(redact_text(str(e)) or type(e).__name__) from None
