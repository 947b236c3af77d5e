"""No parser regex of sources/ and diagnose/ has the shape of exponential backtracking: an unbounded repeat nested
inside another unbounded repeat (``(\\s*\\w+)*:``, ``(a+)+$``), which retries every way of splitting a run.

Structure, not a clock: the cost of every regex on adversarial lines (the quadratic shapes too, such as the
perfquery dots that took 9 s before their fix) is measured by ``benchmarks/regex_cost.py``, with PASS/FAIL.
"""

from __future__ import annotations

import re
import sys
from functools import cache
from typing import Any

import dgxdoctor.diagnose
import dgxdoctor.sources
from dgxdoctor.lazy_re import module_patterns

if sys.version_info >= (3, 11):
    import re._constants as sre_constants
    import re._parser as sre_parse
else:  # pragma: no cover - the 3.10 unit run
    import sre_constants
    import sre_parse

# A possessive repeat (3.11) never gives back what it took: nesting one is no risk.
BACKTRACKING_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT)


@cache
def parser_regexes() -> tuple[tuple[str, re.Pattern[str]], ...]:
    found = module_patterns(dgxdoctor.sources, dgxdoctor.diagnose)
    assert len(found) > 50
    return tuple(found)


def _parts(op: Any, av: Any) -> list[Any]:
    """The sub-patterns of one parsed item that are not repeats: a group's, each branch's, a look-around's."""
    if op == sre_constants.SUBPATTERN:
        return [av[-1]]
    if op == sre_constants.BRANCH:
        return list(av[1])
    if op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
        return [av[1]]
    return []


def nests_unbounded_repeats(items: Any, inside: bool = False) -> bool:
    """Whether the parsed pattern holds an unbounded backtracking repeat inside another one."""
    for op, av in items:
        if op in BACKTRACKING_REPEATS:
            _, high, sub = av
            unbounded = high == sre_constants.MAXREPEAT
            if (unbounded and inside) or nests_unbounded_repeats(sub, inside or unbounded):
                return True
        elif any(nests_unbounded_repeats(part, inside) for part in _parts(op, av)):
            return True
    return False


def nested(pattern: re.Pattern[str]) -> bool:
    return nests_unbounded_repeats(sre_parse.parse(pattern.pattern, pattern.flags))


def test_no_parser_regex_nests_an_unbounded_repeat() -> None:
    assert [name for name, pattern in parser_regexes() if nested(pattern)] == []


def test_the_shapes_of_exponential_backtracking_are_seen() -> None:
    for bad in (r"(a+)+$", r"^(\s*\w+)*:", r"(?:x|(?:y.*)+)z", r"(?=(\d+)*!)", r"((?:a|b)*c)*d"):
        assert nested(re.compile(bad)), bad
    for fine in (r"^\s*(\w+)\s*:\s*(.*)$", r"(?:ab){1,4}c", r"(\d{1,3}\.){3}\d{1,3}", r"[a-z]+(?:-[a-z]+)?"):
        assert not nested(re.compile(fine)), fine
