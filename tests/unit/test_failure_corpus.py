"""The failure corpus: every real excerpt is named without --kind; real healthy logs give no finding.

tests/fixtures/corpus/failures/<code>.txt holds excerpts of one failure class, each under a header line
``=== <source> | <what it shows>``; tests/fixtures/corpus/healthy/ holds whole healthy logs. SOURCES.md there lists
every source, and a test holds the two in step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from dgxdoctor.diagnose.registry import diagnose
from dgxdoctor.result import Status

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"
HEADER = re.compile(r"^=== (?P<source>\S+) \| (?P<what>.+)$", re.M)
MIN_EXCERPTS = 8


@dataclass(frozen=True)
class Excerpt:
    code: str
    source: str
    what: str
    text: str

    def __str__(self) -> str:
        return f"{self.code} {self.source} ({self.what})"


def excerpts(path: Path) -> list[Excerpt]:
    text = path.read_text(encoding="utf-8")
    for line in text.splitlines():
        assert not line.startswith("=== ") or HEADER.match(line), f"{path.name}: malformed header {line!r}"
    heads = list(HEADER.finditer(text))
    assert heads and heads[0].start() == 0, f"{path.name}: must start with a '=== source | what' line"
    out = []
    for head, nxt in zip(heads, [*heads[1:], None], strict=True):
        body = text[head.end() + 1 : nxt.start() if nxt else len(text)]
        out.append(Excerpt(path.stem.upper(), head["source"], head["what"], body))
    return out


FAILURES = sorted((CORPUS / "failures").glob("*.txt"))
ALL = [e for path in FAILURES for e in excerpts(path)]
HEALTHY = sorted((CORPUS / "healthy").glob("*.txt"))


@pytest.mark.parametrize("excerpt", ALL, ids=str)
def test_every_excerpt_is_named_without_kind(excerpt: Excerpt) -> None:
    found = diagnose(excerpt.text)
    codes = {f.code for d in found for f in d.findings}
    assert excerpt.code in codes, f"{excerpt}: found {sorted(codes)} in\n{excerpt.text}"
    assert "UNRECOGNIZED_INPUT" not in codes


@pytest.mark.parametrize("path", FAILURES, ids=lambda p: p.stem)
def test_each_class_has_enough_real_excerpts_from_distinct_places(path: Path) -> None:
    found = excerpts(path)
    assert len(found) >= MIN_EXCERPTS, f"{path.name}: {len(found)} excerpts, want {MIN_EXCERPTS}"
    assert len({e.source for e in found}) >= MIN_EXCERPTS - 1, f"{path.name}: too few distinct sources"


@pytest.mark.parametrize("path", HEALTHY, ids=lambda p: p.stem)
def test_healthy_log_gives_no_finding(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = diagnose(text)
    assert all(d.status in (Status.OK, Status.SKIPPED) for d in found), [
        (d.kind, [(f.code, f.evidence) for f in d.findings]) for d in found
    ]
    assert all(not d.findings for d in found), [(d.kind, [f.code for f in d.findings]) for d in found]


def test_sources_md_lists_every_source() -> None:
    listed = (CORPUS / "SOURCES.md").read_text(encoding="utf-8")
    for excerpt in ALL:
        assert excerpt.source in listed, f"{excerpt}: source missing from SOURCES.md"
    for path in HEALTHY:
        assert path.name in listed, f"{path.name} missing from SOURCES.md"


def test_every_catalog_code_but_cuda_oom_has_a_corpus_class() -> None:
    from dgxdoctor.judge.signatures import load_catalog

    classes = {p.stem.upper() for p in FAILURES}
    # The generic OOM (no phase) keeps its excerpts in tests/fixtures/logs/: the corpus names the phase.
    assert {s.code for s in load_catalog().signatures} - classes == {"CUDA_OOM"}
