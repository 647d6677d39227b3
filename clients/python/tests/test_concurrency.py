"""The concurrency budget and the circuit breaker in the synchronous client, against a private
redis-server: the same sections, keys, scripts, reasons and metrics as the Rust library
(crates/fleet-budget/src/concurrency, breaker, budget/admission.rs)."""

import threading

import pytest
import redis

from fleet_budget import (CIRCUIT_OPEN, CONCURRENCY_CAP, CONCURRENCY_RETRY_SHARE, FAILED, INCONCLUSIVE, SUCCEEDED,
                          Call, Config, ConfigError, DeadLetter, FleetBudget, Hold)

CONFIG = """
[dependencies.paid-api]
tasks = ["charge"]
min_allowance = 10
[dependencies.paid-api.concurrency]
cap = 5
planned_primary = 4
min_retry_slots = 1
[dependencies.search]
tasks = ["index"]
[dependencies.search.breaker]
failure_ratio = 0.5
min_volume = 4
open_secs = 30
half_open_probes = 2
max_wait_secs = 60
"""


def budget(url, text=CONFIG, **kw):
    return FleetBudget(Config.from_toml(text, "t.toml"), redis_url=url, group_commit=False, **kw)


def problem_keys(text):
    with pytest.raises(ConfigError) as e:
        Config.from_toml(text, "t")
    return [p.key for p in e.value.problems]


def test_sections_are_read_as_in_rust():
    c = Config.from_toml('[dependencies.paid-api]\ntasks = ["charge"]\n[dependencies.paid-api.concurrency]\n'
                         'cap = 20\nplanned_primary = 16\n', "t")
    p = c.concurrency["paid-api"]
    assert (p.cap, p.max_retry_fraction, p.min_retry_slots, p.lease_ms, p.primary_waits) == (20, 0.25, 3, 30_000, False)
    assert p.retry_slots(16) == 4 and p.retry_slots(2) == 3
    c = Config.from_toml("[dependencies.search.breaker]\n[dependencies.mail]\nmin_allowance = 1\n"
                         "[dependencies.mail.breaker]\nhalf_open_probes = 1\nopen_secs = 5\nfailure_ratio = 1.0\n", "t")
    s, m = c.breakers["search"], c.breakers["mail"]
    assert (s.half_open_probes, s.close_after, s.min_volume) == (3, 3, 20)
    assert (m.half_open_probes, m.close_after, m.open_ms, m.failure_ratio) == (1, 1, 5000, 1.0)


def test_bad_sections_are_named_as_in_rust():
    # The Rust tests' texts (config/concurrency.rs, config/breaker.rs), the same keys.
    assert sorted(problem_keys(
        "[dependencies.a.concurrency]\ncap = 0\nplanned_primary = 1\n[dependencies.b.concurrency]\ncap = 20\n"
        "planned_primary = 21\nmin_retry_slots = -1\nlease_secs = 0\nmax_retry_fraction = -0.5\n"
        "[dependencies.c.concurrency]\nplanned_primary = 3\n[dependencies.d.concurrency]\ncap = 4\n")) == sorted([
            "dependencies.a.concurrency.cap", "dependencies.b.concurrency.planned_primary",
            "dependencies.b.concurrency.min_retry_slots", "dependencies.b.concurrency.lease_secs",
            "dependencies.b.concurrency.max_retry_fraction", "dependencies.c.concurrency.cap",
            "dependencies.d.concurrency.planned_primary"])
    assert sorted(problem_keys(
        "[dependencies.a.breaker]\nfailure_ratio = 0.0\nmin_volume = 0\nopen_secs = 0\nclose_after = 9\n"
        "[dependencies.b]\nmin_allowance = 2\n[dependencies.b.breaker]\nhalf_open_probes = 3\n")) == sorted([
            "dependencies.a.breaker.open_secs", "dependencies.a.breaker.failure_ratio",
            "dependencies.a.breaker.min_volume", "dependencies.a.breaker.close_after",
            "dependencies.b.breaker.half_open_probes"])
    for text in ("[dependencies.a.concurrency]\ncap = 3\ncpa = 2\n", "[dependencies.a.breaker]\nopen = 3\n",
                 "[dependencies.a.concurrency]\ncap = \"3\"\n", "[dependencies.a.concurrency]\ncap = 3\n"
                 "planned_primary = 1\nprimary_waits = 1\n", "[dependencies.a.breaker]\nfailure_ratio = true\n"):
        with pytest.raises(ConfigError) as e:
            Config.from_toml(text, "t")
        assert not e.value.problems, text  # the whole text is refused, as serde refuses it


