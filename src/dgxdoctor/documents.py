"""The results document: one set of records for every JSON rendering of results. `dgxdoctor check --json` and the
daemon's /state write it, and a peer's /state is validated by it (everything a peer sends is untrusted: sizes are
bounded). Apart from ``result.py``: the check path that prints a table imports none of it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta, Struct, field

from dgxdoctor import __version__
from dgxdoctor.result import DEFAULT_GROUP, UNKNOWN_GROUP, CheckResult, Finding, merged_facts, overall_status
from dgxdoctor.validation import Clipped, enc_hook

MAX_CHECKS = 200
MAX_SAMPLES = 20_000
MAX_FINDINGS = 2_000
MAX_FACTS = 2_000
MAX_TEXT = 4_096
MAX_NAME = 256
# The results document's schema. 1: the release before it was numbered (0.1.0 at 85f803c), whose documents carry
# no ``schema`` and no ``agent_version`` and whose findings carry no evidence, remedy, action or cure. 2: those
# keys. A reader knows every schema up to SCHEMA: it reads an older one with the missing keys absent (unknown,
# never OK) and a newer one for the keys it knows (the rest are ignored), and a peer of another release is
# compared like any other (the version difference is a PEER_VERSION_SKEW warning, fleet/compare.py). 3: the node's
# serving ``group``, at the top and on every finding (absent: result.UNKNOWN_GROUP).
SCHEMA = 3
UNNUMBERED_SCHEMA = 1

Text = Annotated[str, Meta(max_length=MAX_TEXT)]
# A status (or a finding's action or cure) as another node wrote it: kept as text (at most 32 characters), never
# trusted to be one of ours.


class LooseStatus(Clipped):
    limit = 32


# A finding's words as another node wrote them: cut to a bound rather than refused, so one long log line in a
# peer's evidence does not cost the whole peer (the body itself is read up to MAX_STATE_BYTES).
class ClippedName(Clipped):
    limit = MAX_NAME


class ClippedText(Clipped):
    limit = MAX_TEXT


C = TypeVar("C", bound=Clipped)


def _clipped(kind: type[C], value: str | None) -> C | None:
    return None if value is None else kind(value)


# The checks' part of the per-check document in `check --json` (the rest is /state's).
REPORT_CHECK_KEYS = ("name", "status", "summary", "findings", "action", "duration_s", "error")
# What the node comparison reads of each check (fleet/compare.py, fleet/stuck_rank.py, judge/hardware_cause.py):
# the peer's findings are its verdicts (a headless worker down, an engine stalled, an XID with its kernel line);
# ``started_at`` with the document's ``generated_at`` dates what a relayed verdict rests on (fleet.compare).
COMPARED_CHECK_KEYS = ("name", "status", "findings", "samples", "started_at")


def _finite(value: float) -> float | None:
    """JSON has no NaN or infinity: a non-finite value travels as null (absent)."""
    return value if math.isfinite(value) else None


class _Doc(Struct, frozen=True, kw_only=True):
    """Keys a document does not know are ignored: a newer peer may send more."""

    def dumped(self, keys: Sequence[str] | None = None) -> dict[str, Any]:
        """The document as JSON-ready builtins; only ``keys`` when given."""
        out: dict[str, Any] = msgspec.to_builtins(self, enc_hook=enc_hook)
        return out if keys is None else {key: out[key] for key in keys}


class FindingDoc(_Doc, frozen=True):
    """A finding whole, with what follows from it as judge/ decided: a peer's findings decide this node's actions
    (the hardware gate reads ``cure``, the kernel's XID/SXID line is ``evidence``). ``action`` and ``cure`` are
    result.FindingAction and result.Cure's values; a peer's are kept as text, never trusted to be one of ours.
    A new field of ``Finding`` gets a field here and a line in ``of`` (but ``seen_at``: this node's clock, and a
    peer's evidence is dated by its check's ``started_at``)."""

    code: ClippedName
    status: LooseStatus
    subject: ClippedName | None = None
    message: ClippedText = ClippedText("")
    evidence: ClippedText | None = None
    remedy: ClippedText | None = None
    # None: not sent (a schema 1 document): unknown, never "nothing follows" (judge/hardware_cause.py).
    action: LooseStatus | None = None
    cure: LooseStatus | None = None
    # The serving group of the node that found it ([node] group); None: not sent (a schema 1 or 2 document), read
    # as result.UNKNOWN_GROUP.
    group: ClippedName | None = None

    @classmethod
    def of(cls, finding: Finding, group: str | None = None) -> FindingDoc:
        return cls(
            group=_clipped(ClippedName, group),
            code=ClippedName(finding.code),
            status=LooseStatus(finding.status.value),
            subject=_clipped(ClippedName, finding.subject),
            message=ClippedText(finding.message),
            evidence=_clipped(ClippedText, finding.evidence),
            remedy=_clipped(ClippedText, finding.remedy),
            action=_clipped(LooseStatus, finding.action),
            cure=LooseStatus(finding.cure.value),
        )


class ActionDoc(_Doc, frozen=True):
    kind: str
    remedy: str


class SampleDoc(_Doc, frozen=True):
    name: str
    labels: dict[str, Text] = field(default_factory=dict)
    value: float | None = None  # a peer's non-finite one is read as absent (fleet.peers.response_json)

    @classmethod
    def of_value(cls, name: str, labels: dict[str, str], value: float | None) -> SampleDoc:
        return cls(name=name, labels=labels, value=None if value is None else _finite(value))


class CheckDoc(_Doc, frozen=True):
    name: str
    status: LooseStatus = LooseStatus("unknown")
    summary: str = ""
    findings: list[FindingDoc] = field(default_factory=list)
    action: ActionDoc | None = None
    duration_s: float = 0.0
    error: str | None = None
    started_at: float = 0.0
    samples: list[SampleDoc] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, r: CheckResult, group: str | None = None) -> CheckDoc:
        return cls(
            name=r.check,
            status=LooseStatus(r.status.value),
            summary=r.summary,
            findings=[FindingDoc.of(f, group) for f in r.findings],
            action=ActionDoc(kind=r.action.kind, remedy=r.action.remedy) if r.action else None,
            duration_s=round(r.duration_s, 6),
            error=r.error,
            started_at=round(r.started_at, 3),
            samples=[SampleDoc.of_value(s.metric.name, dict(s.labels), s.value) for s in r.samples],
            facts=dict(r.facts),
        )


class ResultsDocument(_Doc, kw_only=True, frozen=True):
    """A node's results: ``report()`` is `check --json`, ``state()`` is /state, ``compared()`` what peers compare."""

    node: Annotated[str, Meta(min_length=1, max_length=253)]
    schema: Annotated[int, Meta(ge=1, le=1_000_000)] = UNNUMBERED_SCHEMA  # absent: the unnumbered release
    agent_version: ClippedName | None = None  # dgxdoctor's version on the node; None: not sent (schema 1)
    # The node's serving group ([node] group); None: not sent (schema 1 and 2), read as result.UNKNOWN_GROUP.
    group: ClippedName | None = None
    status: LooseStatus = LooseStatus("unknown")
    generated_at: float | None = None
    checks: Annotated[list[CheckDoc], Meta(max_length=MAX_CHECKS)]
    facts: Annotated[dict[Annotated[str, Meta(max_length=256)], Text], Meta(max_length=MAX_FACTS)] = field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        """At most MAX_SAMPLES samples and MAX_FINDINGS findings in all the checks."""
        if sum(len(c.samples) for c in self.checks) > MAX_SAMPLES:
            raise ValueError(f"more than {MAX_SAMPLES} samples")
        if sum(len(c.findings) for c in self.checks) > MAX_FINDINGS:
            raise ValueError(f"more than {MAX_FINDINGS} findings")

    @classmethod
    def of(
        cls, node: str, results: Sequence[CheckResult], generated_at: float | None = None, group: str = DEFAULT_GROUP
    ) -> ResultsDocument:
        return cls(
            node=node,
            schema=SCHEMA,
            agent_version=ClippedName(__version__),
            group=ClippedName(group),
            status=LooseStatus(overall_status(results).value),
            generated_at=None if generated_at is None else round(generated_at, 3),
            checks=[CheckDoc.of(r, group) for r in results],
            facts=merged_facts(results),
        )

    def report(self, role: str | None = None) -> dict[str, Any]:
        """The shape of ``dgxdoctor check --json``; ``role`` is the node's declared role (None: nothing required)."""
        return {
            "node": self.node,
            "group": self.group_name,
            "role": role,
            "required": role is not None,
            "status": self.status,
            "checks": [c.dumped(REPORT_CHECK_KEYS) for c in self.checks],
            "facts": dict(self.facts),
        }

    def state(self) -> dict[str, Any]:
        """The shape of the daemon's ``/state``."""
        return self.dumped()

    def compared(self) -> dict[str, Any]:
        """What the node comparison reads of a peer's /state (fleet.compare)."""
        return {
            "node": self.node,
            "schema": self.schema,
            "agent_version": self.agent_version,
            "group": self.group_name,
            "status": self.status,
            "generated_at": self.generated_at,
            "checks": [c.dumped(COMPARED_CHECK_KEYS) for c in self.checks],
            "facts": dict(self.facts),
        }

    @property
    def group_name(self) -> str:
        """The node's serving group; ``UNKNOWN_GROUP`` for a document of a release that sends none."""
        return self.group or UNKNOWN_GROUP

    def newer_schema(self) -> str | None:
        """What to say of a document of a schema this release does not know (a newer agent's), or None."""
        if self.schema <= SCHEMA:
            return None
        return (
            f"results schema {self.schema} (dgxdoctor {self.agent_version or 'version not sent'}), newer than this "
            f"agent's {SCHEMA}: read for the keys schema {SCHEMA} has, the rest ignored"
        )
