"""Verdicts on kernel log faults beyond XIDs (sources/kernel_events.py): one table, kind -> code, status, remedy.

Shared by the xid check (the followed kernel log) and ``diagnose --kind kernel-log`` (a pasted dmesg).

Severities: what breaks the tensor-parallel group now is CRITICAL (a NIC whose firmware stopped answering, a rail's
link down, a fatal or uncorrectable PCIe error on a GPU, NVSwitch or HCA, an uncorrectable memory error, the OOM
killer taking a vLLM or Ray process, the model's NFS server gone, a GPU or NIC the driver could not initialise, an
uncorrected machine check, a poisoned page, a PCIe error the kernel could not recover on those devices); what
degrades or warns of worse is WARNING (corrected AER on those devices, corrected memory errors and machine checks,
hung tasks, soft lockups, RCU stalls and workqueue lockups, a link that went down and came back, GPUDirect RDMA lost,
an mlx5 health report whose own severity is a warning). Each rule says why (``KernelRule.reason``).
NVSentinel's NIC syslog detection treats the mlx5 command timeout and health-poll failures as fatal too.
"""

from __future__ import annotations

from msgspec import Struct
from msgspec.structs import replace

from dgxdoctor.judge.kernel_families import assess_message
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
    """``reason``: why this status, from the kernel's own printk level and the vendor's guidance."""

    code: str
    title: str
    status: Status
    remedy: str
    reason: str = ""


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
    "mlx5_probe_failed": KernelRule(
        "KERNEL_MLX5_PROBE_FAILED", "NIC failed to initialise", Status.CRITICAL,
        "the NIC function never came up (its rail is missing): check its firmware (`mlxfwmanager --query`, "
        "`devlink health`), then reset it (`mlxfwreset`) or reboot",
        "mlx5_core_err (KERN_ERR): mlx5_load_one/handle_hca_cap failed, or the driver core's probe failure",
    ),
    "aer_unrecovered": KernelRule(
        "KERNEL_AER_UNRECOVERED", "PCIe error not recovered", Status.CRITICAL,
        "the kernel could not recover the device from an uncorrectable PCIe error: drain the node and reboot it",
        "pci/pcie/err.c: recovery failed, or the device's driver has no error handler to recover it",
    ),
    "mce_uncorrected": KernelRule(
        "KERNEL_MCE_UNCORRECTED", "uncorrected machine check", Status.CRITICAL,
        "the CPU or memory reported an uncorrected hardware error: drain the node; `ras-mc-ctl --errors` or "
        "`mcelog --client` names the bank and DIMM",
        "MCi_STATUS.UC (bit 61) set, or a firmware record of severity recoverable/fatal (cper.c)",
    ),
    "memory_failure": KernelRule(
        "KERNEL_MEMORY_FAILURE", "memory page poisoned", Status.CRITICAL,
        "a page of memory went bad and the task that touched it was killed (SIGBUS): replace the DIMM "
        "(`ras-mc-ctl --errors`); the page is offlined until then",
        "mm/memory-failure.c pr_err (KERN_ERR): an uncorrected memory error reached a task",
    ),
    "rcu_stall": KernelRule(
        "KERNEL_RCU_STALL", "RCU stall", Status.WARNING,
        "a CPU did not pass through a quiescent state for seconds (a stuck driver or interrupt storm): read the "
        "stack dump that follows it in dmesg",
        "tree_stall.h pr_err: the kernel warns and goes on; it names the CPU, not a device",
    ),
    "workqueue_lockup": KernelRule(
        "KERNEL_WORKQUEUE_LOCKUP", "workqueue lockup", Status.WARNING,
        "a kernel worker pool made no progress for seconds: read the busy workers dmesg lists after it",
        "workqueue.c pr_emerg, but the kernel goes on: a hang of some work, not a device fault by itself",
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

# Why each status (the kernel's printk level, the vendor's guidance); the rules above carry their own.
_REASONS = {
    "mlx5_cmd_timeout": "cmd.c mlx5_core_err/warn: the firmware did not complete a command; NVIDIA's NVSentinel "
    "treats it as fatal",
    "mlx5_health": "health.c: the health buffer's own severity (severity(N), a printk level); ERROR or worse is "
    "critical, WARNING is a warning",
    "mlx5_fatal": "health.c: a fatal firmware syndrome; the device is in internal error",
    "link_down": "a rail of the group down (mlx5e carrier, the IB port's state, a bond member)",
    "module_event": "events.c port_module_event: a cable or transceiver unplugged or in error",
    "aer_fatal": "aer.c: Uncorrected (Fatal): the link is reset; the device stops until recovered",
    "aer_nonfatal": "aer.c: Uncorrected (Non-Fatal) on a GPU, NVSwitch or HCA: a transaction was lost",
    "aer_corrected": "aer.c: Corrected: the hardware retried; a warning on the group's devices, ok elsewhere",
    "mce": "a corrected machine check (MCi_STATUS.UC clear) or one whose severity is not in the log",
    "edac_ce": "edac_mc.c: a corrected memory error; the DIMM's count grows toward replacement",
    "edac_ue": "edac_mc.c: an uncorrected memory error",
    "hung_task": "hung_task.c pr_err: a task stuck in the kernel; the kernel goes on",
    "soft_lockup": "watchdog.c pr_emerg: a CPU stuck; the kernel goes on unless softlockup_panic",
    "oom_kill": "oom_kill.c: critical when the victim is a serving process of a serving user, else a warning",
    "nfs_not_responding": "sunrpc: the model's storage stops answering",
    "nvrm_init_failed": "NVRM (NV_DBG_ERRORS): the driver could not initialise the GPU (RmInitAdapter, GSP, probe)",
    "nvrm_api_mismatch": "NVRM: the user-space driver and the kernel module differ",
    "nvswitch_fatal": "nvidia-nvswitch: a switch of the NVLink fabric failed",
    "peermem_load_failed": "GPUDirect RDMA unavailable: NCCL falls back, slower but working",
}
RULES = {kind: rule if rule.reason else replace(rule, reason=_REASONS[kind]) for kind, rule in RULES.items()}


class KernelVerdict(Struct, frozen=True):
    code: str
    status: Status
    title: str
    remedy: str


# printk levels: 0 emergency .. 3 error, 4 warning, 5 notice, 6 info, 7 debug.
WARNING_LEVEL = 4


def assess_kernel(
    kind: str,
    role: str | None,
    process: str | None = None,
    recovered: bool = False,
    trusted: bool = True,
    level: int | None = None,
) -> KernelVerdict:
    """The verdict on one (kind, device): ``role`` of the device it names (gpu, nvswitch, hca, pci ...),
    ``process`` the task it names, ``recovered`` when a later line reported the recovery (link up, NFS OK),
    ``trusted`` False when the task is another user's (its name alone makes no serving process: anyone can run a
    program named vllm); ``level`` the printk level the line states for itself (mlx5's health severity)."""
    rule = RULES[kind]
    status, title, remedy = rule.status, rule.title, rule.remedy
    if kind in ("oom_kill", "memory_failure") and process and trusted and SERVING_PROCESS_RE.match(process):
        status, title = Status.CRITICAL, f"{title}: a serving process killed"
        if kind == "oom_kill":
            title = "host OOM killed a serving process"
    elif kind in ("aer_corrected", "aer_nonfatal", "aer_unrecovered") and role not in GROUP_ROLES:
        status = Status.WARNING if kind != "aer_corrected" else Status.OK
    elif kind == "mlx5_health" and level is not None and level >= WARNING_LEVEL:
        status, title = Status.WARNING, "NIC health warning"
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
    if event.kind == "kernel_message":
        return _message_finding(tally, now)
    role = device.role if device else None
    uid = event.uid if isinstance(event.uid, int) else None
    trusted = owners is None or uid is None or uid in owners
    verdict = assess_kernel(kind, role, event.process, tally.recovered_at is not None, trusted, event.level)
    where = device.text if device else ""
    detail = event.detail
    if kind == "oom_kill" and not event.process:
        detail += "; the victim is not in the log"
    if event.process:
        owner = "" if trusted else f" of uid {uid}, not a serving user"
        detail = f"{event.process}, pid {event.pid}{owner}" + (f", {detail}" if detail else "")
    age = ago(now - tally.last_seen) if now is not None else None
    return kernel_finding(verdict, device.label if device else None, where, tally.count, age, detail, event.line)


def _message_finding(tally: KernelTally, now: float | None) -> Finding:
    """A templated message's finding: its family's verdict (judge/kernel_families.py), the format it printed."""
    event, device = tally.event, tally.device
    verdict = assess_message(event.family, event.level)
    age = ago(now - tally.last_seen) if now is not None else None
    kernel = KernelVerdict(verdict.code, verdict.status, verdict.title, verdict.remedy)
    label = device.label if device else None
    return kernel_finding(kernel, label, device.text if device else "", tally.count, age, event.template, event.line)
