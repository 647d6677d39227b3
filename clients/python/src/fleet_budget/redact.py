"""The one redactor, as the Rust library's (``crates/fleet-budget/src/redact.rs``): what the client
logs or writes into a header goes through it.

URLs are shown by allow-list: scheme, user, host, port and path (query and fragment dropped, a
password shown as ``***``). Free text keeps its words but loses the values of credential shapes:
``Authorization:``, ``Proxy-Authorization:``, ``Cookie:``, ``Set-Cookie:`` and ``X-Api-Key:``
headers, ``Bearer`` and ``Basic`` credentials, keys naming a password, secret, token or key, AWS
access key ids, and every URL in the text. ``tests/python_client.rs`` checks that both languages
redact a corpus of hostile texts to the same output.
"""

from __future__ import annotations

from typing import Optional

MASK = "***"

#: Longest error text carried in the ``fb-error`` header, in bytes (UTF-8).
ERROR_TEXT_MAX_BYTES = 512

# Rust's char::is_whitespace (Unicode White_Space); Python's str.isspace also takes \x1c-\x1f.
_WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
                        "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")

_SECRET_HEADERS = ("proxy-authorization:", "authorization:", "set-cookie:", "cookie:", "x-api-key:")
_SECRET_KEY_PARTS = ("password", "passwd", "secret", "token", "apikey", "api_key", "api-key",
                     "access_key", "accesskey", "private_key", "privatekey", "authorization", "cookie")
_SECRET_KEY_WORDS = ("pass", "pwd", "auth")


def _ascii_alnum(c: str) -> bool:
    return c.isascii() and c.isalnum()


def _lower(text: str) -> str:
    """ASCII lower case only, as Rust's ``to_ascii_lowercase`` (same length, same indices)."""
    return "".join(c.lower() if c.isascii() else c for c in text)


def _find(text: str, chars: str | frozenset[str], start: int = 0) -> Optional[int]:
    for i in range(start, len(text)):
        if text[i] in chars:
            return i
    return None


def redact_url(url: str) -> str:
    """``scheme://user:password@host:port/path?query#fragment`` → ``scheme://user:***@host:port/path``."""
    parts = _split_url(url)
    return redact_text(_shown(parts) if parts is not None else url)


def redact_text(text: str) -> str:
    """Redacts the credential shapes listed in the module documentation anywhere in ``text``."""
    with_urls = _redact_urls_in_text(text)
    masks: list[tuple[int, int]] = []
    _header_values(with_urls, masks)
    _scheme_credentials(with_urls, masks)
    _key_values(with_urls, masks)
    _aws_key_ids(with_urls, masks)
    return _apply_masks(with_urls, masks)


def truncate(text: str, max_bytes: int) -> str:
    """At most ``max_bytes`` bytes of UTF-8 on a character boundary, the cut marked with ``…``."""
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text
    ellipsis = "…"
    end = max(0, max_bytes - len(ellipsis.encode("utf-8")))
    return data[:end].decode("utf-8", "ignore") + ellipsis


def error_text(message: str) -> str:
    """Error text as it may leave the process: redacted, at most 512 bytes (the ``fb-error`` header)."""
    return truncate(redact_text(message), ERROR_TEXT_MAX_BYTES)


def _userinfo_char(c: str) -> bool:
    """RFC 3986 ``userinfo`` characters, without ``:`` (it ends the user name)."""
    return _ascii_alnum(c) or c in "-._~%!$&'()*+,;="


def _scheme_char(c: str) -> bool:
    return _ascii_alnum(c) or c in "+-."


def _split_url(url: str) -> Optional[tuple[str, Optional[str], bool, str, str]]:
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme or not all(_scheme_char(c) for c in scheme):
        return None
    at = rest.rfind("@")
    if at >= 0:
        userinfo, host_and_after = rest[:at], rest[at + 1:]
        user, colon, _ = userinfo.partition(":")
        has_password = bool(colon)
    else:
        user, has_password, host_and_after = None, False, rest
    authority_end = _find(host_and_after, "/?#")
    if authority_end is None:
        authority_end = len(host_and_after)
    host_port, after = host_and_after[:authority_end], host_and_after[authority_end:]
    path_end = _find(after, "?#")
    return scheme, user, has_password, host_port, after[:path_end if path_end is not None else len(after)]


def _shown(parts: tuple[str, Optional[str], bool, str, str]) -> str:
    scheme, user, has_password, host_port, path = parts
    out = f"{scheme}://"
    if user is not None:
        # A user name RFC 3986 would not allow (`#`, `/`, `@`, spaces...) is part of a mangled
        # secret or of the text around it: masked too, so the shown form parses back to itself.
        shown_user = user if all(_userinfo_char(c) for c in user) else MASK
        out += shown_user + (":" + MASK if has_password else "") + "@"
    return out + host_port + path


def _ends_url(c: str) -> bool:
    return c in _WHITESPACE or c in "\"'<>`()[]{},;"


