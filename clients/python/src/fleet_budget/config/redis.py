"""``[redis]``: where the fleet store is and how to reach it (URL or cluster seeds, deadline, key
prefix, fallback, deposit batching, deny cache, heartbeat, TLS files), with the URL checks the Rust library
makes, and ``FLEET_BUDGET_REDIS_URL`` / ``FLEET_BUDGET_REDIS_CA_FILE`` read over the file."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Optional
from urllib.parse import parse_qsl, unquote_to_bytes, urlsplit

from .check import _Checker, _quoted, _table, _unknown, _wrong_type
from .names import key_prefix_problem
from ..redact import redact_url

ENV_REDIS_URL = "FLEET_BUDGET_REDIS_URL"


ENV_REDIS_CA_FILE = "FLEET_BUDGET_REDIS_CA_FILE"


REDIS_SCHEMES = ("redis", "rediss", "redis+unix", "unix")


#: ``redis.heartbeat_ms``: 0 (off) or from the first to the second, as in the Rust library
#: (``crates/fleet-budget/src/config/redis.rs``).
MIN_HEARTBEAT_MS, MAX_HEARTBEAT_MS = 100, 300_000


#: Redis Cluster seed nodes (``redis.cluster_urls``): no TLS in this client's cluster mode yet,
#: so ``rediss://`` seeds are refused by name rather than connected in plaintext.
CLUSTER_SCHEMES = ("redis",)


@dataclass
class RedisSettings:
    url: str = "redis://127.0.0.1:6379"
    timeout_ms: int = 50
    key_prefix: str = "fb"
    fallback: str = "local"
    deposit_flush_ms: int = 100
    deposit_flush_count: int = 1000
    #: A denial of the fleet store stands in the process at most this long (0: off; deny_cache.py).
    deny_cache_ms: int = 100
    #: How often a worker writes its report to the worker registry (0: off). Read and checked
    #: as the Rust library does; 0 sends none (registry.py).
    heartbeat_ms: int = 5000
    #: Redis Cluster seed nodes, instead of ``url`` when not empty.
    cluster_urls: list[str] = field(default_factory=list)
    # rediss:// certificate files, as the Rust library reads them: a CA file instead of the
    # system's roots, and a client certificate with its key.
    tls_ca_file: Optional[str] = None
    tls_cert_file: Optional[str] = None
    tls_key_file: Optional[str] = None

    def client_kwargs(self) -> dict[str, Any]:
        """redis-py connection arguments for the TLS settings: certificate and host name always
        verified. Files set for a URL that is not ``rediss://`` are refused (nothing would be
        encrypted)."""
        tls = self.url.lower().startswith("rediss://")
        files = (self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        if not tls:
            if any(files):
                raise ValueError("TLS certificate files are set (redis.tls_*) but the URL is not "
                                 "rediss://, so the connection would not be encrypted")
            return {}
        kwargs: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
        if self.tls_ca_file:
            kwargs["ssl_ca_certs"] = self.tls_ca_file
        if self.tls_cert_file:
            kwargs["ssl_certfile"] = self.tls_cert_file
            kwargs["ssl_keyfile"] = self.tls_key_file
        return kwargs


def read_redis(c: _Checker, value: Any) -> RedisSettings:
    """``[redis]``, checked."""
    settings = RedisSettings()
    r = _table(c, "redis", value)
    _unknown(c, "redis", r, ("url", "cluster_urls", "timeout_ms", "key_prefix", "fallback",
                             "deposit_flush_ms", "deposit_flush_count", "deny_cache_ms", "batch_across_dependencies", "heartbeat_ms",
                             "tls_ca_file", "tls_cert_file", "tls_key_file"))
    if "url" in r:
        url = r["url"]
        if not isinstance(url, str):
            raise _wrong_type("redis.url", "...", "a string")
        if _url_problem(c, "redis.url", url, REDIS_SCHEMES):
            settings.url = url
    if "cluster_urls" in r:
        urls = r["cluster_urls"]
        if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
            raise _wrong_type("redis.cluster_urls", "...", "a list of URLs")
        ok = [_url_problem(c, f"redis.cluster_urls[{i}]", u, CLUSTER_SCHEMES) for i, u in enumerate(urls)]
        if all(ok):
            settings.cluster_urls = list(urls)
    settings.timeout_ms = c.int_in("redis.timeout_ms", r.get("timeout_ms"), 1, 60_000, 50)
    if "key_prefix" in r:
        prefix = r["key_prefix"]
        if not isinstance(prefix, str):
            raise _wrong_type("redis.key_prefix", prefix, "a string")
        wrong = key_prefix_problem(prefix)
        if wrong:
            c.problem("redis.key_prefix", _quoted(prefix), wrong)
        else:
            settings.key_prefix = prefix
    settings.fallback = c.choice("redis.fallback", r.get("fallback"), ("local", "deny", "allow"), "local")
    settings.deposit_flush_ms = c.int_in("redis.deposit_flush_ms", r.get("deposit_flush_ms"), 0, 10_000, 100)
    settings.deposit_flush_count = c.int_in(
        "redis.deposit_flush_count", r.get("deposit_flush_count"), 1, 1_000_000_000, 1000)
    settings.deny_cache_ms = c.int_in("redis.deny_cache_ms", r.get("deny_cache_ms"), 0, 10_000, 100)
    heartbeat = r.get("heartbeat_ms")
    if heartbeat is not None:
        if isinstance(heartbeat, bool) or not isinstance(heartbeat, int):
            raise _wrong_type("redis.heartbeat_ms", heartbeat, "an integer")
        if heartbeat == 0 or MIN_HEARTBEAT_MS <= heartbeat <= MAX_HEARTBEAT_MS:
            settings.heartbeat_ms = heartbeat
        else:
            c.problem("redis.heartbeat_ms", heartbeat,
                      f"must be 0 (off) or from {MIN_HEARTBEAT_MS} to {MAX_HEARTBEAT_MS}")
    # Read for the Rust client's group commit across dependencies; this client sends one
    # dependency per call, so the key is only checked here.
    if "batch_across_dependencies" in r and not isinstance(r["batch_across_dependencies"], bool):
        c.problem("redis.batch_across_dependencies", repr(r["batch_across_dependencies"]),
                  "must be true or false")
    for key in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        if key in r:
            if isinstance(r[key], str) and r[key]:
                setattr(settings, key, r[key])
            else:
                c.problem(f"redis.{key}", repr(r[key]), "must be the path of a PEM file")
    if (settings.tls_cert_file is None) != (settings.tls_key_file is None):
        c.problem("redis.tls_cert_file", "(only one of the pair)",
                  "redis.tls_cert_file and redis.tls_key_file must be set together")
    return settings


def _url_problem(c: _Checker, key: str, url: str, schemes: tuple[str, ...]) -> bool:
    """Checks ``url`` as the Rust ``check_url`` does; True when it is usable. A TLS scheme this
    client cannot honour is refused by name rather than connected without encryption, and a
    ``#fragment`` (``rediss://h/#insecure``) is refused: certificate checks cannot be turned off."""
    scheme, sep, _ = url.partition("://")
    if sep and scheme.endswith("s") and scheme not in schemes and scheme[:-1] in schemes:
        c.problem(key, _redact(url), f"TLS ({scheme}://) is not available here, and the connection "
                  f"would not be encrypted; use {scheme[:-1]}:// on a trusted network or through a TLS tunnel")
        return False
    if url.partition("#")[2]:
        c.problem(key, _redact(url), "must not have a #fragment (certificate and host name checks "
                  "cannot be turned off)")
        return False
    if not _url_ok(url, schemes):
        c.problem(key, _redact(url), "must be a URL of the form " + " or ".join(f"{s}://..." for s in schemes))
        return False
    why = _client_url_problem(url)
    if why:
        c.problem(key, _redact(url), f"the Redis client cannot use this URL ({why})")
        return False
    return True



