"""Group commit of withdrawals: the protocol (with a sender the test holds), and spend_many.lua
against a private redis-server answering each request as spend.lua calls in a row would."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from fleet_budget import Config, Failure, FleetBudget, Retry
from fleet_budget.group_commit import GroupCommit, GroupTimeout

TOML = """
[redis]
deposit_flush_ms = 0
timeout_ms = 5000
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
    assert len(granted) == 10 and all(d.source == "fleet" for d in decisions)
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
