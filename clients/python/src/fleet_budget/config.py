"""The TOML configuration the Rust library reads (``crates/fleet-budget/src/config``): the same
sections, keys, limits and defaults, every problem reported at once, ``FLEET_BUDGET_REDIS_URL``
over ``redis.url`` and ``FLEET_BUDGET_REDIS_CA_FILE`` over ``redis.tls_ca_file``. Sections of other components (``[amqp]``) are ignored, as the Rust worker does."""

from __future__ import annotations

import ipaddress
import math
import os
import re
import tomllib
from urllib.parse import parse_qsl, unquote_to_bytes, urlsplit
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional

from .redact import redact_url
from . import brokers
from .breaker import BreakerPolicy
from .concurrency import MAX_CAP, ConcurrencyPolicy
from .policy import CLASS_MAX_ATTEMPTS, DEFAULT_MAX_DELAY_SECS, Backoff, BudgetPolicy, TaskCeiling

ENV_REDIS_URL = "FLEET_BUDGET_REDIS_URL"
ENV_REDIS_CA_FILE = "FLEET_BUDGET_REDIS_CA_FILE"
REDIS_SCHEMES = ("redis", "rediss", "redis+unix", "unix")
#: Redis Cluster seed nodes (``redis.cluster_urls``): no TLS in this client's cluster mode yet,
#: so ``rediss://`` seeds are refused by name rather than connected in plaintext.
CLUSTER_SCHEMES = ("redis",)
MAX_WINDOW_SECS = 86_400
MAX_RATIO = 10.0
MAX_DEPENDENCY_LEN = 200
#: Longest ``max_delay_secs`` accepted: a week (the Rust ``MAX_DELAY_SECS``).
MAX_DELAY_SECS = 7 * 86_400
#: Most unmapped names that may get a budget of their own (the Rust ``MAX_OWN_BUDGETS``).
MAX_OWN_BUDGETS = 100_000
#: Unmapped names given a budget of their own by default, per process.
DEFAULT_MAX_OWN_BUDGETS = 100
#: The budget shared by unmapped names past ``max_own_budgets`` (the Rust ``OVERFLOW_DEPENDENCY``).
OVERFLOW_DEPENDENCY = "unmapped"
OTHER_SECTIONS = ("amqp",)


@dataclass(frozen=True)
class Problem:
    key: str
    value: str
    allowed: str

    def __str__(self) -> str:
        return f"{self.key} = {self.value}: {self.allowed}"


class ConfigError(Exception):
    """A configuration that cannot be used: unreadable, not TOML, or values out of range."""

    def __init__(self, origin: str, message: str, problems: Optional[list[Problem]] = None) -> None:
        self.origin = origin
        self.problems = problems or []
        super().__init__(f"{origin}: {message}")


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


@dataclass(frozen=True)
class UnmappedTasks:
    """``[unmapped_tasks]``: what a task no ``[dependencies.*]`` section names spends.
    ``own_budget``: its own budget for the first ``max_own_budgets`` names a process meets, the
    shared ``unmapped`` budget for later ones; ``share``: ``dependency``'s budget; ``reject``: the
    task is refused (:class:`fleet_budget.UnmappedTask`)."""

    policy: str = "own_budget"
    max_own_budgets: int = DEFAULT_MAX_OWN_BUDGETS
    dependency: Optional[str] = None


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


def dependency_name_problem(name: str) -> Optional[str]:
    """What is wrong with a dependency name, or None (the Rust ``validate_name``)."""
    if not name:
        return "dependency name is empty"
    if len(name.encode("utf-8")) > MAX_DEPENDENCY_LEN:
        return f"dependency name is {len(name.encode('utf-8'))} bytes long, at most {MAX_DEPENDENCY_LEN} allowed"
    for c in name:
        if c in "{}" or _is_unsafe_char(c):
            return (f"dependency name contains {_code_point(c)}; `{{`, `}}`, control, bidirectional "
                    "control and invisible characters are not allowed")
    return None


