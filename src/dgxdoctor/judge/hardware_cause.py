"""Which findings are hardware or driver faults that no restart of vLLM or Ray cures: the one table read by the
remediation gate (remediation/hardware_gate.py) on this node's results and by peer_compare on a peer's /state.

An XID is a cause when judge/xid.py's verdict on it is a GPU reset or a reboot (XID 79, 48, 94/95 ... ; not the
application's 13/31/43/45); an SXID when it is fatal. The other causes are named by code below.
"""

from __future__ import annotations

from dgxdoctor.judge.xid import assess_sxid, assess_xid
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.xid import SxidEvent, XidEvent, load_catalog, parse_sxid_line, parse_xid_line

CAUSE_CODES = frozenset(
    {
        "GPU_LOST",  # NVML lost the GPU (gpu check)
        "GPU_MISSING_FROM_NVML",
        "GPU_NOT_VISIBLE",
        "DRIVER_FABRIC_MANAGER_DOWN",  # an NVSwitch node without its fabric manager (driver_stack check)
        "DRIVER_FABRIC_NOT_READY",  # NVML: a GPU not (yet) on the NVSwitch fabric
        "IB_PORT_DOWN",  # a rail of the group down (infiniband check)
        "IB_PORTS_MISSING",
        "KERNEL_LINK_DOWN",  # the kernel's view of the same (xid check, kernel faults)
        "KERNEL_MODULE_EVENT",
        "KERNEL_MLX5_CMD_TIMEOUT",
        "KERNEL_MLX5_HEALTH",
        "KERNEL_MLX5_FATAL",
        "KERNEL_AER_FATAL",
        "KERNEL_NVRM_INIT_FAILED",
        "KERNEL_NVSWITCH_FATAL",
    }
)


def _xid_needs_reset_or_reboot(code: str, subject: str | None, evidence: str | None) -> bool:
    """judge/xid.py's verdict on the finding's own line when there is one, else on its code."""
    event: XidEvent | SxidEvent | None = None
    if evidence:
        event = parse_xid_line(evidence) or parse_sxid_line(evidence)
    number = code.split("_", 1)[1]
    if event is None and number.isdigit():
        if code.startswith("XID_"):
            event = XidEvent(subject or "", int(number), "")
        else:
            return False  # an SXID without its line: fatal or not is unknown; its own agent pages for it
    if isinstance(event, XidEvent):
        return assess_xid(event, load_catalog().xid(event.xid)).action in ("reset_gpu", "reboot_node")
    if isinstance(event, SxidEvent):
        return assess_sxid(event, load_catalog().sxid(event.sxid)).action == "reboot_node"
    return False


def is_hardware_cause(code: str, status: Status | str, subject: str | None, evidence: str | None = None) -> bool:
    """True for a CRITICAL finding that a restart cannot cure."""
    if status not in (Status.CRITICAL, Status.CRITICAL.value):
        return False
    if code.startswith(("XID_", "SXID_")):
        return _xid_needs_reset_or_reboot(code, subject, evidence)
    return code in CAUSE_CODES


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
            if not is_hardware_cause(code, str(f.get("status", "")), subject, _text(f.get("evidence"))):
                continue
            if code.startswith(("XID_", "SXID_")):
                family, number = code.split("_", 1)
                out.append(f"{family} {number} on {subject} of {node}")
            else:
                out.append(f"{code} on {node}: {f.get('message', '')}")
    return out


def peer_cause_findings(state: dict[str, object], peer: str) -> list[Finding]:
    """The peer's causes as PEER_HARDWARE_FAULT findings of the peer_compare check, so this node's remediation does
    not restart the group they share. WARNING here: the peer's own agent is the one that pages for its fault."""
    return [
        Finding("PEER_HARDWARE_FAULT", Status.WARNING, cause, subject=peer,
                remedy="the peer's hardware fault stops the tensor-parallel group: see that node's findings")
        for cause in peer_causes(state)
    ]  # fmt: skip
