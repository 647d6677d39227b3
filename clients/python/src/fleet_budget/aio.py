"""The asyncio flavour: ``fleet_budget.aio.FleetBudget`` has the same names as
``fleet_budget.FleetBudget``, its calls are coroutines on ``redis.asyncio``. The decision order,
the fallback, the metrics and the deposit rules are the synchronous class's own steps and
collaborators (``decide.py``; ``deposits.py``, its store call written once as steps that yield it,
awaited here), and so are ``admit`` / ``finish`` / ``try_hedge`` (the concurrency budget and the
circuit breaker): written once in ``admission.py`` as steps that yield their store calls, awaited
here. Every store call is
bounded by ``redis.timeout_ms`` (the client's socket timeouts), as in the synchronous class."""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Optional

import redis
import redis.asyncio

from . import budget as _sync
from . import registry, scripts
from .admission import Admission, Call, drive_async
from .breaker import BreakerStatus
from .config import Config
from .decide import refusal, shadowable, shadows
from .decision import Decision, Failure
from .deny_cache import SOURCE as FLEET_CACHE
from .deny_cache import next_grant_ms
from .deposits import Deposits
from .snapshot import BudgetSnapshot

log = logging.getLogger("fleet_budget")


class FleetBudget(_sync.FleetBudget):
    """Use from one event loop; ``await budget.close()`` at shutdown (it flushes deposits)."""

    async def admit(self, task: str, attempt: int,  # type: ignore[override]
                    held_for: Optional[float] = None) -> Admission:
        """:meth:`fleet_budget.FleetBudget.admit`: the same steps, each store call awaited."""
        self._ensure_heartbeat()
        return await drive_async(self._admission.admit_steps(self.dependency(task), attempt, held_for, self.withdraw))

    async def try_hedge(self, task: str) -> Optional[Call]:  # type: ignore[override]
        self._ensure_heartbeat()
        return await drive_async(self._admission.hedge_steps(self.dependency(task), self.withdraw))

    async def finish(self, call: Call, outcome: str) -> None:  # type: ignore[override]
        await drive_async(self._admission.finish_steps(call, outcome))

    async def breaker_status(self, dependency: str) -> Optional[BreakerStatus]:  # type: ignore[override]
        return await drive_async(self._admission.status_steps(dependency))

    def _new_client(self, url: str, timeout: float) -> Any:
        return redis.asyncio.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout,
            **self.config.redis.client_kwargs())

    def _new_cluster_client(self, urls: list[str], timeout: float) -> Any:
        from .aio_cluster import AsyncLazyCluster

        return AsyncLazyCluster(urls, timeout)

    def _new_deposits(self, client: Any) -> Deposits:
        """The deposits, their flusher an asyncio task started by the first deposit, in its loop."""
        self._task: Optional[asyncio.Task[None]] = None
        return Deposits(client, self.config, self._clock, self.metrics, self._health, self.local, self._denials,
                        self._memory, threaded=False)

    def _start_heartbeat(self) -> None:
        """The worker registry's writer as an asyncio task: started now when the budget is made
        in a running loop, else by its first call (or ``async with``), in that loop."""
        self._beats: Optional[asyncio.Task[None]] = None
        interval = self.config.redis.heartbeat_ms
        if interval > 0:
            self._registry = registry.AsyncRegistry(self._heartbeat, self.config.redis.key_prefix, interval)
            self._ensure_heartbeat()

    def _ensure_heartbeat(self) -> None:
        reg = self._registry
        if self._beats is not None or not isinstance(reg, registry.AsyncRegistry) or reg.left:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: the first call starts it
        self._beats = loop.create_task(registry.run_async(weakref.ref(self), reg))

    @classmethod
    def from_config(cls, path: str, **kwargs: Any) -> "FleetBudget":
        return cls(Config.from_path(path), **kwargs)

    async def on_attempt(self, task: str, attempt: int) -> None:  # type: ignore[override]
        self._ensure_heartbeat()
        dependency = self._attempt(task, attempt)
        if dependency is not None:
            await self._deposit_async(dependency, 0, 1)

    async def on_success(self, task: str) -> None:  # type: ignore[override]
        self._ensure_heartbeat()
        await self._deposit_async(self._success(task), 1, 0)

    async def on_failure(self, task: str, attempt: int, failure: Failure) -> Decision:  # type: ignore[override]
        return await self.on_failure_since(task, attempt, failure, None)

    async def on_failure_since(self, task: str, attempt: int, failure: Failure,  # type: ignore[override]
                               since_first_failure: Optional[float]) -> Decision:
        self._ensure_heartbeat()
        dependency, early = self._before_budget(task, attempt, failure, since_first_failure)
        if early is not None:
            return early
        granted, snapshot, source = await self.withdraw(dependency)
        reason = refusal(granted, snapshot)
        enforcement = await self._enforcement.of_async(dependency, self._redis) if shadowable(reason, source) else None
        return self._after_budget(task, attempt, failure, granted, snapshot, source,
                                  since_first_failure=since_first_failure,
                                  shadow=shadows(reason, source, enforcement))

    async def withdraw(self, dependency: str) -> tuple[bool, BudgetSnapshot, str]:  # type: ignore[override]
        policy = self.config.policy(dependency)
        cached, epoch = self._denials.lookup(dependency)
        if cached is not None:
            self._deposits.count_denied(dependency)  # Redis never sees it: sent with the deposits
            self._ensure_flush_task()
            return False, cached, FLEET_CACHE
        if self._health.should_try(dependency):
            sent = self._denials.now()
            asked = self._clock()
            try:
                reply = await self._spend(keys=scripts.keys(self.config.redis.key_prefix, dependency),
                                          args=scripts.spend_args(policy, self._memory_args(dependency)))
                granted, snapshot, base = self._remembered("spend", dependency, reply, policy)
                wait = next_grant_ms("spend", base)
            except (redis.exceptions.RedisError, scripts.BadReply) as e:
                self._health.failed(dependency, e)
            else:
                self._health.ok(dependency)
                self._health.saw(dependency, asked, snapshot.control.frozen, wait)
                self._denials.remember(dependency, epoch, sent, granted == 1, snapshot, wait)
                return granted == 1, snapshot, "fleet"
        return self._fallback(dependency)

    async def status(self, dependency: str) -> tuple[BudgetSnapshot, str]:  # type: ignore[override]
        self._ensure_heartbeat()
        policy = self.config.policy(dependency)
        try:
            reply = await self._status(keys=scripts.keys(self.config.redis.key_prefix, dependency),
                                       args=scripts.status_args(policy))
            _, snapshot, _ = scripts.parse_reply("status", reply, policy)
        except (redis.exceptions.RedisError, scripts.BadReply) as e:
            self._health.failed(dependency, e)
            return self.local.status(dependency, policy), "local_fallback"
        self._health.ok(dependency)
        self._denials.seen(dependency, snapshot.control)
        return snapshot, "fleet"

    async def flush(self) -> None:  # type: ignore[override]
        for dependency, s, a, n in self._deposits.take():
            await drive_async(self._deposits.send_steps(dependency, s, a, n))
        self._deposits.set_pending_gauge()

    async def close(self) -> int:  # type: ignore[override]
        self._deposits.stop()
        task = getattr(self, "_task", None)
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        await self.flush()
        reg, beats = self._registry, self._beats
        if isinstance(reg, registry.AsyncRegistry):
            await reg.leave_async()  # waits for a beat in flight: none lands after the leave
        if beats is not None:
            beats.cancel()
            try:
                await beats
            except asyncio.CancelledError:
                pass
        await self._redis.aclose()
        return self._deposits.report_unsent()

    async def __aenter__(self) -> "FleetBudget":
        self._ensure_heartbeat()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _deposit_async(self, dependency: str, successes: int, first_attempts: int) -> None:
        if (now := self._deposits.count(dependency, successes, first_attempts)) is not None:
            await drive_async(self._deposits.send_steps(dependency, *now))
            return
        self._ensure_flush_task()
        if self._deposits.hurried():
            await self.flush()

    def _ensure_flush_task(self) -> None:
        """Starts the flusher task in the running loop, once (by the first deposit or denial)."""
        if self._deposits.flush_ms > 0 and getattr(self, "_task", None) is None and not self._deposits.closed:
            self._task = asyncio.get_running_loop().create_task(self._flush_loop_async())

    async def _flush_loop_async(self) -> None:
        while not self._deposits.closed:
            registry.raise_if_cancelled()
            await asyncio.sleep(self._deposits.flush_ms / 1000)
            try:
                await self.flush()
            except Exception:  # the flusher must outlive any one failure
                log.exception("fleet budget: flushing deposits failed")
