"""No restart that cannot help: while this node or its peer has a hardware or driver fault that a restart does not
cure, a vLLM or cluster restart is refused and one page names the serving symptom and its hardware cause.

A restart of vLLM on a GPU that fell off the bus (XID 79), a GPU that NVML lost, an NVSwitch node whose fabric
manager is down, or a group whose IB rail is down only fails again, burns the restart budget and hides the cause.
The causes are the findings of the checks' latest results that judge/ marked ``Cure.HARDWARE`` (judge.consequence:
XIDs needing a GPU reset or a reboot, fatal SXIDs, the kernel's link-down and NIC firmware faults, lost GPUs, the
fabric manager down, IB ports down), and the peer's: as the mesh's peer_compare check relays them, or with
Prometheus as the cluster view from the critical findings of the other nodes of this node's serving group
(PEER_HARDWARE_FAULT, judge/hardware_cause.py, relayed by the daemon from fleet.prom_fleet).
``HardwareGate.apply`` turns restart decisions into refusals and says which page to send, once per (problem, cause)
while the cause lasts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from msgspec import Struct
from msgspec.structs import replace

from dgxdoctor.judge.consequence import symptom as symptom_of
from dgxdoctor.judge.hardware_cause import PEER_CAUSE_CODE
from dgxdoctor.remediation.guard import Decision
from dgxdoctor.remediation.policy import RESTARTS, Problem
from dgxdoctor.result import CheckResult, Cure, Finding


class HardwareCause(Struct, frozen=True):
    """``text``: "XID 79 on GPU 3 of dgx-a at 12:03 UTC"; ``key`` identifies it while it lasts."""

    key: str
    text: str
    finding: Finding


def _bus_key(bus: str) -> str:
    """``00000000:3B:00.0`` and ``0000:3b:00`` alike: bus and device, lower case."""
    return ":".join(bus.lower().split(".")[0].split(":")[-2:])


def _gpu_name(results: Mapping[str, CheckResult], bus: str) -> str:
    # The checks' own metric definitions, imported here: `dgxdoctor remediation status` and the config load
    # remediation without any check (test_check_settings_typed); a refusal is the rare path that needs them.
    from dgxdoctor.checks.gpu import GPU_INFO

    gpu = results.get("gpu")
    if gpu is not None:
        for s in gpu.samples:
            if s.metric.name == GPU_INFO.name and _bus_key(s.labels.get("pci_bus_id", "")) == _bus_key(bus):
                return f"GPU {s.labels.get('gpu')}"
    return f"GPU {bus}"


def _xid_when(result: CheckResult, bus: str, code: int) -> str:
    from dgxdoctor.checks.xid import XID_LAST_SEEN  # as in _gpu_name

    for s in result.samples:
        named = s.labels.get("pci_bus_id") == bus and s.labels.get("xid") == str(code)
        if s.metric.name == XID_LAST_SEEN.name and named and s.value is not None:
            return " at " + time.strftime("%H:%M UTC", time.gmtime(s.value))
    return ""


def _cause(node: str, results: Mapping[str, CheckResult], result: CheckResult, f: Finding) -> HardwareCause | None:
    if f.cure is not Cure.HARDWARE:
        return None
    if f.code == PEER_CAUSE_CODE:
        return _relayed(f)
    if f.code.startswith(("XID_", "SXID_")):
        number = f.code.split("_", 1)[1]
        family = "XID" if f.code.startswith("XID_") else "SXID"
        where = _gpu_name(results, f.subject or "") if family == "XID" else (f.subject or "an NVSwitch")
        when = _xid_when(result, f.subject or "", int(number)) if family == "XID" and number.isdigit() else ""
        return HardwareCause(f"{node}:{f.code}:{f.subject}", f"{family} {number} on {where} of {node}{when}", f)
    return HardwareCause(f"{node}:{f.code}:{f.subject}", f"{f.code} on {node}: {f.message}", f)


def _relayed(f: Finding) -> HardwareCause:
    """A peer's cause as relayed (PEER_HARDWARE_FAULT: the message names the fault, the subject the peer)."""
    return HardwareCause(f"peer:{f.subject}:{f.message}", f.message, f)


def causes(results: Mapping[str, CheckResult], node: str, relayed: Iterable[Finding] = ()) -> list[HardwareCause]:
    """The active hardware and driver causes in this node's latest results (the peer's, as the mesh's peer_compare
    relays them), and ``relayed``: the PEER_HARDWARE_FAULT findings relayed from beyond the results (with
    Prometheus as the cluster view, the group's, judge.hardware_cause)."""
    found: dict[str, HardwareCause] = {}
    for result in results.values():
        for finding in result.findings:
            cause = _cause(node, results, result, finding)
            if cause is not None:
                found.setdefault(cause.key, cause)
    for f in relayed:
        if f.code == PEER_CAUSE_CODE and f.cure is Cure.HARDWARE:
            cause = _relayed(f)
            found.setdefault(cause.key, cause)
    return list(found.values())


def symptom(problem: Problem, node: str) -> str:
    """The serving symptom in a page's words: the judge's for the finding's code, the code, or the alert."""
    return f"{symptom_of(problem.code) or problem.code or problem.reason} on {node}"


class HardwareGate:
    """Remembers which (problem, cause) pairs were paged, so one page goes out per pair while the cause lasts."""

    def __init__(self) -> None:
        self.paged: set[tuple[str, str]] = set()

    def forget(self, active: set[str]) -> None:
        """Forget the pages of causes no longer active (by key): the cause's next episode is paged again."""
        self.paged = {p for p in self.paged if p[1] in active}

    def apply(
        self, decisions: Sequence[Decision], found: Iterable[HardwareCause], node: str
    ) -> tuple[list[Decision], list[Decision]]:
        """(decisions with the restarts refused, the pages to send); unchanged when there is no cause."""
        active = list(found)
        if not active:
            self.paged.clear()
            return list(decisions), []
        keys = {c.key for c in active}
        self.paged = {p for p in self.paged if p[1] in keys}
        cause = active[0]
        out: list[Decision] = []
        pages: list[Decision] = []
        for d in decisions:
            if d.action not in RESTARTS or d.problem.action not in RESTARTS:
                out.append(d)
                continue
            message = f"{symptom(d.problem, node)}; cause: {cause.text}"
            reason = f"a restart cannot help: {message} ({cause.finding.code})"
            out.append(replace(d, verdict="refuse", reason=reason))
            if (d.problem.key, cause.key) not in self.paged:
                self.paged.add((d.problem.key, cause.key))
                pages.append(Decision("page", "page", message, replace(d.problem, action="page")))
        return out, pages
