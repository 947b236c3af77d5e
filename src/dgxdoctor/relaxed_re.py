"""A form of a Python regular expression that RE2 can run and that matches wherever the Python one matches in
ASCII text (it may match more, never less): what an automaton pass over a whole text gates the per-line regexes
with (``judge.line_set`` for the signature catalog, ``sources.kernel_events`` for the kernel log's parsers).

The zero-width assertions (lookarounds, ``\\b``, ``^``, ``$``) are left out and ``\\s`` is spelt as Python's set.
``may_search`` runs that form over a whole text before Python's engine searches it (``diagnose``'s log readers).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

# Python's \s on ASCII text: RE2's \s lacks \v and the separators \x1c-\x1f, which str.isspace() counts.
_SPACE = r"\t\n\v\f\r \x1c-\x1f"
_LOOKAROUNDS = ("(?=", "(?!", "(?<=", "(?<!")


def _class_end(body: str, i: int) -> int:
    """The index after the character class that opens at ``body[i]`` (``[``)."""
    j = i + 1
    if body.startswith("^", j):
        j += 1
    if body.startswith("]", j):  # a leading "]" is literal
        j += 1
    while j < len(body):
        if body[j] == "\\":
            j += 2
            continue
        if body[j] == "]":
            return j + 1
        j += 1
    return len(body)


def _group_end(body: str, i: int) -> int:
    """The index after the group that opens at ``body[i]`` (``(``)."""
    depth, j = 0, i
    while j < len(body):
        ch = body[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "[":
            j = _class_end(body, j)
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        j += 1
        if depth == 0:
            return j
    return len(body)


def _class(text: str) -> str:
    """A character class with ``\\s`` spelt out (see ``_SPACE``)."""
    out, j = [], 0
    while j < len(text):
        if text[j] == "\\":
            out.append(_SPACE if text[j + 1 : j + 2] == "s" else text[j : j + 2])
            j += 2
            continue
        out.append(text[j])
        j += 1
    return "".join(out)


def relaxed(source: str) -> str | None:
    """An RE2 pattern that matches wherever the Python pattern ``source`` matches in ASCII text; None when the
    pattern holds what the two engines may read differently (``{,n}``: RE2 reads it as text)."""
    flag, body = ("(?i)", source[4:]) if source.startswith("(?i)") else ("", source)
    if "{," in body:
        return None
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            nxt = body[i + 1 : i + 2]
            if nxt == "s":
                out.append(f"[{_SPACE}]")
            elif nxt not in ("b", "B", "A", "Z"):
                out.append(body[i : i + 2])
            i += 2
        elif ch == "[":
            end = _class_end(body, i)
            out.append(_class(body[i:end]))
            i = end
        elif body.startswith(_LOOKAROUNDS, i):
            i = _group_end(body, i)
        elif ch in "^$":
            i += 1
        else:
            out.append(ch)
            i += 1
    text = "".join(out)
    return f"(?i:{text})" if flag else f"(?:{text})"


@cache
def _automaton(source: str, flags: int) -> Any | None:
    """``source`` relaxed, in RE2 over bytes; None without RE2 or where RE2 cannot run it."""
    try:
        import re2  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    whole = relaxed(f"(?i){source}" if flags & re.IGNORECASE and not source.startswith("(?i)") else source)
    if whole is None:
        return None
    options = re2.Options()
    options.max_mem = 64 << 20
    options.log_errors = False
    try:
        return re2.compile(whole.encode(), options)
    except re2.error:
        return None


def may_search(pattern: re.Pattern[str], text: str) -> bool:
    """False only when ``pattern.search(text)`` finds nothing: one pass of RE2's automaton of the relaxed form over
    ``text``, linear where Python's engine may retry a pattern from every line start (True where it cannot tell:
    no RE2, a pattern RE2 cannot run, text that is not ASCII)."""
    if not text.isascii():
        return True
    found = _automaton(pattern.pattern, pattern.flags)
    return found is None or found.search(text.encode("ascii")) is not None
