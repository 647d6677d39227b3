"""Why a configuration cannot be used: each problem with its key, the value and what is allowed
(the Rust ``ConfigError`` and ``Problem``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


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
