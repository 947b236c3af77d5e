"""Verdicts on kernel log faults beyond XIDs (sources/kernel_events.py): one table, kind -> code, status, remedy.

Shared by the xid check (the followed kernel log) and ``diagnose --kind kernel-log`` (a pasted dmesg).

Severities: what breaks the tensor-parallel group now is CRITICAL (a NIC whose firmware stopped answering, a rail's
link down, a fatal or uncorrectable PCIe error on a GPU, NVSwitch or HCA, an uncorrectable memory error, the OOM
killer taking a vLLM or Ray process, the model's NFS server gone, a GPU the driver could not initialise); what
degrades or warns of worse is WARNING (corrected AER on those devices, corrected memory errors, hung tasks and soft
lockups, a link that went down and came back, GPUDirect RDMA lost). NVSentinel's NIC syslog detection treats the
mlx5 command timeout and health-poll failures as fatal too.
"""

from __future__ import annotations

from msgspec import Struct

from dgxdoctor.judge.xid import ago
from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.device_map import Device
from dgxdoctor.sources.kernel_events import KernelEvent

# Devices whose PCIe errors stall the serving group: corrected errors mean link retries there.
GROUP_ROLES = frozenset({"gpu", "nvswitch", "hca"})

# The processes of serving: vLLM (its API server, engine core and workers; "VLLM::EngineCor" is the 15-character
# comm of the title "VLLM::EngineCore"), Ray's workers and daemons (comm "ray::RayWorkerW" of
# ray::RayWorkerWrapper), and torch's main thread name.
SERVING_PROCESS_RE = lazy_compile(r"(?i)^(?:vllm|ray::|raylet|gcs_server|VllmWorker|EngineCore|pt_main_thread)")


class KernelRule(Struct, frozen=True):
    code: str
    title: str
    status: Status
    remedy: str


REMEDY_NIC_FW = (
    "the NIC's firmware stopped answering the driver: drain the node, collect `mlxdump`/`devlink health` output, "
    "then reset the NIC (`mlxfwreset -d <dev> reset`) or reboot; update the firmware if it recurs"
)
RULES: dict[str, KernelRule] = {
    "mlx5_cmd_timeout": KernelRule(
        "KERNEL_MLX5_CMD_TIMEOUT", "NIC firmware command timeout", Status.CRITICAL, REMEDY_NIC_FW
    ),
    "mlx5_health": KernelRule("KERNEL_MLX5_HEALTH", "NIC health compromised", Status.CRITICAL, REMEDY_NIC_FW),
    "mlx5_fatal": KernelRule("KERNEL_MLX5_FATAL", "NIC fatal firmware error", Status.CRITICAL, REMEDY_NIC_FW),
    "link_down": KernelRule(
        "KERNEL_LINK_DOWN", "link down", Status.CRITICAL,
        "the rail lost its link: check the cable and transceiver on both ends and the switch port (`ibstat`, "
        "`mlxlink -d <dev> -m`); NCCL traffic on this rail fails or falls back",
    ),
    "module_event": KernelRule(
        "KERNEL_MODULE_EVENT", "cable/module fault", Status.CRITICAL,
        "the transceiver or cable was pulled or failed: reseat or replace it (`mlxlink -d <dev> -m` shows the module)",
    ),
    "aer_fatal": KernelRule(
        "KERNEL_AER_FATAL", "fatal PCIe error", Status.CRITICAL,
        "a fatal PCIe error: drain the node and reboot it; reseat the device and check its riser if it recurs",
    ),
    "aer_nonfatal": KernelRule(
        "KERNEL_AER_NONFATAL", "uncorrectable PCIe error", Status.CRITICAL,
        "an uncorrectable PCIe error: drain the node, check the device with `lspci -vvv -s <addr>` and reboot",
    ),
    "aer_corrected": KernelRule(
        "KERNEL_AER_CORRECTED", "corrected PCIe errors", Status.WARNING,
        "the PCIe link retries (a marginal link): watch `lspci -vvv` AER counters; reseat if they keep growing",
    ),
    "mce": KernelRule(
        "KERNEL_MCE", "machine check", Status.WARNING,
        "the CPU or memory reported a hardware error: `ras-mc-ctl --errors` or `mcelog --client` says which",
    ),
    "edac_ce": KernelRule(
        "KERNEL_EDAC_CE", "corrected memory errors", Status.WARNING,
        "a DIMM corrects errors: schedule its replacement before it fails (`ras-mc-ctl --error-count`)",
    ),
    "edac_ue": KernelRule(
        "KERNEL_EDAC_UE", "uncorrectable memory error", Status.CRITICAL,
        "an uncorrectable memory error: drain the node and replace the DIMM the line names",
    ),
    "hung_task": KernelRule(
        "KERNEL_HUNG_TASK", "hung task", Status.WARNING,
        "a task is stuck in the kernel (often I/O: NFS, a driver call): `cat /proc/<pid>/stack`, check storage",
    ),
    "soft_lockup": KernelRule(
        "KERNEL_SOFT_LOCKUP", "soft lockup", Status.WARNING,
        "a CPU spun in the kernel for seconds: check the stack trace that follows it in dmesg",
    ),
    "oom_kill": KernelRule(
        "KERNEL_OOM_KILL", "host OOM kill", Status.WARNING,
        "the host ran out of memory: lower vLLM's swap_space/cpu offload or Ray's object store, or add memory",
    ),
    "nfs_not_responding": KernelRule(
        "KERNEL_NFS_NOT_RESPONDING", "NFS server not responding", Status.CRITICAL,
        "the NFS server stopped answering: model loads and checkpoints hang until it returns; check the server and "
        "the storage network",
    ),
    "nvrm_init_failed": KernelRule(
        "KERNEL_NVRM_INIT_FAILED", "GPU failed to initialise", Status.CRITICAL,
        "the driver could not initialise the GPU: check `nvidia-smi -q`, the GSP firmware and the PCIe link; "
        "reboot, then contact NVIDIA support with nvidia-bug-report.sh",
    ),
    "nvrm_api_mismatch": KernelRule(
        "KERNEL_NVRM_API_MISMATCH", "driver API mismatch", Status.CRITICAL,
        "the user-space driver and the kernel module differ (a half-done upgrade): reboot, or reload the modules",
    ),
    "nvswitch_fatal": KernelRule(
        "KERNEL_NVSWITCH_FATAL", "NVSwitch fatal error", Status.CRITICAL,
        "an NVSwitch failed: stop the NVLink workload and reset the fabric (reboot); contact NVIDIA support",
    ),
    "peermem_load_failed": KernelRule(
        "KERNEL_PEERMEM_LOAD_FAILED", "nvidia_peermem failed to load", Status.WARNING,
        "GPUDirect RDMA is off: nvidia_peermem needs MOFED's ib_core (reinstall the driver after MOFED), or use "
        "dma-buf with the open kernel module; NCCL stages through host memory meanwhile",
    ),
}  # fmt: skip


