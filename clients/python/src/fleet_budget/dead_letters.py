"""The dead-letter index (``lua/README.md``, "Dead-letter index"), kept by Python workers as the
Rust workers keep it: every dead letter the broker confirmed is counted in Redis, under the row
the Rust tools read back from its headers, so that ``budgetctl dlq stats`` and a replay's dry run
never read the queue, and a replay's counts out (Rust, ``Row::in_dead_letters``) find the rows
Python wrote.

- :func:`row` is the Rust ``Row::in_dead_letters(..).encode()`` of the headers as published: the
  record read as ``DeadLetterRecord::parse`` reads it (required headers present, a known reason, a
  non-empty dependency; else ``None``, not counted, as Rust counts it nowhere), then the JSON array
  ``[dependency, reason, error_class, task, original_exchange, replays, minute]`` in serde_json's
  compact text, each text cut to 256 bytes at a character boundary, ``minute`` the dead-letter
  time in Unix ms // 60,000.
- :class:`Tally` sums the rows in the process and sends them, one ``dead_letters.lua`` call per
  500 rows, every 250 ms from a thread of its own (started by the first count, in a forked child
  too) and when the process ends (``forks.before_exit``: ``atexit``, a ``multiprocessing`` child's
  end, Celery's ``worker_process_shutdown``). Each call is a batch numbered for the process (its
  writer key, ``lua/README.md``, "A batch applied once"): one whose answer did not come (a
  timeout, a dropped connection) is sent again at the next flush and applied once, up to
  :data:`TRIES` tries, new counts waiting meanwhile; what is given up is logged and counted in
  ``unrecorded`` (the index is then short of the queue, and every look says so). A worker killed
  outright loses at most its last 250 ms of counts, as a Rust worker.
- :func:`count_confirmed` is what ``fleet_budget.celery`` calls once the broker confirmed a dead
  letter: it never raises and never waits on Redis.
"""

from __future__ import annotations

import calendar
import json
import logging
import os
import re
import secrets
import threading
import time
import weakref
from datetime import datetime
from typing import Any, Mapping, Optional

from redis import exceptions as redis_exceptions

from . import forks, scripts
from . import headers as h

log = logging.getLogger("fleet_budget.dead_letters")

#: Longest text of a row's field (bytes), as the Rust ``FIELD_MAX``.
FIELD_MAX = 256
#: How often a process sends its counts (seconds), as the Rust ``Tally::EVERY``.
EVERY = 0.25
#: Most rows in one ``dead_letters.lua`` call, as the Rust ``DeadLetterIndex`` sends them.
CHUNK = 500
#: The index's bound on rows (``DeadLetterIndex::DEFAULT_MAX_ROWS``): past it, new rows are
#: counted on the row ``[]``.
MAX_ROWS = 10_000
#: Largest change of one row in one call (the script refuses more; Rust clamps to it too).
DELTA_MAX = 1_000_000
#: How many times a batch is sent before it is given up (the Rust ``Tally::TRIES``).
TRIES = 20

#: Every dead-letter reason the Rust ``DeadLetterReason::parse`` knows.
REASONS = frozenset((
    "non_retryable", "attempts_exhausted", "budget_exhausted", "budget_frozen", "concurrency_cap",
    "concurrency_retry_share", "circuit_open", "fanout_exhausted", "delay_exceeded",
))

_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1
# Rust's `str::trim`: the characters with Unicode's White_Space property (Python's `strip` also
# takes U+001C..U+001F, which Rust keeps, and fails the number).
_RUST_WHITESPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
                    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
# What `i128::from_str` takes: an optional sign, then ASCII digits.
_INTEGER = re.compile(r"[+-]?[0-9]+")


class _Unreadable(Exception):
    """A header Rust's ``DeadLetterRecord::parse`` refuses: the message is not counted."""


def queue_of(amqp_prefix: str) -> str:
    """The topology's dead-letter queue, ``<amqp.prefix>.dead`` (the Rust ``Topology::dead_queue``;
    the dead-letter exchange has the same name)."""
    return f"{amqp_prefix}.dead"


