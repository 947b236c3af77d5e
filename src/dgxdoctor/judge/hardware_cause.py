"""A peer's hardware and driver faults, relayed: the findings of a peer's ``/state`` that its judge marked
``Cure.HARDWARE`` (judge.consequence) become PEER_HARDWARE_FAULT findings of this node's peer_compare check, so this
node's remediation does not restart the group they share (remediation/hardware_gate.py reads them as causes).

With Prometheus as the cluster view no peer's ``/state`` is fetched: the daemon reads the critical findings of the
other nodes of its serving group from Prometheus (``fleet.prom_fleet``, code and subject, no cure, no message) and
relays them through the same ``peer_cause_findings`` into remediation's hardware gate.

Nothing is re-judged here: the peer's document says what follows from each of its findings (``cure``), as this
node's own results do. A peer of the release before findings carried it (results schema 1) sends no ``cure``: that
is unknown, never "no hardware fault": its critical finding is read with this node's table (judge.consequence), and a
critical XID or SXID, whose class only the peer's catalog decided, counts as a hardware cause (the cautious side: a
refused restart pages a person, a restart under a lost GPU only fails again).
"""

from __future__ import annotations

from dgxdoctor.judge.consequence import of_code
from dgxdoctor.result import Cure, Finding, Status

# What the peer_compare check relays of a peer's causes; remediation/hardware_gate.py names it in its pages.
PEER_CAUSE_CODE = "PEER_HARDWARE_FAULT"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def peer_causes(doc: dict[str, object]) -> list[str]:
    """The causes in a peer's /state document, each as "XID 79 on 0000:3b:00 of dgx-b" or "<CODE> on dgx-b: <msg>"."""
    node = str(doc.get("node", "the peer"))
    out: list[str] = []
    checks = doc.get("checks")
    for check in checks if isinstance(checks, list) else []:
        findings = check.get("findings") if isinstance(check, dict) else None
        for f in findings if isinstance(findings, list) else []:
            if not isinstance(f, dict):
                continue
            code, subject = str(f.get("code", "")), _text(f.get("subject"))
            if f.get("status") != Status.CRITICAL.value or _cure(f.get("cure"), code) is not Cure.HARDWARE:
                continue
            if code.startswith(("XID_", "SXID_")):
                family, number = code.split("_", 1)
                out.append(f"{family} {number} on {subject} of {node}")
            elif f.get("message"):
                out.append(f"{code} on {node}: {f.get('message')}")
            else:  # a document from Prometheus's labels: no message, the subject names the part
                out.append(f"{code} on {subject or 'the node'} of {node}")
    return out


def _cure(sent: object, code: str) -> Cure | None:
    """The cure the peer sent; where it sent none (schema 1), this node's verdict for a critical ``code``."""
    if sent is not None:
        return next((c for c in Cure if c.value == sent), None)
    if code.startswith(("XID_", "SXID_")):
        return Cure.HARDWARE
    return of_code(code, Status.CRITICAL).cure


def peer_cause_findings(state: dict[str, object], peer: str) -> list[Finding]:
    """The peer's causes as PEER_HARDWARE_FAULT findings of the peer_compare check: ``Cure.HARDWARE``, so this node's
    remediation refuses restarts while they last; WARNING, because the peer's own agent is the one that pages."""
    return [
        Finding(PEER_CAUSE_CODE, Status.WARNING, cause, subject=peer, cure=Cure.HARDWARE,
                remedy="the peer's hardware fault stops the tensor-parallel group: see that node's findings")
        for cause in peer_causes(state)
    ]  # fmt: skip
