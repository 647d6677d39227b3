"""Publishing a copy the way the Rust ``Publisher`` does (``crates/fleet-budget-amqp/src/publish.rs``):
``mandatory`` on a channel in confirm mode, and only a broker ``Ack`` with no returned message
counts. Anything else (a nack, a return, a timeout, a closed channel or connection) raises
:class:`NotConfirmed`, and the caller must not ack the original.

One connection per process (opened on first use, again after a fork or a failure), its own
channel in confirm mode, a lock around each publish: dead letters are rare next to the jobs, and
a worker thread blocked on the confirm is the point. A forked child (a Celery prefork child)
starts with a lock of its own and no connection: the parent's is dropped, never closed from the
child, since closing it would send the broker a close on the parent's socket (``forks.py``).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any, Callable

from . import forks
from .redact import redact_text

#: Longest AMQP short string (exchange names, routing keys).
SHORT_STRING_MAX = 255


class NotConfirmed(Exception):
    """The broker did not confirm the copy; the original must stay unacked (it comes back)."""


class PermanentlyRefused(NotConfirmed):
    """A copy the broker can never take (a name over 255 bytes): the Rust worker parks these."""


def fanout_key(routing_key: str) -> str:
    """The routing key of a copy to a fanout exchange: the original's when it fits a short string."""
    return routing_key if len(routing_key.encode("utf-8")) <= SHORT_STRING_MAX else ""


class ConfirmedPublisher:
    """Publishes with confirms on a connection from ``connect`` (a kombu ``Connection`` factory,
    e.g. ``app.connection_for_write``); ``timeout`` bounds connecting and each confirm (seconds)."""

    def __init__(self, connect: Callable[[], Any], timeout: float = 10.0) -> None:
        self._connect = connect
        self._timeout = timeout
        self._lock = threading.Lock()
        self._pid = -1
        self._conn: Any = None
        self._channel: Any = None
        self._returned: list[str] = []
        forks.register(self)

    def _after_fork_in_child(self) -> None:
        # The lock may have been held by a parent's thread waiting for a confirm; the connection
        # is the parent's.
        self._lock = threading.Lock()
        self._conn, self._channel, self._pid = None, None, os.getpid()
        self._returned = []

    def publish(self, exchange: str, routing_key: str, body: bytes, headers: dict[str, Any],
                properties: dict[str, Any]) -> None:
        """Publishes and waits for the confirm; raises :class:`NotConfirmed` otherwise."""
        import amqp  # a dependency of Celery's default transport (py-amqp)

        for what, name in (("exchange", exchange), ("routing key", routing_key)):
            if len(name.encode("utf-8")) > SHORT_STRING_MAX:
                raise PermanentlyRefused(f"{what} {name[:64]!r}... is longer than {SHORT_STRING_MAX} bytes")
        with self._lock:
            try:
                channel = self._open()
                self._returned.clear()
                message = amqp.Message(body, application_headers=headers, **properties)
                channel.basic_publish_confirm(message, exchange=exchange, routing_key=routing_key,
                                              mandatory=True, confirm_timeout=self._timeout)
            except NotConfirmed:
                self._close()
                raise
            except (amqp.exceptions.MessageNacked, amqp.exceptions.AMQPError, OSError, socket.timeout) as e:
                self._close()
                raise NotConfirmed(f"publish to {exchange!r} not confirmed: {redact_text(str(e) or type(e).__name__)}") from None
            if self._returned:
                raise NotConfirmed(f"publish to {exchange!r} returned unroutable: {self._returned[0]}")

    def _open(self) -> Any:
        if self._pid != os.getpid():
            # After a fork the parent's socket is not ours to use.
            self._conn, self._channel, self._pid = None, None, os.getpid()
        if self._channel is not None and self._channel.is_open:
            return self._channel
        self._close()
        conn = self._connect()
        try:
            conn.connect_timeout = self._timeout
            # One try per node of a failover list (brokers.celery_broker_url), two for one broker.
            conn.ensure_connection(max_retries=max(1, len(getattr(conn, "alt", ())) - 1), timeout=self._timeout)
            channel = conn.connection.channel()
            if not hasattr(channel, "basic_publish_confirm"):
                raise NotConfirmed(f"transport {conn.transport_cls!r} is not py-amqp (amqp://): "
                                   "dead letters need RabbitMQ's publisher confirms")
            channel.confirm_select()
            channel.events["basic_return"].add(self._on_return)
        except NotConfirmed:
            conn.release()
            raise
        except Exception as e:
            conn.release()
            raise NotConfirmed(f"cannot reach the broker: {redact_text(str(e) or type(e).__name__)}") from None
        self._conn, self._channel = conn, channel
        return channel

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        self._returned.append(f"{exc} (exchange {exchange!r}, routing key {routing_key!r})")

    def _close(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None:
            try:
                conn.release()
            except Exception:  # closing a broken connection may fail too; it is dropped either way
                pass

    def close(self) -> None:
        with self._lock:
            self._close()
