"""One RE2 ``Set`` says which signatures a line can show (``judge.line_set``): every pattern's relaxed form matches
wherever the pattern does, and a line that shares a word with many signatures but matches none runs no regex of
theirs. Structure, not a clock: ``benchmarks/diagnose_scan.py --kinds`` measures the rate.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import re2

from dgxdoctor.judge.line_set import relaxed
from dgxdoctor.judge.records import clean, shape
from dgxdoctor.judge.signatures import Catalog, _Searcher, load_catalog, parse_catalog

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def fixture_lines() -> list[str]:
    lines: list[str] = []
    for path in sorted(FIXTURES.rglob("*")):
        if path.is_file() and path.stat().st_size < 2_000_000:
            try:
                lines += path.read_text(encoding="utf-8").splitlines()
            except UnicodeDecodeError:
                continue
    return lines


@pytest.fixture(scope="module")
def lines() -> list[str]:
    found = fixture_lines()
    # Two neighbours joined as a wrapped record is read (judge.scan), with and without the space.
    pairs = list(itertools.pairwise(found))
    return found + [a + b for a, b in pairs] + [a + " " + b for a, b in pairs]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (r"NCCL WARN Call to ibv_(?!poll_cq)\w+ failed", r"(?:NCCL WARN Call to ibv_\w+ failed)"),
        (r"(?<!ray\.exceptions\.)(?<!Ray)OutOfMemoryError(?!: Task)", r"(?:OutOfMemoryError)"),
        (r"^\bError\b: [^\]$]+$", r"(?:Error: [^\]$]+)"),
        (r"(?i)cuda\s+error", r"(?i:cuda[\t\n\v\f\r \x1c-\x1f]+error)"),
        (r"a[\s,]b", r"(?:a[\t\n\v\f\r \x1c-\x1f,]b)"),
        (r"x{,3}y", None),
    ],
)
def test_relaxed_form(pattern: str, expected: str | None) -> None:
    assert relaxed(pattern) == expected


def test_every_shipped_pattern_runs_in_re2_whole() -> None:
    """No pattern falls back to its anchor: each line is told apart by its whole pattern."""
    for sig in load_catalog().signatures:
        for p in sig.patterns:
            form = relaxed(p.pattern)
            assert form is not None, p.pattern
            re2.compile(form)


def test_relaxed_form_matches_wherever_the_pattern_does(lines: list[str]) -> None:
    compiled = [(p, re2.compile(relaxed(p.pattern))) for s in load_catalog().signatures for p in s.patterns]
    ascii_lines = [line for line in lines if line.isascii()]
    missed = [
        (p.pattern, line[:200])
        for p, form in compiled
        for line in ascii_lines
        if p.search(line) and form.search(line) is None
    ]
    assert missed == []


def test_find_is_what_the_anchor_path_finds(lines: list[str]) -> None:
    """The Set decides which patterns run; the answer is the one of trying every candidate by its anchor."""
    catalog = load_catalog()
    by_anchor = Catalog(catalog.signatures)
    by_anchor.__dict__["_line_set"] = None  # the path without RE2
    differ = []
    for line in lines:
        text = clean(line)
        start = shape(text).message
        for kind in (None, "ray"):
            for quoted in (True, False):
                want = [s.code for s in by_anchor.find(text, kind, start=start, quoted=quoted)]
                got = [s.code for s in catalog.find(text, kind, start=start, quoted=quoted)]
                if want != got:
                    differ.append((line[:200], want, got))
        if not catalog.may_match(line):
            assert by_anchor.find(text, start=start) == [], line
    assert differ == []


def test_a_line_sharing_a_word_with_many_signatures_runs_none_of_their_regexes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 signatures anchored on the same words: a line that holds the words and matches none costs one pass of
    the automaton, not 200 regexes (before, every signature whose anchor the line held ran its pattern)."""
    entries = [
        {
            "code": f"NODE_{n}",
            "severity": "warning",
            "kinds": ["ray"],
            "meaning": "m",
            "fix": "f",
            "patterns": [rf"Health check failed for node (?:alpha|beta){n}\b"],
        }
        for n in range(200)
    ]
    catalog = parse_catalog({"signature": entries})
    calls = []
    span = _Searcher.span
    monkeypatch.setattr(_Searcher, "span", lambda self, text: calls.append(text) or span(self, text))
    assert catalog.find("Health check failed for node gamma7, retrying") == []
    assert calls == []
    assert [s.code for s in catalog.find("Health check failed for node beta42")] == ["NODE_42"]
    assert len(calls) <= 2  # NODE_4 and NODE_42: the relaxed form has no \b


def test_may_search_never_says_no_where_the_pattern_finds_a_line() -> None:
    """``diagnose``'s log readers skip Python's search where RE2's pass of the relaxed form finds nothing: on every
    fixture text, never where Python's search would have found a line."""
    from pathlib import Path

    from dgxdoctor.diagnose.logs import NCCL_LINE, PG_NCCL_LINE, RAY_MARKER, RAY_PY_LINE, VLLM_LINE
    from dgxdoctor.relaxed_re import may_search

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(fixtures.rglob("*.txt"))]
    texts += [p.read_text(encoding="utf-8", errors="replace") for p in sorted(fixtures.rglob("*.log"))]
    found = 0
    for pattern in (VLLM_LINE, RAY_PY_LINE, RAY_MARKER, NCCL_LINE, PG_NCCL_LINE):
        for text in texts:
            if pattern.search(text) is not None:
                found += 1
                assert may_search(pattern, text), (pattern.pattern, text[:200])
    assert found > 50
    kernel = (fixtures / "kernel_log" / "faults_lookalikes.txt").read_text()
    assert not may_search(VLLM_LINE, kernel) and not may_search(RAY_PY_LINE, kernel)
