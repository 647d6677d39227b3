"""fleet_budget.dead_letters: the rows of the dead-letter index as the Rust ``Row::encode`` writes
them (these were printed by Rust; ``tests/celery_dead_letters.rs`` compares both languages on many
more header sets), and the tally that sends them: summed per row, one ``dead_letters.lua`` call per
500 rows, within 250 ms by a thread and when the process ends, a failure never sent again."""

from __future__ import annotations

import secrets
import time

import pytest

import redis

from fleet_budget import FleetBudget, forks
from fleet_budget.dead_letters import CHUNK, MAX_ROWS, Tally, bounded, count_confirmed, index_key, row

HEADERS = {
    "fb-task": "fail_as", "fb-dependency": "search", "fb-reason": "non_retryable", "fb-original-exchange": "",
    "fb-original-routing-key": "fleet.celery", "fb-original-queue": "fleet.celery", "fb-attempts": 1,
    "fb-first-failure-ms": 1_765_000_000_000, "fb-dead-lettered-ms": 1_765_000_059_999, "fb-error-class": "timeout",
    "fb-error": "it failed", "fb-replays": 0, "task": "fail_as", "id": "0b5d",
}
TAIL = '"fail_as","",0,29416667]'

# (changed headers, the row Rust's Row::in_dead_letters(..).encode() gives for them)
ROWS = [
    ({}, '["search","non_retryable","timeout",' + TAIL),
    ({"fb-error-class": 'quote" back\\slash / solidus'},
     '["search","non_retryable","quote\\" back\\\\slash / solidus",' + TAIL),
    ({"fb-error-class": "\0\x01\b\t\n\x0b\x0c\r\x1b\x1f \x7f\x80\x9f"},
     '["search","non_retryable","\\u0000\\u0001\\b\\t\\n\\u000b\\f\\r\\u001b\\u001f \x7f\x80\x9f",' + TAIL),
    ({"fb-error-class": "ünïcødé 日本語 🦀 \u2028\u2029 \u202eevil\ufeff"},
     '["search","non_retryable","ünïcødé 日本語 🦀 \u2028\u2029 \u202eevil\ufeff",' + TAIL),
    # Cut at 256 bytes inside a character (255 and 254 bytes kept); integers as text.
    ({"fb-error-class": "x" + "é" * 200, "fb-task": "ab" + "🦀" * 100, "fb-replays": "3",
      "fb-dead-lettered-ms": " 1765000060000\n"},
     '["search","non_retryable","x' + "é" * 127 + '","ab' + "🦀" * 63 + '","",3,29416667]'),
    ({"fb-error-class": None, "fb-reason": "budget_exhausted", "fb-budget-allowance": 10, "fb-budget-retries": 10},
     '["search","budget_exhausted","",' + TAIL),
]


@pytest.mark.parametrize("change,expected", ROWS)
def test_rows_are_the_rust_rows(change, expected):
    headers = {k: v for k, v in {**HEADERS, **change}.items() if v is not None}
    assert row(headers) == expected
    assert len(row(headers).encode()) <= 2048


@pytest.mark.parametrize("change", [
    {"fb-reason": "no_such_reason"}, {"fb-dependency": ""}, {"fb-task": None}, {"fb-original-routing-key": None},
    {"fb-dead-lettered-ms": None}, {"fb-dead-lettered-ms": -1}, {"fb-dead-lettered-ms": "1_000"},
    {"fb-dead-lettered-ms": 1.5}, {"fb-dead-lettered-ms": True}, {"fb-replays": 2**32}, {"fb-error-class": 5},
    {"fb-budget-allowance": 3, "fb-budget-retries": "many"}, {"fb-error": b"\xff"},
])
def test_what_rust_cannot_read_is_not_counted(change):
    headers = {k: v for k, v in {**HEADERS, **change}.items() if v is not None}
    assert row(headers) is None


def test_bounded_cuts_at_a_character_boundary():
    assert bounded("a" * 256) == "a" * 256
    assert bounded("a" * 255 + "é") == "a" * 255
    assert bounded("🦀" * 70) == "🦀" * 64


