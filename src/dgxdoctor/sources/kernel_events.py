"""Kernel log faults beyond XIDs: NIC firmware, links and cables, PCIe AER, machine checks, hangs, the OOM killer,
NFS, and NVIDIA driver faults that print no Xid. One parser for the followed ``/dev/kmsg`` and a pasted dmesg.

Each pattern has a real line above it and where it was seen (tests/fixtures/kernel_log/SOURCES.md lists them
again with their sources). The printk formats are the kernel's: mlx5 ``drivers/net/ethernet/mellanox/mlx5/core``
(``health.c``, ``cmd.c``, ``events.c``, ``en_main.c``), ``drivers/pci/pcie/aer.c``, ``arch/x86/kernel/cpu/mce``,
``drivers/edac/edac_mc.c``, ``kernel/hung_task.c``, ``kernel/watchdog.c``, ``mm/oom_kill.c``,
``fs/nfs/`` and ``net/sunrpc/clnt.c``. Whatever precedes the driver prefix (a dmesg stamp, a syslog
``host kernel:``) is ignored, as in sources/xid.py. Pure: no verdicts (judge/kernel.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Literal

from msgspec import Struct

from dgxdoctor.lazy_re import lazy_compile

Kind = Literal[
    "mlx5_cmd_timeout",
    "mlx5_health",
    "mlx5_fatal",
    "link_down",
    "link_up",
    "module_event",
    "aer_corrected",
    "aer_nonfatal",
    "aer_fatal",
    "mce",
    "edac_ce",
    "edac_ue",
    "hung_task",
    "soft_lockup",
    "oom_kill",
    "nfs_not_responding",
    "nfs_ok",
    "nvrm_init_failed",
    "nvrm_api_mismatch",
    "nvswitch_fatal",
    "peermem_load_failed",
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

# arch/x86/kernel/cpu/mce: "mce: [Hardware Error]: Machine check events logged" (corrected, logged by the CMCI), and
# the panic path's "Machine check: Processor context corrupt":
#   mce: [Hardware Error]: Machine check events logged                    (radiasoft/devops#134)
#   mce: [Hardware Error]: CPU 1: Machine Check: 0 Bank 11: 8c00004f000800c2
MCE_RE = lazy_compile(r"mce: \[Hardware Error\]: (?:CPU (?P<cpu>\d{1,5}): Machine Check|Machine check)")

# drivers/edac/edac_mc.c edac_mc_handle_error:
#   EDAC MC1: 1 CE memory scrubbing error on CPU_SrcID#1_Ha#0_Chan#0_DIMM#0 (channel:0 slot:0 page:0xee30a0 ...)
#   EDAC MC0: 4 CE error on CPU#0Channel#2_DIMM#0 (channel:2 slot:0 page:0x0 offset:0x0 grain:8 syndrome:0x0)
#   EDAC MC0: 1 UE memory read error on CPU_SrcID#0_MC#0_Chan#0_DIMM#0 (channel:0 slot:0 page:0xe16677 ...)
EDAC_RE = lazy_compile(r"EDAC (?P<mc>MC\d{1,3}): (?P<count>\d{1,10}) (?P<type>CE|UE) .{0,80}?\bon (?P<dimm>\S{1,80})")

# kernel/hung_task.c:
#   INFO: task python3:48213 blocked for more than 120 seconds.
HUNG_TASK_RE = lazy_compile(r"INFO: task (?P<comm>.{1,16}):(?P<pid>\d{1,10}) blocked for more than (?P<secs>\d{1,7}) s")

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

# fs/nfs and net/sunrpc: the server stops answering, then answers again (the "OK" line is the recovery):
#   nfs: server 100.73.159.36 not responding, still trying       (nfs-ganesha/nfs-ganesha#1295)
#   nfs: server thinkcentre not responding, timed out
#   nfs: server thinkcentre OK                                   (linux-surface/linux-surface#1494: a look-alike)
NFS_RE = lazy_compile(r"\bnfs: server (?P<server>\S{1,255}) (?P<what>not responding|OK)\b")

# NVIDIA driver faults without an Xid:
#   NVRM: GPU 0000:98:00.0: RmInitAdapter failed! (0x62:0x65:1792)     (NVIDIA/open-gpu-kernel-modules#789)
#   NVRM: RmInitAdapter failed! (0x22:0x56:667)                       (older drivers name no GPU)
NVRM_INIT_RE = lazy_compile(r"NVRM: (?:GPU " + _PCI + r": )?RmInitAdapter failed! \((?P<code>[0-9a-fx:]{1,40})\)")
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


class KernelEvent(Struct, frozen=True):
    """One fault line: what kind, the device it names in its own words, and the line.

    ``pci`` is a full PCI address (``0000:3b:00.0``), ``netdev`` an interface name; ``other`` names what is not a
    PCI device (``MC0``, ``cpu7``, an NFS server). ``process``/``pid``: the task a hang or the OOM killer names.
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

    @property
    def named(self) -> str:
        """The device as the line names it ("" when it names none)."""
        return self.netdev or self.pci or self.other or ""


