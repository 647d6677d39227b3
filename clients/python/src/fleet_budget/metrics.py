"""The Prometheus metrics, with the Rust library's names and labels (``metrics.rs``)."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from typing import Any, Awaitable, Callable, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from .snapshot import BudgetSnapshot

log = logging.getLogger("fleet_budget")

#: At most this many dependencies get their first policy conflict logged (bounded whatever task
#: names arrive).
CONFLICT_LOG_LIMIT = 1024

#: Upper bounds of the store-call duration buckets, in seconds: the Rust library's
#: ``STORE_CALL_BUCKETS``, fine around the 50 ms default deadline (``redis.timeout_ms``).
STORE_CALL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.25)


class Metrics:
    """One set of metrics in ``registry`` (a private registry when none is given)."""

    def __init__(self, registry: Optional[CollectorRegistry] = None) -> None:
        self._own_registry = registry is None
        self.registry = registry if registry is not None else CollectorRegistry()
        r, dep = self.registry, ["dependency"]
        # prometheus_client appends _total to counters itself.
        self.successes = Counter("fleet_budget_successes", "Successful jobs.", dep, registry=r)
        self.first_attempts = Counter("fleet_budget_first_attempts", "First executions of jobs.", dep, registry=r)
        self.executions = Counter("fleet_budget_executions", "All executions (first + retries).", dep, registry=r)
        self.retries_granted = Counter("fleet_budget_retries_granted", "Retries the budget granted.", dep, registry=r)
        self.retries_denied = Counter("fleet_budget_retries_denied", "Retries the budget refused.", dep, registry=r)
        self.retries_denied_in_process = Counter(
            "fleet_budget_retries_denied_in_process",
            "Denials of the fleet store answered in the process while they stand, without a call "
            "(also in retries_denied_total).", dep, registry=r)
        self.retries_would_deny = Counter(
            "fleet_budget_retries_would_deny",
            "Denials of a dependency in shadow, retried anyway: jobs enforcement would have "
            "dead-lettered (also in retries_denied_total).", dep, registry=r)
        self.dead_letters = Counter(
            "fleet_budget_dead_letters", "Dead-letter decisions.", ["dependency", "reason"], registry=r)
        self.allowance = Gauge("fleet_budget_allowance", "Allowance at the last decision.", dep, registry=r)
        self.headroom = Gauge("fleet_budget_headroom", "Retries still grantable at the last decision.", dep, registry=r)
        self.fallback_active = Gauge(
            "fleet_budget_fallback_active",
            "1 while the fleet store fails for the dependency and the fallback decides.", dep, registry=r)
        self.store_call_duration = Histogram(
            "fleet_budget_store_call_duration_seconds", "Budget store calls by operation, failed ones included.",
            ["op"], buckets=STORE_CALL_BUCKETS, registry=r)
        self.fallback_dependencies = Gauge(
            "fleet_budget_fallback_dependencies", "Dependencies whose store calls fail now.", registry=r)
        self.store_errors = Counter("fleet_budget_store_errors", "Store calls that failed.", ["kind"], registry=r)
        self.fallback_decisions = Counter(
            "fleet_budget_fallback_decisions", "Retry decisions taken by the fallback.", ["mode"], registry=r)
        self.deposits_pending = Gauge(
            "fleet_budget_deposits_pending", "Deposits counted locally, not yet flushed.", registry=r)
        self.policy_conflicts = Counter(
            "fleet_budget_policy_conflicts",
            "Store calls whose policy differed from the one in force (served by that one).", dep, registry=r)
        # The concurrency budget, hedges and the circuit breaker (the Rust ``metrics/calls.rs``).
        self.calls_in_flight = Gauge(
            "fleet_budget_calls_in_flight",
            "Calls in flight fleet-wide (leases of the concurrency budget) at this process's last lease call.",
            ["dependency", "kind"], registry=r)
        self.retry_fraction = Gauge(
            "fleet_budget_retry_fraction",
            "Retries in flight over primary calls in flight, fleet-wide, at this process's last lease call.",
            dep, registry=r)
        self.hedges = Counter(
            "fleet_budget_hedges",
            "Hedged requests asked for, by outcome (granted, refused); never counted as retries.",
            ["dependency", "outcome"], registry=r)
        self.leases_lost = Counter(
            "fleet_budget_leases_lost",
            "Leases given back that were gone from Redis before their expiry (evicted, flushed): their "
            "slots were free meanwhile.", dep, registry=r)
        self.breaker_transitions = Counter(
            "fleet_budget_breaker_transitions",
            "Circuit breaker state changes this process made, by the state entered.", ["dependency", "to"], registry=r)
        self.breaker_state = Gauge(
            "fleet_budget_breaker_state",
            "Circuit breaker state at this process's last breaker call: 0 closed, 1 open, 2 half-open.",
            dep, registry=r)
        self.budget_lost = Counter(
            "fleet_budget_budget_lost",
            "Store calls that found the dependency's budget hash lost (evicted, flushed, Redis restarted "
            "empty) and restored what this process remembered.", dep, registry=r)
        self._conflicts_logged: set[str] = set()
        # Dependency -> the window index whose lost budget was logged (one line per window).
        self._lost_logged: dict[str, int] = {}
        self._lock = threading.Lock()

    def for_child(self) -> "Metrics":
        """The metrics of a forked child (``fleet_budget.forks``): the child's own, from zero,
        counting only what the child does, as a new process's would; the parent's are left as
        they were. With a private registry (the default) the child gets a new one; with a
        registry that was given, the parent's collectors in it are replaced by the child's (its
        lock made anew first: a parent's thread may have held it, scraping, at the fork).
        Whoever exposes the registry does so from the child, with the child's object."""
        if self._own_registry:
            return Metrics()
        registry = self.registry
        if isinstance(getattr(registry, "_lock", None), type(threading.Lock())):
            registry._lock = threading.Lock()  # type: ignore[attr-defined]
        for collector in vars(self).values():
            if isinstance(collector, MetricWrapperBase):
                try:
                    registry.unregister(collector)
                except KeyError:  # unregistered by someone else already
                    pass
        return Metrics(registry)

    def snapshot(self, dependency: str, snap: BudgetSnapshot) -> None:
        if snap.control.conflict:
            self.policy_conflicts.labels(dependency).inc()
            with self._lock:
                first = len(self._conflicts_logged) < CONFLICT_LOG_LIMIT and dependency not in self._conflicts_logged
                self._conflicts_logged.add(dependency) if first else None
            if first:
                log.warning("this worker's budget policy for %s differs from the one in force in Redis, which "
                            "decides instead (see `budgetctl status`); counted in "
                            "fleet_budget_policy_conflicts_total", dependency)
        self.allowance.labels(dependency).set(snap.allowance)
        self.headroom.labels(dependency).set(snap.remaining())

    def budget_lost_seen(self, dependency: str, snap: BudgetSnapshot) -> None:
        """Counts a call that found ``dependency``'s budget hash lost and restored what this
        process remembered; logs it once per dependency per window (the Rust ``budget_lost``)."""
        self.budget_lost.labels(dependency).inc()
        with self._lock:
            logged = self._lost_logged.get(dependency)
            first = logged != snap.window_index and (
                logged is not None or len(self._lost_logged) < CONFLICT_LOG_LIMIT)
            if first:
                self._lost_logged[dependency] = snap.window_index
        if first:
            log.warning("the budget hash of %s was lost in Redis (evicted by a maxmemory-policy, FLUSHALL, or a "
                        "restart without persistence); restored what this worker remembered (overrides in "
                        "force, counters) before deciding (frozen %s, retries %d); counted in "
                        "fleet_budget_budget_lost_total", dependency, snap.control.frozen, snap.current.retries)

    def in_flight(self, dependency: str, primaries: int, retries: int) -> None:
        self.calls_in_flight.labels(dependency, "primary").set(primaries)
        self.calls_in_flight.labels(dependency, "retry").set(retries)
        self.retry_fraction.labels(dependency).set(retries / primaries if primaries else 0.0)
        self.leases_lost.labels(dependency)  # a series from zero for every dependency with leases

    def timed(self, op: str, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` (a registered script), each call's duration observed under ``op`` (``spend``,
        ``deposit``, ``status``), failed calls included; a coroutine is timed until it is done."""
        histogram = self.store_call_duration.labels(op)

        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            pending = False
            try:
                result = call(*args, **kwargs)
                if inspect.isawaitable(result):
                    pending = True
                    return _observed(result, histogram, start)
                return result
            finally:
                if not pending:
                    histogram.observe(time.perf_counter() - start)

        return run

    def value(self, name: str, **labels: str) -> float:
        """A sample's value (0 when never set), e.g. ``value("fleet_budget_successes_total", dependency="x")``."""
        return self.registry.get_sample_value(name, labels) or 0.0


async def _observed(awaitable: Awaitable[Any], histogram: Any, start: float) -> Any:
    try:
        return await awaitable
    finally:
        histogram.observe(time.perf_counter() - start)
