"""``[metrics]``: read by the Rust library (its listen address), checked alike here so that one
file is accepted or refused by both."""

from __future__ import annotations

import ipaddress
from typing import Any

from .check import _Checker, _debug_str, _table, _unknown, _wrong_type


def read_metrics(c: _Checker, value: Any) -> None:
    """Checks ``[metrics]``."""
    m = _table(c, "metrics", value)
    _unknown(c, "metrics", m, ("listen",))
    if "listen" in m and not isinstance(m["listen"], str):
        raise _wrong_type("metrics.listen", m["listen"], "a string")
    if "listen" in m and not _socket_addr(m["listen"]):
        c.problem("metrics.listen", _debug_str(m["listen"]),
                  'an IP address and port, such as "127.0.0.1:9464" or "[::]:9464"')


def _socket_addr(value: Any) -> bool:
    """Whether ``value`` is ``IPv4:port`` or ``[IPv6]:port`` (Rust's ``SocketAddr`` syntax)."""
    if not isinstance(value, str):
        return False
    host, sep, port = value.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535:
        return False
    try:
        if host.startswith("[") and host.endswith("]"):
            address, percent, scope = host[1:-1].partition("%")
            # Rust's ``SocketAddrV6`` takes a numeric scope id only (``[fe80::1%2]``, not ``%eth0``).
            if percent and not (scope.isascii() and scope.isdigit() and int(scope) < 2**32):
                return False
            ipaddress.IPv6Address(address)
        else:
            ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True