def key_prefix_problem(prefix: str) -> Optional[str]:
    """What is wrong with a Redis key prefix (``redis.key_prefix``), or None: the Rust
    ``check_key_prefix``, 1 to 64 bytes without ``{``, ``}``, spaces, or a character
    :func:`_is_unsafe_char` names. The first offending character is named by its code point."""
    rule = ("must be 1 to 64 bytes without `{`, `}`, spaces, control, bidirectional control or "
            "invisible characters")
    for c in prefix:
        if c in "{}" or c.isspace() or _is_unsafe_char(c):
            return f"contains {_code_point(c)}; {rule}"
    size = len(prefix.encode("utf-8"))
    if not 1 <= size <= 64:
        return f"is {size} bytes long; {rule}"
    return None


def _is_control(c: str) -> bool:
    o = ord(c)
    return o < 0x20 or 0x7F <= o <= 0x9F


def _is_bidi_control(c: str) -> bool:
    """The Rust ``is_bidi_control``: a name holding one prints as something it is not."""
    o = ord(c)
    return o in (0x061C, 0x200E, 0x200F) or 0x202A <= o <= 0x202E or 0x2066 <= o <= 0x2069


#: What the Rust ``is_unsafe_char`` names, written out as it is there (not read from
#: ``unicodedata``, whose tables follow the Python version): control characters, the line and
#: paragraph separators, and Unicode's default-ignorable code points (bidirectional controls,
#: zero-width characters, the soft hyphen, variation selectors, tags, fillers).
_UNSAFE_RANGES = (
    (0x0000, 0x001F), (0x007F, 0x009F), (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C),
    (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F), (0x2028, 0x2029),
    (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)


def _is_unsafe_char(c: str) -> bool:
    """Whether ``c`` must not be part of a name (the Rust ``is_unsafe_char``): printed, it drives
    the terminal, breaks the line, or hides or reorders the text around it."""
    o = ord(c)
    return any(lo <= o <= hi for lo, hi in _UNSAFE_RANGES)


def _code_point(c: str) -> str:
    """``c`` as an error message names it (the Rust ``CodePoint``): ``U+202E (a bidirectional
    control)``, or ``U+007B `{` `` for a character that shows."""
    if _is_control(c):
        what = "a control character"
    elif _is_bidi_control(c):
        what = "a bidirectional control"
    elif c in "\u2028\u2029":
        what = "a line or paragraph separator"
    elif _is_unsafe_char(c):
        what = "an invisible character"
    elif c.isspace():
        what = "a space"
    else:
        return f"U+{ord(c):04X} `{c}`"
    return f"U+{ord(c):04X} ({what})"


class _Checker:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def problem(self, key: str, value: object, allowed: str) -> None:
        self.problems.append(Problem(key, str(value), allowed))

    def int_in(self, key: str, value: Any, lo: int, hi: int, default: int) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise _wrong_type(key, value, "an integer")
        if not lo <= value <= hi:
            self.problem(key, value, f"must be an integer from {lo} to {hi}")
            return default
        return value

    def ratio(self, key: str, value: Any, default: float) -> float:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _wrong_type(key, value, "a number")
        v = float(value)
        if not math.isfinite(v) or not 0.0 <= v <= MAX_RATIO:
            self.problem(key, f"{v:g}", f"must be a finite number from 0 to {MAX_RATIO:g} (retries per deposit)")
            return default
        return v

    def choice(self, key: str, value: Any, allowed: tuple[str, ...], default: str) -> str:
        if value is None:
            return default
        if not isinstance(value, str):
            raise _wrong_type(key, value, "a string")
        if value not in allowed:
            # An enum in the Rust configuration: an unknown variant refuses the whole text.
            raise _Unknown(f"unknown variant {value!r:.60} for `{key}`, expected one of "
                           + ", ".join(f"`{a}`" for a in allowed))
        return str(value)


def _table(c: _Checker, key: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _wrong_type(key, value, "a table")
    return value


class _Unknown(Exception):
    """An unknown key or a value of the wrong type: like the Rust parser (serde), the first one
    is the error and the whole text is refused (a misspelt key, a string for a number)."""


def _wrong_type(key: str, value: Any, expected: str) -> _Unknown:
    return _Unknown(f"invalid type for `{key}`: {type(value).__name__} {value!r:.60}, expected {expected}")


def _unknown(c: _Checker, at: str, table: Mapping[str, Any], known: tuple[str, ...]) -> None:
    for k in table:
        if k not in known:
            where = f" in `{at}`" if at else ""
            raise _Unknown(f"unknown field `{k}`{where}, expected one of " + ", ".join(f"`{n}`" for n in known))


_POLICY_KEYS = ("window_secs", "ratio", "min_allowance", "deposit", "mode")


def _max_delay(c: _Checker, at: str, t: Mapping[str, Any]) -> Optional[float]:
    """The section's ``max_delay_secs`` when given and in range (the Rust ``max_delay``)."""
    secs = c.int_in(f"{at}.max_delay_secs", t.get("max_delay_secs"), 1, MAX_DELAY_SECS, 0)
    return float(secs) if secs > 0 else None


def _unmapped(c: _Checker, t: Mapping[str, Any], policies: Mapping[str, BudgetPolicy]) -> UnmappedTasks:
    """``[unmapped_tasks]``: ``share`` must name a ``[dependencies.*]`` section, so that a typo does
    not quietly make a budget of its own; each key goes only with its policy."""
    _unknown(c, "unmapped_tasks", t, ("policy", "dependency", "max_own_budgets"))
    policy = c.choice("unmapped_tasks.policy", t.get("policy"), ("own_budget", "share", "reject"), "own_budget")
    dependency = t.get("dependency")
    if dependency is not None and not isinstance(dependency, str):
        raise _wrong_type("unmapped_tasks.dependency", dependency, "a string")
    own = t.get("max_own_budgets")
    if own is not None and (isinstance(own, bool) or not isinstance(own, int)):
        raise _wrong_type("unmapped_tasks.max_own_budgets", own, "an integer")
    if policy != "share" and dependency is not None:
        c.problem("unmapped_tasks.dependency", _debug_str(dependency), 'goes only with policy = "share"')
    if policy != "own_budget" and own is not None:
        c.problem("unmapped_tasks.max_own_budgets", own, 'goes only with policy = "own_budget"')
    if policy == "reject":
        return UnmappedTasks("reject", 0, None)
    if policy == "own_budget":
        n = c.int_in("unmapped_tasks.max_own_budgets", own, 0, MAX_OWN_BUDGETS, DEFAULT_MAX_OWN_BUDGETS)
        return UnmappedTasks("own_budget", n, None)
    if dependency is not None and dependency in policies:
        return UnmappedTasks("share", 0, dependency)
    named = ", ".join(sorted(policies)) or "there is none"
    c.problem("unmapped_tasks.dependency", "none" if dependency is None else _debug_str(dependency),
              f'policy = "share" needs the name of a [dependencies.*] section ({named})')
    return UnmappedTasks()


_CONCURRENCY_INTS = ("cap", "planned_primary", "min_retry_slots", "lease_secs", "max_wait_secs")


def _concurrency(c: _Checker, at: str, t: Mapping[str, Any]) -> Optional[ConcurrencyPolicy]:
    """``[dependencies.X.concurrency]`` as the Rust ``RawConcurrency::resolve`` reads it: every
    problem named, the share derived from ``planned_primary`` unless ``max_retry_fraction`` is given."""
    _unknown(c, at, t, (*_CONCURRENCY_INTS, "max_retry_fraction", "primary_waits"))
    for key in _CONCURRENCY_INTS:
        if key in t and (isinstance(t[key], bool) or not isinstance(t[key], int)):
            raise _wrong_type(f"{at}.{key}", t[key], "an integer")
    fraction = t.get("max_retry_fraction")
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))):
        raise _wrong_type(f"{at}.max_retry_fraction", fraction, "a number")
    waits = t.get("primary_waits", False)
    if not isinstance(waits, bool):
        raise _wrong_type(f"{at}.primary_waits", waits, "a boolean")
    before = len(c.problems)
    if "cap" not in t:
        c.problem(f"{at}.cap", "missing", "a concurrency section needs cap (calls in flight the dependency accepts)")
        return None
    cap = c.int_in(f"{at}.cap", t["cap"], 1, MAX_CAP, 1)
    planned = t.get("planned_primary")
    if planned is not None and not 1 <= planned <= cap:
        c.problem(f"{at}.planned_primary", planned, f"must be an integer from 1 to the cap ({cap})")
    elif planned is None and fraction is None:
        c.problem(f"{at}.planned_primary", "missing", "needed to derive max_retry_fraction = (cap - planned_primary) "
                  "/ planned_primary; give it or max_retry_fraction")
    min_slots = c.int_in(f"{at}.min_retry_slots", t.get("min_retry_slots"), 0, MAX_CAP, 3)
    lease = c.int_in(f"{at}.lease_secs", t.get("lease_secs"), 1, 86_400, 30)
    max_wait = c.int_in(f"{at}.max_wait_secs", t.get("max_wait_secs"), 0, 86_400, 600)
    if fraction is not None and not (math.isfinite(fraction) and 0.0 <= fraction <= 1000.0):
        c.problem(f"{at}.max_retry_fraction", f"{float(fraction):g}", "must be a number from 0 to 1000")
    if len(c.problems) > before:
        return None
    if fraction is None:
        fraction = (cap - planned) / planned
    try:
        return ConcurrencyPolicy(cap, float(fraction), min_slots, lease * 1000, waits, float(max_wait)).checked()
    except ValueError as e:
        # A share derived past what the scripts take (cap 5000, planned_primary 1): named here.
        c.problem(at, "the section", str(e))
        return None


