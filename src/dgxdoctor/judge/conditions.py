"""Node conditions in node-problem-detector's format, from a node's results: the one table from finding code to
condition (``CONDITIONS``), and the verdict over a results document (``node_conditions``).

A condition is True while a CRITICAL finding of one of its codes is in the results (its reason the code in
CamelCase, ``IB_PORT_DOWN`` -> ``IbPortDown``; its message the subject and the finding's words), False when none is
and every check it is read from answered, Unknown when one of those checks is UNKNOWN (a missing source is never
"no problem") or when there are no results at all. The peer comparison's findings count only where they name this
node (``about_this_node``): a condition is this node's. A CRITICAL finding no row names sets ``DgxdoctorCritical``, so
no fault is missing from the conditions. Warnings set none: a condition is what draino, the Node Readiness
Controller or a cloud's auto-repair act on.

``tests/unit/test_conditions.py`` walks every finding code (the consequence table, the kernel rules, the log
signatures, the XID catalog) and holds each critical hardware or fabric code to a row of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from msgspec import Struct

from dgxdoctor import codes
from dgxdoctor.documents import ResultsDocument

ConditionStatus = Literal["True", "False", "Unknown"]
MAX_MESSAGE = 1024  # Kubernetes keeps the message short; the daemon's /state has the whole of each finding


class ConditionRule(Struct, frozen=True):
    """One condition: its type, what it says while False, the checks it is read from, its codes."""

    type: str
    ok_reason: str
    ok_message: str
    checks: tuple[str, ...]
    codes: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    def matches(self, code: str) -> bool:
        return code in self.codes or code.startswith(self.prefixes)


def _rule(type_: str, ok_reason: str, ok_message: str, checks: tuple[str, ...], *found: str,
          prefixes: tuple[str, ...] = ()) -> ConditionRule:  # fmt: skip
    return ConditionRule(type_, ok_reason, ok_message, checks, frozenset(found), prefixes)


CONDITIONS: tuple[ConditionRule, ...] = (
    _rule("GpuXidCritical", "NoCriticalXid", "no critical XID on any GPU", ("xid",), prefixes=(codes.XID_PREFIX,)),
    _rule("GpuMissing", "AllGpusPresent", "every expected GPU is visible to the driver and NVML",
          ("gpu", "topology", "logs"), "GPU_LOST", "GPU_MISSING_FROM_NVML", "GPU_NOT_VISIBLE", "GPU_COUNT_MISMATCH",
          "GPU_REQUIRED_MISSING", "GPU_NVML_INIT_FAILED", "GPU_NVML_MISSING", "GPU_DRIVER_NOT_LOADED",
          "GPU_UNREADABLE", "NO_GPU_VISIBLE", "TOPO_GPU_COUNT"),
    _rule("GpuHardwareFault", "GpusHealthy", "no uncorrected memory error, PCIe fault or critical temperature",
          ("gpu", "xid", "logs"), "GPU_ECC_UNCORRECTED", "GPU_ROW_REMAP_FAILED", "GPU_ROW_REMAP_PENDING",
          "GPU_RETIRED_PAGES_PENDING", "GPU_RECOVERY_ACTION", "GPU_TEMPERATURE_CRITICAL", "GPU_HW_SLOWDOWN",
          "GPU_HW_THERMAL_SLOWDOWN", "GPU_HW_POWER_BRAKE", "GPU_PCIE_GEN_DEGRADED", "GPU_PCIE_WIDTH_DEGRADED",
          "CUDA_ECC_ERROR", "CUDA_DRIVER_INIT", "KERNEL_NVRM_INIT_FAILED", "KERNEL_AER_FATAL", "KERNEL_AER_NONFATAL",
          "KERNEL_AER_UNRECOVERED"),
    _rule("NvlinkFabricDegraded", "NvlinkFabricHealthy", "NVLinks up, NVSwitch fabric and fabric manager running",
          ("xid", "driver_stack", "gpu", "topology"), "KERNEL_NVSWITCH_FATAL", "DRIVER_FABRIC_MANAGER_DOWN",
          "DRIVER_FABRIC_NOT_READY", "NVLINK_DOWN", "TOPO_NVLINK_DEGRADED", "TOPO_GPU_PAIR_NOT_NVLINK",
          prefixes=(codes.SXID_PREFIX,)),
    _rule("DriverMismatch", "DriverStackConsistent", "driver, kernel module and GPUDirect RDMA agree",
          ("gpu", "xid", "driver_stack", "peer_compare", "logs"), "GPU_DRIVER_MISMATCH", "KERNEL_NVRM_API_MISMATCH",
          "KERNEL_PEERMEM_LOAD_FAILED", "DRIVER_GPUDIRECT_RDMA_OFF", "DRIVER_PERSISTENCED_DOWN",
          codes.PEER_VERSION_SKEW, "RAY_VERSION_MISMATCH"),
    _rule("RdmaPortDown", "RdmaPortsActive", "every RDMA port the node needs is Active at its rate",
          ("infiniband", "xid", "mlxlink", "nccl_env"), codes.IB_PORT_DOWN, codes.IB_PORT_DISABLED,
          codes.IB_PORT_NOT_ACTIVE, codes.IB_LINK_FLAPPING, "IB_PORTS_MISSING", "IB_REQUIRED_MISSING",
          "IB_DRIVER_NOT_LOADED", "IB_PORT_RATE_LOW", "IB_PORT_STATE_UNREADABLE", "IB_EFFECTIVE_BER_HIGH",
          "IB_MODULE_TEMPERATURE_HIGH", "KERNEL_LINK_DOWN", "KERNEL_LINK_FLAPPED", "KERNEL_MODULE_EVENT",
          "KERNEL_MLX5_CMD_TIMEOUT", "KERNEL_MLX5_HEALTH", "KERNEL_MLX5_FATAL", "KERNEL_MLX5_PROBE_FAILED",
          "NCCL_IB_HCA_MISSING", "NCCL_IB_PORT_MISSING", "NCCL_IFNAME_DOWN"),
    _rule("NcclNetworkFailure", "NcclNetworkHealthy", "collectives between the nodes run at their bandwidth",
          ("logs", "nccl", "ras"), codes.NCCL_NET_FAILURE, codes.NCCL_NETWORK_ERROR, codes.NCCL_SYSTEM_ERROR,
          codes.GLOO_SOCKET, "NCCL_PEER_PROBE_FAILED", "NCCL_PROBE_FAILED", "NCCL_BANDWIDTH_LOW",
          "NCCL_CROSS_HOST_BUSBW_LOW", "NCCL_TESTS_LOW_BUSBW", "NCCL_TESTS_WRONG_RESULTS", "NCCL_RAIL_DEGRADED",
          "NCCL_SOCKET_FALLBACK"),
    _rule("NcclRankDead", "NcclRanksAlive", "every rank of the serving communicator answers",
          ("ras", "logs", "peer_compare", "vllm_executor"), "RAS_RANK_DEAD", "RAS_RANK_UNRESPONSIVE",
          "RAS_RANK_ERROR", "RAS_RANK_BEHIND", "RAS_COLLECTIVE_TIMEOUTS", codes.NCCL_TIMEOUT, "PEER_TP_RANK_STUCK",
          "PEER_TP_RANK_STOPPED", "VLLM_MP_RANK_STOPPED"),
    _rule("ServingGroupStalled", "ServingGroupProgressing", "the serving group's engine makes progress, all its "
          "nodes present", ("vllm", "ray", "vllm_executor", "peer_compare", "logs"), codes.ENGINE_HUNG,
          codes.ENGINE_NO_PROGRESS, "ENGINE_STUCK", codes.VLLM_HUNG, codes.RAY_NODE_DEAD, codes.RAY_NODES_MISSING,
          codes.RAY_GPUS_MISSING, codes.RAY_RAYLET_DOWN, "RAY_GCS_UNREACHABLE", "RAY_NODE_LOST", "RAY_WORKER_DIED",
          "RAY_CHANNEL_TIMEOUT", "PEER_MP_WORKER_DOWN", "VLLM_MP_HEADLESS_MISSING", "VLLM_MP_HEADLESS_STOPPED",
          "VLLM_MP_WORKERS_MISSING", "VLLM_MP_MASTER_UNREACHABLE"),
    _rule("VllmDown", "VllmServing", "vLLM answers and completes", ("vllm", "logs"), codes.VLLM_DEAD,
          "VLLM_UNHEALTHY", "VLLM_NOT_ANSWERING", "VLLM_ENGINE_DEAD", "CANARY_FAILED", "CANARY_TIMEOUT",
          "CANARY_EMPTY", "MODEL_NOT_SERVED"),
    _rule("HostHardwareFault", "HostHardwareHealthy", "no uncorrected machine check or memory error on the host",
          ("xid", "host"), "KERNEL_MCE_UNCORRECTED", "KERNEL_EDAC_UE", "KERNEL_MEMORY_FAILURE"),
    # node-problem-detector's own name for a kernel that stopped scheduling
    _rule("KernelDeadlock", "KernelHasNoDeadlock", "no hung task, soft lockup or RCU stall", ("xid",),
          "KERNEL_HUNG_TASK", "KERNEL_SOFT_LOCKUP", "KERNEL_RCU_STALL", "KERNEL_WORKQUEUE_LOCKUP"),
    _rule("StorageUnresponsive", "StorageResponding", "the NFS servers answer", ("xid",),
          "KERNEL_NFS_NOT_RESPONDING"),
)  # fmt: skip
# Every other CRITICAL finding; read from every check.
OTHER = ConditionRule("DgxdoctorCritical", "NoCriticalFinding", "no other critical finding", ())
NO_RESULTS = "DgxdoctorUnavailable"
# The check that compares this node with its peers: its findings are about the nodes' relation or another node.
PEER_CHECK = "peer_compare"


def about_this_node(check: str, subject: str | None, node: str) -> bool:
    """Whether a finding describes this node: every check's own do; the peer comparison's only where it names this
    node (a peer's stopped rank or dead worker is that peer's condition, and its drain, not ours)."""
    return check != PEER_CHECK or subject == node


class NodeCondition(Struct, frozen=True):
    """One condition as Kubernetes' NodeCondition spells it (the times are added by whoever reports it)."""

    type: str
    status: ConditionStatus
    reason: str
    message: str


