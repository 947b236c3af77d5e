"""`dgxdoctor diagnose`: recognise what a tool printed and say what is wrong with it.

Each input kind is an Analyzer: ``detect`` is cheap and conservative, ``analyze`` parses with the same
pure ``parse_*`` functions the live checks use (one parser per format, wherever it runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from dgxdoctor.result import Finding, Status


@dataclass(frozen=True)
class Diagnosis:
    kind: str
    findings: tuple[Finding, ...] = ()
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> Status:
        return Status.worst(f.status for f in self.findings)


class Analyzer(Protocol):
    kind: ClassVar[str]

    def detect(self, text: str) -> bool:
        """True when ``text`` looks like this kind's output."""
        ...

    def analyze(self, text: str) -> Diagnosis: ...


UNRECOGNIZED = "unknown"


def diagnose_text(text: str, analyzers: Sequence[Analyzer], kind: str | None = None) -> Diagnosis:
    """Pick the analyzer (``kind`` forces one) and run it; unrecognised input is an UNKNOWN finding."""
    if kind is not None:
        chosen = next((a for a in analyzers if a.kind == kind), None)
        if chosen is None:
            raise ValueError(f"unknown kind {kind!r}; known: {', '.join(a.kind for a in analyzers)}")
        return chosen.analyze(text)
    for analyzer in analyzers:
        if analyzer.detect(text):
            return analyzer.analyze(text)
    return Diagnosis(
        UNRECOGNIZED,
        (
            Finding(
                "UNRECOGNIZED_INPUT",
                Status.UNKNOWN,
                "input is none of the known kinds: " + ", ".join(a.kind for a in analyzers),
                remedy="pass --kind KIND to force one",
            ),
        ),
    )
