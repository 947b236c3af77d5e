"""Shared pieces of the bad-input property tests: input strategies and the "fails cleanly" assertion.

Every parser may refuse input, but only with its documented error type (a ValueError subclass) and a message
naming what is wrong; IndexError, KeyError, TypeError, AttributeError or RecursionError escaping a parser is a bug.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FIXTURES = Path(__file__).resolve().parent / "fixtures"

T = TypeVar("T")

# Generous deadline: the machine running the suite is shared; a parser that hangs still fails it.
# DGXDOCTOR_FUZZ_EXAMPLES=2000 for a longer search than the suite's default.
FUZZ = settings(
    max_examples=int(os.environ.get("DGXDOCTOR_FUZZ_EXAMPLES", "60")),
    deadline=timedelta(seconds=20),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def clean(fn: Callable[..., T], *args: Any, allowed: tuple[type[BaseException], ...] = (ValueError,)) -> T | None:
    """Call ``fn``; a refusal must be one of ``allowed`` with a non-empty message. Anything else propagates."""
    try:
        return fn(*args)
    except allowed as exc:
        assert str(exc).strip(), f"{type(exc).__name__} raised with an empty message"
        return None


def corpus(*patterns: str) -> list[str]:
    """Real captured fixtures (text) matching the glob patterns under tests/fixtures/."""
    texts = []
    for pattern in patterns:
        for path in sorted(FIXTURES.glob(pattern)):
            if path.is_file() and path.name != "SOURCES.md":
                texts.append(path.read_text(encoding="utf-8", errors="replace"))
    assert texts, f"no fixtures match {patterns}"
    return texts


@st.composite
def mutated(draw: st.DrawFn, texts: list[str]) -> str:
    """A real fixture, damaged: truncated, lines dropped/duplicated/swapped, bytes flipped, junk inserted."""
    text = draw(st.sampled_from(texts))
    ops = ["cut", "drop", "dup", "swap", "flip", "junk", "nul", "bigint", "odd_digit"]
    for op in draw(st.lists(st.sampled_from(ops), max_size=5)):
        lines = text.splitlines(keepends=True)
        if op == "cut":
            text = text[: draw(st.integers(0, len(text)))]
        elif op in ("drop", "dup", "swap", "junk") and lines:
            i = draw(st.integers(0, len(lines) - 1))
            if op == "drop":
                del lines[i]
            elif op == "dup":
                lines.insert(i, lines[i])
            elif op == "swap":
                j = draw(st.integers(0, len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
            else:
                lines.insert(i, draw(st.text(max_size=80)) + "\n")
            text = "".join(lines)
        elif op == "flip" and text:
            raw = bytearray(text.encode("utf-8"))
            i = draw(st.integers(0, len(raw) - 1))
            raw[i] ^= 1 << draw(st.integers(0, 7))
            text = raw.decode("utf-8", errors="replace")
        elif op == "nul" and text:
            i = draw(st.integers(0, len(text)))
            text = text[:i] + "\0" * draw(st.integers(1, 8)) + text[i:]
        elif op in ("bigint", "odd_digit") and (digits := [i for i, c in enumerate(text) if c.isdigit()]):
            # A number past int()'s 4300-digit limit, or a character str.isdigit() accepts and int() refuses.
            i = draw(st.sampled_from(digits))
            text = text[:i] + ("9" * 4400 if op == "bigint" else "\u00b2") + text[i + 1 :]
    return text


def garbage() -> st.SearchStrategy[str]:
    """Text with no structure: random unicode, binary decoded as the CLI does, NULs, one huge line."""
    return st.one_of(
        st.text(),
        st.binary(max_size=2048).map(lambda b: b.decode("utf-8", errors="replace")),
        st.text(alphabet=st.sampled_from("\0\n\r\t ,;:=|[]{}()'\"X0123456789.-+eE"), max_size=400),
        st.integers(10_000, 300_000).map(lambda n: "A" * n),
        st.integers(10_000, 100_000).map(lambda n: "\0" * n + "\n"),
    )


def texts_for(*patterns: str) -> st.SearchStrategy[str]:
    """Garbage, real fixtures of the area mutated, and the fixtures with a huge line spliced in."""
    real = corpus(*patterns)
    return st.one_of(
        garbage(),
        mutated(real),
        st.sampled_from(real).map(lambda t: t + "x" * 200_000 + "\n" + t),
    )


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)


def deep_json(depth: int = 100_000) -> str:
    """JSON nested far deeper than the interpreter's recursion limit (json.loads raises RecursionError)."""
    return "[" * depth + "]" * depth


@st.composite
def json_mutants(draw: st.DrawFn, docs: list[Any]) -> Any:
    """A real JSON document with one node replaced by something of another type (or removed)."""
    doc = json.loads(json.dumps(draw(st.sampled_from(docs))))
    node = doc
    for _ in range(draw(st.integers(0, 6))):
        if isinstance(node, dict) and node:
            key = draw(st.sampled_from(sorted(node)))
            if draw(st.booleans()) and isinstance(node[key], dict | list):
                node = node[key]
                continue
            if draw(st.booleans()):
                del node[key]
            else:
                node[key] = draw(json_values)
            break
        if isinstance(node, list) and node:
            i = draw(st.integers(0, len(node) - 1))
            if draw(st.booleans()) and isinstance(node[i], dict | list):
                node = node[i]
                continue
            node[i] = draw(json_values)
            break
        break
    return doc
