"""Verdicts on the kernel's templated messages (sources/kernel_templates.py) that no rule of judge/kernel.py names:
one rule per family, from the printk level the source prints the message at and the vendor's guidance.

A family's rule says up to which printk level its messages are a WARNING (``warn_at``: 0 emergency .. 4 warning);
milder ones, messages whose level the caller computes (null in the table), and every message of a family no rule
judges yet (``warn_at`` None) are INFO: an OK finding that shows the line, never an alert or an action. The faults
of these families that stop the serving group (a link down, a fatal AER, an uncorrected memory error, a NIC or GPU
that failed to initialise ...) are judge/kernel.py's own rules, which the hand-written parsers feed; a template
only names what they do not.
"""

from __future__ import annotations

from msgspec import Struct

from dgxdoctor.result import Status


class FamilyRule(Struct, frozen=True):
    code: str
    title: str
    warn_at: int | None
    remedy: str
    reason: str


FAMILIES: dict[str, FamilyRule] = {
    "mlx5": FamilyRule(
        "KERNEL_MLX5_MESSAGE", "NIC driver message", 2,
        "read the lines around it (`dmesg | grep mlx5_core`) and `devlink health show`; update the firmware if it "
        "recurs",
        "mlx5_core_err (KERN_ERR) also reports a refused command or an unsupported feature on a healthy NIC; only "
        "crit and worse warn here. Health syndromes, command timeouts and load failures have their own rules "
        "(KERNEL_MLX5_HEALTH, _CMD_TIMEOUT, _PROBE_FAILED); NVIDIA's health guide: a syndrome is judged by its "
        "severity",
    ),
    "bonding": FamilyRule(
        "KERNEL_BONDING_MESSAGE", "bonding message", None,
        "check the bond's members (`cat /proc/net/bonding/<bond>`)",
        "bond_main.c's errors refuse a configuration; a member lost is KERNEL_LINK_DOWN's",
    ),
    "aer": FamilyRule(
        "KERNEL_AER_MESSAGE", "PCIe AER message", 3,
        "read the AER lines around it and `lspci -vvv -s <addr>`; reseat the device if uncorrectable errors recur",
        "aer.c prints an uncorrectable error's detail at KERN_ERR and a corrected one's at KERN_WARNING; the "
        "summaries and recovery failures have their own rules (KERNEL_AER_*)",
    ),
    "mce": FamilyRule(
        "KERNEL_MCE_MESSAGE", "machine check message", 3,
        "`ras-mc-ctl --errors` or `mcelog --client` says which bank and DIMM",
        "mce/core.c prints a bank's record at KERN_EMERG; the bank's UC bit decides in KERNEL_MCE/_UNCORRECTED",
    ),
    "edac": FamilyRule(
        "KERNEL_EDAC_MESSAGE", "memory controller message", 3,
        "`ras-mc-ctl --error-count` names the DIMM",
        "edac_mc.c prints a UE at KERN_EMERG and a CE at KERN_WARNING; counted errors are KERNEL_EDAC_CE/_UE",
    ),
    "ghes": FamilyRule(
        "KERNEL_GHES_MESSAGE", "firmware hardware-error record", 3,
        "`ras-mc-ctl --errors` shows the record",
        "ghes.c/cper.c print a record at its severity's level (KERN_ERR recoverable or fatal, KERN_WARNING "
        "corrected); the record's severity line decides in KERNEL_MCE/_EDAC_*",
    ),
    "memory_failure": FamilyRule(
        "KERNEL_MEMORY_FAILURE_MESSAGE", "memory failure handling", None,
        "`ras-mc-ctl --errors` names the DIMM",
        "memory-failure.c prints its handling of a poisoned page at KERN_ERR even when it recovered it; a task "
        "killed or a failed recovery is KERNEL_MEMORY_FAILURE's",
    ),
    "hung_task": FamilyRule(
        "KERNEL_HUNG_TASK_MESSAGE", "hung task message", 3,
        "read the stack that follows it in dmesg",
        "hung_task.c pr_err: a task stuck in the kernel; the kernel goes on",
    ),
    "watchdog": FamilyRule(
        "KERNEL_WATCHDOG_MESSAGE", "lockup watchdog", 3,
        "a CPU stopped taking interrupts or spun in the kernel: read the stack that follows it in dmesg",
        "watchdog.c pr_emerg (a hard lockup among them): the kernel goes on unless the panic knobs are set",
    ),
    "rcu": FamilyRule(
        "KERNEL_RCU_MESSAGE", "RCU stall message", 3,
        "read the stack dump that follows it in dmesg",
        "tree_stall.h pr_err: a CPU or task held up RCU; the kernel goes on",
    ),
    "workqueue": FamilyRule(
        "KERNEL_WORKQUEUE_MESSAGE", "workqueue message", 3,
        "read the busy workers dmesg lists after it",
        "workqueue.c pr_err/pr_emerg: work that made no progress; pr_warn (a CPU hog) is INFO",
    ),
    "oom": FamilyRule(
        "KERNEL_OOM_MESSAGE", "OOM killer message", 3,
        "the host ran short of memory: check what grew (`ps aux --sort=-rss`)",
        "oom_kill.c pr_err: the OOM killer could not do its work (the kill itself is KERNEL_OOM_KILL's)",
    ),
    "nfs": FamilyRule(
        "KERNEL_NFS_MESSAGE", "NFS message", None,
        "check the NFS server and the storage network",
        "not judged yet: fs/nfs messages mix client-side refusals with server faults; the server not responding is "
        "KERNEL_NFS_NOT_RESPONDING's",
    ),
    "sunrpc": FamilyRule(
        "KERNEL_SUNRPC_MESSAGE", "SUNRPC message", None,
        "check the NFS server and the storage network",
        "not judged yet: net/sunrpc messages are mostly set-up refusals",
    ),
    "nvrm": FamilyRule(
        "KERNEL_NVRM_MESSAGE", "NVIDIA driver error", 3,
        "the driver could not bring up or lost a GPU: `nvidia-smi -q`, then nvidia-bug-report.sh",
        "NVRM at NV_DBG_ERRORS/LEVEL_ERROR, kept only where it says a GPU failed to initialise or was lost; "
        "RmInitAdapter and probe failures are KERNEL_NVRM_INIT_FAILED's",
    ),
    "peermem": FamilyRule(
        "KERNEL_PEERMEM_MESSAGE", "nvidia-peermem message", None,
        "GPUDirect RDMA may be off: check `lsmod | grep peermem` and MOFED",
        "not judged: nvidia-peermem's runtime errors (peer_err, KERN_ERR) include an invalid context in the free "
        "callback on a healthy teardown (gpud's look-alikes); a module that could not load is "
        "KERNEL_PEERMEM_LOAD_FAILED's",
    ),
}  # fmt: skip


class FamilyVerdict(Struct, frozen=True):
    code: str
    status: Status
    title: str
    remedy: str
    reason: str


def assess_message(family: str, level: int | None) -> FamilyVerdict:
    """A templated message of ``family`` printed at ``level``: WARNING up to the family's ``warn_at``, else INFO."""
    rule = FAMILIES.get(family)
    if rule is None:
        code = f"KERNEL_{family.upper()}_MESSAGE"
        return FamilyVerdict(code, Status.OK, "kernel message", "", "a family no rule judges yet: INFO")
    warn = rule.warn_at is not None and level is not None and level <= rule.warn_at
    status = Status.WARNING if warn else Status.OK
    return FamilyVerdict(rule.code, status, rule.title, rule.remedy, rule.reason)
