"""The broker's nodes, as the Rust worker reads them (``crates/fleet-budget-amqp/src/config/nodes.rs``):
``[amqp] url`` (one broker) or ``[amqp] urls`` (a cluster's nodes), never both;
``FLEET_BUDGET_AMQP_URL`` or ``FLEET_BUDGET_AMQP_URLS`` (comma-separated) over either, never both.
Each URL is checked as the Rust ``check_url`` checks it, and every problem shows it with its
password redacted.

The Python client publishes through the Celery app's connection (``publish.py``), and Celery's
own failover is a ``broker_url`` of several URLs separated by ``;``: :func:`celery_broker_url`
makes it, and :func:`configure_celery` sets it on an app, the list rotated to start at a random
node (so a fleet spreads over the cluster) with kombu's ``round-robin`` strategy (each node once
per round; kombu's ``shuffle`` picks at random and may try a dead node twice in a row). Kombu tries
the next node when one does not answer, for Celery's consumer and for the dead-letter publisher
alike (``docs/guides/broker-cluster.md``).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Mapping, Optional

from .redact import redact_url

ENV_AMQP_URL = "FLEET_BUDGET_AMQP_URL"
ENV_AMQP_URLS = "FLEET_BUDGET_AMQP_URLS"
AMQP_SCHEMES = ("amqp", "amqps")
#: Most nodes one configuration may list (the Rust ``MAX_BROKER_URLS``).
MAX_BROKER_URLS = 32

#: ``problem(key, value, allowed)``: how a problem is reported (the configuration's checker).
Report = Callable[[str, str, str], None]


def _url_ok(key: str, url: Any, problem: Report) -> bool:
    """The Rust ``check_url`` for ``amqp://`` and ``amqps://``."""
    if not isinstance(url, str):
        problem(key, repr(type(url).__name__), "must be a string")
        return False
    if url.partition("#")[2]:
        problem(key, redact_url(url), "must not have a #fragment (certificate and host name checks "
                "cannot be turned off)")
        return False
    scheme, sep, rest = url.partition("://")
    if not (sep and scheme in AMQP_SCHEMES and rest):
        problem(key, redact_url(url), "must be a URL of the form amqp://... or amqps://...")
        return False
    return True


def checked_nodes(key: str, urls: Any, problem: Report) -> tuple[str, ...]:
    """``urls`` when each is a broker URL, listed once, and there are 1 to ``MAX_BROKER_URLS``;
    otherwise the problems are reported (``key[i]`` names one URL) and the result is empty."""
    if not isinstance(urls, list):
        problem(key, repr(type(urls).__name__), "must be a list of broker URLs")
        return ()
    if not urls:
        problem(key, "[]", "must list at least one broker URL")
        return ()
    if len(urls) > MAX_BROKER_URLS:
        problem(key, f"{len(urls)} URLs", f"must list at most {MAX_BROKER_URLS} broker nodes")
        return ()
    for i, url in enumerate(urls):
        if not _url_ok(f"{key}[{i}]", url, problem):
            return ()
        if url in urls[:i]:
            problem(f"{key}[{i}]", redact_url(url), "lists the same node twice")
            return ()
    schemes = {u.partition("://")[0] for u in urls}
    if len(schemes) > 1:
        problem(key, shown(urls), "mixes amqps:// and amqp:// nodes: a failover to a plaintext node "
                "would drop the encryption")
        return ()
    return tuple(urls)


def from_section(amqp: Mapping[str, Any], problem: Report) -> tuple[str, ...]:
    """The nodes of an ``[amqp]`` table: ``url`` alone, or ``urls``; empty when it sets neither
    (the default broker) or on a problem (reported)."""
    if "url" in amqp and "urls" in amqp:
        problem("amqp.urls", "amqp.url and amqp.urls",
                "set one of amqp.url (one broker) or amqp.urls (a cluster's nodes), not both")
        return ()
    if "url" in amqp:
        return (amqp["url"],) if _url_ok("amqp.url", amqp["url"], problem) else ()
    if "urls" in amqp:
        return checked_nodes("amqp.urls", amqp["urls"], problem)
    return ()


def from_env(env: Mapping[str, str], problem: Report) -> Optional[tuple[str, ...]]:
    """The nodes the environment names (``FLEET_BUDGET_AMQP_URL`` or ``FLEET_BUDGET_AMQP_URLS``,
    an empty value being none), or None; on a problem (reported) None too."""
    url, urls = env.get(ENV_AMQP_URL, ""), env.get(ENV_AMQP_URLS, "")
    if url and urls:
        problem(ENV_AMQP_URLS, f"{ENV_AMQP_URL} and {ENV_AMQP_URLS}",
                f"set one of {ENV_AMQP_URL} (one broker) or {ENV_AMQP_URLS} (a cluster's nodes, "
                "comma-separated), not both")
        return None
    if url:
        return (url,) if _url_ok(ENV_AMQP_URL, url, problem) else None
    if urls:
        return checked_nodes(ENV_AMQP_URLS, [u.strip() for u in urls.split(",")], problem) or None
    return None


def shown(urls: Any) -> str:
    """URLs as problems and logs show them: passwords redacted, separated by commas."""
    return ", ".join(redact_url(u) for u in urls)


def celery_broker_url(urls: tuple[str, ...] | list[str]) -> str:
    """Celery's ``broker_url`` for these nodes: the URLs separated by ``;`` (kombu's failover
    list). A URL holding ``;`` cannot be listed (write it ``%3B``)."""
    for u in urls:
        if ";" in u:
            raise ValueError(f"broker URL {redact_url(u)} holds ';', which separates Celery's "
                             "failover URLs: write it %3B")
    return ";".join(urls)


def configure_celery(app: Any, urls: tuple[str, ...] | list[str], start: Optional[int] = None) -> None:
    """Points ``app`` at the nodes ``urls`` (a Config's ``amqp_urls``; nothing changes when empty):
    ``broker_url`` as the failover list rotated to begin at node ``start`` (random when None, so
    each process starts elsewhere), ``broker_failover_strategy = "round-robin"``."""
    if not urls:
        return
    first = random.randrange(len(urls)) if start is None else start % len(urls)
    nodes = list(urls[first:]) + list(urls[:first])
    app.conf.broker_url = celery_broker_url(nodes)
    app.conf.broker_failover_strategy = "round-robin"
