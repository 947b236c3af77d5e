"""Pure data every check returns and every renderer (CLI table, --json, /state, exporter) reads."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from msgspec import Struct, field

# The serving group of a node that names none (``[node] group`` unset): every such node is one group.
DEFAULT_GROUP = "default"
# The group of a document that names none: an agent of a release before serving groups (read, compared, never
# refused: fleet.compare puts it with the one group there is, or on its own beside several).
UNKNOWN_GROUP = "unknown"


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


class MetricSpec(Struct, frozen=True):
    """One exported metric family: its full name, HELP text, type and label names.

    Counters are named with ``_total``; info metrics with ``_info`` and value 1.
    """

    name: str
    help: str
    type: MetricType = "gauge"
    labels: tuple[str, ...] = ()


class Sample(Struct, frozen=True):
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


# What follows from a finding, decided with its status in judge/ (judge.consequence): nothing; a restart of vLLM; a
# restart of the cluster (Ray, or the mp deployment); a page to a person, never acted on.
FindingAction = Literal["none", "restart_vllm", "restart_cluster", "page"]


class Cure(enum.Enum):
    """Whether a restart of vLLM or the cluster can cure what a finding reports (judge.consequence decides).

    ``RESTART``: the restart the finding's action names cures it. ``PERSON``: no restart does; a person must (the
    action is a page), but a restart asked for by another finding may still help. ``HARDWARE``: a hardware or driver
    fault no restart cures, and while it lasts any restart only fails again: remediation refuses restarts and pages
    with it as the cause (a peer's such fault, relayed by peer_compare as a warning, too). ``NA``: nothing here
    for a restart to cure (every other finding: ok, warning, unknown, or critical with no action).
    """

    NA = "n/a"
    RESTART = "restart"
    PERSON = "person"
    HARDWARE = "hardware"


class Finding(Struct, frozen=True):
    """One observation: what (code), about what (subject: a GPU, a port, a node), how bad, and why; and what follows
    from it (``action``, ``cure``), decided in judge/ with the status and read as data by remediation."""

    code: str
    status: Status
    message: str
    subject: str | None = None
    evidence: str | None = None
    remedy: str | None = None
    action: FindingAction = "none"
    cure: Cure = Cure.NA
    # When the evidence was seen, on this node's clock, where it is older than the run that reports it (a log line
    # the logs check holds for its hold_s, a peer's result relayed): remediation does not act on evidence from
    # before its last action ended (policy.problems_from_results). None: the run's own observation. Not sent to
    # peers (documents.FindingDoc): a peer's age is its check's started_at in its own document.
    seen_at: float | None = None

    def to_diagnose_dict(self) -> dict[str, Any]:
        """``dgxdoctor diagnose --json``: the results document's finding (documents.FindingDoc) without its action
        and cure."""
        return {"code": self.code, "status": self.status.value, "subject": self.subject, "message": self.message,
                "evidence": self.evidence, "remedy": self.remedy}  # fmt: skip


class Action(Struct, frozen=True):
    """A suggested remedy. ``kind`` names what remediation could do (``restart_vllm``, ``reset_gpu``,
    ``investigate``, ...); ``remedy`` is the operator-facing text."""

    kind: str
    remedy: str


class CheckResult(Struct, frozen=True):
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
