"""FleetBudget against a private redis-server: the decision order, the budget, deposits,
the fallback and the metrics."""

import pytest
import redis

from fleet_budget import (ATTEMPTS_EXHAUSTED, BUDGET_EXHAUSTED, DELAY_EXCEEDED, NON_RETRYABLE, PROBE_INTERVAL_MS,
                          Config, DeadLetter, Failure, FleetBudget, InvalidTask, Retry, UnmappedTask)
from fleet_budget.scripts import workers_keys

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
    assert b.metrics.value("fleet_budget_fallback_active", dependency="search") == 1
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


def test_unmapped_names_get_their_own_budget_up_to_the_cap_then_share_unmapped(redis_url):
    b = budget(redis_url, TOML + "[unmapped_tasks]\nmax_own_budgets = 3\n")
    names = [b.dependency(f"t{i}") for i in range(1000)]
    assert names[:3] == ["t0", "t1", "t2"] and set(names[3:]) == {"unmapped"}
    assert b.dependency("t1") == "t1", "an admitted name keeps its budget"
    assert b.dependency("index_document") == "search", "a mapped task is never capped"
    with pytest.raises(InvalidTask):
        b.dependency("a{b}")
    # The decisions spend those budgets: 3 own, the rest the one `unmapped` budget (floor 3).
    for i in range(3, 50):
        b.on_failure(f"t{i}", 1, Failure.retryable("503"))
    # Every key but the worker registry's two (one per fleet, whatever the tasks).
    keys = {k.decode() for k in redis.Redis.from_url(redis_url).keys("fb:v1:*")}
    keys -= set(workers_keys("fb"))
    assert keys == {"fb:v1:{unmapped}"}, keys
    assert b.on_failure("t999", 1, Failure.retryable("503")).reason == BUDGET_EXHAUSTED
    deps = {s.labels.get("dependency") for m in b.metrics.registry.collect() for s in m.samples} - {None}
    assert deps <= {"unmapped", "t0", "t1", "t2", "search"}, "label values bounded by the cap"
    b.close()
    zero = budget(redis_url, TOML + "[unmapped_tasks]\nmax_own_budgets = 0\n")
    assert zero.dependency("x") == "unmapped"
    zero.close()


def test_unmapped_names_share_a_named_dependency_or_are_rejected(redis_url):
    b = budget(redis_url, TOML + "[unmapped_tasks]\npolicy = \"share\"\ndependency = \"search\"\n")
    assert b.dependency("any") == "search" and b.dependency("a{b}") == "search", "not a key when it shares"
    d = b.on_failure("any", 1, Failure.retryable("503"))
    assert isinstance(d, Retry) and d.dependency == "search"
    b.close()
    b = budget(redis_url, TOML + "[unmapped_tasks]\npolicy = \"reject\"\n")
    with pytest.raises(UnmappedTask, match="rejected"):
        b.on_failure("any", 1, Failure.retryable("503"))
    with pytest.raises(UnmappedTask):
        b.on_attempt("any", 1)
    assert b.dependency("index_document") == "search"
    assert not redis.Redis.from_url(redis_url).keys("fb:v1:{any}")
    b.close()


def test_a_retry_after_past_max_delay_is_dead_lettered_before_the_budget(redis_url):
    b = budget(redis_url, TOML + "[tasks.slow]\nmax_delay_secs = 60\nbackoff_cap_ms = 86400000\n")
    d = b.on_failure("slow", 1, Failure.after(61, "429"))
    assert isinstance(d, DeadLetter) and d.reason == DELAY_EXCEEDED and d.source == "not_consulted"
    assert d.snapshot is None and not redis.Redis.from_url(redis_url).keys("fb:v1:{slow}"), "no budget spent"
    assert b.metrics.value("fleet_budget_dead_letters_total", dependency="slow", reason="delay_exceeded") == 1
    d = b.on_failure("slow", 1, Failure.after(60, "429"))
    assert isinstance(d, Retry) and d.delay == 60, "at max_delay exactly: allowed"
    # The backoff (cap a day) is capped at max_delay: 2^20 s nominal at attempt 21.
    b2 = budget(redis_url, TOML + "[tasks.slow]\nmax_delay_secs = 60\nbackoff_cap_ms = 86400000\nmax_attempts = 30\n")
    d = b2.on_failure("slow", 21, Failure.retryable("503"))
    assert isinstance(d, Retry) and d.delay == 60
    # Unset: 1,024 s or twice the cap; a Retry-After of 1,201 s with the default 600 s cap is refused.
    assert b.on_failure("index_document", 1, Failure.after(1201, "429")).reason == DELAY_EXCEEDED
    assert isinstance(b.on_failure("index_document", 1, Failure.after(1200, "429")), Retry)
    b.close()
    b2.close()
