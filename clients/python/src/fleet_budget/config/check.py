"""How every section is checked: a problem recorded per key (all reported at once), integers,
ratios and choices in range, tables, unknown keys and wrong types, and values quoted as the
Rust messages quote them."""

from __future__ import annotations

import math
from typing import Any, Mapping

from .error import Problem
from .names import _is_unsafe_char

MAX_RATIO = 10.0


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