def writer_key(key_prefix: str, queue: str, writer: str) -> str:
    """The last batch ``writer`` applied to the index of ``queue``:
    ``<prefix>:v1:dead-letters-writer:{<queue>}:<writer>`` (the Rust ``dead_letters_writer_key``)."""
    return f"{key_prefix}:v1:dead-letters-writer:{{{queue}}}:{writer}"


def index_key(key_prefix: str, queue: str) -> str:
    """The index of ``queue``: ``<prefix>:v1:dead-letters:{<queue>}`` (the Rust ``dead_letters_key``)."""
    return f"{key_prefix}:v1:dead-letters:{{{queue}}}"


def bounded(text: str) -> str:
    """``text`` cut to :data:`FIELD_MAX` bytes of UTF-8 at a character boundary (the Rust ``bounded``)."""
    data = text.encode("utf-8")
    if len(data) <= FIELD_MAX:
        return text
    # The cut may split the last character: its bytes are dropped, nothing else is invalid.
    return data[:FIELD_MAX].decode("utf-8", "ignore")


def encode(dependency: str, reason: str, error_class: str, task: str, original_exchange: str,
           replays: int, minute: int) -> str:
    """The row as the index holds it, in serde_json's compact text (the Rust ``Row::encode``;
    the texts are taken as given, cut by :func:`row`). ``json.dumps`` without ``ensure_ascii``
    escapes exactly what serde_json escapes: ``"``, ``\\``, and the control characters below
    U+0020 (``\\b \\t \\n \\f \\r`` short, the others ``\\u00xx`` in lower-case hex); the rest,
    U+007F, U+2028 and every non-ASCII character included, is written as it is."""
    return json.dumps([dependency, reason, error_class, task, original_exchange, replays, minute],
                      separators=(",", ":"), ensure_ascii=False)


def _text(headers: Mapping[str, Any], name: str) -> Optional[str]:
    """The Rust ``get_str`` of the value py-amqp sends for ``headers[name]``."""
    value = headers.get(name)
    if value is None:  # absent, or Void
        return None
    if isinstance(value, str):  # a long string, UTF-8 with surrogates passed through
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _Unreadable(name) from None
        return value
    if isinstance(value, (bytes, bytearray)):  # a long string too
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise _Unreadable(name) from None
    raise _Unreadable(name)


def _integer(headers: Mapping[str, Any], name: str, largest: int = _U64_MAX) -> Optional[int]:
    """The Rust ``get_u64`` (``get_u32`` with ``largest`` 2^32 - 1) of the value py-amqp sends for
    ``headers[name]``: an integer of any width, a timestamp, or decimal text."""
    value = headers.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or isinstance(value, float):  # a boolean, a double: not a number here
        raise _Unreadable(name)
    if isinstance(value, int):
        number = value
    elif isinstance(value, datetime):  # a timestamp, in seconds
        number = int(calendar.timegm(value.utctimetuple()))
    elif isinstance(value, (str, bytes, bytearray)):
        if isinstance(value, str):
            value = value.encode("utf-8", "surrogatepass")
        text = bytes(value).decode("utf-8", "replace").strip(_RUST_WHITESPACE)
        if not _INTEGER.fullmatch(text):
            raise _Unreadable(name)
        number = int(text)
    else:
        raise _Unreadable(name)
    if not 0 <= number <= largest:
        raise _Unreadable(name)
    return number


def _required_text(headers: Mapping[str, Any], name: str) -> str:
    value = _text(headers, name)
    if value is None:
        raise _Unreadable(name)
    return value


