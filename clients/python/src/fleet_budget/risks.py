"""Settings of the Redis server that take budgets away without an error, logged once at start.

An eviction policy other than ``noeviction`` lets Redis drop any key when memory is full: a
budget's hash, an operator's freeze, an open breaker, a lease, the audit trail. A server without
persistence forgets the same keys on every restart. Neither is an error a call returns, so the
client reads the settings once when it starts (:func:`start`), as the Rust crate's
``fleet_budget::risks`` does for its workers, and ``budgetctl doctor`` checks them with the rest.

Read with ``CONFIG GET``, else ``INFO``; what neither shows is "not checked" with the server's
reason, never guessed. Under an ACL user nothing is asked: the users of ``lua/README.md`` have
neither command, and a refusal is an entry in ``ACL LOG``, which operators watch. The check runs
in a daemon thread on a connection of its own (closed after), so a Redis that is down delays
nothing and the budget's own client (sync or asyncio) is not touched.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional
from urllib.parse import urlsplit

import redis

from .redact import redact_text, redact_url

log = logging.getLogger("fleet_budget")

#: The longest text kept from a reply or an error.
MAX_TEXT = 200

EVICTION_COST = (
    "when memory is full Redis may evict any key the policy covers: a budget's counters (the "
    "budget starts again at its floor and grants retries it had refused), an operator's freeze or "
    "set override (lifted without a word), an open breaker, a concurrency lease and the audit "
    "trail; no script, log or metric notices")
EVICTION_ACTION = (
    "set `maxmemory-policy noeviction` on the budgets' Redis, or give the budgets a Redis of their "
    "own that no cache shares")
PERSISTENCE_COST = (
    "a restart empties Redis: every budget loses its window's counters (each starts again at its "
    "floor), operators' overrides are gone (a freeze is lifted), open breakers close, and the "
    "audit trail and the dead-letter index are lost")
PERSISTENCE_ACTION = (
    "turn on AOF (`appendonly yes`) or RDB snapshots (`save 60 1000`) on the budgets' Redis, or "
    "accept that a restart resets budgets and lifts freezes")


def _short(text: Any) -> str:
    text = redact_text(str(text))
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


def acl_user(url: str) -> Optional[str]:
    """The ACL user named in ``url``, unless it is ``default`` (or none is named)."""
    try:
        user = urlsplit(url).username
    except ValueError:
        return None
    return _short(user) if user and user != "default" else None


def _config_get(client: Any, name: str) -> dict[str, str]:
    reply = client.config_get(name)
    return {_short(k): _short(v) for k, v in dict(reply).items()}


def _info(client: Any, section: str) -> dict[str, str]:
    reply = client.info(section)
    return {_short(k): _short(v) for k, v in dict(reply).items()}


def read_redis_risks(client: Any) -> list[tuple[str, str, str, str, str]]:
    """Each check as ``(check, state, found, cost, action)``: ``state`` is ``ok``, ``risk`` or
    ``not_checked`` (then ``found`` says why); ``cost`` and ``action`` are empty unless a risk."""
    out = []
    # maxmemory-policy
    try:
        pairs = _config_get(client, "maxmemory*")
        policy, limit, via = pairs.get("maxmemory-policy"), pairs.get("maxmemory", "unknown"), "CONFIG GET"
    except redis.exceptions.RedisError as config_refused:
        try:
            info = _info(client, "memory")
            policy, limit, via = info.get("maxmemory_policy"), info.get("maxmemory", "unknown"), "INFO memory"
        except redis.exceptions.RedisError as info_refused:
            policy, via = None, f"CONFIG GET: {_short(config_refused)}; INFO: {_short(info_refused)}"
    if policy is None:
        out.append(("maxmemory_policy", "not_checked", f"maxmemory-policy not readable ({via})", "", ""))
    elif policy == "noeviction":
        out.append(("maxmemory_policy", "ok", f"maxmemory-policy noeviction, maxmemory {limit} ({via})", "", ""))
    else:
        out.append(("maxmemory_policy", "risk", f"maxmemory-policy {policy}, maxmemory {limit} ({via})",
                    EVICTION_COST, EVICTION_ACTION))
    # persistence
    try:
        save = _config_get(client, "save").get("save", "")
        aof = _config_get(client, "appendonly").get("appendonly", "no")
        rdb_on, aof_on = bool(save.strip()), aof == "yes"
        found = f"RDB {'on' if rdb_on else 'off'} (save {save!r}), AOF {'on' if aof_on else 'off'} (CONFIG GET)"
        if rdb_on or aof_on:
            out.append(("persistence", "ok", found, "", ""))
        else:
            out.append(("persistence", "risk", found, PERSISTENCE_COST, PERSISTENCE_ACTION))
    except redis.exceptions.RedisError as config_refused:
        try:
            info = _info(client, "persistence")
            if str(info.get("aof_enabled")) == "1":
                out.append(("persistence", "ok", "AOF on (INFO persistence)", "", ""))
            else:
                out.append(("persistence", "not_checked", "INFO shows AOF off and cannot show the RDB "
                            f"schedule; CONFIG GET save: {_short(config_refused)}", "", ""))
        except redis.exceptions.RedisError as info_refused:
            out.append(("persistence", "not_checked", f"persistence not readable: CONFIG GET: "
                        f"{_short(config_refused)}; INFO: {_short(info_refused)}", "", ""))
    return out


def log_redis_risks(risks: list[tuple[str, str, str, str, str]], server: str) -> None:
    """One line per risk (warning) and per check not made (info)."""
    for check, state, found, cost, action in risks:
        if state == "risk":
            log.warning("Redis risk (%s) at %s: %s: %s. What to do: %s (`budgetctl doctor` checks it)",
                        check, server, found, cost, action)
        elif state == "not_checked":
            log.info("Redis setting not checked (%s) at %s: %s", check, server, found)


def _check(url: str, timeout: float, kwargs: dict[str, Any]) -> None:
    server = redact_url(url)
    user = acl_user(url)
    if user is not None:
        why = (f"connected as ACL user {user!r}, which is not asked for CONFIG or INFO (a refusal "
               "would fill ACL LOG); run `budgetctl doctor` with a user granted +config|get +info")
        log_redis_risks([(c, "not_checked", why, "", "") for c in ("maxmemory_policy", "persistence")],
                        server)
        return
    client = None
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                      **kwargs)
        log_redis_risks(read_redis_risks(client), server)
    except Exception as e:  # noqa: BLE001 - a check that cannot run never stops a worker
        log.info("Redis settings not checked at %s: %s", server, _short(e))
    finally:
        if client is not None:
            client.close()


def start(config: Any) -> Optional[threading.Thread]:
    """Reads and logs the risks of the Redis of ``config`` (its URL, or a cluster's first node)
    once, in a daemon thread."""
    settings = config.redis
    url = settings.cluster_urls[0] if settings.cluster_urls else settings.url
    try:
        kwargs = settings.client_kwargs()
    except ValueError:
        return None
    timeout = max(settings.timeout_ms / 1000, 1.0)
    thread = threading.Thread(target=_check, args=(url, timeout, kwargs),
                              name="fleet-budget-redis-risks", daemon=True)
    thread.start()
    return thread
