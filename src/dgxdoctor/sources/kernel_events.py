"""Kernel log faults beyond XIDs: NIC firmware, links and cables, PCIe AER, machine checks, hangs, the OOM killer,
NFS, and NVIDIA driver faults that print no Xid. One parser for the followed ``/dev/kmsg`` and a pasted dmesg.

Each pattern has a real line above it and where it was seen (tests/fixtures/kernel_log/SOURCES.md lists them
again with their sources). The printk formats are the kernel's: mlx5 ``drivers/net/ethernet/mellanox/mlx5/core``
(``health.c``, ``cmd.c``, ``main.c``, ``events.c``, ``en_main.c``), ``drivers/infiniband/core/cache.c``,
``drivers/net/bonding``, ``drivers/pci/pcie/aer.c`` and ``err.c``, ``arch/x86/kernel/cpu/mce``,
``drivers/edac/edac_mc.c`` and ``sb_edac.c``/``skx_common.c``, ``acpi/apei/ghes.c`` and ``firmware/efi/cper.c``,
``mm/memory-failure.c``, ``kernel/hung_task.c``, ``kernel/watchdog.c``, ``kernel/rcu/tree_stall.h``,
``kernel/workqueue.c``, ``mm/oom_kill.c``, ``fs/nfs/``, ``net/sunrpc/clnt.c`` and NVIDIA's ``nv.c``/``osinit.c``.
A report of several lines (an AER summary and its detail, the OOM killer's report) is one event: ``KernelJoiner``.
Whatever precedes the driver prefix (a dmesg stamp, a syslog ``host kernel:``) is ignored, as in sources/xid.py.
Pure: no verdicts (judge/kernel.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from functools import cache
from typing import Literal, Protocol, cast

from msgspec import Struct
from msgspec.structs import replace

from dgxdoctor.lazy_re import LazyPattern, lazy_compile
from dgxdoctor.relaxed_re import relaxed
from dgxdoctor.sources.kernel_templates import anchor_texts, match_template

Kind = Literal[
    "mlx5_cmd_timeout",
    "mlx5_health",
    "mlx5_fatal",
    "mlx5_probe_failed",
    "link_down",
    "link_up",
    "module_event",
    "aer_corrected",
    "aer_nonfatal",
    "aer_fatal",
    "aer_unrecovered",
    "mce",
    "mce_uncorrected",
    "edac_ce",
    "edac_ue",
    "memory_failure",
    "hung_task",
    "soft_lockup",
    "rcu_stall",
    "workqueue_lockup",
    "oom_kill",
    "nfs_not_responding",
    "nfs_ok",
    "nvrm_init_failed",
    "nvrm_api_mismatch",
    "nvswitch_fatal",
    "peermem_load_failed",
    "kernel_message",  # a message of the kernel's own table (sources/kernel_templates.py) no parser above names
]
# Kinds that report a recovery, not a fault: they clear an earlier fault of the same device and count nowhere.
RECOVERY_KINDS: frozenset[str] = frozenset({"link_up", "nfs_ok"})

# A PCI address as dev_printk prints it: domain:bus:device.function.
_PCI = r"(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"

# mlx5_core prints "<driver> <pci>[ <netdev>]: [<func>:<line>:(pid N): ]message" (mlx5_core_err, netdev_info).
#   mlx5_core 0000:01:00.0 enp1s0f0: Link up            (the netdev after the address)
MLX5_PREFIX_RE = lazy_compile(r"\bmlx5_core " + _PCI + r"(?: (?P<netdev>[A-Za-z0-9_.\-]{1,15}))?: ")

# cmd.c, a firmware command that never completed (NVSentinel's NIC syslog detection: "timeout. Will cause a leak of
# a command resource" means the driver lost its firmware):
#   mlx5_core 0000:3b:00.0: wait_func:1120:(pid 48213): CREATE_MKEY(0x200) timeout. Will cause a leak of a command
#   resource                                                                       (one line in the log)
MLX5_CMD_TIMEOUT_RE = lazy_compile(r"(?P<cmd>[A-Z][A-Z0-9_]{2,40})\(0x[0-9a-f]{1,4}\) timeout\. Will cause a leak")

# health.c poll_health (the FreeBSD and Linux drivers print the same words):
#   mlx5_core 0000:5e:00.0: poll_health:800:(pid 0): device's health compromised - reached miss count
#   mlx5_core 0000:5e:00.0: poll_health:815:(pid 0): Fatal error 1 detected
#   mlx5_core 0000:5e:00.0: mlx5_health_try_recover:327:(pid 1187): health recovery flow aborted, PCI reads still
#   not working                                                                    (one line in the log)
MLX5_HEALTH_RE = lazy_compile(r"health compromised|health recovery flow aborted|FW is unable to respond")
# health.c print_health_info (5.19+ names the syndrome and its printk level; older kernels print only the dump lines):
#   mlx5_core 0000:08:00.0: print_health_info:425:(pid 912): Health issue observed, firmware internal error,
#   severity(3) ERROR:                          (one line; the net/mlx5 patch adding it, lore.kernel.org linux-rdma)
#   mlx5_core 0000:08:00.0: print_health_info:429:(pid 912): assert_var[0] 0x08040700      (a line of its dump)
#   mlx5_core 0000:08:00.0: mlx5_health_try_recover:335:(pid 1): handling bad device here   (the recovery it starts)
MLX5_HEALTH_ISSUE_RE = lazy_compile(r"Health issue observed, (?P<synd>[^,]{1,80}), severity\((?P<sev>\d)\)")
MLX5_HEALTH_DUMP_RE = lazy_compile(r"\b(?:print_health_info|mlx5_health_try_recover):\d{1,6}:")
# cmd.c, a command the firmware never completed and one the driver could not even queue:
#   mlx5_core 0000:56:00.0: wait_func_handle_exec_timeout:1159:(pid 72061): cmd[0]: ACCESS_REG(0x805) No done
#   completion                                           (one line; a linux-rdma report, code index id 31492381258)
#   mlx5_core 0000:3b:00.0: cmd_work_handler:877:(pid 6712): failed to allocate command entry
MLX5_NO_COMPLETION_RE = lazy_compile(r"(?P<cmd>[A-Z][A-Z0-9_]{1,40})\(0x[0-9a-f]{1,4}\) No done completion")
MLX5_CMD_ALLOC_RE = lazy_compile(r"cmd_work_handler:\d{1,6}:\(pid \d{1,10}\): failed to allocate")
# main.c, the NIC function that never came up (its rail is missing until it does):
#   mlx5_core 0000:3b:00.0: mlx5_init_one:1460:(pid 1): mlx5_load_one failed with error code -110
#   mlx5_core 0000:3b:00.0: mlx5_function_setup:1104:(pid 1): handle_hca_cap failed
MLX5_LOAD_FAILED_RE = lazy_compile(
    r"\b(?:mlx5_load_one failed with error code (?P<err>-?\d{1,5})|handle_hca_cap failed)"
)
# infiniband/core/cache.c (6.14+), the IB device's own port state, beside the netdev's "Link down":
#   [ 4443.974372] mlx5_core 0000:53:00.0 mlx5_3: Port: 1 Link DOWN   (a bond's flap, code index id 53115452667)
#   mlx5_core 0000:08:00.0 rdmap8s0f0: Port: 2 Link ACTIVE                 (the patch's own example)
IB_PORT_STATE_RE = lazy_compile(r"Port: (?P<port>\d{1,3}) Link (?P<state>DOWN|ACTIVE)\s*$")
MLX5_FATAL_RE = lazy_compile(r"\bFatal error (?P<code>\d{1,10}) detected|\bsystem error event triggered|unrecoverable")

# en_main.c mlx5e_update_carrier, and the IPoIB netdev of an InfiniBand rail alike:
#   mlx5_core 0000:01:00.0 enp1s0f0: Link up        (jishuzhan.net/article/1911252493641777153, a plugged cable)
#   mlx5_core 0000:1a:00.0 ibp26s0: Link down
MLX5_LINK_RE = lazy_compile(r": Link (?P<state>up|down)\s*$")

# events.c port_module_event:
#   mlx5_core 0000:01:00.0: Port module event: module 0, Cable plugged        (info: a look-alike, not a fault)
#   mlx5_core 0000:1a:00.0: Port module event: module 0, Cable unplugged
#   mlx5_core 0000:1a:00.0: Port module event[error]: module 0, Cable error, High Temperature
MODULE_EVENT_RE = lazy_compile(
    r"Port module event(?P<error>\[error\])?: module (?P<module>\d{1,3}), (?P<status>Cable (?:plugged|unplugged|error)"
    r"|[A-Za-z ]{3,40}?)(?:, (?P<why>.{1,80}))?\s*$"
)

# aer.c aer_print_error, the line that names the device with the error ("<driver> <pci>: PCIe Bus Error: ..."); the
# severity words changed from "Corrected"/"Uncorrected" to "Correctable"/"Uncorrectable" in Linux 6.x:
#   pcieport 0000:00:03.1: PCIe Bus Error: severity=Correctable, type=Data Link Layer, (Transmitter ID)   (pop#3363)
#   pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)
#   pcieport 0000:80:1b.4: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, (Receiver ID)
#   nvidia 0000:3b:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)
# Look-alike: "pcieport 0000:00:01.0: AER: enabled with IRQ 24" (boot) has no "PCIe Bus Error".
AER_RE = lazy_compile(
    r"(?P<driver>[A-Za-z0-9_\-]{1,32}) " + _PCI + r":(?: AER:)? PCIe Bus Error: severity=(?P<sev>Correct(?:ed|able)"
    r"|Uncorrect(?:ed|able) \((?P<fatal>Non-Fatal|Fatal)\))"
)

# aer.c aer_isr_one_error, the root port's summary before the detail lines above; the erring device is the source
# it names (``id=BBDF`` before 5.x, the address later, "error message received from" in 6.x):
#   pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: id=0008   (linux-pci, code index id 15130804285)
#   pcieport 0002:00:00.0: AER: Uncorrected (Fatal) error received: 0002:01:00.0          (code index id 44844950347)
#   pcieport 0000:00:01.1: AER: Multiple Uncorrected (Fatal) error received: 0000:00:01.0  (code index id 40949722272)
#   pcieport 0000:00:1c.5: AER: Correctable error message received from 0000:03:00.0      (6.x wording)
AER_SUMMARY_RE = lazy_compile(
    r"\b[A-Za-z0-9_\-]{1,32} " + _PCI + r": AER: (?:Multiple )?(?P<sev>Correct(?:ed|able)|Uncorrect(?:ed|able) "
    r"\((?P<fatal>Non-Fatal|Fatal)\)) error(?: message)? received(?::| from) ?(?:id=(?P<id>[0-9a-fA-F]{4})\b|"
    r"(?P<src>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]))?"
)
# pci/pcie/err.c: the device whose driver cannot take part in the recovery, and the recovery that failed:
#   e1000e 0000:03:00.0: AER: can't recover (no error_detected callback)
#   pcieport 0000:00:02.0: AER: device has no AER-aware driver
#   pcieport 0000:00:01.1: AER: Device recovery failed                      (code index id 40949722272)
AER_UNRECOVERED_RE = lazy_compile(
    r"\b[A-Za-z0-9_\-]{1,32} " + _PCI + r": (?:AER: )?(?P<what>[Cc]an't recover \(no error_detected callback\)"
    r"|device has no AER-aware driver|[Dd]evice recovery failed)"
)

# arch/x86/kernel/cpu/mce: "mce: [Hardware Error]: Machine check events logged" (corrected, logged by the CMCI), and
# the panic path's "Machine check: Processor context corrupt":
#   mce: [Hardware Error]: Machine check events logged                    (radiasoft/devops#134)
#   mce: [Hardware Error]: CPU 1: Machine Check: 0 Bank 11: 8c00004f000800c2
MCE_RE = lazy_compile(r"mce: \[Hardware Error\]: (?:CPU (?P<cpu>\d{1,5}): Machine Check|Machine check)")
# The bank's status names a corrected or an uncorrected error (MCi_STATUS bit 61, UC); the EDAC drivers (sb_edac.c,
# skx_common.c, i10nm) print the same line after their own head:
#   EDAC sbridge MC3: HANDLING MCE MEMORY ERROR                 (Documentation/firmware-guide/acpi/apei/einj.rst)
#   EDAC sbridge MC3: CPU 0: Machine Check Event: 0 Bank 7: 8c00004000010090
MACHINE_CHECK_RE = lazy_compile(
    r"(?:EDAC (?:\w{1,16} )?(?P<mc>MC\d{1,3}): )?CPU (?P<cpu>\d{1,5}): Machine Check(?: (?:Event|Exception))?: "
    r"(?:0x)?[0-9a-fA-F]{1,16} Bank (?P<bank>\d{1,3}): (?P<status>[0-9a-fA-F]{16})\b"
)
EDAC_HANDLING_RE = lazy_compile(r"EDAC (?:\w{1,16} )?(?P<mc>MC\d{1,3}): HANDLING MCE MEMORY ERROR")
MCI_STATUS_UC = 1 << 61
# acpi/apei/ghes.c and firmware/efi/cper.c: a firmware-first record, its severity before its section:
#   {1}[Hardware Error]: event severity: corrected
#   {1}[Hardware Error]: section_type: memory error
GHES_SEVERITY_RE = lazy_compile(r"\{\d{1,6}\}\[Hardware Error\]: event severity: (?P<sev>corrected|recoverable|fatal)")
GHES_MEMORY_RE = lazy_compile(r"\{\d{1,6}\}\[Hardware Error\]: {1,4}section_type: memory error")
# mm/memory-failure.c: a poisoned page, and the task that touched it:
#   Memory failure: 0x7dcdb: Sending SIGBUS to python3:48213 due to hardware memory corruption
#   Memory failure: 0x7dcdb: recovery action for dirty LRU page: Failed
MEMORY_FAILURE_RE = lazy_compile(
    r"Memory failure: (?P<pfn>0x[0-9a-f]{1,16}): (?:Sending SIGBUS to (?P<comm>.{1,16}?):(?P<pid>\d{1,10}) due to"
    r"|recovery action for (?P<page>[^:]{1,60}): Failed)"
)

# drivers/edac/edac_mc.c edac_mc_handle_error:
#   EDAC MC1: 1 CE memory scrubbing error on CPU_SrcID#1_Ha#0_Chan#0_DIMM#0 (channel:0 slot:0 page:0xee30a0 ...)
#   EDAC MC0: 4 CE error on CPU#0Channel#2_DIMM#0 (channel:2 slot:0 page:0x0 offset:0x0 grain:8 syndrome:0x0)
#   EDAC MC0: 1 UE memory read error on CPU_SrcID#0_MC#0_Chan#0_DIMM#0 (channel:0 slot:0 page:0xe16677 ...)
EDAC_RE = lazy_compile(r"EDAC (?P<mc>MC\d{1,3}): (?P<count>\d{1,10}) (?P<type>CE|UE) .{0,80}?\bon (?P<dimm>\S{1,80})")

# kernel/hung_task.c:
#   INFO: task python3:48213 blocked for more than 120 seconds.
HUNG_TASK_RE = lazy_compile(r"INFO: task (?P<comm>.{1,16}):(?P<pid>\d{1,10}) blocked for more than (?P<secs>\d{1,7}) s")

# kernel/rcu/tree_stall.h and kernel/workqueue.c:
#   rcu: INFO: rcu_sched detected stalls on CPUs/tasks:
#   rcu: INFO: rcu_preempt self-detected stall on CPU
#   BUG: workqueue lockup - pool cpus=5 node=0 flags=0x0 nice=0 stuck for 31s!
RCU_STALL_RE = lazy_compile(r"INFO: (?P<flavor>rcu_\w{1,16}) (?:self-)?detected (?:expedited )?stalls?\b")
WORKQUEUE_RE = lazy_compile(r"BUG: workqueue lockup - pool (?P<pool>.{1,80}?) stuck for (?P<secs>\d{1,7})s!")

# kernel/watchdog.c:
#   watchdog: BUG: soft lockup - CPU#7 stuck for 23s! [pytest:25222]        (deepspeedai/DeepSpeed#925)
#   NMI watchdog: BUG: soft lockup - CPU#2 stuck for 22s! [SimpleCacheWork:8140]
SOFT_LOCKUP_RE = lazy_compile(
    r"BUG: soft lockup - CPU#(?P<cpu>\d{1,5}) stuck for (?P<secs>\d{1,7})s! \[(?P<comm>.{1,16}):(?P<pid>\d{1,10})\]"
)

# mm/oom_kill.c __oom_kill_process (5.x+), and the memory cgroup form; comm is at most 15 characters:
#   Out of memory: Killed process 48213 (ray::RayWorkerW) total-vm:98765432kB, anon-rss:45678901kB, ...
#   Memory cgroup out of memory: Killed process 3302 (python3) total-vm:2052448kB, anon-rss:1048576kB, ...
#   Killed process 1234 (java) total-vm:4194304kB, anon-rss:2097152kB, file-rss:0kB          (3.x: no prefix)
OOM_KILL_RE = lazy_compile(
    r"(?:out of memory: )?Killed process (?P<pid>\d{1,10}) \((?P<comm>.{1,16}?)\)(?: total-vm|,|$)"
)
# The killed task's owner, which the kernel itself writes after the sizes (5.x+): ``..., shmem-rss:0kB, UID:0
# pgtables:123456kB oom_score_adj:0``. Unlike the comm, no user can write it.
OOM_UID_RE = lazy_compile(r"\bUID:(?P<uid>\d{1,10})\b")
# The report's head and its summary line (5.x+), which name the task that asked for memory and the victim:
#   systemd invoked oom-killer: gfp_mask=0x6200ca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0
#   oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/system.slice/
#   pm2-root.service,task=node,pid=2092,uid=0                   (one line; a CentOS messages file, code index id
#   15097352197, with the kill and the reaper's line after it)
OOM_INVOKED_RE = lazy_compile(r"(?P<comm>\S{1,16}) invoked oom-killer: ")
OOM_CONSTRAINT_RE = lazy_compile(
    r"oom-kill:constraint=(?P<constraint>\w{1,32}),.{0,600}?\btask=(?P<comm>[^,]{1,16}),pid=(?P<pid>\d{1,10}),"
    r"uid=(?P<uid>\d{1,10})"
)

# fs/nfs and net/sunrpc: the server stops answering, then answers again (the "OK" line is the recovery):
#   nfs: server 100.73.159.36 not responding, still trying       (nfs-ganesha/nfs-ganesha#1295)
#   nfs: server thinkcentre not responding, timed out
#   nfs: server thinkcentre OK                                   (linux-surface/linux-surface#1494: a look-alike)
NFS_RE = lazy_compile(r"\bnfs: server (?P<server>\S{1,255}) (?P<what>not responding|OK)\b")

# drivers/net/bonding/bond_main.c, a bond's member lost (the rail behind it is down):
#   bond0: (slave enp83s0f0np0): link status definitely down, disabling slave   (5.x+; code index id 53115452667)
#   bond0: link status definitely down for interface eth1, disabling it         (4.x and earlier)
BOND_RE = lazy_compile(
    r"[A-Za-z0-9_.\-]{1,15}: (?:\(slave (?P<slave>[A-Za-z0-9_.\-]{1,15})\): link status definitely (?P<state>up|down)"
    r"|link status definitely (?P<state2>up|down) for interface (?P<slave2>[A-Za-z0-9_.\-]{1,15}))"
)

# NVIDIA driver faults without an Xid:
#   NVRM: GPU 0000:98:00.0: RmInitAdapter failed! (0x62:0x65:1792)     (NVIDIA/open-gpu-kernel-modules#789)
#   NVRM: RmInitAdapter failed! (0x22:0x56:667)                       (older drivers name no GPU)
NVRM_INIT_RE = lazy_compile(r"NVRM: (?:GPU " + _PCI + r": )?RmInitAdapter failed! \((?P<code>[0-9a-fx:]{1,40})\)")
#   NVRM: GPU0 RmInitAdapter: Cannot initialize GSP firmware RM           (code index id 55080197096, with the
#   NVRM: GPU 0000:04:00.0: rm_init_adapter failed, device minor number 0   RmInitAdapter failed! line after it)
NVRM_GSP_RE = lazy_compile(r"NVRM: (?:GPU(?P<gpu>\d{1,3}) )?RmInitAdapter: Cannot initialize GSP firmware RM")
NVRM_RM_INIT_RE = lazy_compile(r"NVRM: (?:GPU " + _PCI + r": )?rm_init_adapter failed")
# The driver's probe and module load giving up (nv.c), and the driver core's line for the device it failed:
#   NVRM: The NVIDIA probe routine failed for 1 device(s).        (Bumblebee-Project/Bumblebee#550 and others)
#   NVRM: None of the NVIDIA graphics adapters were initialized!  /  NVRM: None of the NVIDIA devices were initialized.
#   NVRM: No NVIDIA graphics adapter probed!  /  NVRM: NVIDIA init module failed!
#   nvidia: probe of 0000:01:00.0 failed with error -1                   (drivers/base/dd.c before 6.x)
#   nvidia 0000:67:00.0: probe with driver nvidia failed with error -1   (6.x)
NVRM_PROBE_RE = lazy_compile(
    r"NVRM: (?P<what>The NVIDIA probe routine failed for \d{1,3} device|None of the NVIDIA (?:graphics adapters|"
    r"devices) were initiali[sz]ed|No NVIDIA graphics adapter probed|NVIDIA init module failed)"
)
PROBE_OF_RE = lazy_compile(r"\b(?P<drv>nvidia|mlx5_core): probe of " + _PCI + r" failed with error (?P<err>-?\d{1,5})")
PROBE_WITH_RE = lazy_compile(
    r"\b(?P<drv>nvidia|mlx5_core) " + _PCI + r": probe with driver \S{1,32} failed with error (?P<err>-?\d{1,5})"
)
#   NVRM: API mismatch: the client has the version 535.54.03, but   (stackhpc/ansible-slurm-appliance#287)
#   NVRM: API mismatch: the client 'kwin_wayland' (pid 1005)         (595 drivers; the versions follow on the next line)
NVRM_API_RE = lazy_compile(
    r"NVRM: API mismatch: the client (?:has the version (?P<client>[0-9.]{1,20})|'(?P<comm>[^']{1,64})')"
)
# nvidia-nvswitch, the driver failing a switch outside an SXid (the SXid lines themselves are sources/xid.py's):
#   nvidia-nvswitch2: NVSwitch fatal error: ...  /  nvidia-nvswitch: Probing device 0000:07:00.0 failed
NVSWITCH_FATAL_RE = lazy_compile(
    r"(?P<dev>nvidia-nvswitch\d{0,3}): (?:.*\bfatal error\b|Probing device " + _PCI + r" failed)", re.I
)
# nvidia_peermem against an ib_core without the peer-memory API (inbox rdma-core, a MOFED rebuilt under it):
#   nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -22)     (NVIDIA/gpu-operator#2868)
#   nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client
PEERMEM_RE = lazy_compile(
    r"\b(?P<mod>nvidia_peermem|nv_peer_mem): (?:Unknown symbol|disagrees about version of symbol) (?P<sym>\w{1,64})"
)


Part = Literal["", "head", "detail"]


class KernelEvent(Struct, frozen=True):
    """One fault line: what kind, the device it names in its own words, and the line.

    ``pci`` is a full PCI address (``0000:3b:00.0``), ``netdev`` an interface name; ``other`` names what is not a
    PCI device (``MC0``, ``cpu7``, an NFS server). ``process``/``pid``: the task a hang or the OOM killer names.
    ``level``: the printk level (0 emergency .. 7 debug) where the line states its own (mlx5's ``severity(N)``).
    ``part``: ``head`` for a line that opens a report whose next lines name the device or the verdict (an AER
    summary, the OOM killer's head, an EDAC head, a GHES record's severity, NVRM's GSP line); ``detail`` for a line
    of a report already counted (an mlx5 health dump line, NVRM's probe summary). ``KernelJoiner`` joins them.
    """

    kind: Kind
    line: str
    pci: str | None = None
    netdev: str | None = None
    other: str | None = None
    process: str | None = None
    pid: int | None = None
    detail: str = ""
    uid: int | None = None  # the task's owner, where the kernel writes it (the OOM killer's UID:)
    level: int | None = None
    part: Part = ""
    family: str = ""  # a kernel_message's family (data/kernel_templates.json)
    template: str = ""  # a kernel_message's format, as its source prints it

    @property
    def key(self) -> str:
        """What a tally counts by: the kind, or a templated message's family (``mlx5_message``)."""
        return f"{self.family}_message" if self.kind == "kernel_message" else self.kind

    @property
    def named(self) -> str:
        """The device as the line names it ("" when it names none)."""
        return self.netdev or self.pci or self.other or ""


def _said(rest: str) -> str:
    return rest.split("): ", 1)[-1][:160]


def _mlx5(line: str) -> KernelEvent | None:
    prefix = MLX5_PREFIX_RE.search(line)
    if prefix is None:
        return None
    rest = line[prefix.end() :].strip()
    pci, netdev = prefix["pci"].lower(), prefix["netdev"]
    text = line.strip()
    port = IB_PORT_STATE_RE.search(rest) if "Port: " in rest else None
    if port is not None and netdev:
        kind: Kind = "link_down" if port["state"] == "DOWN" else "link_up"
        return KernelEvent(kind, text, pci, netdev, detail=f"Port {port['port']} Link {port['state']}")
    link = MLX5_LINK_RE.search(line) if "Link " in rest else None
    if link is not None and netdev:
        kind = "link_down" if link["state"] == "down" else "link_up"
        return KernelEvent(kind, text, pci, netdev, detail=f"Link {link['state']}")
    module = MODULE_EVENT_RE.search(rest) if "module event" in rest else None
    if module is not None:
        status = module["status"].strip()
        if status == "Cable plugged" and not module["error"]:
            return None  # a cable plugged in: the look-alike of a module fault
        detail = f"module {module['module']}: {status}" + (f", {module['why'].strip()}" if module["why"] else "")
        return KernelEvent("module_event", text, pci, netdev, detail=detail)
    if "timeout" in rest and (timeout := MLX5_CMD_TIMEOUT_RE.search(rest)) is not None:
        return KernelEvent("mlx5_cmd_timeout", text, pci, netdev, detail=f"{timeout['cmd']} timed out")
    if "No done completion" in rest and (stuck := MLX5_NO_COMPLETION_RE.search(rest)) is not None:
        return KernelEvent("mlx5_cmd_timeout", text, pci, netdev, detail=f"{stuck['cmd']}: no done completion")
    if MLX5_CMD_ALLOC_RE.search(rest):
        return KernelEvent("mlx5_cmd_timeout", text, pci, netdev, detail="no free command entry")
    if (issue := MLX5_HEALTH_ISSUE_RE.search(rest)) is not None:
        detail = f"{issue['synd']}, severity({issue['sev']})"
        return KernelEvent("mlx5_health", text, pci, netdev, detail=detail, level=int(issue["sev"]))
    if MLX5_FATAL_RE.search(rest):
        return KernelEvent("mlx5_fatal", text, pci, netdev, detail=_said(rest))
    if MLX5_HEALTH_RE.search(rest):
        return KernelEvent("mlx5_health", text, pci, netdev, detail=_said(rest))
    if MLX5_HEALTH_DUMP_RE.search(rest):  # the dump of a health report, or the recovery it starts
        return KernelEvent("mlx5_health", text, pci, netdev, detail=_said(rest), part="detail")
    if "failed" in rest and (load := MLX5_LOAD_FAILED_RE.search(rest)) is not None:
        return KernelEvent("mlx5_probe_failed", text, pci, netdev, detail=load[0])
    return _probe(line)


_AER_KINDS: dict[str, Kind] = {"Fatal": "aer_fatal", "Non-Fatal": "aer_nonfatal"}


def _aer_source(port: str, source_id: str | None, source: str | None) -> str:
    """The erring device an AER summary names: its address, or its ``id`` (bus << 8 | devfn) in the port's domain."""
    if source:
        return source.lower()
    if source_id:
        value = int(source_id, 16)
        domain = port.split(":", 1)[0]
        return f"{domain}:{value >> 8:02x}:{(value >> 3) & 0x1F:02x}.{value & 7}"
    return port


def _aer(line: str) -> KernelEvent | None:
    match = AER_RE.search(line)
    if match is not None:
        kind = _AER_KINDS.get(match["fatal"] or "", "aer_corrected")
        detail = f"severity={match['sev']} ({match['driver']})"
        return KernelEvent(kind, line.strip(), match["pci"].lower(), detail=detail)
    summary = AER_SUMMARY_RE.search(line)
    if summary is not None:
        kind = _AER_KINDS.get(summary["fatal"] or "", "aer_corrected")
        device = _aer_source(summary["pci"].lower(), summary["id"], summary["src"])
        detail = f"{summary['sev']} error reported by {summary['pci'].lower()}"
        return KernelEvent(kind, line.strip(), device, detail=detail, part="head")
    unrecovered = AER_UNRECOVERED_RE.search(line)
    if unrecovered is not None:
        return KernelEvent("aer_unrecovered", line.strip(), unrecovered["pci"].lower(), detail=unrecovered["what"])
    return None


def _machine_check(line: str) -> KernelEvent | None:
    if (m := MACHINE_CHECK_RE.search(line)) is not None:
        uncorrected = int(m["status"], 16) & MCI_STATUS_UC
        kind: Kind = "mce_uncorrected" if uncorrected else "mce"
        where = m["mc"] or f"cpu{m['cpu']}"
        detail = f"bank {m['bank']} status {m['status']}: {'uncorrected' if uncorrected else 'corrected'}"
        return KernelEvent(kind, line.strip(), other=where, detail=detail)
    if (m := EDAC_HANDLING_RE.search(line)) is not None:
        return KernelEvent("mce", line.strip(), other=m["mc"], detail="memory error", part="head")
    if (m := GHES_SEVERITY_RE.search(line)) is not None:
        kind = "mce" if m["sev"] == "corrected" else "mce_uncorrected"
        return KernelEvent(kind, line.strip(), detail=f"firmware-reported, {m['sev']}", part="head")
    if GHES_MEMORY_RE.search(line):
        return KernelEvent("mce", line.strip(), other="memory", detail="memory error (severity not stated)")
    if (m := MCE_RE.search(line)) is not None:
        return KernelEvent("mce", line.strip(), other=f"cpu{m['cpu']}" if m["cpu"] else None)
    return None


def _oom(line: str) -> KernelEvent | None:
    if (m := OOM_KILL_RE.search(line)) is not None and "Killed process" in line:
        owner = OOM_UID_RE.search(line, m.end())
        uid = int(owner["uid"]) if owner is not None else None
        return KernelEvent("oom_kill", line.strip(), process=m["comm"], pid=int(m["pid"]), uid=uid)
    if (m := OOM_CONSTRAINT_RE.search(line)) is not None:
        return KernelEvent("oom_kill", line.strip(), process=m["comm"], pid=int(m["pid"]), uid=int(m["uid"]),
                           detail=m["constraint"], part="head")  # fmt: skip
    if (m := OOM_INVOKED_RE.search(line)) is not None:
        return KernelEvent("oom_kill", line.strip(), detail=f"invoked by {m['comm']}", part="head")
    return None


def _host(line: str) -> KernelEvent | None:
    """Machine checks, EDAC, hangs, the OOM killer, NFS."""
    if "oom" in line or "Killed process" in line:
        event = _oom(line)
        if event is not None:
            return event
    if (m := HUNG_TASK_RE.search(line)) is not None:
        detail = f"blocked for more than {m['secs']} s"
        return KernelEvent("hung_task", line.strip(), process=m["comm"], pid=int(m["pid"]), detail=detail)
    if (m := SOFT_LOCKUP_RE.search(line)) is not None:
        cpu, detail = f"cpu{m['cpu']}", f"stuck for {m['secs']} s"
        return KernelEvent("soft_lockup", line.strip(), other=cpu, process=m["comm"], pid=int(m["pid"]), detail=detail)
    if (m := RCU_STALL_RE.search(line)) is not None:
        return KernelEvent("rcu_stall", line.strip(), detail=f"{m['flavor']} stall")
    if (m := WORKQUEUE_RE.search(line)) is not None:
        return KernelEvent("workqueue_lockup", line.strip(), detail=f"pool {m['pool']} stuck for {m['secs']} s")
    if (m := EDAC_RE.search(line)) is not None:
        kind: Kind = "edac_ue" if m["type"] == "UE" else "edac_ce"
        return KernelEvent(kind, line.strip(), other=m["mc"], detail=f"{m['count']} {m['type']} on {m['dimm']}")
    if (m := MEMORY_FAILURE_RE.search(line)) is not None:
        if m["comm"]:
            return KernelEvent("memory_failure", line.strip(), other="memory", process=m["comm"], pid=int(m["pid"]),
                               detail=f"page {m['pfn']} poisoned")  # fmt: skip
        return KernelEvent("memory_failure", line.strip(), other="memory", detail=f"{m['page']} {m['pfn']}: Failed")
    if (event := _machine_check(line)) is not None:
        return event
    if (m := NFS_RE.search(line)) is not None:
        kind = "nfs_ok" if m["what"] == "OK" else "nfs_not_responding"
        return KernelEvent(kind, line.strip(), other=f"nfs:{m['server']}", detail=m["what"])
    return None


def _probe(line: str) -> KernelEvent | None:
    """The driver core's line for a GPU or NIC whose driver failed to probe it."""
    m = PROBE_OF_RE.search(line) or PROBE_WITH_RE.search(line)
    if m is None:
        return None
    kind: Kind = "nvrm_init_failed" if m["drv"] == "nvidia" else "mlx5_probe_failed"
    return KernelEvent(kind, line.strip(), m["pci"].lower(), detail=f"probe failed with error {m['err']}")


def _nvidia(line: str) -> KernelEvent | None:
    if (m := NVRM_INIT_RE.search(line)) is not None:
        pci = m["pci"].lower() if m["pci"] else None
        return KernelEvent("nvrm_init_failed", line.strip(), pci, detail=f"RmInitAdapter failed ({m['code']})")
    if (m := NVRM_GSP_RE.search(line)) is not None:
        other = f"GPU{m['gpu']}" if m["gpu"] else None
        detail = "cannot initialize GSP firmware RM"
        return KernelEvent("nvrm_init_failed", line.strip(), other=other, detail=detail, part="head")
    if (m := NVRM_RM_INIT_RE.search(line)) is not None:
        pci = m["pci"].lower() if m["pci"] else None
        return KernelEvent("nvrm_init_failed", line.strip(), pci, detail="rm_init_adapter failed", part="detail")
    if (m := NVRM_PROBE_RE.search(line)) is not None:
        return KernelEvent("nvrm_init_failed", line.strip(), detail=m["what"], part="detail")
    if (m := NVRM_API_RE.search(line)) is not None:
        who = f"client version {m['client']}" if m["client"] else f"client {m['comm']}"
        return KernelEvent("nvrm_api_mismatch", line.strip(), detail=who)
    if (m := NVSWITCH_FATAL_RE.search(line)) is not None:
        pci = m["pci"].lower() if m["pci"] else None
        return KernelEvent("nvswitch_fatal", line.strip(), pci, other=m["dev"])
    if (m := PEERMEM_RE.search(line)) is not None:
        return KernelEvent("peermem_load_failed", line.strip(), detail=f"{m['mod']}: symbol {m['sym']}")
    return _probe(line)


def _bond(line: str) -> KernelEvent | None:
    m = BOND_RE.search(line)
    if m is None:
        return None
    state, slave = m["state"] or m["state2"], m["slave"] or m["slave2"]
    kind: Kind = "link_down" if state == "down" else "link_up"
    return KernelEvent(kind, line.strip(), netdev=slave, detail=f"bond member link {state}")


# Substrings that every line of a kind contains, each naming the parsers that may take the line: one scan of a line
# with none of them, and only its own parsers' regexes otherwise (the follower runs this on every kernel log line).
# (A loop of substring tests measured 1.4x faster than one alternation regex: benchmarks/kernel_scan.py.)
_HOST = (_host,)
_ROUTES: tuple[tuple[str, tuple[Callable[[str], KernelEvent | None], ...]], ...] = (
    ("mlx5_core", (_mlx5, _aer, _probe)),
    ("PCIe Bus Error", (_aer,)),
    ("AER: ", (_aer,)),
    ("error_detected callback", (_aer,)),
    ("NVRM: ", (_nvidia,)),
    ("nvswitch", (_nvidia,)),
    ("peermem", (_nvidia,)),
    ("peer_mem", (_nvidia,)),
    ("nvidia", (_probe,)),
    ("link status definitely", (_bond,)),
    ("Hardware Error", _HOST),
    ("EDAC ", _HOST),
    ("blocked for more than", _HOST),
    ("soft lockup", _HOST),
    ("detected stall", _HOST),
    ("detected expedited stall", _HOST),
    ("workqueue lockup", _HOST),
    ("Memory failure:", _HOST),
    ("Killed process", _HOST),
    ("oom-kill", _HOST),
    ("nfs: server", _HOST),
)


def parse_kernel_event(line: str, templates: bool = True) -> KernelEvent | None:
    """The fault (or recovery) ``line`` reports, or None. XID/SXID lines are sources/xid.py's, not this.
    ``templates`` False: the caller knows the line holds no format of the kernel's table (``lines_to_look_at``).

    One line alone: ``KernelJoiner`` joins a report's lines (``KernelEvent.part``) into one event."""
    if "NVRM: Xid" in line or "SXid (" in line:
        return None
    parsers = next((route for hint, route in _ROUTES if hint in line), ())
    for parse in parsers:
        event = parse(line)
        if event is not None:
            return event
    return _templated(line) if templates else None


def _templated(line: str) -> KernelEvent | None:
    """A message of the kernel's own table; a line of a report (``detail``) where its family has one."""
    if "fallen off the bus" in line:
        return None  # XID 79's own words, sources/xid.py's (with or without the Xid line)
    found = match_template(line)
    if found is None:
        return None
    t = found.template
    return KernelEvent("kernel_message", line.strip(), found.pci, found.netdev, detail=t.template, level=t.level,
                       part="detail", family=t.family, template=t.template)  # fmt: skip


# ---- one report, one event ----

# Kinds whose lines join: a report's head and the lines after it are one fault of one family.
_FAMILY: dict[str, str] = {
    "aer_corrected": "aer", "aer_nonfatal": "aer", "aer_fatal": "aer", "aer_unrecovered": "aer",
    "mce": "mce", "mce_uncorrected": "mce", "edac_ce": "mce", "edac_ue": "mce",
    "oom_kill": "oom", "nvrm_init_failed": "nvrm", "mlx5_health": "mlx5_health", "mlx5_fatal": "mlx5_health",
}  # fmt: skip
# Within a family, the worse of two kinds (a joined report keeps the worse).
_RANK: dict[str, int] = {
    "aer_corrected": 0, "aer_unrecovered": 1, "aer_nonfatal": 2, "aer_fatal": 3,
    "mce": 0, "edac_ce": 1, "mce_uncorrected": 2, "edac_ue": 3,
}  # fmt: skip


# A templated message's family, as the kinds above join: the lines of a report a parser names (AER's detail lines,
# an MCE's banks, the OOM report, an mlx5 health dump, a stall's dump) join the event they follow.
_TEMPLATE_FAMILY: dict[str, str] = {
    "aer": "aer", "mce": "mce", "edac": "mce", "ghes": "mce", "memory_failure": "memory_failure", "oom": "oom",
    "nvrm": "nvrm", "mlx5": "mlx5_health", "hung_task": "hung_task", "watchdog": "soft_lockup", "rcu": "rcu_stall",
    "workqueue": "workqueue_lockup", "nfs": "nfs", "sunrpc": "sunrpc",
    "bonding": "link_down", "peermem": "peermem_load_failed",
}  # fmt: skip


def _family(event: KernelEvent) -> str:
    if event.kind == "kernel_message":
        return _TEMPLATE_FAMILY.get(event.family, event.family)
    return _FAMILY.get(event.kind, event.kind)


def _merge(head: KernelEvent, event: KernelEvent) -> KernelEvent:
    """``event`` completed by the ``head`` before it: the device and task where ``event`` names none, the worse
    kind, both details; a head that joins a head stays a head (the OOM killer's summary after its head)."""
    kind = event.kind
    if _RANK.get(head.kind, 0) > _RANK.get(kind, 0):
        kind = head.kind
    if head.kind == "mce_uncorrected" and event.other == "memory":  # a GHES record's memory section
        kind = "edac_ue"
    elif head.kind == "mce" and head.part == "head" and event.other == "memory" and head.other is None:
        kind = "edac_ce"
    named = bool(event.pci or event.netdev or event.other)
    details = [d for d in (head.detail, event.detail) if d]
    return KernelEvent(
        kind,
        event.line,
        event.pci if named else head.pci,
        event.netdev if named else head.netdev,
        event.other if named else head.other,
        event.process or head.process,
        event.pid if event.process else head.pid,
        "; ".join(dict.fromkeys(details)),
        event.uid if event.uid is not None else head.uid,
        event.level if event.level is not None else head.level,
        "head" if event.part == "head" else "",
    )


def _same_device(first: KernelEvent, then: KernelEvent) -> bool:
    return not then.named or then.named == first.named or (then.pci is not None and then.pci == first.pci)


class KernelJoiner:
    """Joins a report's lines into one event, for the daemon's follower and ``diagnose`` alike.

    A head is held until the next event: one of its family completes it (an AER summary and the detail line naming
    the device, the OOM killer's head and the kill naming the victim), any other releases it alone. A detail line
    right after an event of its family and device is part of it and counts nothing; a templated message of a
    family (an AER error's status line, an MCE's banks, a stall's dump) is part of the last event of its family
    within ``ADJACENT_LINES`` lines, or of its family and device within ``REPORT_LINES``, interleaved with other
    lines or not. ``flush`` releases a head still held
    (the end of a paste, the end of a batch of the followed log: a head and its detail split across two batches
    count twice).
    """

    REPORT_LINES = 40
    ADJACENT_LINES = 8

    def __init__(self) -> None:
        self._held: KernelEvent | None = None
        self._last: KernelEvent | None = None
        self._recent: dict[str, tuple[KernelEvent, int]] = {}  # family -> its last event, at which line
        self._lines = 0

    def feed(self, line: str, templates: bool = True) -> list[KernelEvent]:
        self._lines += 1
        event = parse_kernel_event(line, templates)
        return self.add(event) if event is not None else []

    def skip(self) -> None:
        """A line the caller knows names no event (``scan_kernel_text``): counted, not parsed."""
        self._lines += 1

    def add(self, event: KernelEvent) -> list[KernelEvent]:
        out: list[KernelEvent] = []
        held, self._held = self._held, None
        if held is not None and event.kind == "kernel_message" and _family(held) == _family(event):
            self._held = held  # a line of the report between its head and the line that names the device
            return out
        if held is not None:
            if _family(held) == _family(event):
                event = _merge(held, event)
            else:
                out.append(self._emit(held))
        if event.part == "head":
            self._held = event
        elif event.part == "detail" and self._part_of_recent(event):
            pass  # a line of the report just counted
        else:
            out.append(self._emit(event))
        return out

    def _part_of_recent(self, event: KernelEvent) -> bool:
        if event.kind != "kernel_message":
            last = self._last
            return last is not None and _family(last) == _family(event) and _same_device(last, event)
        recent = self._recent.get(_family(event))
        if recent is None:
            return False
        since = self._lines - recent[1]
        # Right after its event, a line of the report may name the reporting port (AER's root port) instead.
        return since <= self.ADJACENT_LINES or (since <= self.REPORT_LINES and _same_device(recent[0], event))

    def flush(self) -> list[KernelEvent]:
        held, self._held = self._held, None
        return [self._emit(held)] if held is not None else []

    def _emit(self, event: KernelEvent) -> KernelEvent:
        event = event if event.part == "" else replace(event, part="")
        self._last = event
        self._recent[_family(event)] = (event, self._lines)
        return event


# What alone names no event: the mlx5 prefix (each mlx5 event needs a pattern of what follows it) and the OOM kill's
# owner (read only after the kill's own pattern). Every other pattern above is a parser's, in the gate below.
_NOT_IN_GATE = frozenset({"MLX5_PREFIX_RE", "OOM_UID_RE"})


def _gate_patterns() -> list[LazyPattern]:
    """The parsers' patterns: a line that none of them matches is no event of a parser (every parser returns an
    event only after one of these matched in the line)."""
    return [v for k, v in globals().items() if isinstance(v, LazyPattern) and k not in _NOT_IN_GATE]


class _Searcher(Protocol):
    def search(self, text: bytes, pos: int = ...) -> re.Match[bytes] | None: ...


@cache
def _gate() -> _Searcher | None:
    """One RE2 automaton over Latin-1 bytes of every parser's pattern (``relaxed_re.relaxed``: it matches wherever
    the pattern matches in ASCII text; its groups unnamed, its counted repetitions unbounded), every anchor of the
    kernel's table (``match_template`` names no line without one) and any byte outside ASCII (where Python's
    ``\\w``, ``\\d`` and case folding are Unicode's, the line is parsed). None without RE2: every line is parsed."""
    try:
        import re2  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    parts = []
    for pattern in _gate_patterns():
        source = pattern.pattern
        if pattern.source_flags & re.IGNORECASE and not source.startswith("(?i)"):
            source = "(?i)" + source
        whole = relaxed(source)
        if whole is None:
            return None
        parts.append(_COUNTED.sub("*", _GROUP_NAME.sub("(?:", whole)))
    parts += [re2.escape(literal) for literal in anchor_texts()]
    options = re2.Options()
    options.max_mem = 64 << 20
    options.log_errors = False
    options.encoding = re2.Options.Encoding.LATIN1
    try:
        return cast(_Searcher, re2.compile("|".join([*parts, r"[\x80-\xff]"]).encode(), options))
    except re2.error:
        return None


_GROUP_NAME = re.compile(r"\(\?P<\w+>")
# A counted repetition ``{m,n}`` as ``*`` (it matches more, never less): bounds of hundreds (``.{0,600}?``) swell
# the automaton past RE2's DFA into its NFA, ~40 MB/s instead of hundreds.
_COUNTED = re.compile(r"(?<!\\)\{\d+,\d*\}")


def _gated_lines(lines: Sequence[str]) -> set[int] | None:
    """The indexes of ``lines`` that may name an event, in one pass of ``_gate`` over the text; None without the
    gate. A match that spans lines names its first; the search goes on at the line after it, so every line in
    which a pattern matches is named."""
    gate = _gate()
    if gate is None:
        return None
    data = "\n".join(lines).encode("utf-8", errors="surrogatepass")
    found: set[int] = set()
    line, pos, counted = 0, 0, 0
    while (m := gate.search(data, pos)) is not None:
        line += data.count(b"\n", counted, m.start())
        counted = m.start()
        found.add(line)
        nxt = data.find(b"\n", m.start())
        if nxt == -1:
            break
        pos = counted = nxt + 1
        line += 1
    return found


def scan_kernel_text(text: str) -> Iterator[KernelEvent]:
    """The events of the lines of ``text`` (``str.splitlines``), as ``scan_kernel_lines`` gives them, parsing only
    the lines one pass of ``_gate`` names (a healthy kernel log's lines hold the parsers' words, "NVRM: ",
    "mlx5_core", and no fault: most cost nothing more)."""
    lines = text.splitlines()
    gated = _gated_lines(lines)
    joiner = KernelJoiner()
    for n, line in enumerate(lines):
        if gated is None or n in gated:
            yield from joiner.feed(line)
        else:
            joiner.skip()
    yield from joiner.flush()


def scan_kernel_lines(lines: Iterable[str], template_lines: Collection[str] | None = None) -> Iterator[KernelEvent]:
    """The events of ``lines``, each report joined into one (``KernelJoiner``). ``template_lines``: the only lines
    that may print a format of the kernel's table (``lines_to_look_at`` over the whole text, one automaton pass);
    None: look every line up."""
    joiner = KernelJoiner()
    for line in lines:
        yield from joiner.feed(line, template_lines is None or line in template_lines)
    yield from joiner.flush()
