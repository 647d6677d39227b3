"""The configuration as a whole: :class:`Config`, read from a file or a TOML text section by
section (each in its own module, as in ``crates/fleet-budget/src/config``), every problem
reported at once, and the environment read over the file."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from .amqp import read_amqp_prefix, read_amqp_urls
from .audit import read_audit
from .breaker import read_breakers
from .check import _Checker, _Unknown, _unknown
from .dependencies import read_dependencies
from .defaults import read_defaults
from .enforcement import read_enforcement
from .error import ConfigError
from .metrics import read_metrics
from .redis import ENV_REDIS_CA_FILE, ENV_REDIS_URL, REDIS_SCHEMES, RedisSettings, _url_problem, read_redis
from .tasks import read_tasks
from .check import _table
from .unmapped import UnmappedTasks, _unmapped
from .. import brokers
from ..breaker import BreakerPolicy
from ..concurrency import ConcurrencyPolicy
from ..policy import DEFAULT_MAX_DELAY_SECS, BudgetPolicy, TaskCeiling

OTHER_SECTIONS = ("amqp",)


@dataclass
class Config:
    redis: RedisSettings = field(default_factory=RedisSettings)
    defaults: BudgetPolicy = field(default_factory=BudgetPolicy)
    policies: dict[str, BudgetPolicy] = field(default_factory=dict)
    tasks: dict[str, str] = field(default_factory=dict)
    default_ceiling: TaskCeiling = field(default_factory=TaskCeiling)
    ceilings: dict[str, TaskCeiling] = field(default_factory=dict)
    unmapped: UnmappedTasks = field(default_factory=UnmappedTasks)
    #: ``[dependencies.X.concurrency]``: the concurrency budgets, by dependency.
    concurrency: dict[str, ConcurrencyPolicy] = field(default_factory=dict)
    #: ``[dependencies.X.breaker]``: the circuit breakers, by dependency.
    breakers: dict[str, BreakerPolicy] = field(default_factory=dict)
    #: The ``max_delay`` (seconds) of a task that sets none, nor ``[defaults]``: the longest
    #: default retry tier, as in the Rust library without a broker configuration; twice the
    #: task's backoff cap when that is longer (:meth:`ceiling`).
    default_max_delay: float = float(DEFAULT_MAX_DELAY_SECS)
    #: ``[amqp] prefix`` (default ``fleet``): the topology's names, ``<prefix>.dead`` the
    #: dead-letter exchange the Celery integration publishes to. The other ``[amqp]`` keys belong
    #: to the Rust worker and are not read here.
    amqp_prefix: str = "fleet"
    #: ``[amqp] url`` or ``urls`` (``FLEET_BUDGET_AMQP_URL``/``_URLS`` over them): the broker's
    #: nodes, empty for Celery's own ``broker_url`` (``brokers.configure_celery``).
    amqp_urls: tuple[str, ...] = ()
    #: ``[defaults] enforcement``: ``"enforce"`` or ``"shadow"`` (fleet_budget.decision).
    default_enforcement: str = "enforce"
    #: ``[dependencies.X] enforcement``, where a section gives one.
    enforcement: dict[str, str] = field(default_factory=dict)

    def enforcement_of(self, dependency: str) -> str:
        """The configured enforcement of ``dependency``: its section's, else the default."""
        return self.enforcement.get(dependency, self.default_enforcement)

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.amqp_prefix}.dead"

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> "Config":
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ConfigError(str(path), f"cannot read configuration file: {e.strerror or e}") from None
        config = cls.from_toml(text, str(path))
        config.apply_env(os.environ)
        return config

    @classmethod
    def from_toml(cls, text: str, origin: str = "<toml>") -> "Config":
        # A byte order mark (a file saved by a Windows editor) is skipped, as the Rust parser does.
        text = text.removeprefix("\ufeff")
        try:
            root = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(origin, str(e)) from None
        try:
            return _resolve(root, origin)
        except _Unknown as e:
            raise ConfigError(origin, str(e)) from None

    def apply_env(self, env: Mapping[str, str]) -> None:
        """``FLEET_BUDGET_REDIS_URL`` replaces ``redis.url`` (and any ``cluster_urls``), checked."""
        url = env.get(ENV_REDIS_URL, "")
        if url:
            c = _Checker()
            if not _url_problem(c, ENV_REDIS_URL, url, REDIS_SCHEMES):
                raise ConfigError(ENV_REDIS_URL, str(c.problems[0]), c.problems)
            self.redis.url = url
            self.redis.cluster_urls = []
        ca_file = env.get(ENV_REDIS_CA_FILE, "")
        if ca_file:
            self.redis.tls_ca_file = ca_file
        c = _Checker()
        if (nodes := brokers.from_env(env, c.problem)) or c.problems:
            if c.problems:
                raise ConfigError(c.problems[0].key, str(c.problems[0]), c.problems)
            self.amqp_urls = nodes or ()

    def dependency(self, task: str) -> str:
        """The dependency whose budget ``task`` spends, not counting the cap on own budgets (an
        unmapped name under ``own_budget`` is its own): for showing a configuration. A worker
        asks :meth:`fleet_budget.FleetBudget.dependency`. Under ``reject`` an unmapped task's
        own name is returned; ``FleetBudget.dependency`` refuses it."""
        mapped = self.tasks.get(task)
        if mapped is not None:
            return mapped
        if self.unmapped.policy == "share" and self.unmapped.dependency is not None:
            return self.unmapped.dependency
        return task

    def policy(self, dependency: str) -> BudgetPolicy:
        return self.policies.get(dependency, self.defaults)

    def ceiling(self, task: str) -> TaskCeiling:
        """The ceiling of ``task``, its ``max_delay`` filled in: as configured, else the longer of
        :attr:`default_max_delay` and twice the task's backoff cap (the Rust ``Ceilings::for_task``)."""
        ceiling = self.ceilings.get(task, self.default_ceiling)
        if ceiling.max_delay is not None:
            return ceiling
        return replace(ceiling, max_delay=max(self.default_max_delay, 2 * ceiling.backoff.cap))


