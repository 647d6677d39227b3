"""The broker's node list (``fleet_budget.brokers``): ``[amqp] url`` or ``urls`` and the environment
read as the Rust worker reads them, and what the publishing path does with a list: Celery's
``broker_url`` of ``;``-separated URLs, a node that does not answer skipped, by the dead-letter
publisher alone and in a Celery worker on its default prefork pool (tests/python/celery_fleet.py),
against the RabbitMQ at 127.0.0.1:5672 (the other "node" a port nothing listens on)."""

from __future__ import annotations

import os
import socket
import time
import uuid

import pytest
from celery import Celery
from test_celery import BROKER, Worker, declare_dead, get_all, raw_channel, wait_for

from fleet_budget import Config
from fleet_budget import brokers
from fleet_budget.config import ConfigError
from fleet_budget.publish import ConfirmedPublisher, NotConfirmed


def dead_node() -> str:
    """A broker URL on a local port nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"amqp://guest:guest@127.0.0.1:{port}//"


def problems_of(text: str) -> list:
    with pytest.raises(ConfigError) as e:
        Config.from_toml(text)
    return e.value.problems


def test_a_cluster_is_url_or_urls_never_both_each_checked_with_passwords_redacted():
    c = Config.from_toml('[amqp]\nurls = ["amqp://u:p@n1", "amqp://u:p@n2:5673"]\n')
    assert c.amqp_urls == ("amqp://u:p@n1", "amqp://u:p@n2:5673")
    assert Config.from_toml('[amqp]\nurl = "amqp://n1"\n').amqp_urls == ("amqp://n1",)
    assert Config.from_toml("").amqp_urls == ()

    p = problems_of('[amqp]\nurl = "amqp://a"\nurls = ["amqp://b"]\n')
    assert [x.key for x in p] == ["amqp.urls"] and "not both" in p[0].allowed
    assert problems_of("[amqp]\nurls = []\n")[0].key == "amqp.urls"
    p = problems_of('[amqp]\nurls = ["amqp://a", "http://u:secret@b"]\n')
    assert p[0].key == "amqp.urls[1]" and "secret" not in str(p[0])
    assert problems_of('[amqp]\nurls = ["amqp://a", "amqp://a"]\n')[0].key == "amqp.urls[1]"
    many = ", ".join(f'"amqp://n{i}"' for i in range(brokers.MAX_BROKER_URLS + 1))
    assert problems_of(f"[amqp]\nurls = [{many}]\n")[0].key == "amqp.urls"
    p = problems_of('[amqp]\nurls = ["amqps://u:secret@a", "amqp://b"]\n')
    assert "drop the encryption" in p[0].allowed and "secret" not in str(p[0])


def test_the_environment_names_one_broker_or_a_cluster_never_both():
    c = Config.from_toml('[amqp]\nurls = ["amqp://a", "amqp://b"]\n')
    c.apply_env({brokers.ENV_AMQP_URLS: "amqp://x, amqp://u:secret@y"})
    assert c.amqp_urls == ("amqp://x", "amqp://u:secret@y")
    c.apply_env({brokers.ENV_AMQP_URL: "amqp://z"})
    assert c.amqp_urls == ("amqp://z",)
    with pytest.raises(ConfigError) as e:
        c.apply_env({brokers.ENV_AMQP_URL: "amqp://z", brokers.ENV_AMQP_URLS: "amqp://x"})
    assert e.value.problems[0].key == brokers.ENV_AMQP_URLS
    with pytest.raises(ConfigError) as e:
        c.apply_env({brokers.ENV_AMQP_URLS: "amqp://x,redis://u:secret@y"})
    assert e.value.problems[0].key == "FLEET_BUDGET_AMQP_URLS[1]" and "secret" not in str(e.value)
    assert c.amqp_urls == ("amqp://z",), "unchanged after a problem"


def test_celery_gets_the_nodes_as_its_failover_list():
    app = Celery(f"brokers{uuid.uuid4().hex[:6]}")
    brokers.configure_celery(app, ("amqp://a//", "amqp://b//", "amqp://c//"), start=1)
    assert app.conf.broker_url == "amqp://b//;amqp://c//;amqp://a//"
    assert app.conf.broker_failover_strategy == "round-robin"
    conn = app.connection_for_write()
    assert list(conn.alt) == ["amqp://b//", "amqp://c//", "amqp://a//"]
    starts = set()
    for _ in range(200):
        brokers.configure_celery(app, ("amqp://a//", "amqp://b//", "amqp://c//"))
        starts.add(app.conf.broker_url.split(";")[0])
    assert starts == {"amqp://a//", "amqp://b//", "amqp://c//"}, "a fleet spreads over every node"
    with pytest.raises(ValueError, match="%3B"):
        brokers.celery_broker_url(["amqp://u:p;x@a//"])


@pytest.fixture
def own_queue():
    tag = uuid.uuid4().hex[:10]
    name = f"fbpy-brokers-{tag}"
    conn, channel = raw_channel()
    channel.exchange_declare(name, "fanout", durable=False, auto_delete=False)
    channel.queue_declare(name, durable=False, auto_delete=False)
    channel.queue_bind(name, name, "")
    yield channel, name
    channel.queue_delete(name)
    channel.exchange_delete(name)
    conn.close()


def test_the_dead_letter_publisher_skips_a_node_that_does_not_answer(own_queue):
    channel, name = own_queue
    for nodes in ([dead_node(), BROKER], [dead_node(), dead_node(), BROKER], [BROKER, dead_node()]):
        app = Celery(f"brokers{uuid.uuid4().hex[:6]}")
        # round-robin (kombu's default): the listed order, so the dead nodes come first.
        app.conf.broker_url = brokers.celery_broker_url(nodes)
        publisher = ConfirmedPublisher(app.connection_for_write, timeout=5)
        try:
            publisher.publish(name, "k", b"body", {"fb-test": "1"}, {"message_id": "m1"})
        finally:
            publisher.close()
        got = wait_for(lambda: get_all(channel, name), f"the copy published through {len(nodes)} nodes", 10)
        assert [m.body for m in got] == [b"body"]


def test_the_dead_letter_publisher_fails_within_its_timeouts_when_no_node_answers(own_queue):
    app = Celery(f"brokers{uuid.uuid4().hex[:6]}")
    app.conf.broker_url = brokers.celery_broker_url([dead_node(), dead_node()])
    publisher = ConfirmedPublisher(app.connection_for_write, timeout=2)
    began = time.monotonic()
    with pytest.raises(NotConfirmed) as e:
        publisher.publish(own_queue[1], "k", b"body", {}, {})
    assert "guest:guest" not in str(e.value)
    # Bounded: a refused connection per node, a retry interval of kombu's in between (never the
    # default endless retry).
    assert time.monotonic() - began < 60


def test_a_prefork_worker_with_a_dead_first_node_consumes_and_dead_letters(redis_url, tmp_path):
    tag = uuid.uuid4().hex[:10]
    prefix, queue = f"fbpybrk{tag}", f"fbpy-brokers-{tag}"
    config = tmp_path / "fleet-budget.toml"
    config.write_text(
        f'[amqp]\nprefix = "{prefix}"\n[redis]\ndeposit_flush_ms = 0\ntimeout_ms = 2000\n'
        "[defaults]\nmin_allowance = 1\nratio = 0\nwindow_secs = 3600\n"
        '[dependencies.search]\ntasks = ["index_document"]\n')
    nodes = brokers.celery_broker_url([dead_node(), BROKER])
    env = {**os.environ, "FB_CONFIG": str(config), "FB_CELERY_QUEUE": queue,
           "FLEET_BUDGET_REDIS_URL": redis_url, "FB_BROKER": nodes}
    conn, channel = raw_channel()
    dead = declare_dead(channel, prefix)
    worker = Worker(env, tmp_path / "worker.log", pool="prefork", concurrency=2)
    try:
        wait_for(lambda: b" ready." in worker.log.read_bytes(), "the prefork worker to be ready", 90)
        client = Celery(f"client{tag}", broker=nodes)
        client.conf.update(task_default_queue=queue, result_backend="rpc://", broker_connection_timeout=5)
        # Consumed through the live node; a non-retryable failure is dead-lettered from the pool's
        # child, whose publisher connects through the same list.
        assert client.send_task("index_document", (1,), {}).get(timeout=60) == "indexed 1"
        client.send_task("index_document", (2,), {"fail": -1})
        got = wait_for(lambda: get_all(channel, dead), "the dead letter", 60)
        assert len(got) == 1
        assert got[0].application_headers.get("fb-error-class")
    finally:
        worker.stop()
        print(worker.log.read_text(errors="replace")[-4000:])
        for name in (queue, dead):
            channel.queue_delete(name)
            channel.exchange_delete(name)
        conn.close()
