"""Admission of one call to a dependency (the Rust ``budget/admission.rs``): whether an execution
may run now, and what it holds while it runs.

The rate budget (``on_failure``) decides whether a failed job *may* retry; the retry runs later,
after its delay. The concurrency budget is about the moment of the call: a retry needs a slot
when it runs. So every execution asks :meth:`FleetBudget.admit <fleet_budget.FleetBudget.admit>` just before its body runs, and
gives the :class:`Call` back to :meth:`FleetBudget.finish` when the body returns. ``admit`` answers:

- a :class:`Call`: run it (holding a lease when the dependency has a concurrency budget);
- a :class:`Hold`: do not run it and do not count an attempt; let it wait ``hold.pause`` seconds
  (a delay tier, a Celery countdown) and ask again, with ``held_for`` the time held so far. A
  primary at the cap when ``primary_waits = true`` (``primary_at_cap``), or a circuit breaker open
  or half-open with every probe out (``circuit_open``);
- a :class:`~fleet_budget.DeadLetter`: do not run it. A retry refused a slot
  (``concurrency_cap``, ``concurrency_retry_share``: a retry never waits for a slot), a primary
  held past the policy's ``max_wait`` (``concurrency_cap``), a job held by the breaker past its
  ``max_wait`` (``circuit_open``).

Before the slot the breaker is asked: closed → go on; half-open with a probe left → the call is a
probe, one retry of the rate budget's floor (a probe the rate budget refuses is given back and the
job waits). The outcome given to ``finish`` feeds the breaker: ``SUCCEEDED``, ``FAILED`` (a
retryable failure) or ``INCONCLUSIVE`` (a non-retryable failure says nothing about the
dependency's health). When Redis does not answer, the call runs without a lease and without a
breaker: the rate budget and its fallback still bound retries, and a dead store must not stop
primary traffic.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Generator, Optional, TypeVar, Union

import redis

from . import breaker as cb
from . import scripts
from .concurrency import (HEDGE, PRIMARY, RETRY, Acquired, ConcurrencyPolicy, Lease, LeaseIds, acquire_args,
                          lease_keys, parse_acquire, parse_release)
from .decide import Jitter, dead_letter
from .decision import DeadLetter
from .redact import redact_url
from .scripts import BadReply

log = logging.getLogger("fleet_budget")

#: How an admitted call ended, for the breaker (the Rust ``CallOutcome``).
SUCCEEDED = "succeeded"
FAILED = "failed"
INCONCLUSIVE = "inconclusive"

PRIMARY_AT_CAP = "primary_at_cap"
CIRCUIT_OPEN = cb.CIRCUIT_OPEN

_STORE_ERRORS = (redis.exceptions.RedisError, BadReply)


@dataclass
class Call:
    """An admitted execution: the dependency and what it holds. Give it to ``finish``."""

    dependency: str
    lease: Optional[Lease] = None
    #: Whether the breaker admitted it (its result is then reported to the breaker).
    judged: bool = False
    #: The generation of the half-open probe it is, if it is one.
    probe: Optional[int] = None

    @property
    def is_probe(self) -> bool:
        return self.probe is not None


@dataclass(frozen=True)
class Hold:
    """Do not run it yet: wait ``pause`` seconds without spending an attempt, then ask again."""

    reason: str
    pause: float


Admission = Union[Call, Hold, DeadLetter]


#: One store call an admission step needs: a function of no arguments that makes it. The
#: synchronous client calls it; the asyncio flavour awaits what it returns (its scripts and its
#: ``withdraw`` are coroutines). Its answer, or the exception it raised, is sent back into the steps.
Step = Callable[[], Any]
T = TypeVar("T")
Steps = Generator[Step, Any, T]
#: The rate budget's withdrawal of one retry for a dependency, made as a :data:`Step`.
Withdraw = Callable[[str], Any]


def drive(steps: Steps[T]) -> T:
    """Runs ``steps`` with blocking calls (the synchronous client)."""
    answer: Any = None
    error: Optional[Exception] = None
    while True:
        try:
            step = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        answer, error = None, None
        try:
            answer = step()
        except Exception as e:  # handed to the step, which decides (a store error is not fatal)
            error = e


async def drive_async(steps: Steps[T]) -> T:
    """Runs ``steps`` awaiting each call (``fleet_budget.aio``): the same decisions, in the same
    order, as :func:`drive`."""
    answer: Any = None
    error: Optional[Exception] = None
    while True:
        try:
            step = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        answer, error = None, None
        try:
            answer = await step()
        except Exception as e:
            error = e


class AdmissionControl:
    """The admission of each call (the Rust ``AdmissionControl``): the circuit breaker, then a
    lease. Owns the lease ids of this process and its store calls (``lease_acquire.lua``,
    ``lease_release.lua``, ``breaker.lua``); records each store result in the budget's
    :class:`~fleet_budget.health.StoreHealth`. Each operation is written once, as steps that yield
    their store calls (:data:`Step`): :func:`drive` runs them for :class:`fleet_budget.FleetBudget`,
    :func:`drive_async` for its asyncio flavour, so both decide alike. A probe spends one retry of
    the rate budget, which the caller hands in as ``withdraw`` (a step of its own: its
    ``withdraw`` is a coroutine in the asyncio flavour). A forked child makes a new one."""

    def __init__(self, client: Any, config: Any, metrics: Any, health: Any, jitter: Jitter) -> None:
        self._config = config
        self._metrics = metrics
        self._health = health
        self._jitter = jitter
        self._lease_ids = LeaseIds()
        # Not timed, as in Rust: the histogram's `op` is one of spend, deposit, status.
        self._lease_acquire = client.register_script(scripts.text("lease_acquire"))
        self._lease_release = client.register_script(scripts.text("lease_release"))
        self._breaker = client.register_script(scripts.text("breaker"))

    # The steps, shared by both flavours: every store call is yielded, never made here.

    def admit_steps(self, dependency: str, attempt: int, held_for: Optional[float],
                    withdraw: Withdraw) -> Steps[Admission]:
        """Whether execution ``attempt`` (1 = first) of a job of ``dependency`` may run now."""
        call = Call(dependency)
        held = yield from self._judge(call, held_for, withdraw)
        if held is not None:
            return held
        policy = self._config.concurrency.get(dependency)
        if policy is None or not self._health.should_try(dependency):
            return call
        kind = PRIMARY if int(attempt) <= 1 else RETRY
        acquired = yield from self._acquire(dependency, policy, kind)
        if acquired is None:
            return call
        if acquired.lease is not None:
            call.lease = acquired.lease
            return call
        # Not run: a probe it was is given back for another call to make.
        yield from self.finish_steps(call, INCONCLUSIVE)
        if kind == PRIMARY and (held_for or 0.0) < policy.max_wait:
            return Hold(PRIMARY_AT_CAP, 1.0)
        return dead_letter(self._metrics, dependency, acquired.refusal or "", None, "fleet")

    def hedge_steps(self, dependency: str, withdraw: Withdraw) -> Steps[Optional[Call]]:
        """A hedged request to ``dependency``: a slot of the retry share and one retry."""
        call = Call(dependency)
        policy = self._config.concurrency.get(dependency)
        if policy is not None:
            acquired = yield from self._acquire(dependency, policy, HEDGE)
            if acquired is None or acquired.lease is None:
                self._metrics.hedges.labels(dependency, "refused").inc()
                return None
            call.lease = acquired.lease
        granted, _, _ = yield lambda: withdraw(dependency)
        self._metrics.hedges.labels(dependency, "granted" if granted else "refused").inc()
        if granted:
            return call
        yield from self.finish_steps(call, INCONCLUSIVE)
        return None

    def finish_steps(self, call: Call, outcome: str) -> Steps[None]:
        """Gives back what ``call`` holds and reports how it ended to the breaker."""
        dependency = call.dependency
        prefix = self._config.redis.key_prefix
        lease = call.lease
        if lease is not None:
            call.lease = None
            try:
                reply = yield lambda: self._lease_release(keys=lease_keys(prefix, dependency), args=[lease.id])
                in_flight = parse_release(reply)
            except _STORE_ERRORS as e:
                self._health.failed(dependency, e)
                log.debug("lease of %s not released (%s); it expires by itself", dependency, redact_url(str(e)))
            else:
                self._health.ok(dependency)
                self._metrics.in_flight(dependency, in_flight.primaries, in_flight.retries)
                # Not removed, though not expired by the server's ms (field 4 since 0.2.0): the
                # lease was lost (evicted, flushed), its slot free meanwhile (the Rust
                # ``release_checked``).
                if reply[0] == 0 and len(reply) > 3 and isinstance(reply[3], int) and reply[3] < lease.expires_at_ms:
                    self._metrics.leases_lost.labels(dependency).inc()
                    log.warning("a concurrency lease of %s was gone from Redis before its expiry (evicted by a "
                                "maxmemory-policy, FLUSHALL, or a restart without persistence): its slot was free "
                                "for others meanwhile; counted in fleet_budget_leases_lost_total", dependency)
        policy = self._config.breakers.get(dependency)
        if not call.judged or policy is None or (outcome == INCONCLUSIVE and call.probe is None):
            return
        call.judged = False
        keys = cb.breaker_key(prefix, dependency)
        try:
            if outcome == INCONCLUSIVE:
                cb.parse_cancel((yield lambda: self._breaker(keys=keys, args=cb.args(policy, "cancel",
                                                                                     str(call.probe)))))
                decided = None
            else:
                decided = cb.parse_record((yield lambda: self._breaker(
                    keys=keys, args=cb.record_args(policy, outcome == SUCCEEDED, call.probe))))
        except _STORE_ERRORS as e:
            self._health.failed(dependency, e)
            log.debug("result of a call to %s not reported to the breaker (%s)", dependency, redact_url(str(e)))
            return
        self._health.ok(dependency)
        if decided is not None:
            self._breaker_seen(dependency, decided)

    def status_steps(self, dependency: str) -> Steps[Optional[cb.BreakerStatus]]:
        policy = self._config.breakers.get(dependency)
        if policy is None:
            return None
        keys = cb.breaker_key(self._config.redis.key_prefix, dependency)
        return cb.parse_status((yield lambda: self._breaker(keys=keys, args=cb.args(policy, "status"))))

    def _acquire(self, dependency: str, policy: ConcurrencyPolicy, kind: str) -> Steps[Optional[Acquired]]:
        """One ``lease_acquire.lua`` call; None when the store failed (the call runs uncounted)."""
        lease_id = self._lease_ids.next(kind)
        keys = lease_keys(self._config.redis.key_prefix, dependency)
        try:
            reply = yield lambda: self._lease_acquire(keys=keys, args=acquire_args(policy, kind, lease_id))
            acquired = parse_acquire(reply, dependency, policy, kind, lease_id)
        except _STORE_ERRORS as e:
            self._health.failed(dependency, e)
            log.debug("no lease for %s (%s); the call runs uncounted", dependency, redact_url(str(e)))
            return None
        self._health.ok(dependency)
        self._metrics.in_flight(dependency, acquired.in_flight.primaries, acquired.in_flight.retries)
        return acquired

    def _judge(self, call: Call, held_for: Optional[float], withdraw: Withdraw) -> Steps[Optional[Admission]]:
        """Asks the breaker, if the dependency has one: None to go on (``call`` marked judged, and
        a probe when it is one), else the admission of a held job."""
        dependency = call.dependency
        policy = self._config.breakers.get(dependency)
        if policy is None or not self._health.should_try(dependency):
            return None
        keys = cb.breaker_key(self._config.redis.key_prefix, dependency)
        try:
            decided = cb.parse_admit((yield lambda: self._breaker(keys=keys, args=cb.args(policy, "admit"))))
        except _STORE_ERRORS as e:
            self._health.failed(dependency, e)
            log.debug("breaker of %s not consulted (%s); the call runs", dependency, redact_url(str(e)))
            return None
        self._health.ok(dependency)
        self._breaker_seen(dependency, decided)
        if decided.verdict == cb.RUN:
            call.judged = True
            return None
        if decided.verdict == cb.PROBE:
            # A probe is one retry of the rate budget, which the floor grants however it fails.
            granted, _, _ = yield lambda: withdraw(dependency)
            if granted:
                call.judged, call.probe = True, decided.generation
                return None
            cancel = cb.args(policy, "cancel", str(decided.generation))
            try:
                cb.parse_cancel((yield lambda: self._breaker(keys=keys, args=cancel)))
            except _STORE_ERRORS as e:
                log.debug("probe of %s not given back (%s); it is reissued after the probe timeout", dependency,
                          redact_url(str(e)))
        return self._held_by_breaker(dependency, policy, decided, held_for)

    def _held_by_breaker(self, dependency: str, policy: cb.BreakerPolicy, decided: cb.Decided,
                         held_for: Optional[float]) -> Admission:
        held = held_for or 0.0
        if held >= policy.max_wait:
            return dead_letter(self._metrics, dependency, CIRCUIT_OPEN, None, "fleet")
        # Back when the open period ends, or when the job's limit does if that comes first; at
        # least 1 s, and up to a quarter more so that the held jobs do not all come back at once.
        rest = max(1.0, min(max(0, decided.open_until_ms - decided.now_ms) / 1000, policy.max_wait - held))
        jitter = self._jitter.draw(lambda rng: rng.uniform(1.0, 1.25))
        return Hold(CIRCUIT_OPEN, rest * jitter)

    def _breaker_seen(self, dependency: str, decided: cb.Decided) -> None:
        """Shows the state seen; logs and counts a change made by this call (once fleet-wide)."""
        self._metrics.breaker_state.labels(dependency).set(decided.state)
        # A breaker this process saw open, found closed before its open period ended without this
        # call closing it, was lost (evicted, flushed): an open breaker only closes through
        # half-open (the Rust ``Health::breaker_lost``).
        if self._health.breaker_lost(dependency, decided):
            self._metrics.breaker_transitions.labels(dependency, "lost").inc()
            log.warning("circuit breaker of %s found closed before its open period ended: its key was lost in "
                        "Redis (evicted by a maxmemory-policy, FLUSHALL, or a restart without persistence); it "
                        "opens again after min_volume calls; counted in "
                        "fleet_budget_breaker_transitions_total{to=\"lost\"}", dependency)
        if decided.changed:
            self._metrics.breaker_transitions.labels(dependency, decided.state_name).inc()
            log.warning("circuit breaker of %s changed state to %s (open until %d ms)", dependency,
                        decided.state_name, decided.open_until_ms)
