"""``FleetBudget``: the Rust library's decision order, deposits, fallback and metrics, on the
same Redis scripts (``crates/fleet-budget/src/budget``)."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import replace
from typing import Any, Callable, Optional

import redis

from . import forks, registry, risks, scripts
from . import breaker as cb
from .admission import Admission, AdmissionControl, Call, drive
from .decide import BLIND, Jitter, after_budget, before_budget, dead_letter, refusal, shadowable, shadows
from .deposits import Deposits
from .health import PROBE_INTERVAL_MS, StoreHealth, error_kind  # noqa: F401  (their old home)
from .deny_cache import SOURCE as FLEET_CACHE
from .deny_cache import DenyCache, batch_next, next_grant_ms
from .config import (OVERFLOW_DEPENDENCY, Config, ConfigError, _quoted, dependency_name_problem,
                     key_prefix_problem, redact_url)
from .decision import DeadLetter, Decision, Failure
from .enforcement import EnforcementInForce
from .group_commit import GroupCommit, GroupTimeout, batch_answer
from .local import LocalStore
from .memory import Memory, remember
from .metrics import Metrics
from .policy import BudgetPolicy
from .snapshot import BudgetSnapshot

log = logging.getLogger("fleet_budget")


class InvalidTask(ValueError):
    """A task with no mapping whose name cannot be a dependency name."""


class UnmappedTask(InvalidTask):
    """A task with no mapping, refused by ``[unmapped_tasks] policy = "reject"`` (the Rust
    ``Error::UnmappedTask``): a worker dead-letters it ``non_retryable``, class ``unmapped_task``,
    without running it."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class FleetBudget:
    """A process's view of the fleet budgets. Thread-safe; call :meth:`close` at shutdown.

    It is the API, and hands each call to the collaborator that owns what it needs, each with its
    own state and lock (as the Rust ``budget/`` does): the decision order is ``decide.py``'s
    functions of the failure, the ceiling and the withdrawal; the withdrawal is asked here (the
    fleet store, the deny cache of ``deny_cache.py``, the fallback); :class:`StoreHealth`
    (``health.py``) says whether the store answers per dependency; :class:`Deposits`
    (``deposits.py``) counts and flushes the deposits; :class:`AdmissionControl`
    (``admission.py``) admits each call (``admit``, ``finish``, ``try_hedge``: the circuit
    breaker, then a lease); ``enforcement.py`` says whether a dependency is in shadow now."""

    def __init__(
        self,
        config: Optional[Config] = None,
        *,
        redis_url: Optional[str] = None,
        key_prefix: Optional[str] = None,
        metrics: Optional[Metrics] = None,
        clock: Callable[[], int] = _now_ms,
        seed: Optional[int] = None,
        client: Any = None,
        group_commit: bool = True,
    ) -> None:
        self.config = config if config is not None else Config()
        if redis_url is not None:
            self.config.redis.url = redis_url
        if key_prefix is not None:
            # Checked as the file's `redis.key_prefix` is (the Rust `Config::set_key_prefix`).
            wrong = key_prefix_problem(key_prefix)
            if wrong:
                raise ConfigError("key_prefix", f"{_quoted(key_prefix)}: {wrong}")
            self.config.redis.key_prefix = key_prefix
        self.metrics = metrics if metrics is not None else Metrics()
        self._series_for_configured()
        self._clock = clock
        # The jitter of delays and of the breaker's holds (decide.py).
        self._jitter = Jitter(seed)
        self.local = LocalStore(clock)
        # The unmapped names given a budget of their own: at most `max_own_budgets`, first come,
        # kept for the life of the process (the Rust `OwnBudgets`).
        self._own_budgets: set[str] = set()
        self._own_lock = threading.Lock()
        settings = self.config.redis
        timeout = settings.timeout_ms / 1000
        # A client of our own is made again in a forked child; one given is the caller's.
        self._own_client = client is None
        if client is None and settings.cluster_urls:
            client = self._new_cluster_client(settings.cluster_urls, timeout)
        if client is None:
            try:
                client = self._new_client(settings.url, timeout)
            except ValueError as e:
                raise ConfigError("redis.url", f"{redact_url(settings.url)}: {e}") from None
        # What this process last saw of each budget hash, sent with every budget call so that a
        # hash lost mid-window is restored (memory.py, lua/README.md "Lost budgets").
        self._memory = Memory()
        # Whether the store answers per dependency, and the freezes and breakers it last showed.
        self._health = StoreHealth(clock, self.metrics, self.config.redis.fallback)
        # Group commit of withdrawals (on by default, as in Rust): see group_commit.py.
        self._group = GroupCommit(timeout) if group_commit else None
        # Exhausted budgets answered in the process (redis.deny_cache_ms): see deny_cache.py.
        self._denials = DenyCache(settings.deny_cache_ms)
        # Shadow or enforcement, per dependency (enforcement.py).
        self._enforcement = EnforcementInForce(self.config)
        # The deposits (deposits.py) and the admission of calls (admission.py), on `client`.
        self._connect(client)
        # The worker registry (redis.heartbeat_ms; registry.py): this worker's report.
        self._registry: Optional[registry.Registry] = None
        self._start_heartbeat()
        forks.register(self)
        forks.flush_at_exit(self)
        # The Redis settings that drop budgets silently (eviction, no persistence), logged once
        # (risks.py); not for a client the caller made, whose server the configuration may not name.
        if self._own_client:
            risks.start(self.config)

    def _connect(self, client: Any) -> None:
        """The store calls, on ``client``, timed in this process's metrics, and the collaborators
        that make their own (the deposits; the admission of calls, its leases and breakers) with
        this process's health, memory and deny cache."""
        self._redis = client
        timed = self.metrics.timed
        self._spend = timed("spend", client.register_script(scripts.text("spend")))
        self._spend_many = timed("spend", client.register_script(scripts.text("spend_many")))
        self._status = timed("status", client.register_script(scripts.text("status")))
        # The worker registry's writes (never part of a decision, never timed).
        self._heartbeat = client.register_script(scripts.text("heartbeat"))
        self._deposits = self._new_deposits(client)
        self._admission = AdmissionControl(client, self.config, self.metrics, self._health, self._jitter)

    def _new_deposits(self, client: Any) -> Deposits:
        """The deposits, their flusher a thread started by the first deposit counted."""
        return Deposits(client, self.config, self._clock, self.metrics, self._health, self.local, self._denials,
                        self._memory)

    def _start_heartbeat(self) -> None:
        """This worker's entry in the worker registry, written by a thread of its own every
        ``redis.heartbeat_ms`` (none when 0); the thread holds the budget weakly."""
        interval = self.config.redis.heartbeat_ms
        if interval <= 0:
            return
        self._registry = registry.Registry(self._heartbeat, self.config.redis.key_prefix, interval)
        threading.Thread(target=registry.run, args=(weakref.ref(self), self._registry),
                         name="fleet-budget-heartbeat", daemon=True).start()

    @property
    def in_fallback(self) -> bool:
        """Whether the fallback decides for some dependency because the store failed."""
        return self._health.in_fallback

    def fallback_dependencies(self) -> list[tuple[str, int]]:
        """The dependencies whose decisions come from the fallback now, each with how long it has
        been (ms of the budget's clock), in name order: what the worker registry reports (the
        Rust ``fallback_dependencies``)."""
        return self._health.episodes()

    @property
    def worker_id(self) -> Optional[str]:
        """This worker's id in the worker registry (``{host}-{pid}-{4 hex}``, a new one in a forked
        child), or None when it does not report (``redis.heartbeat_ms = 0``)."""
        return self._registry.id if self._registry is not None else None

    def _after_fork_in_child(self) -> None:
        """In a forked child, this budget starts again as a new process's (forks.py says why):
        fresh locks; the parent's pending deposits dropped (the parent sends them; sent again
        from here they would be counted twice); its own Redis connections; its own metrics
        (:meth:`Metrics.for_child`), fallback budget, jitter and lease ids; the flusher started
        again by the child's first deposit."""
        closed = self._deposits.closed
        self._own_lock = threading.Lock()
        self._memory = Memory()
        # Children of one parent would otherwise draw the same jitter, and retry together.
        self._jitter = Jitter()
        self.local = LocalStore(self._clock)
        self.metrics = self.metrics.for_child()
        self._health = StoreHealth(self._clock, self.metrics, self.config.redis.fallback)
        self._series_for_configured()
        # A fresh cache: its lock may have been held by another thread of the parent.
        self._denials = DenyCache(self.config.redis.deny_cache_ms)
        self._enforcement = EnforcementInForce(self.config)
        if self._group is not None:
            self._group = GroupCommit(self._group.deadline, self._group.max_batch)
        settings = self.config.redis
        timeout = settings.timeout_ms / 1000
        if not self._own_client:
            client = self._redis  # the caller's: redis-py's pools make new connections after a fork
        elif settings.cluster_urls:
            client = self._new_cluster_client(settings.cluster_urls, timeout)
        else:
            client = self._new_client(settings.url, timeout)
        # The parent's client is dropped unclosed: its sockets are the parent's. New deposits
        # (the parent's pending ones are the parent's to send) and a new admission (lease ids).
        self._connect(client)
        # A new worker: the parent's entry (and its lock, perhaps held at the fork) is the parent's.
        self._registry = None
        if closed:
            self._deposits.stop()
        else:
            self._start_heartbeat()

    def _before_exit(self) -> None:
        """The process ends (forks.py): pending deposits are sent, unless closed already, and the
        worker leaves the registry (gone, rather than silent)."""
        if not self._deposits.closed and self.pending_deposits():
            self.flush()
        self._leave_registry()

    def _leave_registry(self) -> None:
        if self._registry is not None and not isinstance(self._registry, registry.AsyncRegistry):
            self._registry.leave()

    def _series_for_configured(self) -> None:
        # A series for every configured dependency before its first failure, as in Rust.
        for dependency in self.config.policies:
            self.metrics.fallback_active.labels(dependency).set(0)
            self.metrics.budget_lost.labels(dependency)

    def _new_client(self, url: str, timeout: float) -> Any:
        return redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout,
            **self.config.redis.client_kwargs())

    def _new_cluster_client(self, urls: list[str], timeout: float) -> Any:
        from .cluster import LazyCluster

        return LazyCluster(urls, timeout)

    @classmethod
    def from_config(cls, path: str, **kwargs: Any) -> "FleetBudget":
        """A budget from a TOML file (``FLEET_BUDGET_REDIS_URL`` over ``redis.url``)."""
        return cls(Config.from_path(path), **kwargs)

    # The contract's three calls.

    def dependency(self, task: str) -> str:
        """The dependency whose budget ``task`` spends: its mapping, else what ``[unmapped_tasks]``
        says (its own budget while fewer than ``max_own_budgets`` names have one, else the shared
        ``unmapped`` budget; the named dependency's; or :class:`UnmappedTask`). A name that cannot
        be a dependency name, to be its own, is :class:`InvalidTask` and takes no place."""
        mapped = self.config.tasks.get(task)
        if mapped is not None:
            return mapped
        unmapped = self.config.unmapped
        if unmapped.policy == "reject":
            raise UnmappedTask(f"task {task!r} has no dependency mapping and unmapped tasks are rejected "
                               '([unmapped_tasks] policy = "reject")')
        if unmapped.policy == "share" and unmapped.dependency is not None:
            return unmapped.dependency
        wrong = dependency_name_problem(task)
        if wrong:
            raise InvalidTask(f"task {task!r} has no dependency mapping and {wrong}")
        with self._own_lock:
            if task in self._own_budgets:
                return task
            if len(self._own_budgets) >= unmapped.max_own_budgets:
                return OVERFLOW_DEPENDENCY
            self._own_budgets.add(task)
            return task

    def on_attempt(self, task: str, attempt: int) -> None:
        """An execution starts; ``attempt`` 1 is the first (a deposit under basis ``request``)."""
        dependency = self._attempt(task, attempt)
        if dependency is not None and (now := self._deposits.count(dependency, 0, 1)) is not None:
            self._deposits.send(dependency, *now)

    def on_success(self, task: str) -> None:
        dependency = self._success(task)
        if (now := self._deposits.count(dependency, 1, 0)) is not None:
            self._deposits.send(dependency, *now)

    def on_failure(self, task: str, attempt: int, failure: Failure) -> Decision:
        """Retry or dead-letter, in the contract's order: retryable, ceiling, then the budget."""
        return self.on_failure_since(task, attempt, failure, None)

    def on_failure_since(self, task: str, attempt: int, failure: Failure,
                         since_first_failure: Optional[float]) -> Decision:
        """:meth:`on_failure` for a job whose first failure was ``since_first_failure`` seconds
        ago (0 for this one): a task with a recovery window is held to the window itself, and its
        delays are fitted to it (the Rust ``on_failure_since``)."""
        dependency, early = self._before_budget(task, attempt, failure, since_first_failure)
        if early is not None:
            return early
        granted, snapshot, source = self.withdraw(dependency)
        reason = refusal(granted, snapshot)
        enforcement = self._enforcement.of(dependency, self._redis) if shadowable(reason, source) else None
        return self._after_budget(task, attempt, failure, granted, snapshot, source,
                                  since_first_failure=since_first_failure,
                                  shadow=shadows(reason, source, enforcement))

    # The admission of each call (admission.py).

    def admit(self, task: str, attempt: int, held_for: Optional[float] = None) -> Admission:
        """Whether execution ``attempt`` (1 = first) of ``task`` may run now; ``held_for`` is how long
        (seconds) the job was already held by earlier :class:`~fleet_budget.admission.Hold` answers
        (None: never). Never waits for a slot. Raises :class:`InvalidTask` as ``dependency`` does."""
        return drive(self._admission.admit_steps(self.dependency(task), attempt, held_for, self.withdraw))

    def try_hedge(self, task: str) -> Optional[Call]:
        """A hedged request to ``task``'s dependency: a slot of the retry share (with a concurrency
        budget) and one retry of the rate budget, granted or refused at once; None: do not send
        it. Counted in ``fleet_budget_hedges_total``, never as a retry. Give a granted call to
        :meth:`finish`."""
        return drive(self._admission.hedge_steps(self.dependency(task), self.withdraw))

    def finish(self, call: Call, outcome: str) -> None:
        """Gives back what ``call`` holds and reports how it ended (``SUCCEEDED``, ``FAILED``,
        ``INCONCLUSIVE``) to the breaker. A store call that fails is logged: the slot comes back
        when its lease expires, a lost probe after the probe timeout."""
        drive(self._admission.finish_steps(call, outcome))

    def breaker_status(self, dependency: str) -> Optional[cb.BreakerStatus]:
        """``dependency``'s breaker as Redis holds it (None: it has no breaker); writes nothing.
        Raises the store's error."""
        return drive(self._admission.status_steps(dependency))

    # The deposits (deposits.py).

    def pending_deposits(self) -> int:
        """The deposits counted in this process and not yet sent."""
        return self._deposits.pending()

    def flush(self) -> None:
        """Send the coalesced deposits now (one ``deposit.lua`` call per dependency)."""
        self._deposits.flush()

    # The steps around the I/O, shared with the asyncio flavour (fleet_budget.aio).

    def _attempt(self, task: str, attempt: int) -> Optional[str]:
        """Counts an execution; the dependency when it is a first attempt (a deposit)."""
        dependency = self.dependency(task)
        self.metrics.executions.labels(dependency).inc()
        if attempt > 1:
            return None
        self.metrics.first_attempts.labels(dependency).inc()
        return dependency

    def _success(self, task: str) -> str:
        dependency = self.dependency(task)
        self.metrics.successes.labels(dependency).inc()
        return dependency

    def _before_budget(self, task: str, attempt: int, failure: Failure,
                       since_first_failure: Optional[float] = None) -> tuple[str, Optional[DeadLetter]]:
        dependency = self.dependency(task)
        reason = before_budget(failure, self.config.ceiling(task), max(1, int(attempt)), since_first_failure)
        if reason is not None:
            return dependency, dead_letter(self.metrics, dependency, reason, None, "not_consulted")
        return dependency, None

    def _after_budget(self, task: str, attempt: int, failure: Failure, granted: bool,
                      snapshot: BudgetSnapshot, source: str, since_first_failure: Optional[float] = None,
                      shadow: bool = False) -> Decision:
        """The decision after the budget's answer (``decide.after_budget``); ``shadow``: the
        refusal is one the dependency's shadow lets through (``decide.shadows``)."""
        return after_budget(self.metrics, self._jitter, self.dependency(task), self.config.ceiling(task),
                            max(1, int(attempt)), failure, granted, snapshot, source, since_first_failure, shadow)

    def withdraw(self, dependency: str) -> tuple[bool, BudgetSnapshot, str]:
        """Spend one retry: (granted, snapshot, source). A denial of the fleet store that still
        stands is answered without a call (source ``fleet_cache``, ``deny_cache.py``)."""
        policy = self.config.policy(dependency)
        cached, epoch = self._denials.lookup(dependency)
        if cached is not None:
            self._deposits.count_denied(dependency)  # Redis never sees it: sent with the deposits
            return False, cached, FLEET_CACHE
        if self._health.should_try(dependency):
            sent = self._denials.now()
            asked = self._clock()
            try:
                if self._group is None:
                    granted, snapshot, wait = self._spend_answers(dependency, policy, 1)[0]
                else:
                    granted, snapshot, wait = self._group.withdraw(
                        dependency, lambda n: self._spend_answers(dependency, policy, n))  # type: ignore
            except (redis.exceptions.RedisError, scripts.BadReply, GroupTimeout) as e:
                self._health.failed(dependency, e)
            else:
                self._health.ok(dependency)
                self._health.saw(dependency, asked, snapshot.control.frozen, wait)
                self._denials.remember(dependency, epoch, sent, granted, snapshot, wait)
                return granted, snapshot, "fleet"
        return self._fallback(dependency)

    def _remembered(self, script: str, dependency: str, reply: Any,
                    policy: BudgetPolicy) -> tuple[int, BudgetSnapshot, Any]:
        """Decodes the reply of a budget script called with this process's memory of the hash
        (``memory.remember``). Returns granted, the snapshot and the reply as it was."""
        key = scripts.keys(self.config.redis.key_prefix, dependency)[0]
        return remember(self._memory, self.metrics, key, script, dependency, reply, policy)

    def _memory_args(self, dependency: str) -> list[str]:
        return self._memory.args(scripts.keys(self.config.redis.key_prefix, dependency)[0])

    def _send_spend(self, dependency: str, policy: BudgetPolicy, n: int) -> list[tuple[bool, BudgetSnapshot]]:
        """One store call deciding ``n`` requests: ``spend.lua`` for one, ``spend_many.lua`` for more."""
        return [(granted, snapshot) for granted, snapshot, _ in self._spend_answers(dependency, policy, n)]

    def _spend_answers(self, dependency: str, policy: BudgetPolicy,
                       n: int) -> list[tuple[bool, BudgetSnapshot, Optional[int]]]:
        """:meth:`_send_spend`'s answers with each one's wait for the next grant (``next_grant_ms``)."""
        keys = scripts.keys(self.config.redis.key_prefix, dependency)
        memory = self._memory_args(dependency)
        if n == 1:
            reply = self._spend(keys=keys, args=scripts.spend_args(policy, memory))
            granted, snapshot, base = self._remembered("spend", dependency, reply, policy)
            return [(granted == 1, snapshot, next_grant_ms("spend", base))]
        reply = self._spend_many(keys=keys, args=scripts.spend_many_args(policy, n, memory))
        granted, snapshot, base = self._remembered("spend_many", dependency, reply, policy)
        wait = next_grant_ms("spend_many", base)
        return [(*batch_answer(snapshot, n, granted, k), batch_next(wait, granted, k)) for k in range(n)]

    def _fallback(self, dependency: str) -> tuple[bool, BudgetSnapshot, str]:
        policy = self.config.policy(dependency)
        mode = self.config.redis.fallback
        self.metrics.fallback_decisions.labels(mode).inc()
        if self._health.frozen(dependency):
            # An operator's freeze Redis showed, not ended: whatever the fallback mode, nothing
            # is granted (the dead letter says budget_frozen).
            snapshot = self.local.status(dependency, policy)
            snapshot = replace(snapshot, allowance=0, control=replace(snapshot.control, frozen=True))
            return False, snapshot, "local_fallback" if mode == "local" else BLIND
        if mode == "local":
            granted, snapshot = self.local.withdraw(dependency, policy)
            return granted, snapshot, "local_fallback"
        return mode == "allow", self.local.status(dependency, policy), BLIND

    def status(self, dependency: str) -> tuple[BudgetSnapshot, str]:
        policy = self.config.policy(dependency)
        try:
            reply = self._status(keys=scripts.keys(self.config.redis.key_prefix, dependency),
                                 args=scripts.status_args(policy))
            _, snapshot, _ = scripts.parse_reply("status", reply, policy)
        except (redis.exceptions.RedisError, scripts.BadReply) as e:
            self._health.failed(dependency, e)
            return self.local.status(dependency, policy), "local_fallback"
        self._health.ok(dependency)
        self._denials.seen(dependency, snapshot.control)
        return snapshot, "fleet"

    def close(self) -> int:
        """Stop the flusher, send what is pending, leave the worker registry, close the connection.
        Returns the deposits that could not be sent (0 when all were), and logs them: they are
        lost, the safe direction (the Rust ``shutdown`` returns the error)."""
        self._deposits.stop()
        self.flush()
        self._leave_registry()
        self._redis.close()
        return self._deposits.report_unsent()

    def __enter__(self) -> "FleetBudget":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