def _redact_urls_in_text(text: str) -> str:
    out: list[str] = []
    rest = text
    while (pos := rest.find("://")) >= 0:
        start = pos
        while start > 0 and _scheme_char(rest[start - 1]):
            start -= 1
        out.append(rest[:start])
        end = pos + 3
        while end < len(rest) and not _ends_url(rest[end]):
            end += 1
        token = rest[start:end]
        parts = _split_url(token)
        if parts is not None:
            out.append(_shown(parts))
        else:
            # `://` without a scheme before it: keep the text, drop any userinfo-like part.
            out.append("://")
            after = token[3:]
            at = after.rfind("@")
            out.append(MASK + after[at:] if at >= 0 else after)
        rest = rest[end:]
    out.append(rest)
    return "".join(out)


def _header_values(text: str, masks: list[tuple[int, int]]) -> None:
    lower = _lower(text)
    for name in _SECRET_HEADERS:
        start_from = 0
        while (found := lower.find(name, start_from)) >= 0:
            value_start = found + len(name)
            start_from = value_start
            before = lower[found - 1] if found > 0 else None
            if before is not None and (_ascii_alnum(before) or before in "-_"):
                continue
            line = text[value_start:]
            skip = len(line) - len(line.lstrip(" \t"))
            end = _find(line, "\n\r")
            end = len(line) if end is None else end
            if end > skip:
                masks.append((value_start + skip, value_start + end))
            start_from = value_start + end


def _ends_token(c: str) -> bool:
    return c in _WHITESPACE or c in "\"',;"


def _scheme_credentials(text: str, masks: list[tuple[int, int]]) -> None:
    lower = _lower(text)
    for scheme, min_len in (("bearer", 1), ("basic", 8)):
        start_from = 0
        while (start := lower.find(scheme, start_from)) >= 0:
            start_from = start + len(scheme)
            before_ok = start == 0 or not _ascii_alnum(lower[start - 1])
            after = text[start_from:]
            gap = len(after) - len(after.lstrip(" \t"))
            if not before_ok or gap == 0:
                continue
            token = after[gap:]
            length = next((i for i, c in enumerate(token) if _ends_token(c)), len(token))
            if length >= min_len:
                masks.append((start_from + gap, start_from + gap + length))
                # ``Bearer Bearer <token>``: a token that is itself a scheme word is read again
                # as a scheme, so the real token after it is masked too (as in Rust).
                if _lower(token[:length]) not in ("bearer", "basic"):
                    start_from += gap + length


def _key_char(c: str) -> bool:
    return _ascii_alnum(c) or c in "_-."


def _secret_key(key: str) -> bool:
    key = _lower(key)
    if any(part in key for part in _SECRET_KEY_PARTS):
        return True
    last = key
    for sep in "_-.":
        last = last.rsplit(sep, 1)[-1]
    return last in _SECRET_KEY_WORDS


def _key_values(text: str, masks: list[tuple[int, int]]) -> None:
    i, n = 0, len(text)
    while i < n:
        if not _key_char(text[i]):
            i += 1
            continue
        key_start = i
        while i < n and _key_char(text[i]):
            i += 1
        key_end = i
        if not _secret_key(text[key_start:key_end]):
            continue
        j = key_end
        if j < n and text[j] in "\"'":
            j += 1
        while j < n and text[j] in " \t":
            j += 1
        if not (j < n and text[j] in "=:"):
            continue
        j += 1
        while j < n and text[j] in " \t":
            j += 1
        if j < n and text[j] in "\"'":
            quote, body_start = text[j], j + 1
            end, escaped, k = n, False, body_start
            while k < n:
                ch = text[k]
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == quote:
                    end = k
                    break
                k += 1
            value_start, value_end = body_start, end
        else:
            k = j
            while k < n and not (text[k] in _WHITESPACE or text[k] in "&,;}])\"'"):
                k += 1
            value_start, value_end = j, k
        if value_end > value_start:
            masks.append((value_start, value_end))
        # Scan the value too: a key inside it has a value of its own.
        i = value_start


def _aws_key_ids(text: str, masks: list[tuple[int, int]]) -> None:
    for prefix in ("AKIA", "ASIA"):
        start_from = 0
        while (start := text.find(prefix, start_from)) >= 0:
            start_from = start + len(prefix)
            ident = text[start_from:start_from + 16]
            if len(ident) == 16 and all(c.isascii() and (c.isupper() or c.isdigit()) for c in ident):
                masks.append((start, start_from + 16))
                start_from += 16


def _apply_masks(text: str, masks: list[tuple[int, int]]) -> str:
    if not masks:
        return text
    out: list[str] = []
    cursor, masked_to = 0, None
    for start, end in sorted(masks):
        if end <= cursor:
            continue
        # A range that overlaps or touches the last one extends it: one mask for both.
        if masked_to is None or start > masked_to:
            out.append(text[cursor:start])
            out.append(MASK)
        cursor = end
        masked_to = end
    out.append(text[cursor:])
    return "".join(out)