def row(headers: Mapping[str, Any]) -> Optional[str]:
    """The row a dead letter with ``headers`` (as published) is counted under, the Rust
    ``Row::in_dead_letters(..).map(Row::encode)``: ``None`` when its record cannot be read (the
    Rust tools count it nowhere either, and a look says it is not in the index)."""
    try:
        reason = _required_text(headers, h.REASON)
        if reason not in REASONS:
            return None
        dependency = _required_text(headers, h.DEPENDENCY)
        if not dependency:
            return None
        # Read, and refused when unreadable, only when the allowance is there (as in Rust).
        if _integer(headers, h.BUDGET_ALLOWANCE) is not None:
            for name in (h.BUDGET_RETRIES, h.BUDGET_WINDOW_MS, h.BUDGET_WINDOW_INDEX):
                _integer(headers, name)
        _text(headers, h.BUDGET_SOURCE)
        task = _required_text(headers, h.TASK)
        original_exchange = _required_text(headers, h.ORIGINAL_EXCHANGE)
        _required_text(headers, h.ORIGINAL_ROUTING_KEY)
        _text(headers, h.ORIGINAL_QUEUE)
        _integer(headers, h.ATTEMPTS, _U32_MAX)
        _integer(headers, h.FIRST_FAILURE_MS)
        dead_lettered_ms = _integer(headers, h.DEAD_LETTERED_MS)
        if dead_lettered_ms is None:
            return None
        error_class = _text(headers, h.ERROR_CLASS) or ""
        _text(headers, h.ERROR)
        replays = _integer(headers, h.REPLAYS, _U32_MAX) or 0
    except _Unreadable:
        return None
    return encode(bounded(dependency), reason, bounded(error_class), bounded(task),
                  bounded(original_exchange), replays, dead_lettered_ms // 60_000)


class Tally:
    """One process's counts for one queue's index, sent in batches (the Rust ``Tally``).

    ``client`` gives the Redis client to call at each flush (a budget's, which a forked child
    makes again): the script is registered on it, and called by ``EVALSHA``."""

    def __init__(self, client: Any, key_prefix: str, queue: str, every: float = EVERY,
                 tries: int = TRIES) -> None:
        self._client_of = client
        self.queue = queue
        self._key_prefix = key_prefix
        self.key = index_key(key_prefix, queue)
        self.every = every
        self.tries = tries
        self._text = scripts.text("dead_letters")
        self._script: Any = None
        self._script_client: Any = None
        self._fresh()
        forks.register(self)
        forks.flush_at_exit(self)

    def _fresh(self) -> None:
        self._lock = threading.Lock()
        self._sending = threading.Lock()
        self._pending: dict[str, int] = {}
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        # This process as a writer of the index (a forked child is another), its batches
        # numbered; those sent without an answer, oldest first: [number, pairs, tries].
        self._writer_key = writer_key(self._key_prefix, self.queue,
                                      f"{os.getpid()}-{secrets.token_hex(8)}")
        self._sent = 0
        self._unsent: list[list[Any]] = []
        #: Messages whose count could not be sent (Redis failed): the index is short by this many.
        self.unrecorded = 0
        #: Batches sent again because the answer to an earlier try did not come.
        self.sent_again = 0

    def _after_fork_in_child(self) -> None:
        # The parent's counts are the parent's to send; its locks may have been held, its
        # thread does not exist here.
        self._fresh()
        self._script = self._script_client = None

    def _before_exit(self) -> None:
        self.flush_last()

    def entered(self, row_text: str, n: int = 1) -> None:
        """Counts ``n`` messages as entering the queue under ``row_text`` (copies the broker
        confirmed there); sent by the next flush."""
        with self._lock:
            self._pending[row_text] = self._pending.get(row_text, 0) + n
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fleet-budget-dead-letters",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def pending(self) -> int:
        """Messages counted and not sent yet."""
        with self._lock:
            return sum(self._pending.values())

    def flush(self) -> int:
        """Sends the batches still unanswered, in order, then (once none is left) what was
        counted since: one call per :data:`CHUNK` rows, each numbered. A batch whose answer did
        not come is sent again at the next flush (the script applies it once), up to
        :attr:`tries` times. Returns the messages given up now (logged, counted in
        :attr:`unrecorded`): Redis refused them, or they ran out of tries."""
        with self._sending:  # one flush at a time: the thread's and the one at exit
            if not self._unsent:
                # New counts are numbered only once the earlier batches are settled: a later
                # batch applied first would make an earlier one's retry look applied.
                with self._lock:
                    batch, self._pending = self._pending, {}
                changes = [(r, max(-DELTA_MAX, min(DELTA_MAX, d))) for r, d in batch.items() if d != 0]
                for start in range(0, len(changes), CHUNK):
                    self._sent += 1
                    self._unsent.append([self._sent, changes[start:start + CHUNK], 0])
            lost = 0
            while self._unsent:
                seq, chunk, tries = self._unsent[0]
                if tries > 0:
                    self.sent_again += 1
                self._unsent[0][2] = tries = tries + 1
                args: list[Any] = [str(MAX_ROWS), str(seq)]
                for r, d in chunk:
                    args += [r, str(d)]
                try:
                    self._evalsha(args)
                except (redis_exceptions.TimeoutError, redis_exceptions.ConnectionError) as e:
                    if tries < self.tries:
                        log.debug("dead-letter index %s: batch %d unanswered (%s); sent again at the next "
                                  "flush", self.key, seq, e)
                        self._wake.set()
                        break
                    lost += self._give_up(chunk, e)
                except Exception as e:  # Redis refused it: logged, not sent again
                    lost += self._give_up(chunk, e)
                self._unsent.pop(0)
            self.unrecorded += lost
            return lost

    def _give_up(self, chunk: list[tuple[str, int]], e: Exception) -> int:
        n = sum(abs(d) for _, d in chunk)
        log.warning("dead-letter index %s not updated for %d messages (%s); `budgetctl dlq "
                    "stats` shows an estimate until `budgetctl dlq reindex`", self.key, n, e)
        return n

    def flush_last(self) -> int:
        """Flushes until nothing waits (at the process's end): the batches still unanswered are
        sent again a few times, 100 ms apart, then given up. Returns the messages given up."""
        lost = 0
        for _ in range(10):
            lost += self.flush()
            if not self._unsent and self.pending() == 0:
                return lost
            time.sleep(0.1)
        with self._sending:
            with self._lock:
                left, self._pending = self._pending, {}
            n = sum(abs(d) for _, chunk, _ in self._unsent for _, d in chunk) + sum(abs(d) for d in left.values())
            self._unsent = []
            if n:
                log.warning("dead-letter index %s not updated for %d messages at the process's end "
                            "(Redis did not answer); `budgetctl dlq stats` shows an estimate until "
                            "`budgetctl dlq reindex`", self.key, n)
                self.unrecorded += n
            return lost + n

    def _evalsha(self, args: list[Any]) -> Any:
        client = self._client_of()
        if self._script is None or self._script_client is not client:
            self._script, self._script_client = client.register_script(self._text), client
        return self._script(keys=[self.key, self._writer_key], args=args)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            # At most one flush every `every`: what arrives meanwhile joins this one.
            time.sleep(self.every)
            try:
                self.flush()
            except Exception:  # the thread must outlive any one failure
                log.exception("fleet budget: sending dead-letter counts failed")


# Each budget's tally (one per process and budget: the budget's Redis, its topology's queue).
_tallies: "weakref.WeakKeyDictionary[Any, Tally]" = weakref.WeakKeyDictionary()
_tallies_lock = threading.Lock()


def _fresh_lock_in_child() -> None:
    global _tallies_lock
    _tallies_lock = threading.Lock()  # a parent's thread may have held it at the fork


os.register_at_fork(after_in_child=_fresh_lock_in_child)


def tally_of(budget: Any) -> Tally:
    """The tally of ``budget`` (a :class:`fleet_budget.FleetBudget`): its Redis, its key prefix,
    the dead-letter queue of its ``amqp.prefix``."""
    with _tallies_lock:
        tally = _tallies.get(budget)
        if tally is None:
            ref = weakref.ref(budget)

            def client() -> Any:
                b = ref()
                if b is None:
                    raise RuntimeError("the budget is gone")
                return b._redis

            config = budget.config
            tally = _tallies[budget] = Tally(client, config.redis.key_prefix, queue_of(config.amqp_prefix))
        return tally


def count_confirmed(budget: Any, headers: Mapping[str, Any]) -> None:
    """Counts a dead letter the broker confirmed, published with ``headers`` by a worker of
    ``budget``, if its record can be read. Never raises, never calls Redis (a thread sends it)."""
    try:
        r = row(headers)
        if r is not None:
            tally_of(budget).entered(r)
    except Exception:  # counting must never fail a job
        log.exception("fleet budget: counting a dead letter failed")


__all__ = ["CHUNK", "EVERY", "FIELD_MAX", "MAX_ROWS", "Tally", "bounded", "count_confirmed", "encode",
           "index_key", "queue_of", "row", "tally_of"]