def _mlx5(line: str) -> KernelEvent | None:
    prefix = MLX5_PREFIX_RE.search(line)
    if prefix is None:
        return None
    rest = line[prefix.end() :].strip()
    pci, netdev = prefix["pci"].lower(), prefix["netdev"]
    link = MLX5_LINK_RE.search(line) if "Link " in rest else None
    if link is not None and netdev:
        kind: Kind = "link_down" if link["state"] == "down" else "link_up"
        return KernelEvent(kind, line.strip(), pci, netdev, detail=f"Link {link['state']}")
    module = MODULE_EVENT_RE.search(rest) if "module event" in rest else None
    if module is not None:
        status = module["status"].strip()
        if status == "Cable plugged" and not module["error"]:
            return None  # a cable plugged in: the look-alike of a module fault
        detail = f"module {module['module']}: {status}" + (f", {module['why'].strip()}" if module["why"] else "")
        return KernelEvent("module_event", line.strip(), pci, netdev, detail=detail)
    timeout = MLX5_CMD_TIMEOUT_RE.search(rest) if "timeout" in rest else None
    if timeout is not None:
        return KernelEvent("mlx5_cmd_timeout", line.strip(), pci, netdev, detail=f"{timeout['cmd']} timed out")
    if MLX5_FATAL_RE.search(rest):
        return KernelEvent("mlx5_fatal", line.strip(), pci, netdev, detail=rest.split("): ", 1)[-1][:160])
    if MLX5_HEALTH_RE.search(rest):
        return KernelEvent("mlx5_health", line.strip(), pci, netdev, detail=rest.split("): ", 1)[-1][:160])
    return None


_AER_KINDS: dict[str, Kind] = {"Fatal": "aer_fatal", "Non-Fatal": "aer_nonfatal"}


def _aer(line: str) -> KernelEvent | None:
    match = AER_RE.search(line)
    if match is None:
        return None
    kind = _AER_KINDS.get(match["fatal"] or "", "aer_corrected")
    return KernelEvent(kind, line.strip(), match["pci"].lower(), detail=f"severity={match['sev']} ({match['driver']})")