class KernelVerdict(Struct, frozen=True):
    code: str
    status: Status
    title: str
    remedy: str


def assess_kernel(
    kind: str, role: str | None, process: str | None = None, recovered: bool = False, trusted: bool = True
) -> KernelVerdict:
    """The verdict on one (kind, device): ``role`` of the device it names (gpu, nvswitch, hca, pci ...),
    ``process`` the task it names, ``recovered`` when a later line reported the recovery (link up, NFS OK),
    ``trusted`` False when the task is another user's (its name alone makes no serving process: anyone can run a
    program named vllm)."""
    rule = RULES[kind]
    status, title, remedy = rule.status, rule.title, rule.remedy
    if kind == "oom_kill" and process and trusted and SERVING_PROCESS_RE.match(process):
        status, title = Status.CRITICAL, "host OOM killed a serving process"
    elif kind in ("aer_corrected", "aer_nonfatal") and role not in GROUP_ROLES:
        status = Status.WARNING if kind == "aer_nonfatal" else Status.OK
    if recovered and kind == "link_down":
        return KernelVerdict("KERNEL_LINK_FLAPPED", Status.WARNING, "link went down and came back", remedy)
    if recovered and kind == "nfs_not_responding":
        return KernelVerdict(rule.code, Status.WARNING, "NFS server stopped responding, then recovered", rule.remedy)
    return KernelVerdict(rule.code, status, title, remedy)


def kernel_finding(verdict: KernelVerdict, subject: str | None, where: str, count: int, ago_text: str | None,
                   detail: str, line: str) -> Finding:  # fmt: skip
    """One finding per (kind, device): the title, where, how often, and the latest line as evidence."""
    where_text = f" on {where}" if where else ""
    latest = f", latest {ago_text}" if ago_text else ""
    said = f" ({detail})" if detail else ""
    message = f"{verdict.title}{where_text}{said}: {count} time(s){latest}"
    return Finding(verdict.code, verdict.status, message, subject or None, evidence=line, remedy=verdict.remedy)


# ---- tallies per (kind, device), as the live check and diagnose keep them ----

RECOVERS = {"link_up": "link_down", "nfs_ok": "nfs_not_responding"}


class KernelTally(Struct):
    count: int
    last_seen: float
    event: KernelEvent
    device: Device | None
    recovered_at: float | None = None


def tally_finding(kind: str, tally: KernelTally, now: float | None, owners: frozenset[int] | None = None) -> Finding:
    """``owners``: the users whose tasks may be serving ones (``procfs.trusted_uids``); None: any (a pasted log of
    another host). A line without its task's uid (kernels before 5.x) is judged by the name."""
    device = tally.device
    event = tally.event
    role = device.role if device else None
    uid = event.uid if isinstance(event.uid, int) else None
    trusted = owners is None or uid is None or uid in owners
    verdict = assess_kernel(kind, role, event.process, tally.recovered_at is not None, trusted)
    where = device.text if device else ""
    detail = event.detail
    if event.process:
        owner = "" if trusted else f" of uid {uid}, not a serving user"
        detail = f"{event.process}, pid {event.pid}{owner}" + (f", {detail}" if detail else "")
    age = ago(now - tally.last_seen) if now is not None else None
    return kernel_finding(verdict, device.label if device else None, where, tally.count, age, detail, event.line)
