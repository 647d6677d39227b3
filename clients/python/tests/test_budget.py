"""FleetBudget against a private redis-server: the decision order, the budget, deposits,
the fallback and the metrics."""

import redis

from fleet_budget import (ATTEMPTS_EXHAUSTED, BUDGET_EXHAUSTED, NON_RETRYABLE, PROBE_INTERVAL_MS, Config,
                          DeadLetter, Failure, FleetBudget, Retry)

TOML = """
[redis]
deposit_flush_ms = 0
[defaults]
min_allowance = 3
[dependencies.search]
tasks = ["index_document"]
[tasks.index_document]
max_attempts = 4
"""


def budget(url, text=TOML, **kw):
    return FleetBudget(Config.from_toml(text), redis_url=url, seed=7, **kw)


def test_the_decision_order_and_the_floor(redis_url):
    b = budget(redis_url)
    d = b.on_failure("index_document", 1, Failure.non_retryable("400"))
    assert isinstance(d, DeadLetter) and d.reason == NON_RETRYABLE and d.snapshot is None
    d = b.on_failure("index_document", 4, Failure.retryable("503"))
    assert d.reason == ATTEMPTS_EXHAUSTED and d.source == "not_consulted"
    grants = [b.on_failure("index_document", 1, Failure.retryable("503")) for _ in range(4)]
    assert [isinstance(g, Retry) for g in grants] == [True, True, True, False]
    assert grants[0].next_attempt == 2 and 1.5 <= grants[0].delay <= 2.5 and grants[0].source == "fleet"
    assert grants[3].reason == BUDGET_EXHAUSTED and grants[3].snapshot.current.denied == 1
    assert b.metrics.value("fleet_budget_retries_granted_total", dependency="search") == 3
    assert b.metrics.value("fleet_budget_dead_letters_total", dependency="search", reason="budget_exhausted") == 1
    raw = redis.Redis.from_url(redis_url).hgetall("fb:v1:{search}")
    assert raw[b"cr"] == b"3" and raw[b"cd"] == b"1"
    b.close()


def test_retry_after_is_a_lower_bound(redis_url):
    b = budget(redis_url)
    d = b.on_failure("index_document", 1, Failure.after(30, "429"))
    assert isinstance(d, Retry) and d.delay == 30
    b.close()


def test_deposits_successes_and_first_attempts(redis_url):
    b = budget(redis_url)
    for _ in range(5):
        b.on_attempt("index_document", 1)
        b.on_success("index_document")
    b.on_attempt("index_document", 2)
    snap, source = b.status("search")
    assert source == "fleet"
    assert (snap.current.successes, snap.current.first_attempts) == (5, 5)
    assert b.metrics.value("fleet_budget_executions_total", dependency="search") == 6
    b.close()


def test_coalesced_deposits_are_sent_on_close(redis_url):
    text = TOML.replace("deposit_flush_ms = 0", "deposit_flush_ms = 10000")
    b = budget(redis_url, text)
    for _ in range(7):
        b.on_success("index_document")
    assert b.pending_deposits() == 7
    b.close()
    assert redis.Redis.from_url(redis_url).hget("fb:v1:{search}", "cs") == b"7"


def test_unreachable_redis_falls_back_and_probes_by_the_clock(dead_url):
    now = [1_000_000]
    b = budget(dead_url, clock=lambda: now[0])
    d = b.on_failure("index_document", 1, Failure.retryable("503"))
    assert isinstance(d, Retry) and d.source == "local_fallback" and b.in_fallback
    assert b.metrics.value("fleet_budget_fallback_active") == 1
    assert b.metrics.value("fleet_budget_store_errors_total", kind="connection") == 1
    b.on_failure("index_document", 1, Failure.retryable("503"))
    assert b.metrics.value("fleet_budget_store_errors_total", kind="connection") == 1, "not probed yet"
    now[0] += PROBE_INTERVAL_MS
    b.on_failure("index_document", 1, Failure.retryable("503"))
    assert b.metrics.value("fleet_budget_store_errors_total", kind="connection") == 2
    d = b.on_failure("index_document", 1, Failure.retryable("503"))
    assert d.reason == BUDGET_EXHAUSTED and d.source == "local_fallback", "the local floor of 3"
    b.close()
    for mode, granted in [("deny", False), ("allow", True)]:
        b = budget(dead_url, TOML.replace("[redis]", f'[redis]\nfallback = "{mode}"'))
        d = b.on_failure("index_document", 1, Failure.retryable("503"))
        assert isinstance(d, Retry) == granted and d.source == "blind"
        b.close()


def test_a_task_that_cannot_be_a_dependency_is_refused(redis_url):
    b = budget(redis_url)
    for task in ["", "a{b", "x" * 201]:
        try:
            b.on_failure(task, 1, Failure.retryable("x"))
        except ValueError:
            continue
        raise AssertionError(task)
    b.close()


def test_a_freeze_dead_letters_as_budget_frozen_and_conflicts_are_counted(redis_url):
    from conftest import REPO

    r = redis.Redis.from_url(redis_url)
    freeze = r.register_script((REPO / "lua" / "override.lua").read_text())
    b = budget(redis_url)
    b.on_success("index_document")
    freeze(keys=["fb:v1:{search}"], args=["freeze", 60_000, "ops", "incident"])
    d = b.on_failure("index_document", 1, Failure.retryable("503"))
    assert d.reason == "budget_frozen" and d.snapshot.control.frozen and d.snapshot.allowance == 0
    other = budget(redis_url, TOML.replace("min_allowance = 3", "min_allowance = 4"))
    d = other.on_failure("index_document", 1, Failure.retryable("503"))
    assert d.snapshot.control.conflict
    assert other.metrics.value("fleet_budget_policy_conflicts_total", dependency="search") == 1
    assert b.metrics.value("fleet_budget_policy_conflicts_total", dependency="search") == 0
    b.close()
    other.close()


def test_a_cluster_that_does_not_answer_at_start_is_a_fallback_not_a_crash(dead_url):
    """The cluster client is made on first use: the worker starts, decides from the fallback,
    and counts a connection error (the Rust store connects lazily too)."""
    b = FleetBudget(Config.from_toml(TOML.replace("[redis]", f'[redis]\ncluster_urls = ["{dead_url}"]\ntimeout_ms = 200')),
                    seed=7)
    d = b.on_failure("index_document", 1, Failure.retryable("503"))
    assert isinstance(d, Retry) and d.source == "local_fallback"
    assert b.metrics.value("fleet_budget_store_errors_total", kind="connection") == 1
    b.close()


def test_close_reports_the_deposits_it_could_not_send(dead_url, caplog):
    b = budget(dead_url)
    b.on_success("index_document")
    b.on_attempt("index_document", 1)
    assert b.close() == 2
    assert "2 deposits not sent" in caplog.text