def _breaker(c: _Checker, at: str, t: Mapping[str, Any], floor: int) -> Optional[BreakerPolicy]:
    """``[dependencies.X.breaker]`` as the Rust ``RawBreaker::resolve`` reads it: every key optional,
    at most ``floor`` (the rate budget's ``min_allowance``) half-open probes."""
    ints = ("min_volume", "window_secs", "open_secs", "half_open_probes", "close_after", "probe_timeout_secs",
            "max_wait_secs")
    _unknown(c, at, t, ("failure_ratio", *ints))
    for key in ints:
        if key in t and (isinstance(t[key], bool) or not isinstance(t[key], int)):
            raise _wrong_type(f"{at}.{key}", t[key], "an integer")
    ratio = t.get("failure_ratio", 0.5)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        raise _wrong_type(f"{at}.failure_ratio", ratio, "a number")
    before = len(c.problems)
    d = BreakerPolicy()
    window = c.int_in(f"{at}.window_secs", t.get("window_secs"), 1, 86_400, d.window_ms // 1000)
    open_secs = c.int_in(f"{at}.open_secs", t.get("open_secs"), 1, 86_400, d.open_ms // 1000)
    probe_timeout = c.int_in(f"{at}.probe_timeout_secs", t.get("probe_timeout_secs"), 1, 86_400,
                             d.probe_timeout_ms // 1000)
    max_wait = c.int_in(f"{at}.max_wait_secs", t.get("max_wait_secs"), 0, 86_400, int(d.max_wait))
    if not (math.isfinite(ratio) and 0.0 < ratio <= 1.0):
        c.problem(f"{at}.failure_ratio", f"{float(ratio):g}", "must be a number above 0 and at most 1")
    min_volume = c.int_in(f"{at}.min_volume", t.get("min_volume"), 1, 1_000_000_000, 20)
    probes = c.int_in(f"{at}.half_open_probes", t.get("half_open_probes"), 1, 1_000_000, 3)
    if probes > floor:
        c.problem(f"{at}.half_open_probes", probes,
                  f"probes are spent from the rate budget's floor: at most min_allowance ({floor})")
    close_after = t.get("close_after", probes)
    if not 1 <= close_after <= probes:
        c.problem(f"{at}.close_after", close_after, f"must be an integer from 1 to half_open_probes ({probes})")
    if len(c.problems) > before:
        return None
    try:
        return BreakerPolicy(window * 1000, float(ratio), min_volume, open_secs * 1000, probes, close_after,
                             probe_timeout * 1000, float(max_wait)).checked()
    except ValueError as e:
        c.problem(at, "the section", str(e))
        return None


def _policy(c: _Checker, at: str, t: Mapping[str, Any], base: BudgetPolicy) -> BudgetPolicy:
    return BudgetPolicy(
        window_ms=1000 * c.int_in(f"{at}.window_secs", t.get("window_secs"), 1, MAX_WINDOW_SECS,
                                  max(1, base.window_ms // 1000)),
        ratio=c.ratio(f"{at}.ratio", t.get("ratio"), base.ratio),
        min_allowance=c.int_in(f"{at}.min_allowance", t.get("min_allowance"), 0, 1_000_000_000, base.min_allowance),
        deposit=c.choice(f"{at}.deposit", t.get("deposit"), ("success", "request"), base.deposit),
        mode=c.choice(f"{at}.mode", t.get("mode"), ("sliding", "fixed"), base.mode),
    )


def _backoff(c: _Checker, at: str, t: Mapping[str, Any], default: Backoff) -> Backoff:
    day = 86_400_000
    base = c.int_in(f"{at}.backoff_base_ms", t.get("backoff_base_ms"), 1, day, round(default.base * 1000))
    cap = c.int_in(f"{at}.backoff_cap_ms", t.get("backoff_cap_ms"), 1, day, round(default.cap * 1000))
    if cap < base:
        c.problem(f"{at}.backoff_cap_ms", cap, f"must be at least backoff_base_ms ({base})")
    return Backoff(base=base / 1000, factor=default.factor, cap=cap / 1000)


def _resolve(root: dict[str, Any], origin: str) -> Config:
    c = _Checker()
    amqp = root.get("amqp")
    root = {k: v for k, v in root.items() if k not in OTHER_SECTIONS}
    _unknown(c, "", root, ("redis", "defaults", "dependencies", "tasks", "metrics", "audit", "unmapped_tasks"))
    config = Config()
    # Sections the Rust library reads and this client does not use: checked alike, so that one
    # file is accepted or refused by both.
    m = _table(c, "metrics", root.get("metrics"))
    _unknown(c, "metrics", m, ("listen",))
    if "listen" in m and not isinstance(m["listen"], str):
        raise _wrong_type("metrics.listen", m["listen"], "a string")
    if "listen" in m and not _socket_addr(m["listen"]):
        c.problem("metrics.listen", _debug_str(m["listen"]),
                  'an IP address and port, such as "127.0.0.1:9464" or "[::]:9464"')
    a = _table(c, "audit", root.get("audit"))
    _unknown(c, "audit", a, ("max_entries", "max_age_days"))
    c.int_in("audit.max_entries", a.get("max_entries"), 1, 10_000_000, 10_000)
    c.int_in("audit.max_age_days", a.get("max_age_days"), 1, 3650, 90)
    config.amqp_urls = brokers.from_section(amqp if isinstance(amqp, dict) else {}, c.problem)
    if isinstance(amqp, dict) and "prefix" in amqp:
        prefix = amqp["prefix"]
        if not isinstance(prefix, str):
            raise _wrong_type("amqp.prefix", prefix, "a string")
        # The Rust check: nothing in the topology's names may print as something it is not.
        rule = ("must be 1 to 100 bytes without spaces, control, bidirectional control or invisible "
                "characters, not starting with `amq.`")
        bad = next((ch for ch in prefix if ch.isspace() or _is_unsafe_char(ch)), None)
        if bad is not None:
            c.problem("amqp.prefix", repr(prefix), f"contains {_code_point(bad)}; {rule}")
        elif not 1 <= len(prefix.encode("utf-8")) <= 100 or prefix.startswith("amq."):
            c.problem("amqp.prefix", repr(prefix), rule)
        else:
            config.amqp_prefix = prefix

    r = _table(c, "redis", root.get("redis"))
    _unknown(c, "redis", r, ("url", "cluster_urls", "timeout_ms", "key_prefix", "fallback",
                             "deposit_flush_ms", "deposit_flush_count", "deny_cache_ms", "batch_across_dependencies",
                             "tls_ca_file", "tls_cert_file", "tls_key_file"))
    if "url" in r:
        url = r["url"]
        if not isinstance(url, str):
            raise _wrong_type("redis.url", "...", "a string")
        if _url_problem(c, "redis.url", url, REDIS_SCHEMES):
            config.redis.url = url
    if "cluster_urls" in r:
        urls = r["cluster_urls"]
        if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
            raise _wrong_type("redis.cluster_urls", "...", "a list of URLs")
        ok = [_url_problem(c, f"redis.cluster_urls[{i}]", u, CLUSTER_SCHEMES) for i, u in enumerate(urls)]
        if all(ok):
            config.redis.cluster_urls = list(urls)
    config.redis.timeout_ms = c.int_in("redis.timeout_ms", r.get("timeout_ms"), 1, 60_000, 50)
    if "key_prefix" in r:
        prefix = r["key_prefix"]
        if not isinstance(prefix, str):
            raise _wrong_type("redis.key_prefix", prefix, "a string")
        wrong = key_prefix_problem(prefix)
        if wrong:
            c.problem("redis.key_prefix", _quoted(prefix), wrong)
        else:
            config.redis.key_prefix = prefix
    config.redis.fallback = c.choice("redis.fallback", r.get("fallback"), ("local", "deny", "allow"), "local")
    config.redis.deposit_flush_ms = c.int_in("redis.deposit_flush_ms", r.get("deposit_flush_ms"), 0, 10_000, 100)
    config.redis.deposit_flush_count = c.int_in(
        "redis.deposit_flush_count", r.get("deposit_flush_count"), 1, 1_000_000_000, 1000)
    config.redis.deny_cache_ms = c.int_in("redis.deny_cache_ms", r.get("deny_cache_ms"), 0, 10_000, 100)
    # Read for the Rust client's group commit across dependencies; this client sends one
    # dependency per call, so the key is only checked here.
    if "batch_across_dependencies" in r and not isinstance(r["batch_across_dependencies"], bool):
        c.problem("redis.batch_across_dependencies", repr(r["batch_across_dependencies"]),
                  "must be true or false")
    for key in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        if key in r:
            if isinstance(r[key], str) and r[key]:
                setattr(config.redis, key, r[key])
            else:
                c.problem(f"redis.{key}", repr(r[key]), "must be the path of a PEM file")
    if (config.redis.tls_cert_file is None) != (config.redis.tls_key_file is None):
        c.problem("redis.tls_cert_file", "(only one of the pair)",
                  "redis.tls_cert_file and redis.tls_key_file must be set together")

    d = _table(c, "defaults", root.get("defaults"))
    _unknown(c, "defaults", d, (*_POLICY_KEYS, "max_attempts", "backoff_base_ms", "backoff_cap_ms",
                                "max_delay_secs"))
    config.defaults = _policy(c, "defaults", d, BudgetPolicy())
    config.default_ceiling = TaskCeiling(
        max_attempts=c.int_in("defaults.max_attempts", d.get("max_attempts"), 1, 1000, 5),
        backoff=_backoff(c, "defaults", d, Backoff()),
        max_delay=_max_delay(c, "defaults", d),
    )

    breakers: list[tuple[str, str, dict[str, Any]]] = []
    for name, dep in _table(c, "dependencies", root.get("dependencies")).items():
        at = f"dependencies.{_toml_key(name)}"
        dep = _table(c, at, dep)
        _unknown(c, at, dep, ("tasks", *_POLICY_KEYS, "concurrency", "breaker"))
        wrong = dependency_name_problem(name)
        if "concurrency" in dep:
            concurrency = _concurrency(c, f"{at}.concurrency", _table(c, f"{at}.concurrency", dep["concurrency"]))
            if concurrency is not None and not wrong:
                config.concurrency[name] = concurrency
        if "breaker" in dep:
            breakers.append((name, at, _table(c, f"{at}.breaker", dep["breaker"])))
        if wrong:
            c.problem(at, _quoted(name), wrong)
        policy = _policy(c, at, dep, config.defaults)
        if wrong:
            continue
        config.policies[name] = policy
        tasks = dep.get("tasks", [])
        if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
            raise _wrong_type(f"{at}.tasks", tasks, "a list of task names")
        for i, task in enumerate(tasks):
            key = f"{at}.tasks[{i}]"
            unsafe = next((ch for ch in task if _is_unsafe_char(ch)), None)
            if not task:
                c.problem(key, '""', "a task name must not be empty")
            elif unsafe is not None:
                c.problem(key, _quoted(task), f"contains {_code_point(unsafe)}; a task name holds no control, "
                          "bidirectional control or invisible characters")
            elif task in config.tasks:
                first = config.tasks[task]
                c.problem(key, repr(task), "is listed twice in this dependency" if first == name else
                          f"is already mapped to dependency {first!r}; a task spends exactly one dependency's budget")
            else:
                config.tasks[task] = name

    config.unmapped = _unmapped(c, _table(c, "unmapped_tasks", root.get("unmapped_tasks")), config.policies)
    # Resolved once the policies are known: half-open probes are spent from the rate budget's floor.
    for name, at, t in breakers:
        if dependency_name_problem(name):
            continue
        breaker = _breaker(c, f"{at}.breaker", t, config.policy(name).min_allowance)
        if breaker is not None:
            config.breakers[name] = breaker

    for task, t in _table(c, "tasks", root.get("tasks")).items():
        at = f"tasks.{_toml_key(task)}"
        t = _table(c, at, t)
        _unknown(c, at, t, ("class", "max_attempts", "recovery_window_secs", "backoff_base_ms", "backoff_cap_ms",
                            "max_delay_secs"))
        if task not in config.tasks and config.unmapped.policy == "own_budget":
            # An unmapped task is its own dependency, so its name must be a valid one.
            wrong = dependency_name_problem(task)
            if wrong:
                c.problem(at, _quoted(task), wrong)
        if sum(k in t for k in ("class", "max_attempts", "recovery_window_secs")) > 1:
            c.problem(at, "class, max_attempts and recovery_window_secs", "set at most one of them")
        backoff = _backoff(c, at, t, config.default_ceiling.backoff)
        max_delay = _max_delay(c, at, t)
        if max_delay is None:
            max_delay = config.default_ceiling.max_delay
        window = None
        if "class" in t:
            cls = c.choice(f"{at}.class", t["class"], tuple(CLASS_MAX_ATTEMPTS), "")
            max_attempts = CLASS_MAX_ATTEMPTS.get(cls, config.default_ceiling.max_attempts)
        elif "max_attempts" in t:
            max_attempts = c.int_in(f"{at}.max_attempts", t["max_attempts"], 1, 1000, 5)
        elif "recovery_window_secs" in t:
            secs = c.int_in(f"{at}.recovery_window_secs", t["recovery_window_secs"], 1, 7 * 86_400, 60)
            max_attempts = backoff.attempts_for_recovery_window(secs)
            window = float(secs)
        else:
            max_attempts = config.default_ceiling.max_attempts
        config.ceilings[task] = TaskCeiling(max_attempts=max_attempts, backoff=backoff, recovery_window=window,
                                           max_delay=max_delay)

    if c.problems:
        raise ConfigError(origin, "invalid configuration:\n" + "\n".join(f"  - {p}" for p in c.problems),
                          c.problems)
    return config


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


def _debug_str(value: Any) -> str:
    return _quoted(value) if isinstance(value, str) else repr(value)


def _toml_key(name: str) -> str:
    """A key as Rust's ``toml_key`` shows it: bare when it can be, else :func:`_quoted`."""
    if name and all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in name):
        return name
    return _quoted(name)


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"}


def _quoted(text: str) -> str:
    """``text`` in double quotes as the Rust ``quoted`` shows a name: backslash, quote, tab, line
    feed, carriage return and NUL escaped, every other character :func:`_is_unsafe_char` names as
    ``\\u{202e}``, so that a key or value never prints as something it is not."""
    shown = "".join(
        _ESCAPES.get(ch) or (f"\\u{{{ord(ch):x}}}" if _is_unsafe_char(ch) else ch) for ch in text)
    return '"' + shown + '"'


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
