"""Settings of the Redis server that take budgets away without an error, logged once at start.

An eviction policy other than ``noeviction`` lets Redis drop any key when memory is full: a
budget's hash, an operator's freeze, an open breaker, a lease, the audit trail. A server without
persistence forgets the same keys on every restart. Neither is an error a call returns, so the
client reads the settings once when it starts (:func:`start`), as the Rust crate's
``fleet_budget::risks`` does for its workers, and ``budgetctl doctor`` checks them with the rest.

Read with ``CONFIG GET``, else ``INFO``; what neither shows is "not checked" with the server's
reason, never guessed. Under an ACL user only ``INFO memory`` and ``INFO persistence`` are sent:
the users of ``lua/README.md`` are granted those two sections (``+info|memory
+info|persistence``) and no ``CONFIG``, and a refusal is an entry in ``ACL LOG``, which operators
watch. ``INFO`` shows ``maxmemory_policy`` and whether AOF is on, not the RDB schedule. The check runs
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


class _NotAsked(redis.exceptions.RedisError):
    """``CONFIG`` is not sent under an ACL user."""


def _grant_hint(refusal: Any) -> str:
    if isinstance(refusal, redis.exceptions.NoPermissionError) or "noperm" in str(refusal).lower():
        return " (grant the user +info|memory +info|persistence, as lua/README.md's ACL lines do)"
    return ""


def read_redis_risks(client: Any, config: bool = True) -> list[tuple[str, str, str, str, str]]:
    """Each check as ``(check, state, found, cost, action)``: ``state`` is ``ok``, ``risk`` or
    ``not_checked`` (then ``found`` says why); ``cost`` and ``action`` are empty unless a risk.
    ``config=False`` sends only ``INFO memory`` and ``INFO persistence`` (an ACL user's rights)."""

    def config_get(name: str) -> dict[str, str]:
        if not config:
            raise _NotAsked("not asked under an ACL user")
        return _config_get(client, name)

    out = []
    # maxmemory-policy
    try:
        pairs = config_get("maxmemory*")
        policy, limit, via = pairs.get("maxmemory-policy"), pairs.get("maxmemory", "unknown"), "CONFIG GET"
    except redis.exceptions.RedisError as config_refused:
        try:
            info = _info(client, "memory")
            policy, limit, via = info.get("maxmemory_policy"), info.get("maxmemory", "unknown"), "INFO memory"
        except redis.exceptions.RedisError as info_refused:
            policy, via = None, (f"CONFIG GET: {_short(config_refused)}; INFO memory: "
                                 f"{_short(info_refused)}{_grant_hint(info_refused)}")
    if policy is None:
        out.append(("maxmemory_policy", "not_checked", f"maxmemory-policy not readable ({via})", "", ""))
    elif policy == "noeviction":
        out.append(("maxmemory_policy", "ok", f"maxmemory-policy noeviction, maxmemory {limit} ({via})", "", ""))
    else:
        out.append(("maxmemory_policy", "risk", f"maxmemory-policy {policy}, maxmemory {limit} ({via})",
                    EVICTION_COST, EVICTION_ACTION))
    # persistence
    try:
        save = config_get("save").get("save", "")
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
                out.append(("persistence", "not_checked", "AOF off (INFO persistence), which does not "
                            f"show the RDB schedule (rdb_saves {info.get('rdb_saves', '?')} since "
                            "start, rdb_changes_since_last_save "
                            f"{info.get('rdb_changes_since_last_save', '?')}); CONFIG GET save: "
                            f"{_short(config_refused)}", "", ""))
        except redis.exceptions.RedisError as info_refused:
            out.append(("persistence", "not_checked", f"persistence not readable: CONFIG GET: "
                        f"{_short(config_refused)}; INFO persistence: {_short(info_refused)}"
                        f"{_grant_hint(info_refused)}", "", ""))
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
    client = None
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                      **kwargs)
        log_redis_risks(read_redis_risks(client, config=acl_user(url) is None), server)
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
