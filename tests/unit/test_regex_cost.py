"""Every parser regex of sources/ and diagnose/ costs time linear in its line: a property test over adversarial
lines (a real fixture line cut anywhere, then a short unit repeated, then a tail that makes the match fail late).

The budget is per KiB and relative: a line 8x longer may cost at most ``SLOWER`` times more per KiB than the short
one (a quadratic regex costs 8x more per KiB, an exponential one far more), with a floor so that microseconds of
noise on a shared machine never fail it. Before their fixes, 8 KiB of perfquery dots took 9 s in
``perfquery.FIELD_RE`` (100 KB ran past 90 s), a run of spaces 3.7 s in ``ibstat.FIELD_RE`` (100 KB of ibstat:
42.9 s) and 1.9 s in ``sysfs_ib.STATE_RE``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import time
from functools import cache

from hypothesis import example, given
from hypothesis import strategies as st

import dgxdoctor.diagnose
import dgxdoctor.sources
from dgxdoctor.lazy_re import LazyPattern
from fuzzing import FIXTURES, FUZZ

SHORT, LONG = 1024, 8 * 1024
SLOWER = 4.0  # linear: ~1x per KiB; quadratic at 8x the length: ~8x
FLOOR_S_PER_KIB = 2e-4  # below this per KiB the line is cheap whatever its shape (20 MB/s of one regex)
UNITS = " \t.:a0-=,/\\([{)]}'\"x"
TAILS = ("", "!", "b", " b c", "\x01", ")")


@cache
def parser_regexes() -> tuple[tuple[str, re.Pattern[str]], ...]:
    found = []
    for package in (dgxdoctor.sources, dgxdoctor.diagnose):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for name, value in vars(module).items():
                if isinstance(value, LazyPattern):  # compiled at first use (dgxdoctor.lazy_re)
                    value = value.compiled
                if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                    found.append((f"{module.__name__}.{name}", value))
    assert len(found) > 50
    return tuple(found)


@cache
def fixture_line_starts() -> tuple[str, ...]:
    """The first 40 characters of every distinct line of the text fixtures (the shapes the regexes are for)."""
    starts: set[str] = set()
    for path in sorted(FIXTURES.rglob("*")):
        if not path.is_file() or path.stat().st_size > 512 * 1024 or path.name == "SOURCES.md":
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        starts.update(line[:40] for line in text.splitlines() if line.strip())
    return tuple(sorted(starts))


def cost_s(pattern: re.Pattern[str], line: str) -> float:
    """The best of three of what a parser does with one line: match at its start, search anywhere."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        pattern.match(line)
        pattern.search(line)
        best = min(best, time.perf_counter() - t0)
    return best


def line_of(prefix: str, unit: str, tail: str, size: int) -> str:
    return prefix + unit * ((size - len(prefix)) // len(unit) + 1) + tail


@st.composite
def adversarial(draw: st.DrawFn) -> tuple[str, str, str]:
    start = draw(st.sampled_from(fixture_line_starts()))
    prefix = start[: draw(st.integers(0, len(start)))]
    unit = draw(st.text(alphabet=UNITS, min_size=1, max_size=3))
    return prefix, unit, draw(st.sampled_from(TAILS))


@FUZZ
@given(adversarial())
@example(("SymbolErrorCounter:", ".", " b c"))  # perfquery's dot padding
@example(("\t\tState: x", " ", "!"))  # ibstat, a run of spaces in a value
@example(("1: a", " ", "\x01"))  # sysfs state
@example(("", " ", ""))  # nvidia-smi -q, a line of spaces
def test_every_parser_regex_costs_linear_time_per_kib(case: tuple[str, str, str]) -> None:
    prefix, unit, tail = case
    short, long = line_of(prefix, unit, tail, SHORT), line_of(prefix, unit, tail, LONG)
    slow = []
    for name, pattern in parser_regexes():
        per_kib_short = cost_s(pattern, short) / (len(short) / 1024)
        per_kib_long = cost_s(pattern, long) / (len(long) / 1024)
        if per_kib_long > max(FLOOR_S_PER_KIB, SLOWER * per_kib_short):
            slow.append(f"{name}: {per_kib_short * 1e6:.0f} -> {per_kib_long * 1e6:.0f} us/KiB")
    assert not slow, f"{case!r}: " + "; ".join(slow)
