"""fleet_budget: fleet-wide retry budgets in Redis, shared with the Rust ``fleet-budget`` library.

Same configuration, same Lua scripts, same decision order. See ``clients/python/README.md``.
"""

from .admission import FAILED, INCONCLUSIVE, SUCCEEDED, Call, Hold
from .breaker import CIRCUIT_OPEN, BreakerPolicy
from .budget import PROBE_INTERVAL_MS, FleetBudget, InvalidTask, UnmappedTask
from .config import Config, ConfigError, Problem, UnmappedTasks
from .decision import (ATTEMPTS_EXHAUSTED, BUDGET_EXHAUSTED, BUDGET_FROZEN, DELAY_EXCEEDED, ENFORCE, NON_RETRYABLE,
                       SHADOW, DeadLetter, Decision, Failure, Retry)
from .concurrency import CONCURRENCY_CAP, CONCURRENCY_RETRY_SHARE, ConcurrencyPolicy
from .metrics import Metrics
from .policy import Backoff, BudgetPolicy, TaskCeiling
from .snapshot import BudgetSnapshot, Control, WindowCounters

__all__ = [
    "ATTEMPTS_EXHAUSTED", "BUDGET_EXHAUSTED", "BUDGET_FROZEN", "CIRCUIT_OPEN", "CONCURRENCY_CAP",
    "CONCURRENCY_RETRY_SHARE", "FAILED", "INCONCLUSIVE", "SUCCEEDED", "BreakerPolicy", "Call", "ConcurrencyPolicy",
    "Hold", "DELAY_EXCEEDED", "ENFORCE", "NON_RETRYABLE", "PROBE_INTERVAL_MS", "SHADOW",
    "Backoff", "BudgetPolicy", "BudgetSnapshot", "Config", "Control", "ConfigError", "DeadLetter", "Decision",
    "Failure", "FleetBudget", "InvalidTask", "Metrics", "Problem", "Retry", "TaskCeiling", "UnmappedTask",
    "UnmappedTasks", "WindowCounters",
]