def test_a_tally_sums_per_row_and_sends_500_rows_a_call(redis_url):
    client = redis.Redis.from_url(redis_url)
    calls: list[list[str]] = []

    class Recording:
        def register_script(self, text):
            script = client.register_script(text)

            def call(keys, args):
                calls.append(args)
                return script(keys=keys, args=args)
            return call

    recording = Recording()
    tally = Tally(lambda: recording, "fb", "fleet.dead", every=3600)
    rows = [row({**HEADERS, "fb-error-class": f"class {i}"}) for i in range(1200)]
    for r in rows:
        tally.entered(r)
    for _ in range(4):
        tally.entered(rows[0])
    assert tally.pending() == 1204
    assert tally.flush() == 0 and tally.pending() == 0
    assert [len(args) for args in calls] == [2 + 2 * CHUNK, 2 + 2 * CHUNK, 2 + 2 * 200]
    assert all(args[0] == str(MAX_ROWS) for args in calls)
    assert [args[1] for args in calls] == ["1", "2", "3"], "each batch numbered"
    index = client.hgetall(index_key("fb", "fleet.dead"))
    assert len(index) == 1200 and index[rows[0].encode()] == b"5" and index[rows[1].encode()] == b"1"
    assert tally.flush() == 0 and len(calls) == 3, "nothing pending, no call"


def test_an_unanswered_batch_is_sent_again_then_given_up_and_logged(dead_url, caplog):
    client = redis.Redis.from_url(dead_url, socket_timeout=0.5, socket_connect_timeout=0.5)
    tally = Tally(lambda: client, "fb", "fleet.dead", every=3600, tries=3)
    tally.entered(row(HEADERS), 3)
    assert tally.flush() == 0 and tally.flush() == 0, "kept, sent again at the next flush"
    tally.entered(row(HEADERS), 2)  # waits behind the unanswered batch
    assert tally.flush() == 3, "given up at its third try"
    assert tally.unrecorded == 3 and tally.sent_again == 2
    assert "dead-letter index fb:v1:dead-letters:{fleet.dead} not updated for 3 messages" in caplog.text
    assert tally.flush_last() == 2 and tally.unrecorded == 5 and tally.pending() == 0


def test_a_batch_whose_answer_was_lost_is_counted_once(redis_url):
    """The call runs in Redis and its answer is lost (a timeout while Redis was busy): sent again
    with its number, the script applies it once."""
    client = redis.Redis.from_url(redis_url)
    lose = [True]

    class LosingFirstAnswer:
        def register_script(self, text):
            script = client.register_script(text)

            def call(keys, args):
                reply = script(keys=keys, args=args)
                if lose[0]:
                    lose[0] = False
                    raise redis.exceptions.TimeoutError("Timeout reading from socket")
                return reply
            return call

    losing = LosingFirstAnswer()
    prefix = f"fbpy{secrets.token_hex(4)}"
    tally = Tally(lambda: losing, prefix, "fleet.dead", every=3600)
    tally.entered(row(HEADERS), 3)
    assert tally.flush() == 0 and tally.sent_again == 0
    assert tally.flush() == 0 and tally.sent_again == 1
    assert client.hgetall(index_key(prefix, "fleet.dead")) == {row(HEADERS).encode(): b"3"}
    assert tally.unrecorded == 0
    writers = client.keys(f"{prefix}:v1:dead-letters-writer:{{fleet.dead}}:*")
    assert len(writers) == 1 and 0 < client.pttl(writers[0]) <= 600_000


def test_a_workers_counts_are_sent_within_250_ms_and_at_exit(redis_url):
    budget = FleetBudget(redis_url=redis_url)
    client = redis.Redis.from_url(redis_url)
    key = "fb:v1:dead-letters:{fleet.dead}"
    count_confirmed(budget, HEADERS)
    count_confirmed(budget, {**HEADERS, "fb-reason": "bogus"})  # not counted, nothing raised
    count_confirmed(budget, {})
    deadline = time.monotonic() + 2
    while not client.hget(key, row(HEADERS)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.hgetall(key) == {row(HEADERS).encode(): b"1"}
    # At exit (forks.before_exit: atexit, a prefork child's worker_process_shutdown) the rest goes.
    from fleet_budget.dead_letters import tally_of
    tally = tally_of(budget)
    tally.every = 3600
    time.sleep(0.3)  # the thread is asleep for an hour after its next wake-up
    tally.entered(row(HEADERS), 2)
    forks.before_exit()
    assert client.hget(key, row(HEADERS)) == b"3"
    budget.close()
