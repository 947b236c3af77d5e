"""What the scanner does per line the block prefilter hits, counted rather than timed (``benchmarks/diagnose_scan.py
--kinds`` times it): a kernel log whose every line holds a catalog anchor ("Unable to", of Ray's ``Unable to connect
to GCS at``) but matches nothing is not read record by record, and no line looks 200 lines back for its owner.
"""

from __future__ import annotations

import pytest

from dgxdoctor.judge import scan
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
