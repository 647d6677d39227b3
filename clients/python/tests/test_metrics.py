"""The metrics have the Rust library's names, types and labels: every metric of the Python client
is a row of the worker-metric table of docs/guides/metrics-and-alerts.md, with the same type and labels, and every row of that
table is in the Python client except those of the AMQP crate's worker."""

import re

from conftest import REPO

from fleet_budget import FleetBudget
from fleet_budget.config import Config
from fleet_budget.metrics import Metrics

#: Rows of the guide's table the Python client does not produce, and why (none since the
#: concurrency budget and the breaker came to it; the AMQP crate's rows are left out below).
NOT_IN_PYTHON: dict[str, str] = {}
#: The guide with the worker-metric table, relative to the repository.
METRICS_GUIDE = "docs/guides/metrics-and-alerts.md"
ROW = re.compile(r"^\| `(fleet_budget_[a-z_]+)` \| (counter|gauge|histogram) \|([a-z, ]*)\|")


def readme_worker_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    text = (REPO / METRICS_GUIDE).read_text(encoding="utf-8")
    table = text.split("| worker metric | type | labels | meaning |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines():
        m = ROW.match(line)
        if m and not m.group(1).startswith("fleet_budget_amqp_"):
            labels = tuple(sorted(x.strip() for x in m.group(3).split(",") if x.strip()))
            rows[m.group(1)] = (m.group(2), labels)
    return rows


def python_metrics(metrics: Metrics) -> dict[str, tuple[str, tuple[str, ...]]]:
    found = {}
    for family in metrics.registry.collect():
        collector = metrics.registry._names_to_collectors[family.name]  # noqa: SLF001
        name = family.name + ("_total" if family.type == "counter" else "")
        found[name] = (family.type, tuple(sorted(collector._labelnames)))  # noqa: SLF001
    return found


def test_names_types_and_labels_are_the_rust_library_s():
    documented = readme_worker_metrics()
    assert len(documented) >= 15, documented
    python = python_metrics(Metrics())
    for name, kind_labels in python.items():
        assert name in documented, f"{name} is not in {METRICS_GUIDE}'s worker-metric table"
        assert kind_labels == documented[name], f"{name}: Python {kind_labels}, {METRICS_GUIDE} {documented[name]}"
    missing = set(documented) - set(python) - set(NOT_IN_PYTHON)
    assert not missing, f"in {METRICS_GUIDE}'s table but not in the Python client: {sorted(missing)}"


def test_store_calls_are_timed_and_fallback_is_per_dependency(dead_url):
    config = Config.from_toml('[dependencies.search]\ntasks = ["index_document"]\n'
                              '[dependencies.mail]\ntasks = ["send_receipt"]\n', "test.toml")
    b = FleetBudget(config, redis_url=dead_url, group_commit=False)
    m = b.metrics
    assert m.value("fleet_budget_fallback_active", dependency="search") == 0
    assert ("fleet_budget_fallback_active", {"dependency": "mail"}) in [
        (s.name, s.labels) for f in m.registry.collect() for s in f.samples], "a series before any failure"
    b.withdraw("search")
    assert m.value("fleet_budget_fallback_active", dependency="search") == 1
    assert m.value("fleet_budget_fallback_active", dependency="mail") == 0
    assert m.value("fleet_budget_store_call_duration_seconds_count", op="spend") == 1
    b.status("mail")
    assert m.value("fleet_budget_fallback_active", dependency="mail") == 1
    assert m.value("fleet_budget_store_call_duration_seconds_count", op="status") == 1
    b.close()
