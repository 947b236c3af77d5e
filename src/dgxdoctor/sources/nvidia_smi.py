"""``nvidia-smi`` as an operator pastes it: ``nvidia-smi -q``, the default table and ``nvidia-smi nvlink -s``, read
into the same ``GpuSnapshot`` that NVML gives, so the gpu check's verdicts (``judge/gpu.py``) judge a paste too.

Layouts, each copied from a real capture (``docs/h200/nvidia-smi-q.txt``, ``nvidia-smi.txt``, ``nvlink-s.txt``,
driver 580.159.04) and from the key names of older drivers in NVIDIA's nvidia-smi(1) documentation:
- ``-q``: ``GPU 00000000:00:06.0`` opens a GPU; then ``Key : value`` lines and section headers, nested by indent.
  R535+ say ``Clocks Event Reasons``, older ``Clocks Throttle Reasons``; R565+ print temperature limits as
  ``T.Limit`` offsets (``GPU T.Limit Temp : 51 C``, ``GPU Slowdown T.Limit Temp : -2 C``), older as absolute
  ``GPU Slowdown Temp : 89 C``; ECC as ``DRAM Uncorrectable`` / ``SRAM Uncorrectable Parity`` (Hopper, R550+),
  ``SRAM Uncorrectable`` (Ampere) or ``Double Bit`` > ``Total`` (Volta).
- the table: ``|   0  NVIDIA H200    On  |   00000000:00:06.0 Off |                    0 |`` then
  ``| N/A   36C    P0    80W /  700W |       0MiB / 143771MiB |      0%      Default |``; ``ERR!`` where NVML
  failed to read a value.
- ``nvlink -s``: ``GPU 0: NVIDIA H200 (UUID: GPU-...)`` then ``\t Link 0: 26.562 GB/s`` or ``Link 3: <inactive>``.
"""

from __future__ import annotations

import re

from msgspec import Struct, field
from msgspec.structs import replace

from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.sources.nvml import (
    RECOVERY_ACTIONS,
    GpuSnapshot,
    RemappedRows,
)

# "GPU 00000000:00:06.0" at the start of a line: one GPU's block of `nvidia-smi -q`.
Q_GPU_RE = lazy_compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$", re.M)
# "    Product Name                                       : NVIDIA H200"
# The key starts at its first non-space and ends at its last before the colon: one way to split the line (a lazy key
# after the indent took 1.9 s on 8 KiB of spaces).
Q_LINE_RE = lazy_compile(r"^( *)([^ :](?:[^:]*[^\s:])?)\s*(?::\s?(.*))?$")
# "|   0  NVIDIA H200                    On  |   00000000:00:06.0 Off |                    0 |"
TABLE_GPU_RE = lazy_compile(
    r"^\s*\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s+\S+\s+\|"
    r"\s*(\S+)\s*\|",
    re.M,
)
# "| N/A   36C    P0             80W /  700W |       0MiB / 143771MiB |      0%      Default |"
TABLE_VALUES_RE = lazy_compile(
    r"^\|\s*(\S+)\s+(\S+?)C?\s+(P\d+|ERR!|N/A)\s+(\S+?)W?\s*/\s*(\S+?)W?\s+\|\s*(\S+?)(?:MiB)?\s*/\s*(\S+?)(?:MiB)?\s+"
    r"\|\s*(\S+?)%?\s+"
)
# "GPU 0: NVIDIA H200 (UUID: GPU-7b512bdd-0fae-0dae-54a8-4e95615233cd)"
NVLINK_GPU_RE = lazy_compile(r"^GPU (\d+): (.*?)(?: \(UUID: (GPU-[0-9a-fA-F-]+)\))?\s*$", re.M)
# "\t Link 0: 26.562 GB/s" or "\t Link 3: <inactive>"
NVLINK_LINK_RE = lazy_compile(r"^\s+Link (\d+): (.+?)\s*$")