def _resolve(root: dict[str, Any], origin: str) -> Config:
    c = _Checker()
    amqp = root.get("amqp")
    root = {k: v for k, v in root.items() if k not in OTHER_SECTIONS}
    _unknown(c, "", root, ("redis", "defaults", "dependencies", "tasks", "metrics", "audit", "unmapped_tasks"))
    config = Config()
    # Sections the Rust library reads and this client does not use: checked alike, so that one
    # file is accepted or refused by both.
    read_metrics(c, root.get("metrics"))
    read_audit(c, root.get("audit"))
    config.amqp_urls = read_amqp_urls(c, amqp)
    prefix = read_amqp_prefix(c, amqp)
    if prefix is not None:
        config.amqp_prefix = prefix
    config.redis = read_redis(c, root.get("redis"))
    config.defaults, config.default_ceiling = read_defaults(c, root.get("defaults"))
    config.default_enforcement, config.enforcement = read_enforcement(
        c, root.get("defaults"), root.get("dependencies"))
    breakers = read_dependencies(c, root.get("dependencies"), config.defaults, config.policies, config.tasks,
                                 config.concurrency)
    config.unmapped = _unmapped(c, _table(c, "unmapped_tasks", root.get("unmapped_tasks")), config.policies)
    config.breakers = read_breakers(c, breakers, config.policies, config.defaults)
    config.ceilings = read_tasks(c, root.get("tasks"), config.tasks, config.unmapped, config.default_ceiling)
    if c.problems:
        raise ConfigError(origin, "invalid configuration:\n" + "\n".join(f"  - {p}" for p in c.problems),
                          c.problems)
    return config
