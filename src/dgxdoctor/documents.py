"""The results document: one pydantic model for every JSON rendering of results. `dgxdoctor check --json` and the
daemon's /state write it, and a peer's /state is validated by it (everything a peer sends is untrusted: sizes are
bounded). Apart from ``result.py`` so the check path (plain dataclasses) builds no model: the models are built when
a document is first rendered or validated (benchmarks/startup.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, field_validator, model_validator

from dgxdoctor.result import CheckResult, Finding, merged_facts, overall_status

MAX_CHECKS = 200
MAX_SAMPLES = 20_000
MAX_FACTS = 2_000
MAX_TEXT = 4_096

Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
# A status as another node wrote it: kept as text (at most 32 characters), never trusted to be one of ours.
LooseStatus = Annotated[str, BeforeValidator(lambda value: str(value)[:32])]
# The checks' part of the per-check document in `check --json` (the rest is /state's).
REPORT_CHECK_KEYS = {"name", "status", "summary", "findings", "action", "duration_s", "error"}
COMPARED_CHECK_KEYS = {"name", "status", "samples"}


class _Doc(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class FindingDoc(_Doc):
    code: str
    status: LooseStatus
    subject: str | None = None
    message: str = ""

    @classmethod
    def of(cls, finding: Finding) -> FindingDoc:
        return cls(code=finding.code, status=finding.status.value, subject=finding.subject, message=finding.message)


class ActionDoc(_Doc):
    kind: str
    remedy: str


class SampleDoc(_Doc):
    name: str
    labels: dict[str, Text] = Field(default_factory=dict)
    value: float | None = None  # JSON has no NaN or infinity: a non-finite value travels as null (absent)

    @field_validator("value", mode="before")
    @classmethod
    def _number(cls, value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("not a number")
        return float(value) if math.isfinite(value) else None


class CheckDoc(_Doc):
    name: str
    status: LooseStatus = "unknown"
    summary: str = ""
    findings: list[FindingDoc] = Field(default_factory=list)
    action: ActionDoc | None = None
    duration_s: float = 0.0
    error: str | None = None
    started_at: float = 0.0
    samples: list[SampleDoc] = Field(default_factory=list)
    facts: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def of(cls, r: CheckResult) -> CheckDoc:
        return cls(
            name=r.check,
            status=r.status.value,
            summary=r.summary,
            findings=[FindingDoc.of(f) for f in r.findings],
            action=ActionDoc(kind=r.action.kind, remedy=r.action.remedy) if r.action else None,
            duration_s=round(r.duration_s, 6),
            error=r.error,
            started_at=round(r.started_at, 3),
            samples=[SampleDoc(name=s.metric.name, labels=dict(s.labels), value=s.value) for s in r.samples],
            facts=dict(r.facts),
        )


class ResultsDocument(_Doc):
    """A node's results: ``report()`` is `check --json`, ``state()`` is /state, ``compared()`` what peers compare."""

    node: str = Field(min_length=1, max_length=253)
    status: LooseStatus = "unknown"
    generated_at: float | None = None
    checks: list[CheckDoc] = Field(max_length=MAX_CHECKS)
    facts: dict[Annotated[str, StringConstraints(max_length=256)], Text] = Field(
        default_factory=dict, max_length=MAX_FACTS
    )

    @model_validator(mode="after")
    def _bounded(self) -> ResultsDocument:
        if sum(len(c.samples) for c in self.checks) > MAX_SAMPLES:
            raise ValueError(f"more than {MAX_SAMPLES} samples")
        return self

    @classmethod
    def of(cls, node: str, results: Sequence[CheckResult], generated_at: float | None = None) -> ResultsDocument:
        return cls(
            node=node,
            status=overall_status(results).value,
            generated_at=None if generated_at is None else round(generated_at, 3),
            checks=[CheckDoc.of(r) for r in results],
            facts=merged_facts(results),
        )

    def report(self, role: str | None = None) -> dict[str, Any]:
        """The shape of ``dgxdoctor check --json``; ``role`` is the node's declared role (None: nothing required)."""
        return {
            "node": self.node,
            "role": role,
            "required": role is not None,
            "status": self.status,
            "checks": [c.model_dump(include=REPORT_CHECK_KEYS) for c in self.checks],
            "facts": dict(self.facts),
        }

    def state(self) -> dict[str, Any]:
        """The shape of the daemon's ``/state``."""
        return self.model_dump()

    def compared(self) -> dict[str, Any]:
        """What the node comparison reads of a peer's /state (fleet.compare)."""
        return {
            "node": self.node,
            "status": self.status,
            "checks": [c.model_dump(include=COMPARED_CHECK_KEYS) for c in self.checks],
            "facts": dict(self.facts),
        }