# nvidia-smi's clock event names -> NVML's bits (nvml.h nvmlClocksEventReason*).
CLOCK_EVENT_NAMES = {
    "Idle": 0x001,
    "Applications Clocks Setting": 0x002,
    "SW Power Cap": 0x004,
    "HW Slowdown": 0x008,
    "Sync Boost": 0x010,
    "SW Thermal Slowdown": 0x020,
    "HW Thermal Slowdown": 0x040,
    "HW Power Brake Slowdown": 0x080,
    "Display Clock Setting": 0x100,
}
# "GPU Recovery Action : None" -> NVML's nvmlDeviceGpuRecoveryAction_t.
RECOVERY_NAMES = {
    "None": 0,
    "Reset": 1,
    "GPU Reset": 1,
    "Reboot": 2,
    "Node Reboot": 2,
    "Drain P2P": 3,
    "Drain and Reset": 4,
}
assert set(RECOVERY_NAMES.values()) <= set(RECOVERY_ACTIONS)


class _Node(Struct):
    value: str | None = None
    children: dict[str, _Node] = field(default_factory=dict)

    def get(self, *path: str) -> str | None:
        node: _Node | None = self
        for key in path:
            node = node.children.get(key) if node is not None else None
        return node.value if node is not None else None

    def sub(self, *path: str) -> _Node | None:
        node: _Node | None = self
        for key in path:
            node = node.children.get(key) if node is not None else None
        return node


def looks_like_query(text: str) -> bool:
    return "==============NVSMI LOG==============" in text or (
        "Product Name" in text and Q_GPU_RE.search(text) is not None
    )


def looks_like_table(text: str) -> bool:
    return "NVIDIA-SMI" in text and TABLE_GPU_RE.search(text) is not None


def looks_like_nvlink_status(text: str) -> bool:
    return "Link 0:" in text and NVLINK_GPU_RE.search(text) is not None


def _tree(lines: list[str]) -> _Node:
    """Indented ``Key : value`` lines -> a tree (a key without a value opens a section)."""
    root = _Node()
    stack: list[tuple[int, _Node]] = [(-1, root)]
    for line in lines:
        m = Q_LINE_RE.match(line.rstrip("\r"))
        if m is None or not m.group(2).strip():
            continue
        indent, key, value = len(m.group(1)), m.group(2).strip(), m.group(3)
        while stack[-1][0] >= indent:
            stack.pop()
        node = _Node(value.strip() if value is not None else None)
        stack[-1][1].children.setdefault(key, node)
        stack.append((indent, node))
    return root


def bus_id(raw: str) -> str:
    """``00000000:00:06.0`` -> ``0000:00:06`` (as the kernel log and the NVML snapshot name a GPU)."""
    domain, bus, rest = raw.split(":")
    return f"{domain[-4:]}:{bus}:{rest.split('.')[0]}".lower()


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", text)
    return float(m.group(1)) if m else None


def _int(text: str | None) -> int | None:
    value = _number(text)
    return None if value is None else int(value)


def _yes(text: str | None) -> bool | None:
    if text is None:
        return None
    word = text.strip().lower()
    return True if word == "yes" else False if word == "no" else None


