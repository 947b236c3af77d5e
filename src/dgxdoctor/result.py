"""Pure data every check returns and every renderer (CLI table, --json, /state, exporter) reads."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, field_validator, model_validator


class Status(enum.Enum):
    """Check and finding status. ``code`` is the Nagios exit code and the exported gauge value."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"
    UNKNOWN = "unknown"
    SKIPPED = "skipped"

    @property
    def code(self) -> int:
        return _CODES[self]

    @property
    def rank(self) -> int:
        """Order for "worst of": evidence of a fault beats not knowing, not knowing beats ok."""
        return _RANKS[self]

    @classmethod
    def worst(cls, statuses: Iterable[Status], default: Status | None = None) -> Status:
        best_seen = default if default is not None else cls.OK
        for status in statuses:
            if status.rank > best_seen.rank:
                best_seen = status
        return best_seen


# SKIPPED exports -1: "not applicable here" must never read as ok (0) on a dashboard.
_CODES = {Status.OK: 0, Status.WARNING: 1, Status.CRITICAL: 2, Status.UNKNOWN: 3, Status.SKIPPED: -1}
_RANKS = {Status.SKIPPED: 0, Status.OK: 1, Status.UNKNOWN: 2, Status.WARNING: 3, Status.CRITICAL: 4}


def overall_status(results: Sequence[CheckResult]) -> Status:
    return Status.worst((r.status for r in results), default=Status.OK)


def merged_facts(results: Iterable[CheckResult]) -> dict[str, str]:
    """The node's facts: every check's, the later check's value winning."""
    facts: dict[str, str] = {}
    for result in results:
        facts.update(result.facts)
    return facts


def exit_code(status: Status) -> int:
    """Nagios plugin convention: 0 ok/skipped, 1 warning, 2 critical, 3 unknown."""
    return 0 if status in (Status.OK, Status.SKIPPED) else status.code


MetricType = Literal["gauge", "counter", "info", "histogram"]


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric family: its full name, HELP text, type and label names.

    Counters are named with ``_total``; info metrics with ``_info`` and value 1.
    """

    name: str
    help: str
    type: MetricType = "gauge"
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sample:
    """One value of a metric family, with its labels (the ``node`` label is added by the exporter)."""

    metric: MetricSpec
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = set(self.metric.labels) - set(self.labels)
        extra = set(self.labels) - set(self.metric.labels)
        if missing or extra:
            raise ValueError(
                f"sample of {self.metric.name}: labels {sorted(self.labels)} do not match "
                f"declared {list(self.metric.labels)}"
            )


@dataclass(frozen=True)
class Finding:
    """One observation: what (code), about what (subject: a GPU, a port, a node), how bad, and why."""

    code: str
    status: Status
    message: str
    subject: str | None = None
    evidence: str | None = None
    remedy: str | None = None

    def to_diagnose_dict(self) -> dict[str, Any]:
        """``dgxdoctor diagnose --json``: the results document's finding with its evidence and remedy."""
        return {**FindingDoc.of(self).model_dump(), "evidence": self.evidence, "remedy": self.remedy}


@dataclass(frozen=True)
class Action:
    """A suggested remedy. ``kind`` names what remediation could do (``restart_vllm``, ``reset_gpu``,
    ``investigate``, ...); ``remedy`` is the operator-facing text."""

    kind: str
    remedy: str


@dataclass(frozen=True)
class CheckResult:
    check: str
    status: Status
    summary: str
    findings: tuple[Finding, ...] = ()
    samples: tuple[Sample, ...] = ()
    action: Action | None = None
    # Node facts for drift comparison between nodes (driver version, NCCL env, model fingerprint ...).
    facts: Mapping[str, str] = field(default_factory=dict)
    started_at: float = 0.0
    duration_s: float = 0.0
    error: str | None = None
    # External probes of this run that timed out (``nvml``, ``ibstat``, ``ray status``, ``peer``): each is
    # counted in dgxdoctor_probe_timeouts_total{check,probe} and named in a finding or the summary.
    timeouts: tuple[str, ...] = ()

    @classmethod
    def skipped(cls, check: str, reason: str) -> CheckResult:
        return cls(check=check, status=Status.SKIPPED, summary=reason)

    @classmethod
    def unknown(cls, check: str, error: str) -> CheckResult:
        return cls(check=check, status=Status.UNKNOWN, summary=error, error=error)


class ResultBuilder:
    """Collects findings and samples; the status is the worst finding's (OK when none)."""

    def __init__(self, check: str) -> None:
        self.check = check
        self.findings: list[Finding] = []
        self.samples: list[Sample] = []
        self.facts: dict[str, str] = {}
        self.timeouts: list[str] = []

    def timed_out(self, probe: str) -> None:
        """An external probe of this run timed out (counted; the caller's finding names it)."""
        self.timeouts.append(probe)

    def add(self, *findings: Finding) -> None:
        """The one way findings join a result: built as ``Finding(...)`` (here or by a judge/ function), added here."""
        self.findings.extend(findings)

    def sample(self, metric: MetricSpec, value: float | None, **labels: str) -> None:
        """Record a value; ``None`` means unavailable and is not exported (absent, never zero)."""
        if value is None:
            return
        self.samples.append(Sample(metric, float(value), labels))

    @property
    def status(self) -> Status:
        return Status.worst(f.status for f in self.findings)

    def build(self, summary: str, action: Action | None = None) -> CheckResult:
        if action is None:
            action = next(
                (
                    Action("investigate", f.remedy)
                    for f in sorted(self.findings, key=lambda f: -f.status.rank)
                    if f.remedy and f.status in (Status.WARNING, Status.CRITICAL)
                ),
                None,
            )
        return CheckResult(
            check=self.check,
            status=self.status,
            summary=summary,
            findings=tuple(self.findings),
            samples=tuple(self.samples),
            action=action,
            facts=dict(self.facts),
            timeouts=tuple(self.timeouts),
        )


# ---- the results document ------------------------------------------------------------------------------------
# One model for every JSON rendering of results: `dgxdoctor check --json` and the daemon's /state write it, and a
# peer's /state is validated by it (everything a peer sends is untrusted: sizes are bounded).

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
