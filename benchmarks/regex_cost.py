"""Every parser regex of sources/ and diagnose/ costs time linear in its line, on adversarial lines.

    PYTHONPATH=src .venv/bin/python benchmarks/regex_cost.py [--examples 60]

A property run (hypothesis) over adversarial lines: a real fixture line cut anywhere, then a short unit repeated,
then a tail that makes the match fail late; and the lines that were slow before their fixes. The budget is per KiB
and relative: a line 8x longer may cost at most ``SLOWER`` times more per KiB than the short one (a quadratic regex
costs 8x more per KiB, an exponential one far more), with a floor so that microseconds of noise on a shared machine
never fail it. Before their fixes, 8 KiB of perfquery dots took 9 s in ``perfquery.FIELD_RE`` (100 KB ran past
90 s), a run of spaces 3.7 s in ``ibstat.FIELD_RE`` (100 KB of ibstat: 42.9 s) and 1.9 s in ``sysfs_ib.STATE_RE``.

Wall-clock figures, so they live here and not in the unit suite (``tests/unit/test_regex_cost.py`` holds what can
be held without a clock: no regex nests one unbounded repeat in another). Prints the costliest regexes of the
historical lines, then PASS/FAIL for the property; exits 1 on a miss. ``scripts/test-all`` runs it.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from functools import cache
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dgxdoctor.diagnose
import dgxdoctor.sources
from dgxdoctor.lazy_re import module_patterns

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
SHORT, LONG = 1024, 8 * 1024
SLOWER = 4.0  # linear: ~1x per KiB; quadratic at 8x the length: ~8x
FLOOR_S_PER_KIB = 2e-4  # below this per KiB the line is cheap whatever its shape (20 MB/s of one regex)
UNITS = " \t.:a0-=,/\\([{)]}'\"x"
TAILS = ("", "!", "b", " b c", "\x01", ")")
# The lines that were slow before their fixes: (fixture line start, repeated unit, tail).
HISTORICAL = (
    ("SymbolErrorCounter:", ".", " b c"),  # perfquery's dot padding
    ("\t\tState: x", " ", "!"),  # ibstat, a run of spaces in a value
    ("1: a", " ", "\x01"),  # sysfs state
    ("", " ", ""),  # nvidia-smi -q, a line of spaces
)


@cache
def parser_regexes() -> tuple[tuple[str, re.Pattern[str]], ...]:
    found = module_patterns(dgxdoctor.sources, dgxdoctor.diagnose)
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
        t0 = time.thread_time()
        pattern.match(line)
        pattern.search(line)
        best = min(best, time.thread_time() - t0)
    return best


def line_of(prefix: str, unit: str, tail: str, size: int) -> str:
    return prefix + unit * ((size - len(prefix)) // len(unit) + 1) + tail


def costs(case: tuple[str, str, str]) -> list[tuple[str, float, float]]:
    """(regex, us/KiB of the short line, us/KiB of the long one) for every parser regex."""
    prefix, unit, tail = case
    short, long = line_of(prefix, unit, tail, SHORT), line_of(prefix, unit, tail, LONG)
    out = []
    for name, pattern in parser_regexes():
        per_kib_short = cost_s(pattern, short) / (len(short) / 1024)
        per_kib_long = cost_s(pattern, long) / (len(long) / 1024)
        out.append((name, per_kib_short, per_kib_long))
    return out


def slow(case: tuple[str, str, str]) -> list[str]:
    return [
        f"{name}: {short * 1e6:.0f} -> {long * 1e6:.0f} us/KiB"
        for name, short, long in costs(case)
        if long > max(FLOOR_S_PER_KIB, SLOWER * short)
    ]


@st.composite
def adversarial(draw: st.DrawFn) -> tuple[str, str, str]:
    start = draw(st.sampled_from(fixture_line_starts()))
    prefix = start[: draw(st.integers(0, len(start)))]
    unit = draw(st.text(alphabet=UNITS, min_size=1, max_size=3))
    return prefix, unit, draw(st.sampled_from(TAILS))


def property_holds(examples: int) -> list[str]:
    """The property over ``examples`` adversarial lines and the historical ones; [] when it holds, else the
    smallest failing line's slow regexes."""
    failed: list[str] = []

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(adversarial())
    @example(HISTORICAL[0])
    @example(HISTORICAL[1])
    @example(HISTORICAL[2])
    @example(HISTORICAL[3])
    def every_parser_regex_costs_linear_time_per_kib(case: tuple[str, str, str]) -> None:
        found = slow(case)
        assert not found, f"{case!r}: " + "; ".join(found)

    try:
        every_parser_regex_costs_linear_time_per_kib()
    except AssertionError as exc:
        failed.append(str(exc).splitlines()[0])
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=60, help="adversarial lines to try (default 60)")
    args = parser.parse_args()
    print(f"{len(parser_regexes())} parser regexes; lines of {SHORT} and {LONG} bytes; budget: the long line at most "
          f"{SLOWER:g}x the short one's cost per KiB, or under {FLOOR_S_PER_KIB * 1e6:.0f} us/KiB")  # fmt: skip
    for case in HISTORICAL:
        worst = sorted(costs(case), key=lambda c: -c[2])[:3]
        shown = ", ".join(f"{name} {short * 1e6:.1f} -> {long * 1e6:.1f}" for name, short, long in worst)
        print(f"  {case!r}: costliest us/KiB {shown}")
    failed = property_holds(args.examples)
    for line in failed:
        print(f"  {line}")
    print("PASS" if not failed else "FAIL")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
