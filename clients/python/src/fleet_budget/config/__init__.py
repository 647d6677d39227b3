"""The TOML configuration the Rust library reads (``crates/fleet-budget/src/config``): the same
sections, keys, limits and defaults, every problem reported at once, ``FLEET_BUDGET_REDIS_URL``
over ``redis.url`` and ``FLEET_BUDGET_REDIS_CA_FILE`` over ``redis.tls_ca_file``. Sections of other
components (``[amqp]``) are ignored but for what this client needs of them, as the Rust worker
does.

One module per section, as in Rust: :mod:`.redis`, :mod:`.defaults`, :mod:`.dependencies`,
:mod:`.concurrency`, :mod:`.breaker`, :mod:`.unmapped`, :mod:`.tasks`, :mod:`.metrics`,
:mod:`.audit`, :mod:`.amqp`; :mod:`.check` and :mod:`.names` check values, :mod:`.error` says
what is wrong, :mod:`.loader` reads a file section by section into :class:`Config`. Every name
the single ``config.py`` had is importable from ``fleet_budget.config`` as before."""

from __future__ import annotations

from .breaker import _breaker  # noqa: F401
from .check import (  # noqa: F401
    MAX_RATIO, _Checker, _debug_str, _ESCAPES, _quoted, _table, _toml_key, _unknown, _Unknown, _wrong_type,
)
from .concurrency import _concurrency, _CONCURRENCY_INTS  # noqa: F401
from .defaults import MAX_DELAY_SECS, MAX_WINDOW_SECS, _backoff, _max_delay, _policy, _POLICY_KEYS  # noqa: F401
from .error import ConfigError, Problem  # noqa: F401
from .loader import Config, OTHER_SECTIONS, _resolve  # noqa: F401
from .metrics import _socket_addr  # noqa: F401
from .names import (  # noqa: F401
    dependency_name_problem, key_prefix_problem, MAX_DEPENDENCY_LEN, _code_point, _is_bidi_control,
    _is_control, _is_unsafe_char, _UNSAFE_RANGES,
)
from .redis import (  # noqa: F401
    CLUSTER_SCHEMES, ENV_REDIS_CA_FILE, ENV_REDIS_URL, REDIS_SCHEMES, RedisSettings, _client_url_problem,
    _FORBIDDEN_HOST, _i64, _redact, _url_ok, _url_problem,
)
from .unmapped import (  # noqa: F401
    DEFAULT_MAX_OWN_BUDGETS, MAX_OWN_BUDGETS, OVERFLOW_DEPENDENCY, UnmappedTasks, _unmapped,
)

# Names the single module imported, which users and the client import from here.
from ..breaker import BreakerPolicy  # noqa: F401
from ..concurrency import MAX_CAP, ConcurrencyPolicy  # noqa: F401
from ..policy import CLASS_MAX_ATTEMPTS, DEFAULT_MAX_DELAY_SECS, Backoff, BudgetPolicy, TaskCeiling  # noqa: F401
from ..redact import redact_url  # noqa: F401