#: Characters a host may not hold (the URL standard's forbidden host code points, which the Rust
#: client's URL parser refuses; tabs and line breaks are dropped from a URL by both parsers).
_FORBIDDEN_HOST = set("\0 #/:<>?@[\\]^|")



def _client_url_problem(url: str) -> Optional[str]:
    """Why the Rust Redis client would refuse the URL at its first connect (the Rust
    ``check_redis_url``, which asks that client), or None: a port out of range, a host it cannot
    parse, a database that is not a number, a wildcard address, an unknown ``protocol``, a user
    or password that is not UTF-8 once decoded, a socket URL with a host."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError when out of range or not a number
    except ValueError:
        return "Redis URL did not parse"
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if query.get("protocol", "2") not in ("2", "resp2", "3", "resp3"):
        return "Invalid protocol version"
    if parts.scheme in ("unix", "redis+unix"):
        if parts.netloc not in ("", "localhost"):
            return "Missing path"
        if "db" in query and not _i64(query["db"]):
            return "Invalid database number"
        return None
    userinfo, _, host = parts.netloc.rpartition("@")
    try:
        for part in userinfo.partition(":")[::2]:
            unquote_to_bytes(part).decode("utf-8")
    except UnicodeDecodeError:
        return "a user name or password that is not UTF-8"
    if host.startswith("["):
        literal = host[1:].partition("]")[0]
        try:
            if "%" in literal:
                raise ValueError(literal)
            host = str(ipaddress.IPv6Address(literal))
        except ValueError:
            return "Redis URL did not parse"
    else:
        host = host.rpartition(":")[0] if ":" in host else host
        if any(ch in _FORBIDDEN_HOST for ch in host):
            return "Redis URL did not parse"
    if not host:
        return "Missing hostname"
    if host in ("0.0.0.0", "::"):
        return "Cannot connect to a wildcard address (0.0.0.0 or ::)"
    db = parts.path.strip("/")
    if db and not _i64(db):
        return "Invalid database number"
    return None



def _i64(text: str) -> bool:
    """Whether Rust's ``i64::from_str`` takes ``text``."""
    return bool(re.fullmatch(r"[+-]?[0-9]+", text)) and -(2**63) <= int(text) < 2**63



def _url_ok(url: str, schemes: tuple[str, ...] = REDIS_SCHEMES) -> bool:
    for scheme in schemes:
        rest = url.removeprefix(scheme)
        if rest != url and rest.startswith("://") and len(rest) > 3:
            return True
    return False


_redact = redact_url
