"""`dgxdoctor diagnose`: recognise what a tool printed and say what is wrong with it.

Each input kind is an Analyzer: ``detect`` is cheap and conservative, ``analyze`` parses with the same
pure ``parse_*`` functions the live checks use (one parser per format, wherever it runs).

A paste is often a fragment (one line, the end of a traceback, a few lines of a status) or several kinds at once
(a log with an embedded ``ray status``). ``diagnose_all`` reads every section kind it finds, then the text as
lines with the failure-signature catalog, so a known failure in any text is named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from msgspec import Struct, field

from dgxdoctor.result import Finding, Status


class Diagnosis(Struct, frozen=True):
    kind: str
    findings: tuple[Finding, ...] = ()
    data: dict[str, Any] = field(default_factory=dict)
    # One line of the figures read, for people (peak and average busbw, ...); None where findings say it all.
    summary: str | None = None

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


def unrecognized(analyzers: Sequence[Analyzer]) -> Diagnosis:
    return Diagnosis(
        UNRECOGNIZED,
        (
            Finding(
                "UNRECOGNIZED_INPUT",
                Status.UNKNOWN,
                "input is none of the known kinds and shows no known failure signature: "
                + ", ".join(a.kind for a in analyzers),
                remedy="pass --kind KIND to force one",
            ),
        ),
    )


def diagnose_all(text: str, sections: Sequence[Analyzer], lines: Sequence[Analyzer]) -> tuple[Diagnosis, ...]:
    """Every section kind found in ``text``, then the first line reader that takes it (the catalog's readers).

    A line reader that finds nothing is left out when a section kind was found (a kernel log is not also an
    empty "text"); nothing at all is UNRECOGNIZED_INPUT.
    """
    found = [a.analyze(text) for a in sections if a.detect(text)]
    reader = next((a for a in lines if a.detect(text)), None)
    if reader is not None:
        read = reader.analyze(text)
        if read.findings or not found:
            found.append(read)
    return tuple(found) or (unrecognized([*sections, *lines]),)


def diagnose_text(text: str, analyzers: Sequence[Analyzer], kind: str | None = None) -> Diagnosis:
    """The first analyzer that takes ``text`` (``kind`` forces one); unrecognised input is an UNKNOWN finding."""
    if kind is not None:
        chosen = next((a for a in analyzers if a.kind == kind), None)
        if chosen is None:
            raise ValueError(f"unknown kind {kind!r}; known: {', '.join(a.kind for a in analyzers)}")
        return chosen.analyze(text)
    for analyzer in analyzers:
        if analyzer.detect(text):
            return analyzer.analyze(text)
    return unrecognized(analyzers)