def _host(line: str) -> KernelEvent | None:
    """Machine checks, EDAC, hangs, the OOM killer, NFS."""
    if (m := OOM_KILL_RE.search(line)) is not None and "Killed process" in line:
        owner = OOM_UID_RE.search(line, m.end())
        uid = int(owner["uid"]) if owner is not None else None
        return KernelEvent("oom_kill", line.strip(), process=m["comm"], pid=int(m["pid"]), uid=uid)
    if (m := HUNG_TASK_RE.search(line)) is not None:
        detail = f"blocked for more than {m['secs']} s"
        return KernelEvent("hung_task", line.strip(), process=m["comm"], pid=int(m["pid"]), detail=detail)
    if (m := SOFT_LOCKUP_RE.search(line)) is not None:
        cpu, detail = f"cpu{m['cpu']}", f"stuck for {m['secs']} s"
        return KernelEvent("soft_lockup", line.strip(), other=cpu, process=m["comm"], pid=int(m["pid"]), detail=detail)
    if (m := EDAC_RE.search(line)) is not None:
        kind: Kind = "edac_ue" if m["type"] == "UE" else "edac_ce"
        return KernelEvent(kind, line.strip(), other=m["mc"], detail=f"{m['count']} {m['type']} on {m['dimm']}")
    if (m := MCE_RE.search(line)) is not None:
        return KernelEvent("mce", line.strip(), other=f"cpu{m['cpu']}" if m["cpu"] else None)
    if (m := NFS_RE.search(line)) is not None:
        kind = "nfs_ok" if m["what"] == "OK" else "nfs_not_responding"
        return KernelEvent(kind, line.strip(), other=f"nfs:{m['server']}", detail=m["what"])
    return None


def _nvidia(line: str) -> KernelEvent | None:
    if (m := NVRM_INIT_RE.search(line)) is not None:
        pci = m["pci"].lower() if m["pci"] else None
        return KernelEvent("nvrm_init_failed", line.strip(), pci, detail=f"RmInitAdapter failed ({m['code']})")
    if (m := NVRM_API_RE.search(line)) is not None:
        who = f"client version {m['client']}" if m["client"] else f"client {m['comm']}"
        return KernelEvent("nvrm_api_mismatch", line.strip(), detail=who)
    if (m := NVSWITCH_FATAL_RE.search(line)) is not None:
        pci = m["pci"].lower() if m["pci"] else None
        return KernelEvent("nvswitch_fatal", line.strip(), pci, other=m["dev"])
    if (m := PEERMEM_RE.search(line)) is not None:
        return KernelEvent("peermem_load_failed", line.strip(), detail=f"{m['mod']}: symbol {m['sym']}")
    return None


# Substrings that every line of a kind contains, each naming the parsers that may take the line: one scan of a line
# with none of them, and only its own parsers' regexes otherwise (the follower runs this on every kernel log line).
# (A loop of substring tests measured 1.4x faster than one alternation regex: benchmarks/kernel_scan.py.)
_HOST = (_host,)
_ROUTES: tuple[tuple[str, tuple[Callable[[str], KernelEvent | None], ...]], ...] = (
    ("mlx5_core", (_mlx5, _aer)),
    ("PCIe Bus Error", (_aer,)),
    ("NVRM: ", (_nvidia,)),
    ("nvswitch", (_nvidia,)),
    ("peermem", (_nvidia,)),
    ("peer_mem", (_nvidia,)),
    ("Hardware Error", _HOST),
    ("EDAC ", _HOST),
    ("blocked for more than", _HOST),
    ("soft lockup", _HOST),
    ("Killed process", _HOST),
    ("nfs: server", _HOST),
)


def parse_kernel_event(line: str) -> KernelEvent | None:
    """The fault (or recovery) ``line`` reports, or None. XID/SXID lines are sources/xid.py's, not this."""
    parsers = next((route for hint, route in _ROUTES if hint in line), None)
    if parsers is None or "NVRM: Xid" in line or "SXid (" in line:
        return None
    for parse in parsers:
        event = parse(line)
        if event is not None:
            return event
    return None


def may_hold_events(text: str) -> bool:
    """False when no line of ``text`` can hold a fault or recovery: none of the routes' substrings occurs (a test
    over the whole text instead of one per line, for the head of a big log that ``diagnose`` reads)."""
    return any(hint in text for hint, _ in _ROUTES)


def scan_kernel_lines(lines: Iterable[str]) -> Iterator[KernelEvent]:
    for line in lines:
        event = parse_kernel_event(line)
        if event is not None:
            yield event
