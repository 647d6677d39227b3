"""Celery tasks that draw on the fleet budget, and dead-letter as the Rust worker does.

::

    @app.task(base=BudgetedTask, budget=budget, name="index_document", retry_on=(search.Unavailable,))
    def index_document(doc_id):
        return search.index(doc_id)

Each execution is reported to the budget (Celery's ``request.retries`` counts from 0, the budget's
attempts from 1). A failure goes through the contract's decision order (``docs/semantics.md``):

- granted: ``self.retry(countdown=decision.delay)``, Celery's own retry (a new message on the
  task's queue with ``retries + 1``, carrying the job's ``fb-*`` headers along);
- denied, exhausted, or not retryable: the job is published to the ``<amqp.prefix>.dead`` exchange
  (``fleet.dead``) with the Rust worker's ``fb-*`` headers, ``mandatory`` and with a publisher
  confirm, and only then acked (the task raises :class:`DeadLettered`, so a caller waiting on the
  result sees why). An unconfirmed copy leaves the job unacked: it is requeued and runs again, a
  duplicate is possible, a loss is not. A confirmed copy is counted in the dead-letter index under
  the row the Rust tools read back from its headers (``fleet_budget.dead_letters``), as the Rust
  worker counts it, so that ``budgetctl dlq stats`` and a replay's dry run never read the queue.

The dead letter is the job in Celery's message format (protocol 2: the ``task``, ``id`` and other
headers, the ``[args, kwargs, embed]`` body, ``correlation_id``), as its next life should start:
``retries`` 0, no ``eta`` and no ``expires`` (a replay is an operator's decision to run the job
anyway, as with the Rust worker's per-message expiration), ``message_id`` the task id. So
``budgetctl dlq stats``/``peek`` read it and ``budgetctl replay`` republishes it, as it does any dead
letter, to the exchange and routing key it was consumed from, where a Celery worker runs it again
with the attempt counter back at 1 and ``fb-replays`` counted.

Every pool works (prefork, the default, with or without ``--max-tasks-per-child``; threads;
solo): a prefork child sends its own deposits within ``redis.deposit_flush_ms`` and before it
exits, and has its own Redis and broker connections and metrics (``fleet_budget.forks``). In the
worker registry each prefork child is a worker of its own; the main process leaves it once the pool
is up (it runs no task).

``acks_late`` is on (the copy is confirmed before the original is acked) and ``max_retries`` is
off (the budget's ceilings decide). Messages that never reach a task (a body Celery cannot decode,
an unknown task, a malformed protocol message) are dead-lettered the same way, ``non_retryable``,
when the worker runs :class:`Consumer` (see :func:`install`); Celery itself acks or rejects them
and they are lost.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Optional

from celery import Task, signals
from celery.exceptions import Ignore, Reject
from celery.exceptions import Retry as CeleryRetry
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.serialization import dumps

from . import dead_letters, forks, registry
from . import headers as h
from .budget import FleetBudget, InvalidTask, UnmappedTask
from .admission import FAILED, INCONCLUSIVE, SUCCEEDED, Hold
from .decision import NON_RETRYABLE, DeadLetter, Failure, Retry
from .publish import ConfirmedPublisher, NotConfirmed, PermanentlyRefused, fanout_key
from .redact import error_text

log = logging.getLogger("fleet_budget.celery")

#: How long an unconfirmed dead letter waits before its job is requeued (the Rust
#: ``unconfirmed_pause``), so that a broken dead-letter path does not spin.
UNCONFIRMED_PAUSE = 0.25

# The publisher of each Celery app (one connection per process and app).
_publishers: "weakref.WeakKeyDictionary[Any, ConfirmedPublisher]" = weakref.WeakKeyDictionary()
# The budget install() gave each app, for messages that never reach a task.
_budgets: "weakref.WeakKeyDictionary[Any, FleetBudget]" = weakref.WeakKeyDictionary()


def _flush_before_the_child_exits(**_: Any) -> None:
    """A prefork child leaves through ``os._exit`` (after ``--max-tasks-per-child`` tasks, or at
    shutdown), where ``atexit`` does not run: its pending deposits are sent here, on Celery's
    ``worker_process_shutdown``, or they would be lost."""
    forks.before_exit()


signals.worker_process_shutdown.connect(_flush_before_the_child_exits, weak=False)


def _prefork_parent_leaves_the_registry(sender: Any = None, **_: Any) -> None:
    """A prefork worker's main process runs no task: once its pool is up (``worker_ready``), its
    budgets leave the worker registry, and the pool shows one worker per child (each child
    reports under its own id from the fork on: ``fleet_budget.registry``). Other pools run their
    tasks in the main process, which stays in the registry."""
    pool = getattr(sender, "pool", None)
    if pool is not None and type(pool).__module__ == "celery.concurrency.prefork":
        registry.leave_all()


signals.worker_ready.connect(_prefork_parent_leaves_the_registry, weak=False)


def held_since_ms(header: Optional[int], now_ms: int) -> Optional[int]:
    """Since when a job has been held, from its ``fb-held-since-ms`` header, as the Rust worker
    reads it: a time after ``now_ms`` (a producer's header, a clock ahead) counts from now, so that
    a job cannot be held past the limit for ever, its hold never seeming to start."""
    return None if header is None else min(header, now_ms)


class DeadLettered(Exception):
    """The job was published to the dead-letter exchange (confirmed) and acked; ``reason`` says why."""

    def __init__(self, task: str, reason: str, error: str = "") -> None:
        # The arguments as given, so that Celery's result backends rebuild it (cls(*args)).
        super().__init__(task, reason, error)
        self.task, self.reason, self.error = task, reason, error

    def __str__(self) -> str:
        return f"{self.task}: dead-lettered ({self.reason}): {self.error}"


def install(app: Any, budget: FleetBudget) -> None:
    """Makes ``app``'s workers dead-letter messages that never reach a task (see :class:`Consumer`)."""
    _budgets[app] = budget
    app.conf.worker_consumer = f"{__name__}:Consumer"


def publisher(app: Any) -> ConfirmedPublisher:
    p = _publishers.get(app)
    if p is None:
        p = _publishers[app] = ConfirmedPublisher(app.connection_for_write)
    return p


class BudgetedTask(Task):
    """A Celery task base drawing on ``budget`` (set it as a task option, ``budget=...``)."""

    acks_late = True
    acks_on_failure_or_timeout = True
    max_retries = None
    #: The FleetBudget the task draws on (required).
    budget: Optional[FleetBudget] = None
    #: The task's name in the budget's task → dependency map; the Celery task name when None.
    budget_task: Optional[str] = None
    #: Exceptions that are retryable failures; anything else is dead-lettered ``non_retryable``.
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    #: Exceptions that are never retried, checked before ``retry_on``.
    give_up_on: tuple[type[BaseException], ...] = ()

    def failure(self, exc: BaseException) -> Failure:
        """How ``exc`` counts: retryable (``retry_on``, with a ``retry_after`` attribute in seconds
        as a ``Retry-After``) or not. The error class is the exception's type name."""
        cls = type(exc).__name__
        if isinstance(exc, self.give_up_on) or not isinstance(exc, self.retry_on):
            return Failure.non_retryable(exc).with_class(cls)
        after = getattr(exc, "retry_after", None)
        if isinstance(after, (int, float)) and not isinstance(after, bool):
            return Failure.after(after, exc).with_class(cls)
        return Failure.retryable(exc).with_class(cls)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly or request.is_eager:
            return super().__call__(*args, **kwargs)
        budget = self._budget()
        task = self.budget_task or self.name
        retries = request.retries or 0
        attempt = retries + 1 if isinstance(retries, int) and not isinstance(retries, bool) and retries >= 0 else 1
        try:
            if attempt == 1 and retries != 0:
                raise h.HeaderError("retries", f"expected a non-negative integer, got {retries!r:.40}")
            job = h.JobHeaders.parse(request.headers)
        except h.HeaderError as e:
            # The Rust worker's `malformed_header`: dead-lettered without running.
            self._dead_letter(task, _dependency_or_empty(budget, task), NON_RETRYABLE, attempt, None,
                              Failure.non_retryable(e).with_class("malformed_header"), None, "not_consulted")
        now = h.now_ms()
        held_since = held_since_ms(job.held_since_ms, now)
        held_for = None if held_since is None else (now - held_since) / 1000
        try:
            # The concurrency budget and the breaker first, as the Rust worker asks them.
            admission = budget.admit(task, attempt, held_for)
            if isinstance(admission, Hold):
                self._hold(admission, held_since if held_since is not None else now)
            if isinstance(admission, DeadLetter):
                failure = Failure.retryable(
                    f"not run: the concurrency budget refused the retry ({admission.reason})").with_class(admission.reason)
                self._dead_letter(task, admission.dependency, admission.reason, attempt, job, failure, None,
                                  admission.source)
            call = admission
            try:
                budget.on_attempt(task, attempt)
            except InvalidTask:
                budget.finish(call, INCONCLUSIVE)
                raise
        except InvalidTask as e:
            # The Rust worker's classes: `unmapped_task` when unmapped tasks are rejected.
            cls = "unmapped_task" if isinstance(e, UnmappedTask) else "invalid_task"
            self._dead_letter(task, "", NON_RETRYABLE, attempt, job,
                              Failure.non_retryable(e).with_class(cls), None, "not_consulted")
        try:
            result = self.run(*args, **kwargs)
        except (CeleryRetry, Ignore, Reject):
            budget.finish(call, INCONCLUSIVE)
            raise
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # Interrupted (a shutdown): nothing said about the dependency; the slot is given back.
                budget.finish(call, INCONCLUSIVE)
                raise
            failure = self.failure(exc)
            # A failure that may be the dependency's feeds its breaker; a non-retryable one (bad
            # input) says nothing about its health.
            budget.finish(call, FAILED if failure.is_retryable else INCONCLUSIVE)
            failed_ms = h.now_ms()
            first = job.first_failure_ms if job.first_failure_ms is not None else failed_ms
            # As the Rust worker: a task with a recovery window is held to the window since the
            # job's first failure (fb-first-failure-ms, carried across Celery's retries).
            since = max(0, failed_ms - first) / 1000
            decision = budget.on_failure_since(task, attempt, failure, since)
            if isinstance(decision, Retry):
                carried = {k: v for k, v in (request.headers or {}).items()
                           if k not in h.DEAD_LETTER_HEADERS and k not in h.HOLD_HEADERS}
                carried[h.FIRST_FAILURE_MS] = first
                # In shadow, a retry the budget refused says so; a granted one drops an earlier mark.
                carried.pop(h.SHADOW_DENIED, None)
                if decision.shadow_denied is not None:
                    carried[h.SHADOW_DENIED] = decision.shadow_denied
                raise self.retry(exc=exc, countdown=decision.delay, headers=carried)
            self._dead_letter(task, decision.dependency, decision.reason, attempt, job, failure,
                              decision.snapshot, decision.source, exc)
        budget.finish(call, SUCCEEDED)
        budget.on_success(task)
        return result

    def _hold(self, hold: Hold, held_since_ms: int) -> None:
        """The job waits ``hold.pause`` seconds without running and without spending an attempt:
        published again with the same ``retries`` and the hold headers (the first hold's time
        kept), then Celery's :class:`~celery.exceptions.Retry` acks this delivery, as a granted
        retry does. A failed publish rejects it with requeue (nothing lost)."""
        request = self.request
        carried = {k: v for k, v in (request.headers or {}).items() if k not in h.DEAD_LETTER_HEADERS}
        carried[h.HOLD_REASON] = hold.reason
        carried[h.HELD_SINCE_MS] = held_since_ms
        signature = self.signature_from_request(request, None, None, countdown=hold.pause, eta=None,
                                                retries=request.retries or 0, headers=carried)
        try:
            signature.apply_async()
        except Exception as e:
            log.warning("%s[%s]: held job not published again (%s); it is requeued", self.name, request.id, e)
            time.sleep(UNCONFIRMED_PAUSE)
            raise Reject(str(e), requeue=True) from e
        raise CeleryRetry(f"held: {hold.reason}", None, when=hold.pause, sig=signature)

    def _budget(self) -> FleetBudget:
        if self.budget is None:
            raise RuntimeError(f"task {self.name}: BudgetedTask needs a budget (budget=FleetBudget(...))")
        return self.budget

    def _dead_letter(self, task: str, dependency: str, reason: str, attempt: int, job: Optional[h.JobHeaders],
                     failure: Failure, snapshot: Any, source: str, exc: Optional[BaseException] = None) -> None:
        """Publishes the job to the dead-letter exchange, then raises :class:`DeadLettered` (the
        job is acked) or, not confirmed, :class:`Reject` with requeue (it comes back)."""
        request = self.request
        job = job or h.JobHeaders()
        delivery = request.delivery_info or {}
        exchange = job.original_exchange if job.original_exchange is not None else str(delivery.get("exchange") or "")
        routing_key = (job.original_routing_key if job.original_routing_key is not None
                       else str(delivery.get("routing_key") or ""))
        now = h.now_ms()
        record = h.DeadLetterRecord(
            task=task, dependency=dependency, reason=reason,
            original_exchange=exchange, original_routing_key=routing_key,
            original_queue=_queue_of(self.app, exchange, routing_key),
            attempts=attempt, first_failure_ms=job.first_failure_ms or now, dead_lettered_ms=now,
            error_class=failure.cls, error=failure.message, snapshot=snapshot, source=source,
            replays=job.replays,
        )
        body, properties, celery_headers = self._job_message()
        carried = {k: v for k, v in (request.headers or {}).items()
                   if k not in h.DEAD_LETTER_HEADERS and k != h.FIRST_FAILURE_MS and k not in h.HOLD_HEADERS}
        headers = {**celery_headers, **carried, **record.headers()}
        target = self._budget().config.dead_letter_exchange
        try:
            publisher(self.app).publish(target, fanout_key(routing_key), body, headers, properties)
        except PermanentlyRefused as e:
            # Never publishable (a name over 255 bytes): acked with the reason logged, as the
            # Rust worker parks it rather than requeueing it forever.
            log.error("%s[%s]: dead letter can never be published (%s); dropping it", task, request.id, e)
            raise DeadLettered(task, reason, f"not published: {e}") from exc
        except NotConfirmed as e:
            log.warning("%s[%s]: dead letter not confirmed (%s); the job is requeued", task, request.id, e)
            time.sleep(UNCONFIRMED_PAUSE)
            raise Reject(str(e), requeue=True) from exc
        # Confirmed: counted in the dead-letter index (sent within 250 ms, by a thread).
        dead_letters.count_confirmed(self._budget(), headers)
        raise DeadLettered(task, reason, error_text(failure.message)) from exc

    def _job_message(self) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
        """This job as Celery's protocol 2 message, ready to run again (``retries`` 0, no ``eta``,
        no ``expires``): body, properties, headers."""
        r = self.request
        limit_hard, limit_soft = r.timelimit or (None, None)
        message = self.app.amqp.as_task_v2(
            r.id, self.name, r.args, r.kwargs, group_id=r.group, group_index=r.group_index, retries=0,
            chord=r.chord, callbacks=r.callbacks, errbacks=r.errbacks, reply_to=r.reply_to,
            time_limit=limit_hard, soft_time_limit=limit_soft, root_id=r.root_id, parent_id=r.parent_id,
            shadow=r.shadow, chain=r.chain, origin=r.origin, ignore_result=r.ignore_result,
            replaced_task_nesting=r.replaced_task_nesting or 0,
        )
        serializer = self.serializer or self.app.conf.task_serializer
        content_type, content_encoding, data = dumps(message.body, serializer=serializer)
        if isinstance(data, str):
            data = data.encode(content_encoding or "utf-8")
        priority = (r.delivery_info or {}).get("priority")
        properties: dict[str, Any] = {
            **{k: v for k, v in message.properties.items() if v},
            "content_type": content_type,
            "content_encoding": content_encoding,
            "delivery_mode": 2,
            "message_id": r.id,
        }
        if priority is not None:
            properties["priority"] = priority
        return data, properties, message.headers


def _dependency_or_empty(budget: FleetBudget, task: str) -> str:
    try:
        return budget.dependency(task)
    except InvalidTask:
        return ""


def _queue_of(app: Any, exchange: str, routing_key: str) -> str:
    """The queue a delivery came from: Celery's queue bound with that exchange and routing key,
    else the routing key (the queue itself, for the default exchange)."""
    for queue in (app.amqp.queues or {}).values():
        if queue.exchange is not None and queue.exchange.name == exchange and queue.routing_key == routing_key:
            return str(queue.name)
    return routing_key


class Consumer(CeleryConsumer):
    """Celery's consumer, dead-lettering what it would drop: a body it cannot decode, an unknown
    task, a malformed task message. Each goes to ``<prefix>.dead`` as ``non_retryable`` (class
    ``poison``, ``unknown_task``, ``invalid_task``) with the message as it came, confirmed before
    the ack; unconfirmed, it is requeued. Enabled by :func:`install`."""

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        self._dead_letter_raw(message, "poison", exc)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._dead_letter_raw(message, "unknown_task", exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._dead_letter_raw(message, "invalid_task", exc)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        self._dead_letter_raw(message, "unknown_message", ValueError("not a Celery task message (no task header)"))

    def _dead_letter_raw(self, message: Any, error_class: str, exc: Exception) -> None:
        budget = _budgets.get(self.app)
        if budget is None:  # not installed for this app: Celery's own handling
            if error_class == "poison":
                return super().on_decode_error(message, exc)
            return message.reject(requeue=False)
        raw_headers = dict(message.headers or {})
        delivery = message.delivery_info or {}
        task = raw_headers.get("task")
        task = task if isinstance(task, str) and task else str(delivery.get("routing_key") or "")
        try:
            job = h.JobHeaders.parse(raw_headers)
        except h.HeaderError:
            job = h.JobHeaders()
        exchange = job.original_exchange if job.original_exchange is not None else str(delivery.get("exchange") or "")
        routing_key = (job.original_routing_key if job.original_routing_key is not None
                       else str(delivery.get("routing_key") or ""))
        now = h.now_ms()
        retries = raw_headers.get("retries")
        attempts = retries + 1 if isinstance(retries, int) and not isinstance(retries, bool) and retries >= 0 else 1
        record = h.DeadLetterRecord(
            task=task, dependency=_dependency_or_empty(budget, task) if task else "", reason=NON_RETRYABLE,
            original_exchange=exchange, original_routing_key=routing_key,
            original_queue=_queue_of(self.app, exchange, routing_key), attempts=attempts,
            first_failure_ms=job.first_failure_ms or now, dead_lettered_ms=now, error_class=error_class,
            error=f"{type(exc).__name__}: {exc}", snapshot=None, source="not_consulted", replays=job.replays,
        )
        headers = {k: v for k, v in raw_headers.items()
                   if k not in h.DEAD_LETTER_HEADERS and not k.startswith("x-")}
        headers.update(record.headers())
        props = message.properties or {}
        properties = {k: props[k] for k in ("content_type", "content_encoding", "correlation_id", "reply_to",
                                             "priority", "message_id", "type", "app_id", "timestamp")
                      if props.get(k) not in (None, "")}
        if getattr(message, "content_type", None):
            properties["content_type"] = message.content_type
        if getattr(message, "content_encoding", None):
            properties["content_encoding"] = message.content_encoding
        properties["delivery_mode"] = 2
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
        try:
            publisher(self.app).publish(budget.config.dead_letter_exchange, fanout_key(routing_key), body,
                                        headers, properties)
        except PermanentlyRefused as e:
            log.error("message on %r can never be dead-lettered (%s); rejecting it", routing_key, e)
            message.reject(requeue=False)
            return
        except NotConfirmed as e:
            log.warning("dead letter of an undeliverable message not confirmed (%s); requeued", e)
            time.sleep(UNCONFIRMED_PAUSE)
            message.reject(requeue=True)
            return
        dead_letters.count_confirmed(budget, headers)
        log.error("message on %r dead-lettered as %s: %s", routing_key, error_class, error_text(str(exc)))
        message.ack()


__all__ = ["BudgetedTask", "Consumer", "DeadLettered", "install", "publisher"]
