"""The names a configuration holds, checked as the Rust library checks them: dependency names,
the key prefix, and the characters that would print as something they are not (control,
bidirectional control, invisible), named by their code point."""

from __future__ import annotations

from typing import Optional

MAX_DEPENDENCY_LEN = 200


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