def parse_query(text: str) -> list[GpuSnapshot]:
    """Every GPU of an ``nvidia-smi -q`` paste (a cut paste gives the GPUs it shows)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if Q_GPU_RE.match(line)]
    gpus = []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        header = Q_GPU_RE.match(lines[start])
        assert header is not None
        tree = _tree(lines[start + 1 : end])
        gpus.append(_snapshot(n, bus_id(header.group(1)), tree))
    return gpus


def _snapshot(index: int, pci: str, t: _Node) -> GpuSnapshot:
    power = t.sub("GPU Power Readings") or t.sub("Power Readings") or _Node()
    link = t.sub("PCI", "GPU Link Info") or _Node()
    g = GpuSnapshot(
        index=_int(t.get("Minor Number")) or index if t.get("Minor Number") not in (None, "N/A") else index,
        name=t.get("Product Name"),
        uuid=t.get("GPU UUID"),
        pci_bus_id=pci,
        power_w=_number(power.get("Average Power Draw") or power.get("Power Draw")),
        power_limit_w=_number(power.get("Current Power Limit") or power.get("Enforced Power Limit")),
        power_default_limit_w=_number(power.get("Default Power Limit")),
        memory_used_bytes=_mib(t.get("FB Memory Usage", "Used")),
        memory_total_bytes=_mib(t.get("FB Memory Usage", "Total")),
        utilization_ratio=_ratio(t.get("Utilization", "GPU") or t.get("Utilization", "Gpu")),
        memory_utilization_ratio=_ratio(t.get("Utilization", "Memory")),
        clock_event_reasons=_clock_events(t.sub("Clocks Event Reasons") or t.sub("Clocks Throttle Reasons")),
        retired_pages_pending=_yes(
            t.get("Retired Pages", "Pending Page Blacklist") or t.get("Retired Pages", "Pending")
        ),
        remapped_rows=_remapped(t.sub("Remapped Rows")),
        pcie_gen_current=_int(link.get("PCIe Generation", "Current")),
        pcie_gen_max=_int(link.get("PCIe Generation", "Max")),
        pcie_width_current=_int(link.get("Link Width", "Current")),
        pcie_width_max=_int(link.get("Link Width", "Max")),
        recovery_action=RECOVERY_NAMES.get(t.get("GPU Recovery Action") or ""),
    )
    return _with_ecc(_with_temperature(g, t.sub("Temperature") or _Node()), t.sub("ECC Errors"))


def _mib(text: str | None) -> int | None:
    value = _number(text)
    return None if value is None else int(value) << 20


def _ratio(text: str | None) -> float | None:
    value = _number(text)
    return None if value is None else value / 100.0


def _clock_events(section: _Node | None) -> int | None:
    """The active reasons as NVML's bitmask; nested ``HW Thermal Slowdown`` lines under ``HW Slowdown`` count."""
    if section is None:
        return None
    mask = 0
    stack = list(section.children.items())
    while stack:
        name, node = stack.pop()
        if (node.value or "").strip() == "Active":
            mask |= CLOCK_EVENT_NAMES.get(name, 0)
        stack.extend(node.children.items())
    return mask


def _remapped(section: _Node | None) -> RemappedRows | None:
    if section is None or section.get("Pending") in (None, "N/A"):
        return None
    return RemappedRows(
        corrected=_int(section.get("Correctable Error")) or 0,
        uncorrected=_int(section.get("Uncorrectable Error")) or 0,
        pending=bool(_yes(section.get("Pending"))),
        failure=bool(_yes(section.get("Remapping Failure Occurred"))),
    )


def _with_temperature(g: GpuSnapshot, t: _Node) -> GpuSnapshot:
    current = _int(t.get("GPU Current Temp"))
    margin = _int(t.get("GPU T.Limit Temp"))
    if margin is not None and current is not None:
        # R565+: limits are offsets from T.Limit (max operating = current + margin; slowdown -2 C = 2 C past it)
        limit = current + margin
        slowdown, shutdown = _int(t.get("GPU Slowdown T.Limit Temp")), _int(t.get("GPU Shutdown T.Limit Temp"))
        return replace(
            g,
            temperature_c=current,
            temperature_margin_c=margin,
            max_operating_c=limit,
            slowdown_c=None if slowdown is None else limit - slowdown,
            shutdown_c=None if shutdown is None else limit - shutdown,
        )
    return replace(
        g,
        temperature_c=current,
        slowdown_c=_int(t.get("GPU Slowdown Temp")),
        shutdown_c=_int(t.get("GPU Shutdown Temp")),
        max_operating_c=_int(t.get("GPU Max Operating Temp")),
    )


