"""What follows from a finding: its action (none, restart_vllm, restart_cluster, page) and whether a restart can cure
it (``result.Cure``), decided here once and carried on the finding (``Finding.action``, ``Finding.cure``).

Remediation's policy and hardware gate, the peer comparison (a peer's causes) and the generated alert rules read
these fields or this table; none of them keeps a list of codes of its own. The XID and SXID verdicts decide theirs
from their assessment (``of_xid``, ``of_sxid``, called by judge/xid.py); every other finding's comes from ``TABLE``
by its code, for a CRITICAL finding only: a warning asks for nothing. ``judged`` applies it: the verdict shapes
build their findings through it (``Signature.finding``, the infiniband ``StateVerdict.finding``), and the check
runner (checks/base.py) passes every result through it, so every finding reaches the store, ``/state`` and a peer
with it.
``tests/unit/test_consequences.py`` walks every code here through the check's status, the alert rules and
remediation.
"""

from __future__ import annotations

from collections.abc import Mapping

from msgspec import Struct
from msgspec.structs import replace

from dgxdoctor import codes
from dgxdoctor.result import CheckResult, Cure, Finding, FindingAction, Status

# An XID or SXID verdict's action that is a person's work (judge/xid.py's ActionKind): no restart performs it.
PERSON_ACTIONS = frozenset({"reset_gpu", "reboot_node", "contact_support"})
# Of those, the GPU or the node itself is broken: while it lasts a restart of vLLM or Ray only fails again.
RESET_OR_REBOOT = frozenset({"reset_gpu", "reboot_node"})


class Consequence(Struct, frozen=True):
    """What follows from a critical finding of one code. ``check``: the check that reports it (for a code more than
    one reports, the one the alert rules read). ``symptom``: how a page names what serving shows ("vLLM down")."""

    action: FindingAction = "none"
    cure: Cure = Cure.NA
    check: str = ""
    symptom: str = ""


NOTHING = Consequence()


def _rows(check: str, action: FindingAction, cure: Cure, *found: str | tuple[str, str]) -> dict[str, Consequence]:
    """``found``: codes, or (code, symptom) pairs."""
    out = {}
    for item in found:
        code, symptom = item if isinstance(item, tuple) else (item, "")
        out[code] = Consequence(action, cure, check, symptom)
    return out


RESTART_VLLM: FindingAction = "restart_vllm"
RESTART_CLUSTER: FindingAction = "restart_cluster"
PAGE: FindingAction = "page"
NONE: FindingAction = "none"

