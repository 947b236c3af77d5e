"""The scanner's shortcuts give what the plain definitions give: the line positions found with one split instead of
a search per line, and the per-pattern anchor test before each regex (case-folded and non-ASCII text included)."""

from __future__ import annotations

import random

from dgxdoctor.judge.scan import _line_end_after, _line_start_before
from dgxdoctor.judge.signatures import parse_catalog


def _start_by_lines(data: bytes, pos: int, n: int) -> int:
    for _ in range(n):
        if pos <= 0:
            return 0
        pos = data.rfind(b"\n", 0, pos - 1) + 1
    return pos


def _end_by_lines(data: bytes, pos: int, n: int) -> int:
    for _ in range(n + 1):
        end = data.find(b"\n", pos)
        if end == -1:
            return len(data)
        pos = end + 1
    return pos - 1


def test_line_positions_match_a_search_per_line() -> None:
    rng = random.Random(7)
    for _ in range(300):
        lines = [b"x" * rng.choice([0, 0, 1, 3, 80, 400, 2000]) for _ in range(rng.randint(0, 25))]
        data = b"\n".join(lines) + rng.choice([b"", b"\n"])
        n = rng.choice([0, 1, 2, 5, 12, 400])
        starts = [0, *(i + 1 for i, c in enumerate(data) if c == 10), rng.randint(0, len(data))]
        for pos in starts:
            assert _line_start_before(data, pos, n) == _start_by_lines(data, pos, n), (data, pos, n)
            assert _end_by_lines(data, pos, n) == _line_end_after(data, pos, n), (data, pos, n)


def _entry(code: str, pattern: str) -> dict[str, object]:
    return {"code": code, "severity": "warning", "kinds": ["vllm"], "meaning": "m", "fix": "f", "patterns": [pattern]}


def test_a_case_insensitive_pattern_is_found_in_any_casing_beside_another_anchor() -> None:
    catalog = parse_catalog({"signature": [_entry("PLAIN", "Zzzz qqqq"), _entry("FOLDED", "(?i)ssss barr")]})
    # The line reaches the patterns through PLAIN's anchor; FOLDED's own anchor is there only in another casing,
    # or only as Unicode case folding reads it (U+017F LATIN SMALL LETTER LONG S matches "s" under (?i)).
    for line in ("Zzzz qqqq sSsS BaRr", "Zzzz qqqq \u017fsss barr"):
        assert sorted(s.code for s in catalog.find(line)) == ["FOLDED", "PLAIN"], line
    assert [s.code for s in catalog.find("Zzzz qqqq sss barr")] == ["PLAIN"]