# Uncorrectable / correctable counters of each driver generation's ECC section.
ECC_UNCORRECTED = (
    "DRAM Uncorrectable",
    "SRAM Uncorrectable",
    "SRAM Uncorrectable Parity",
    "SRAM Uncorrectable SEC-DED",
)
ECC_CORRECTED = ("DRAM Correctable", "SRAM Correctable")


def _ecc_counts(section: _Node | None) -> tuple[int | None, int | None]:
    """(uncorrected, corrected) of a Volatile or Aggregate block; Volta's Double/Single Bit > Total too."""
    if section is None:
        return None, None
    if section.sub("Double Bit") is not None or section.sub("Single Bit") is not None:
        return _int(section.get("Double Bit", "Total")), _int(section.get("Single Bit", "Total"))
    uncorrected = [_int(section.get(k)) for k in ECC_UNCORRECTED if section.get(k) is not None]
    corrected = [_int(section.get(k)) for k in ECC_CORRECTED if section.get(k) is not None]
    known_u = [v for v in uncorrected if v is not None]
    known_c = [v for v in corrected if v is not None]
    return (sum(known_u) if known_u else None), (sum(known_c) if known_c else None)


def _with_ecc(g: GpuSnapshot, ecc: _Node | None) -> GpuSnapshot:
    if ecc is None:
        return g
    vu, vc = _ecc_counts(ecc.sub("Volatile"))
    au, ac = _ecc_counts(ecc.sub("Aggregate"))
    return replace(
        g,
        ecc_volatile_uncorrected=vu,
        ecc_volatile_corrected=vc,
        ecc_aggregate_uncorrected=au,
        ecc_aggregate_corrected=ac,
    )


class TableGpu(Struct, frozen=True):
    """One GPU of the default ``nvidia-smi`` table; ``errors`` names the fields that read ``ERR!``."""

    snapshot: GpuSnapshot
    errors: tuple[str, ...]


TABLE_FIELDS = ("fan", "temperature", "performance state", "power", "power cap", "memory used", "memory total", "util")


def parse_table(text: str) -> list[TableGpu]:
    lines = text.splitlines()
    gpus: list[TableGpu] = []
    for i, line in enumerate(lines):
        head = TABLE_GPU_RE.match(line.strip())
        if head is None:
            continue
        values = TABLE_VALUES_RE.match(lines[i + 1].strip()) if i + 1 < len(lines) else None
        ecc = head.group(5)
        fields = values.groups() if values else ()
        errors = tuple(name for name, v in zip(TABLE_FIELDS, fields, strict=False) if v == "ERR!")
        errors += ("ecc",) if ecc == "ERR!" else ()
        g = GpuSnapshot(
            index=int(head.group(1)),
            name=head.group(2).strip(),
            pci_bus_id=bus_id(head.group(4)),
            ecc_volatile_uncorrected=_int(ecc) if ecc not in ("N/A", "ERR!") else None,
        )
        if values is not None:
            g = replace(
                g,
                temperature_c=_int(values.group(2)),
                power_w=_number(values.group(4)),
                power_limit_w=_number(values.group(5)),
                memory_used_bytes=_mib(values.group(6)),
                memory_total_bytes=_mib(values.group(7)),
                utilization_ratio=_ratio(values.group(8)),
            )
        gpus.append(TableGpu(g, errors))
    return gpus


def parse_nvlink_status(text: str) -> dict[int, tuple[str, str | None, dict[int, str]]]:
    """GPU index -> (name, UUID, link -> what nvidia-smi printed: ``26.562 GB/s`` or ``<inactive>``)."""
    out: dict[int, tuple[str, str | None, dict[int, str]]] = {}
    current: dict[int, str] | None = None
    for line in text.splitlines():
        if (m := NVLINK_GPU_RE.match(line)) is not None:
            current = {}
            out[int(m.group(1))] = (m.group(2), m.group(3), current)
        elif current is not None and (link := NVLINK_LINK_RE.match(line)) is not None:
            current[int(link.group(1))] = link.group(2)
    return out
