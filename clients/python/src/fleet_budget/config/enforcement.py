"""``enforcement`` in ``[defaults]`` and ``[dependencies.X]`` (the Rust ``config/enforcement.rs``):
whether a dependency's rate budget dead-letters what it refuses (``"enforce"``, the default) or
only counts it (``"shadow"``)."""

from __future__ import annotations

from typing import Any

from .check import _Checker, _toml_key
from .names import dependency_name_problem
from ..decision import ENFORCE, ENFORCEMENTS


def read_enforcement(c: _Checker, defaults: Any, dependencies: Any) -> tuple[str, dict[str, str]]:
    """The default enforcement and those the dependency sections give (the sections' other keys
    and their names are checked where they are read)."""
    default = ENFORCE
    if isinstance(defaults, dict):
        default = c.choice("defaults.enforcement", defaults.get("enforcement"), ENFORCEMENTS, ENFORCE)
    by_dependency: dict[str, str] = {}
    if isinstance(dependencies, dict):
        for name, section in dependencies.items():
            if not isinstance(section, dict) or section.get("enforcement") is None:
                continue
            given = c.choice(f"dependencies.{_toml_key(name)}.enforcement", section["enforcement"],
                             ENFORCEMENTS, default)
            if not dependency_name_problem(name):
                by_dependency[name] = given
    return default, by_dependency