def test_a_derived_share_the_scripts_cannot_take_is_named():
    assert problem_keys("[dependencies.a.concurrency]\ncap = 5000\nplanned_primary = 1\n") == [
        "dependencies.a.concurrency"]


def test_retries_never_pass_the_cap_or_the_share_and_never_wait(redis_url):
    b = budget(redis_url)
    held = [b.admit("charge", 1) for _ in range(4)]
    assert all(isinstance(c, Call) and c.lease is not None for c in held)
    # 4 primaries in flight: share = max(1, floor(0.25 * 4)) = 1 retry slot.
    retry = b.admit("charge", 2)
    assert isinstance(retry, Call) and retry.lease.kind == "retry"
    # The cap (5) is reached: a retry is refused at once, `concurrency_cap`.
    refused = b.admit("charge", 3)
    assert isinstance(refused, DeadLetter) and refused.reason == CONCURRENCY_CAP and refused.source == "fleet"
    # Primaries are counted past the cap, never refused (primary_waits = false).
    extra = b.admit("charge", 1)
    assert isinstance(extra, Call) and extra.lease is not None
    m = b.metrics
    assert m.value("fleet_budget_calls_in_flight", dependency="paid-api", kind="primary") == 5
    assert m.value("fleet_budget_calls_in_flight", dependency="paid-api", kind="retry") == 1
    assert m.value("fleet_budget_retry_fraction", dependency="paid-api") == pytest.approx(0.2)
    b.finish(extra, SUCCEEDED)
    b.finish(held.pop(), SUCCEEDED)
    b.finish(held.pop(), SUCCEEDED)
    # 2 primaries and 1 retry: room under the cap, but the retry share (1) is spent.
    refused = b.admit("charge", 2)
    assert isinstance(refused, DeadLetter) and refused.reason == CONCURRENCY_RETRY_SHARE
    b.finish(retry, FAILED)
    again = b.admit("charge", 2)
    assert isinstance(again, Call) and again.lease is not None
    assert m.value("fleet_budget_dead_letters_total", dependency="paid-api", reason=CONCURRENCY_CAP) == 1
    assert m.value("fleet_budget_dead_letters_total", dependency="paid-api", reason=CONCURRENCY_RETRY_SHARE) == 1
    for c in (*held, again):
        b.finish(c, SUCCEEDED)
    r = redis.Redis.from_url(redis_url)
    assert r.zcard("fb:v1:{paid-api}:lp") == 0 and r.zcard("fb:v1:{paid-api}:lr") == 0
    assert not r.exists("fb:v1:{paid-api}:lp"), "an idle dependency leaves no key"
    b.close()


