"""A Celery app on fleet_budget.celery, for tests that run a real worker process:
``celery -A celery_fleet worker -Q $FB_CELERY_QUEUE`` (any pool: prefork, the default, threads,
solo) with ``FB_CONFIG`` (the TOML of
fleet-budget) and ``FB_CELERY_QUEUE`` in the environment. Used by clients/python/tests/test_celery.py
and by the mixed Rust/Celery fleet (tests/mixed_fleet.rs).

``index_document(doc_id, fail=n)`` fails its first ``n`` executions with a retryable error
(``fail=-1``: a non-retryable one). ``search(doc_id)`` calls the dependency the way
``tests/src/bin/fleet-worker.rs`` does: one TCP line ``CALL <task id> search <attempt> <replays>
<pid>`` to the line server at ``FB_UPSTREAM`` (HOST:PORT, owned by the test), answered ``OK``,
``FAIL <class>`` (retryable) or ``REJECT <class>``, 2 s at most. Executions are counted in the
Redis key ``<FB_CELERY_QUEUE>:calls`` (the budget's Redis), and the processes that ran them (``"<pid> <parent's pid>"``) in
the set ``<FB_CELERY_QUEUE>:pids``. ``fail_as(doc_id, error_class, retryable)`` (and ``mail_as``, the same
under another name) fails every execution with that error class. ``shadow_index`` and
``switch_index`` (two task names, two dependencies in a test's configuration) are
``index_document`` that also notes each execution, ``"<task> <doc_id> <attempt>
<fb-shadow-denied or ->"``, in the list ``<FB_CELERY_QUEUE>:seen`` (the header as the delivered
message carries it), and may hold its retries until a test says go.

With ``FB_METRICS`` set, each prefork child serves its own Prometheus registry
(``budget.metrics.registry``, the child's) on a port of its own on 127.0.0.1, as a user scrapes a
prefork pool, and adds the port to the set ``<FB_CELERY_QUEUE>:metrics``."""

import os
import socket
import time

import redis
from celery import Celery, signals

from fleet_budget import FleetBudget
from fleet_budget.celery import BudgetedTask, install
from fleet_budget.decision import Failure

QUEUE = os.environ["FB_CELERY_QUEUE"]
budget = FleetBudget.from_config(os.environ["FB_CONFIG"])
app = Celery("celery_fleet", broker=os.environ.get("FB_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(task_default_queue=QUEUE, result_backend="rpc://", broker_connection_timeout=5,
                worker_prefetch_multiplier=4, worker_hijack_root_logger=False)
install(app, budget)
state = redis.Redis.from_url(budget.config.redis.url, socket_timeout=5)


class Unavailable(Exception):
    pass


class BadRequest(Exception):
    pass


@app.task(base=BudgetedTask, budget=budget, name="index_document", retry_on=(Unavailable,), bind=True)
def index_document(self, doc_id, fail=0, error="search unavailable"):
    state.incr(f"{QUEUE}:calls")
    state.sadd(f"{QUEUE}:pids", f"{os.getpid()} {os.getppid()}")
    if fail < 0:
        raise BadRequest(f"doc {doc_id} is malformed")
    if self.request.retries < fail:
        raise Unavailable(error)
    return f"indexed {doc_id}"


class Rejected(Exception):
    pass


@app.task(base=BudgetedTask, budget=budget, name="search", retry_on=(Unavailable, OSError), bind=True)
def search(self, doc_id):
    state.incr(f"{QUEUE}:calls")
    host, _, port = os.environ["FB_UPSTREAM"].rpartition(":")
    replays = int((self.request.headers or {}).get("fb-replays") or 0)
    line = f"CALL {self.request.id} search {self.request.retries + 1} {replays} {os.getpid()}\n"
    with socket.create_connection((host, int(port)), timeout=2) as conn:
        conn.sendall(line.encode())
        answer = conn.makefile().readline().split()
    if answer[:1] == ["OK"]:
        return doc_id
    if answer[:1] == ["REJECT"]:
        raise Rejected(" ".join(answer[1:]))
    raise Unavailable(" ".join(answer[1:]) or "no answer")


class Failed(Exception):
    """Fails with the error class it is given (``Failed(class, retryable)``): a test's hostile classes."""


class ClassedTask(BudgetedTask):
    """A task whose failures carry the error class they were raised with."""

    def failure(self, exc):
        if isinstance(exc, Failed):
            error_class, retryable = exc.args
            return (Failure.retryable(exc) if retryable else Failure.non_retryable(exc)).with_class(error_class)
        return super().failure(exc)


def _fail_as(self, doc_id, error_class, retryable=False):
    """Fails with ``error_class`` (retryable or not), every time."""
    state.incr(f"{QUEUE}:calls")
    state.sadd(f"{QUEUE}:pids", f"{os.getpid()} {os.getppid()}")
    raise Failed(error_class, retryable)


# ``fail_as`` and ``mail_as``: the same job under two task names (two dependencies, in a test's
# configuration).
fail_as = app.task(base=ClassedTask, budget=budget, name="fail_as", retry_on=(Failed,), bind=True)(_fail_as)
mail_as = app.task(base=ClassedTask, budget=budget, name="mail_as", retry_on=(Failed,), bind=True)(_fail_as)


def _index_noted(self, doc_id, fail=0, hold_retries=False):
    """``index_document``, each execution noted with the ``fb-shadow-denied`` header it carried;
    ``hold_retries``: a retry waits (60 s at most) for the key ``<FB_CELERY_QUEUE>:go:<doc_id>``
    before it goes on, so that a test changes the budget between two attempts."""
    shadow = (self.request.headers or {}).get("fb-shadow-denied") or "-"
    state.rpush(f"{QUEUE}:seen", f"{self.name} {doc_id} {self.request.retries + 1} {shadow}")
    if hold_retries and self.request.retries > 0:
        for _ in range(1200):
            if state.exists(f"{QUEUE}:go:{doc_id}"):
                break
            time.sleep(0.05)
    if self.request.retries < fail:
        raise Unavailable("search unavailable")
    return f"indexed {doc_id}"


shadow_index = app.task(base=BudgetedTask, budget=budget, name="shadow_index", retry_on=(Unavailable,),
                        bind=True)(_index_noted)
switch_index = app.task(base=BudgetedTask, budget=budget, name="switch_index", retry_on=(Unavailable,),
                        bind=True)(_index_noted)


@signals.worker_process_init.connect(weak=False)
def _serve_metrics(**_):
    """A prefork child's metrics on a port of its own (``FB_METRICS`` set)."""
    if os.environ.get("FB_METRICS"):
        from prometheus_client import start_http_server

        server, _thread = start_http_server(0, addr="127.0.0.1", registry=budget.metrics.registry)
        state.sadd(f"{QUEUE}:metrics", server.server_port)