TABLE: Mapping[str, Consequence] = {
    # vllm check: refused connection (dead), /health timing out while idle (hung), /health 200 with work queued and
    # no token counter moving for stall_s (engine hung: a KV or queue stall with no progress).
    **_rows("vllm", RESTART_VLLM, Cure.RESTART, (codes.VLLM_DEAD, "vLLM down"), (codes.VLLM_HUNG, "vLLM hung"),
            (codes.ENGINE_HUNG, "vLLM engine hung")),
    # ray check: a node DEAD, fewer nodes or GPUs than planned (the tutorial's "GPU 8 of 16"), the local raylet gone.
    **_rows("ray", RESTART_CLUSTER, Cure.RESTART, (codes.RAY_NODE_DEAD, "a Ray node dead"),
            (codes.RAY_NODES_MISSING, "Ray nodes missing"), (codes.RAY_GPUS_MISSING, "Ray GPUs missing"),
            (codes.RAY_RAYLET_DOWN, "the raylet down")),
    # logs check (data/signatures.toml): a collective between the nodes failed; a worker or the driver lost the GCS
    # (the head's control store) and exited.
    **_rows("logs", RESTART_CLUSTER, Cure.RESTART, codes.NCCL_NET_FAILURE, codes.NCCL_NETWORK_ERROR,
            codes.NCCL_TIMEOUT, codes.NCCL_SYSTEM_ERROR, codes.GLOO_SOCKET, "RAY_GCS_UNREACHABLE"),
    # The head's peer comparison: a worker of an mp deployment whose headless vLLM is gone or stopped (restarted in
    # the mp order). The head's remediation reads it from its own results: no alert carries it.
    **_rows("peer_compare", RESTART_CLUSTER, Cure.RESTART, "PEER_MP_WORKER_DOWN"),
    # No restart cures these; a person does (paged, never acted on).
    **_rows("infiniband", PAGE, Cure.PERSON, codes.IB_PORT_DISABLED, codes.IB_PORT_NOT_ACTIVE,
            codes.IB_LINK_FLAPPING),
    **_rows("peer_compare", PAGE, Cure.PERSON, codes.PEER_HARDWARE_DRIFT, codes.PEER_VERSION_SKEW,
            codes.PEER_MODEL_MISMATCH, "PEER_MP_LAYOUT_DRIFT"),
    # logs check signatures: version drift between the nodes, a GPU or driver fault, the container's /dev/shm or
    # GPU set-up, the host's RAM (not a CUDA OOM), an unreachable MASTER_ADDR, a corrupt checkpoint (no restart
    # reads the file back whole). The CUDA runtime's and libraries' errors (CUDA_RUNTIME_ERROR, _LIBRARY_ERROR) ask
    # nothing here: the serving process dies with them and VLLM_DEAD restarts it, as an application XID.
    **_rows("logs", PAGE, Cure.PERSON, "RAY_VERSION_MISMATCH", "CUDA_ECC_ERROR", "CUDA_DRIVER_INIT",
            "NO_GPU_VISIBLE", "CUDA_P2P_UNSUPPORTED", "NCCL_DUPLICATE_GPU", "SHM_TOO_SMALL", "RAY_HOST_OOM",
            "TORCH_RENDEZVOUS_TIMEOUT", "CHECKPOINT_LOAD_FAILED"),
    # Hardware and driver faults: paged, and while they last no restart is run (remediation/hardware_gate.py).
    **_rows("infiniband", PAGE, Cure.HARDWARE, codes.IB_PORT_DOWN),  # a rail of the group down
    **_rows("gpu", PAGE, Cure.HARDWARE, "GPU_LOST"),  # NVML lost the GPU (the logs check's signature too)
    # Faults of the same kind that remediation does not page by themselves: the alert rules do (the kernel's and the
    # fabric manager's own, DgxdoctorCheckCritical for the rest); remediation names them as the cause of a restart
    # it refuses.
    **_rows("gpu", NONE, Cure.HARDWARE, "GPU_MISSING_FROM_NVML", "GPU_NOT_VISIBLE"),
    # An NVSwitch node without its fabric manager; NVML: a GPU not (yet) on the NVSwitch fabric.
    **_rows("driver_stack", NONE, Cure.HARDWARE, "DRIVER_FABRIC_MANAGER_DOWN", "DRIVER_FABRIC_NOT_READY"),
    **_rows("infiniband", NONE, Cure.HARDWARE, "IB_PORTS_MISSING"),
    # The kernel's view (the xid check's kernel faults, judge/kernel.py): links down, NIC firmware, fatal AER ...
    **_rows("xid", NONE, Cure.HARDWARE, "KERNEL_LINK_DOWN", "KERNEL_MODULE_EVENT", "KERNEL_MLX5_CMD_TIMEOUT",
            "KERNEL_MLX5_HEALTH", "KERNEL_MLX5_FATAL", "KERNEL_MLX5_PROBE_FAILED", "KERNEL_AER_FATAL",
            "KERNEL_AER_UNRECOVERED", "KERNEL_NVRM_INIT_FAILED", "KERNEL_NVSWITCH_FATAL"),
}  # fmt: skip


def of_code(code: str, status: Status) -> Consequence:
    """What follows from a finding of ``code`` at ``status`` (not an XID's or SXID's: those decide their own)."""
    if status is not Status.CRITICAL:
        return NOTHING
    return TABLE.get(code, NOTHING)


def of_xid(status: Status, kind: str) -> Consequence:
    """An XID verdict (its status and action kind): a critical one that is a person's work is paged; a reset or a
    reboot also means no restart helps while it lasts. The application's XIDs ask for nothing here: the serving
    process dies with them and VLLM_DEAD restarts it."""
    if status is not Status.CRITICAL or kind not in PERSON_ACTIONS:
        return NOTHING
    return Consequence(PAGE, Cure.HARDWARE if kind in RESET_OR_REBOOT else Cure.PERSON, "xid")


def of_sxid(status: Status, kind: str) -> Consequence:
    """A fatal SXID (the NVSwitch fabric needs a reboot): no restart helps while it lasts. Remediation pages it only
    as the cause of a restart it refuses."""
    if status is not Status.CRITICAL or kind not in RESET_OR_REBOOT:
        return NOTHING
    return Consequence(NONE, Cure.HARDWARE, "xid")


def judged(finding: Finding) -> Finding:
    """The finding with what follows from it: as its verdict set it (an XID's, a peer's relayed cause), else the
    table's for its code and status."""
    if finding.action != "none" or finding.cure is not Cure.NA:
        return finding
    found = of_code(finding.code, finding.status)
    if found.action == "none" and found.cure is Cure.NA:
        return finding
    return replace(finding, action=found.action, cure=found.cure)


def judged_result(result: CheckResult) -> CheckResult:
    """``judged`` over a result's findings (the same object when nothing changes)."""
    findings = tuple(judged(f) for f in result.findings)
    if all(new is old for new, old in zip(findings, result.findings, strict=True)):
        return result
    return replace(result, findings=findings)


def symptom(code: str | None) -> str | None:
    """How a page names the serving symptom a finding of ``code`` stands for; None when the table has no words."""
    found = TABLE.get(code) if code is not None else None
    return found.symptom or None if found is not None else None
