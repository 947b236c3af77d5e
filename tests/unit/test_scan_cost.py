"""What the scanner does per line the block prefilter hits, counted rather than timed (``benchmarks/diagnose_scan.py
--kinds`` times it): a kernel log whose every line holds a catalog anchor ("Unable to", of Ray's ``Unable to connect
to GCS at``) but matches nothing is not read record by record, and no line looks 200 lines back for its owner.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from dgxdoctor.judge import scan, signatures
from dgxdoctor.judge.scan import Scanner
from dgxdoctor.judge.signatures import load_catalog

# tests/fixtures/kernel_log/lookalikes.txt: an NVRM line with the anchor of RAY_GCS_UNREACHABLE's pattern.
LINE = "[ {n}.516986] NVRM: GPU1 kbifCacheVFInfo_GB100: Unable to read NV_PF0_INITIAL_AND_TOTAL_VFS"


def test_hit_lines_that_match_nothing_are_not_read_as_records(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"own": 0, "find": 0}
    own, find = scan._Owners.own, load_catalog().find

    def counted_own(self: scan._Owners, index: int) -> object:
        calls["own"] += 1
        return own(self, index)

    def counted_find(*args: object, **kwargs: object) -> object:
        calls["find"] += 1
        return find(*args, **kwargs)  # type: ignore[arg-type]

    catalog = load_catalog()
    monkeypatch.setattr(scan._Owners, "own", counted_own)
    monkeypatch.setattr(catalog, "find", counted_find)
    lines = 2000
    text = "".join(LINE.format(n=n) + "\n" for n in range(lines))
    scanner = Scanner(catalog)
    assert [*scanner.feed(text), *scanner.flush()] == []
    # Before: every hit line was cleaned, shaped with the 200 lines above it and searched alone and joined with
    # each neighbour (~800 shape look-ups and 5 searches a line).
    assert calls["find"] == 0
    assert calls["own"] <= 5 * lines


def test_a_real_line_among_them_is_still_named() -> None:
    gcs = "2023-01-08 10:04:23,614 WARNING utils.py:1422 -- Unable to connect to GCS at 172.31.130.238:56704."
    text = "".join(LINE.format(n=n) + "\n" for n in range(500)) + gcs + "\n"
    scanner = Scanner(load_catalog())
    found = [*scanner.feed(text), *scanner.flush()]
    assert [(m.code, m.number) for m in found] == [("RAY_GCS_UNREACHABLE", 501)]


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# What pasting and collectors put before a line (judge.records.PREFIXES).
PREFIXES = ("", "", "Dec 18 10:00:00 dgx-a vllm[1234]: ", "vllm-1  | ", "[pod/vllm-0/vllm] ", "(Worker pid=7) ")


def real_lines() -> list[str]:
    names = [*sorted((FIXTURES / "corpus" / "failures").glob("*.txt")), *sorted((FIXTURES / "logs").glob("*.log"))]
    names += [*sorted((FIXTURES / "corpus" / "healthy").glob("*.txt")), FIXTURES / "kernel_log" / "lookalikes.txt"]
    return [line for name in names for line in name.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_automaton_pass_changes_no_match(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real lines in random order, some behind a prefix and some wrapped in two at a random place: the scanner
    finds the same with its pass over each hit line and its neighbours as when it reads every hit line in full."""
    rng = random.Random(35)
    pool = real_lines()
    catalog = load_catalog()
    docs = []
    for _ in range(150):
        lines: list[str] = []
        for text in rng.sample(pool, 30):
            prefix = rng.choice(PREFIXES)
            line = prefix + text
            if len(line) > 45 and rng.random() < 0.3:
                cut = rng.randrange(40, len(line))
                rest = line[cut:].lstrip(" ") if rng.random() < 0.5 else line[cut:]
                # A collector stamps each line it reads, the continuation of a wrapped record too.
                lines += [line[:cut], (prefix if rng.random() < 0.5 else "") + rest]
            else:
                lines.append(line)
        docs.append("\n".join(lines) + "\n")

    def scanned(doc: str) -> list[tuple[str, str, bool, int]]:
        found = []
        for kind in (None, "ray"):
            scanner = Scanner(catalog, kind)
            found += [(m.code, m.line, m.trusted, m.number) for m in [*scanner.feed(doc), *scanner.flush()]]
        return found

    fast = [scanned(doc) for doc in docs]
    monkeypatch.setattr(Scanner, "_worth_reading", lambda self, data, hit: True)
    assert fast == [scanned(doc) for doc in docs]
    assert sum(map(len, fast)) > 100  # the documents do show signatures


def test_the_uncatalogued_pass_asks_the_shipped_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether the catalog knows a plain failure is asked of the catalog the scan used, not of a new one whose
    search structures are built again (~30 ms of every `diagnose` that holds one)."""
    from dgxdoctor.diagnose.registry import diagnose

    load_catalog()
    built = []
    init = signatures.Catalog.__init__
    monkeypatch.setattr(signatures.Catalog, "__init__", lambda self, sigs: built.append(1) or init(self, sigs))
    text = (
        "Traceback (most recent call last):\n"
        '  File "/opt/serve/launch.py", line 42, in <module>\n'
        "    main()\n"
        "ValueError: shard plan names 9 stages but the mesh has 8\n"
    )  # a plain failure of no catalogued class (the fixtures of tests/fixtures/uncatalogued now have classes)
    codes = [f.code for d in diagnose(text) for f in d.findings]
    assert "UNCATALOGUED_ERROR" in codes
    assert built == []


def test_without_re2_the_scanner_finds_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """google-re2 is a dependency; where it cannot be imported every pass runs in Python's engine and every hit
    line is read in full, with the same matches."""
    rng = random.Random(36)
    pool = real_lines()
    docs = ["\n".join(rng.sample(pool, 40)) + "\n" for _ in range(20)]

    def scanned(catalog: signatures.Catalog) -> list[tuple[str, int]]:
        out = []
        for doc in docs:
            scanner = Scanner(catalog)
            out += [(m.code, m.number) for m in [*scanner.feed(doc), *scanner.flush()]]
        return out

    with_re2 = scanned(signatures.Catalog(load_catalog().signatures))
    monkeypatch.setitem(sys.modules, "re2", None)  # import re2 raises ImportError
    scan._client_hint.cache_clear()
    try:
        plain = signatures.Catalog(load_catalog().signatures)
        assert plain._line_set is None
        assert scanned(plain) == with_re2
    finally:
        scan._client_hint.cache_clear()
    assert with_re2