def rule_of(code: str) -> ConditionRule:
    """The condition a CRITICAL finding of ``code`` sets (``OTHER`` when no row names it)."""
    return next((r for r in CONDITIONS if r.matches(code)), OTHER)


def reason_of(code: str) -> str:
    """``IB_PORT_DOWN`` -> ``IbPortDown``, ``XID_79`` -> ``Xid79``: a condition's reason is CamelCase."""
    return "".join(part[:1].upper() + part[1:].lower() for part in code.split("_") if part) or "Critical"


class _Critical(Struct, frozen=True):
    check: str
    code: str
    subject: str | None
    message: str


def _criticals(doc: ResultsDocument) -> list[_Critical]:
    return [
        _Critical(c.name, f.code, f.subject, f.message)
        for c in doc.checks
        for f in c.findings
        if f.status == "critical" and about_this_node(c.name, f.subject, doc.node)
    ]


def _true(rule: ConditionRule, found: Sequence[_Critical]) -> NodeCondition:
    first = found[0]
    words = [f"{f.subject + ': ' if f.subject else ''}{f.code}: {f.message}" for f in found]
    return NodeCondition(rule.type, "True", reason_of(first.code), "; ".join(words)[:MAX_MESSAGE])


def node_conditions(doc: ResultsDocument | None, why_none: str = "") -> list[NodeCondition]:
    """Every condition of ``CONDITIONS`` and ``OTHER`` for the results ``doc``; all Unknown when there are none."""
    rules = (*CONDITIONS, OTHER)
    if doc is None:
        return [NodeCondition(r.type, "Unknown", NO_RESULTS, why_none[:MAX_MESSAGE]) for r in rules]
    by_type: dict[str, list[_Critical]] = {}
    for found in _criticals(doc):
        by_type.setdefault(rule_of(found.code).type, []).append(found)
    unknown = [c.name for c in doc.checks if c.status == "unknown"]
    out = []
    for rule in rules:
        if rule.type in by_type:
            out.append(_true(rule, by_type[rule.type]))
            continue
        silent = [name for name in unknown if not rule.checks or name in rule.checks]
        if silent:
            message = f"cannot say: {', '.join(silent)} unknown"
            out.append(NodeCondition(rule.type, "Unknown", "CheckUnknown", message[:MAX_MESSAGE]))
        else:
            out.append(NodeCondition(rule.type, "False", rule.ok_reason, rule.ok_message))
    return out
