"""Group commit of withdrawals: the protocol (with a sender the test holds), and spend_many.lua
against a private redis-server answering each request as spend.lua calls in a row would."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from fleet_budget import Config, Failure, FleetBudget, Retry
from fleet_budget.group_commit import GroupCommit, GroupTimeout

# No deny cache: every decision goes to Redis, so a thread that a loaded machine starts after the
# first denials (clean-clone run 21 of session 10, load 14) is not answered from the cache
# (`fleet_cache`) and counted nowhere in Redis. The deadline is a hang check.
TOML = """
[redis]
deposit_flush_ms = 0
deny_cache_ms = 0
timeout_ms = 10000
[defaults]
min_allowance = 10
ratio = 0
window_secs = 86400
"""


def test_a_batch_answers_each_request_as_spend_calls_in_a_row_would(redis_url):
    batched = FleetBudget(Config.from_toml(TOML), redis_url=redis_url, key_prefix="many")
    single = FleetBudget(Config.from_toml(TOML), redis_url=redis_url, key_prefix="one")
    policy = batched.config.policy("search")
    for n in (7, 1, 5):
        many = batched._send_spend("search", policy, n)
        ones = [single._send_spend("search", policy, 1)[0] for _ in range(n)]
        seen = lambda answers: [(g, s.allowance, s.current, s.previous) for g, s in answers]  # noqa: E731
        assert seen(many) == seen(ones), n
    assert [g for g, _ in batched._send_spend("search", policy, 3)] == [False, False, False]
    raw = redis.Redis.from_url(redis_url)
    assert raw.hmget("one:v1:{search}", "cr", "cd") == [b"10", b"3"]
    assert raw.hmget("many:v1:{search}", "cr", "cd") == [b"10", b"6"], "each request counted once"
    batched.close()
    single.close()


def test_concurrent_withdrawals_grant_exactly_the_allowance(redis_url):
    budget = FleetBudget(Config.from_toml(TOML), redis_url=redis_url)
    start = threading.Barrier(40)
    decisions = []

    def decide():
        start.wait()
        decisions.append(budget.on_failure("search", 1, Failure.retryable("503")))

    threads = [threading.Thread(target=decide) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    granted = [d for d in decisions if isinstance(d, Retry)]
    sources = sorted({d.source for d in decisions})
    assert len(granted) == 10 and sources == ["fleet"], sources
    raw = redis.Redis.from_url(redis_url)
    assert raw.hmget("fb:v1:{search}", "cr", "cd") == [b"10", b"30"]
    budget.close()


class HeldSender:
    """A sender whose first call waits until the test lets it go; records each n."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, n: int):
        self.calls.append(n)
        if len(self.calls) == 1:
            self.entered.set()
            self.release.wait(10)
        return [(True, None)] * n


def test_decisions_arriving_during_a_call_go_together_and_a_lone_one_never_waits():
    group = GroupCommit(deadline=10)
    send = HeldSender()
    answers = []
    leader = threading.Thread(target=lambda: answers.append(group.withdraw("search", send)))
    leader.start()
    assert send.entered.wait(10)
    followers = [threading.Thread(target=lambda: answers.append(group.withdraw("search", send))) for _ in range(5)]
    for t in followers:
        t.start()
    while sum(len(g.queue) for g in group._groups.values()) < 5:
        time.sleep(0.005)
    # Another dependency is not held up by this one's call.
    assert group.withdraw("mail", send) == (True, None)
    send.release.set()
    for t in [leader, *followers]:
        t.join(10)
    assert send.calls == [1, 1, 5] and len(answers) == 6


def test_a_caller_whose_deadline_passes_in_the_queue_is_never_sent():
    group = GroupCommit(deadline=0.2)
    send = HeldSender()
    leader = threading.Thread(target=lambda: group.withdraw("search", send))
    leader.start()
    assert send.entered.wait(10)
    with pytest.raises(GroupTimeout):
        group.withdraw("search", send)  # queued behind the held call until its deadline
    send.release.set()
    leader.join(10)
    assert send.calls == [1], "the caller that gave up was never sent"
    assert group.withdraw("search", send) == (True, None), "and the group is free again"