def test_threads_together_never_hold_more_retries_than_the_cap(redis_url):
    text = CONFIG.replace("cap = 5", "cap = 6").replace("min_retry_slots = 1", "min_retry_slots = 6")
    b = budget(redis_url, text)
    r = redis.Redis.from_url(redis_url)
    most, lock, errors = [0], threading.Lock(), []

    def worker():
        for _ in range(40):
            c = b.admit("charge", 2)
            if isinstance(c, Call):
                n = r.zcard("fb:v1:{paid-api}:lr")
                with lock:
                    most[0] = max(most[0], n)
                b.finish(c, SUCCEEDED)
            elif c.reason != CONCURRENCY_CAP:
                errors.append(c)

    threads = [threading.Thread(target=worker) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and 1 <= most[0] <= 6, (most, errors)
    b.close()


def test_a_primary_at_the_cap_waits_when_told_then_is_dead_lettered(redis_url):
    text = CONFIG.replace("min_retry_slots = 1", "min_retry_slots = 1\nprimary_waits = true\nmax_wait_secs = 60")
    b = budget(redis_url, text)
    calls = [b.admit("charge", 1) for _ in range(5)]
    assert all(isinstance(c, Call) for c in calls)
    hold = b.admit("charge", 1)
    assert hold == Hold("primary_at_cap", 1.0)
    late = b.admit("charge", 1, held_for=60)
    assert isinstance(late, DeadLetter) and late.reason == CONCURRENCY_CAP
    for c in calls:
        b.finish(c, SUCCEEDED)
    b.close()


def test_without_redis_calls_run_uncounted(dead_url):
    b = budget(dead_url)
    c = b.admit("charge", 2)
    assert isinstance(c, Call) and c.lease is None
    b.finish(c, FAILED)
    c = b.admit("index", 1)
    assert isinstance(c, Call) and not c.judged
    b.finish(c, FAILED)
    # Counted as the store's failures, by kind, and the dependency decided by its fallback.
    assert b.metrics.value("fleet_budget_store_errors_total", kind="connection") >= 1
    assert b.metrics.value("fleet_budget_fallback_active", dependency="paid-api") == 1
    b.close()


def open_breaker(b):
    for _ in range(4):
        c = b.admit("index", 1)
        assert isinstance(c, Call) and c.judged
        b.finish(c, FAILED)


def test_the_breaker_opens_holds_probes_and_closes(redis_url):
    b = budget(redis_url)
    m = b.metrics
    open_breaker(b)
    assert m.value("fleet_budget_breaker_transitions_total", dependency="search", to="open") == 1
    status = b.breaker_status("search")
    assert status.state == "open" and status.times_opened == 1
    executions = m.value("fleet_budget_executions_total", dependency="search")
    hold = b.admit("index", 3, held_for=10)
    assert isinstance(hold, Hold) and hold.reason == CIRCUIT_OPEN
    # The rest of the open period (about 30 s) jittered up to a quarter more.
    assert 25 <= hold.pause <= 30 * 1.25
    assert m.value("fleet_budget_executions_total", dependency="search") == executions, "no attempt spent"
    assert m.value("fleet_budget_breaker_state", dependency="search") == 1
    late = b.admit("index", 3, held_for=60)
    assert isinstance(late, DeadLetter) and late.reason == CIRCUIT_OPEN
    # The open period ends (moved to the past in Redis): half-open, two probes fleet-wide.
    redis.Redis.from_url(redis_url).hset("fb:v1:{search}:cb", "ou", 1)
    p1, p2, third = b.admit("index", 1), b.admit("index", 1), b.admit("index", 1)
    assert p1.is_probe and p2.is_probe and isinstance(third, Hold)
    assert m.value("fleet_budget_breaker_transitions_total", dependency="search", to="half_open") == 1
    # A probe ending inconclusively is given back for another call to make.
    b.finish(p2, INCONCLUSIVE)
    p3 = b.admit("index", 1)
    assert isinstance(p3, Call) and p3.is_probe
    b.finish(p1, SUCCEEDED)
    b.finish(p3, SUCCEEDED)
    assert b.breaker_status("search").state == "closed"
    assert m.value("fleet_budget_breaker_transitions_total", dependency="search", to="closed") == 1
    assert m.value("fleet_budget_breaker_state", dependency="search") == 0
    b.close()


def test_a_probe_failure_reopens_it(redis_url):
    b = budget(redis_url)
    open_breaker(b)
    redis.Redis.from_url(redis_url).hset("fb:v1:{search}:cb", "ou", 1)
    probe = b.admit("index", 2)
    assert isinstance(probe, Call) and probe.is_probe
    b.finish(probe, FAILED)
    assert b.breaker_status("search").state == "open"
    assert b.breaker_status("search").times_opened == 2
    b.close()


def test_hedges_draw_on_the_retry_share_and_the_budget(redis_url):
    b = budget(redis_url)
    calls = [b.admit("charge", 1) for _ in range(4)]
    hedge = b.try_hedge("charge")
    assert isinstance(hedge, Call) and hedge.lease.id.startswith("h")
    assert b.try_hedge("charge") is None, "the share (1) is spent"
    m = b.metrics
    assert m.value("fleet_budget_hedges_total", dependency="paid-api", outcome="granted") == 1
    assert m.value("fleet_budget_hedges_total", dependency="paid-api", outcome="refused") == 1
    assert m.value("fleet_budget_retries_granted_total", dependency="paid-api") == 0, "never counted as a retry"
    for c in (*calls, hedge):
        b.finish(c, SUCCEEDED)
    b.close()


def test_a_lease_set_or_breaker_of_another_type_is_a_bad_key_and_the_call_runs(redis_url):
    b = budget(redis_url)
    r = redis.Redis.from_url(redis_url)
    r.set("fb:v1:{paid-api}:lr", "not a set")
    r.set("fb:v1:{search}:cb", "not a hash")
    c = b.admit("charge", 2)
    assert isinstance(c, Call) and c.lease is None, "run uncounted, as when Redis fails"
    c2 = b.admit("index", 1)
    assert isinstance(c2, Call) and not c2.judged
    assert b.metrics.value("fleet_budget_store_errors_total", kind="bad_key") == 2
    assert r.get("fb:v1:{paid-api}:lr") == b"not a set", "nothing written"
    b.close()