class Clock:
    """The group's clock, moved by the test; a thread named in ``skew`` reads it that much later
    (a thread stalled while the others went on)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.skew: dict[str, float] = {}

    def __call__(self) -> float:
        return self.now + self.skew.get(threading.current_thread().name, 0.0)


class PlacedSender(HeldSender):
    """A held sender that answers each request with its place in the call, and records which
    caller's thread sent each call."""

    def __init__(self) -> None:
        super().__init__()
        self.senders: list[str] = []

    def __call__(self, n: int):
        self.senders.append(threading.current_thread().name)
        super().__call__(n)
        return [(True, place) for place in range(n)]


def caller(group, send, results, name):
    """A caller of ``search`` on a thread named ``name``: ``results[name]`` gets its answer or its
    GroupTimeout."""

    def decide():
        try:
            results[name] = group.withdraw("search", send)
        except GroupTimeout as e:
            results[name] = e

    thread = threading.Thread(target=decide, name=name)
    thread.start()
    return thread


def wait_queued(group, n):
    for _ in range(2000):
        if sum(len(g.queue) for g in group._groups.values()) >= n:
            return
        time.sleep(0.005)
    raise AssertionError(f"{n} callers never queued")


def test_the_batch_is_led_by_the_caller_with_the_most_time_left():
    clock = Clock()
    group = GroupCommit(deadline=60, clock=clock)
    send, results = PlacedSender(), {}
    threads = [caller(group, send, results, "a")]
    assert send.entered.wait(10)
    threads.append(caller(group, send, results, "b"))
    wait_queued(group, 1)
    clock.now = 10
    threads.append(caller(group, send, results, "c"))
    wait_queued(group, 2)
    send.release.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert send.calls == [1, 2]
    assert send.senders == ["a", "c"], "c, the latest (the most time left), leads; b follows"
    assert results == {"a": (True, 0), "b": (True, 0), "c": (True, 1)}, "answered in the order they came"


def test_a_batch_whose_oldest_caller_ran_out_of_time_is_sent_for_the_others():
    clock = Clock()
    group = GroupCommit(deadline=60, clock=clock)
    send, results = PlacedSender(), {}
    threads = [caller(group, send, results, "a")]
    assert send.entered.wait(10)
    threads.append(caller(group, send, results, "b"))  # gives up at 60
    wait_queued(group, 1)
    clock.now = 30
    threads.append(caller(group, send, results, "c"))  # gives up at 90
    wait_queued(group, 2)
    clock.now = 70  # b is out of time (its thread still waits, on the real clock), c is not
    send.release.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    # Led by b, the batch was not sent at all and c got a timeout with 20 s left.
    assert send.calls == [1, 1] and send.senders == ["a", "c"], "b was let go unsent"
    assert isinstance(results["b"], GroupTimeout)
    assert results["c"] == (True, 0)


def test_a_caller_woken_to_lead_past_its_deadline_hands_the_batch_on_unsent():
    clock = Clock()
    group = GroupCommit(deadline=60, clock=clock, max_batch=2)
    send, results = PlacedSender(), {}
    threads = [caller(group, send, results, "a")]
    assert send.entered.wait(10)
    for name, at in (("b", 0), ("c", 30), ("d", 50)):  # give up at 60, 90, 110
        clock.now = at
        threads.append(caller(group, send, results, name))
        wait_queued(group, len(threads) - 1)
    # At 50 the next batch is b and c, led by c; c's thread is stalled and wakes at 100, past
    # its deadline: it does not send, b is out of time too, and d leads.
    clock.skew["c"] = 50
    send.release.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert send.calls == [1, 1] and send.senders == ["a", "d"], "b and c never sent"
    assert isinstance(results["b"], GroupTimeout) and isinstance(results["c"], GroupTimeout)
    assert results["d"] == (True, 0)
