"""GPU verdicts over one NVML sweep: inventory, temperature margins, power, clock events, ECC and row remapping,
NVLink, PCIe and the driver's recovery action (reset vs reboot), judged the way DCGM health checks and GPUd do.

Pure: snapshots and limits in, findings out. ``checks/gpu.py`` reads NVML and exports the values; every status
of the GPU domain is decided here.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from dgxdoctor.judge.presence import gpus_missing_from_nvml
from dgxdoctor.result import Action, Finding, Status
from dgxdoctor.sources.nvml import (
    CLOCK_EVENT_HW_POWER_BRAKE,
    CLOCK_EVENT_HW_SLOWDOWN,
    CLOCK_EVENT_HW_THERMAL,
    CLOCK_EVENT_SW_THERMAL,
    RECOVERY_ACTIONS,
    GpuSnapshot,
    NvmlSweep,
)
from dgxdoctor.sources.pci import PciDevice


class GpuLimits(Struct, frozen=True):
    """The ``[checks.gpu]`` keys the verdicts read (GpuSettings documents each one)."""

    expected_count: int = 8
    expected_model: str = ""
    temperature_margin_c: int = 5
    slowdown_c_if_unknown: int = 90
    power_warn_fraction: float | None = None
    power_limit_reduced_fraction: float = 0.9
    expected_nvlinks: int = 0
    pcie_gen_min_utilization: float = 0.5


# What the driver's recovery action asks the operator to do, and the remediation kind it maps to.
RECOVERY_REMEDIES: dict[str, tuple[str, str]] = {
    "gpu_reset": ("reset_gpu", "drain the GPU's work (stop vLLM on this node), then reset it: nvidia-smi -r -i <gpu>"),
    "node_reboot": ("reboot_node", "drain the node and reboot it"),
    "drain_p2p": ("investigate", "stop peer-to-peer (NVLink/NCCL) traffic to this GPU: stop vLLM on this node"),
    "drain_and_reset": ("reset_gpu", "stop vLLM on this node (drain P2P traffic), then reset the GPU: nvidia-smi -r"),
    "recover_imex_domain": ("investigate", "recover the IMEX domain (restart nvidia-imex on its nodes)"),
    "bus_reset": ("reset_gpu", "drain the node's GPU work, then reset the GPU's PCIe bus (or reboot the node)"),
    "system_reboot": ("reboot_node", "drain the node and reboot it"),
}


def unreadable(g: GpuSnapshot) -> Finding:
    """A GPU NVML lists but cannot read at all."""
    return Finding(
        "GPU_LOST" if g.lost else "GPU_UNREADABLE",
        Status.CRITICAL,
        f"GPU {g.index} cannot be read over NVML: {g.unreadable}",
        f"gpu{g.index}",
        remedy="the GPU fell off the bus or needs a reset: look for XID 79/48/94/95 in the kernel log, "
        "drain the node and reboot it; if it recurs, the GPU needs service",
    )


def inventory(nvml: NvmlSweep, limits: GpuLimits, names: list[str], pci_gpus: Sequence[PciDevice]) -> list[Finding]:
    """Count and models: against the settings, against each other, and against the PCI bus."""
    out: list[Finding] = []
    gpus = nvml.gpus
    if limits.expected_count and len(gpus) != limits.expected_count:
        out.append(
            Finding(
                "GPU_COUNT_MISMATCH",
                Status.CRITICAL,
                f"NVML sees {len(gpus)} GPUs, expected {limits.expected_count}",
                remedy="a GPU fell off the bus or failed to initialise: check `nvidia-smi -L` and the kernel log for "
                "XID 79; a node reboot usually brings it back, else the GPU needs service",
            )
        )
    missing = gpus_missing_from_nvml(pci_gpus, [g.pci_bus_id for g in gpus])
    if missing is not None:
        out.append(missing)
    if len(names) > 1:
        out.append(
            Finding(
                "GPU_MODEL_MIXED",
                Status.CRITICAL,
                f"GPUs of different models on one node: {', '.join(names)}",
                remedy="tensor parallelism needs identical GPUs: check the node's inventory",
            )
        )
    if limits.expected_model:
        for g in gpus:
            if g.unreadable is None and g.name is not None and limits.expected_model.lower() not in g.name.lower():
                out.append(
                    Finding(
                        "GPU_MODEL_UNEXPECTED",
                        Status.CRITICAL,
                        f"{g.label} is a {g.name}, expected a '{limits.expected_model}'",
                        g.subject,
                        remedy="wrong node or wrong hardware: check the inventory and the configured expected_model",
                    )
                )
    return out


def gpu_findings(g: GpuSnapshot, limits: GpuLimits) -> list[Finding]:
    """Every verdict over one readable GPU, in a stable order."""
    return [
        *_reads(g),
        *temperature(g, limits),
        *power(g, limits),
        *clock_events(g),
        *memory_errors(g),
        *nvlink(g, limits),
        *pcie(g, limits),
        *recovery(g),
    ]


def _reads(g: GpuSnapshot) -> list[Finding]:
    if g.lost:
        return [
            Finding(
                "GPU_LOST",
                Status.CRITICAL,
                f"{g.label} stopped answering NVML mid-read: {'; '.join(sorted(set(g.read_errors.values())))}",
                g.subject,
                remedy="the GPU fell off the bus or needs a reset: look for XID 79 in the kernel log, drain the node "
                "and reboot it",
            )
        ]
    if g.read_errors:
        return [
            Finding(
                "GPU_READ_ERROR",
                Status.UNKNOWN,
                f"{g.label}: NVML failed to read {', '.join(sorted(g.read_errors))}: "
                f"{'; '.join(sorted(set(g.read_errors.values())))}",
                g.subject,
            )
        ]
    return []


_COOLING = "check the node's cooling (fans, airflow, inlet temperature, `ipmitool sdr type temperature`)"


def temperature(g: GpuSnapshot, limits: GpuLimits) -> list[Finding]:
    """Two views of the same limit. Drivers before R565 report absolute thresholds (H100: slowdown 89 C,
    max operating 87 C); R565+ report "T.Limit", the margin below the maximum operating temperature, at
    which the driver starts to lower clocks (slowdown sits 2 C past it on Hopper). Use whichever is known.
    """
    margin, temp, left = limits.temperature_margin_c, g.temperature_c, g.temperature_margin_c
    if left is not None:
        reading = f"{temp} C, " if temp is not None else ""
        if left <= 0:
            what = f"{g.label} at {reading}{-left} C past its maximum operating temperature (T.Limit {left} C)"
            return [Finding("GPU_TEMPERATURE_CRITICAL", Status.CRITICAL, what, g.subject, remedy=_COOLING)]
        if left <= margin:
            what = f"{g.label} at {reading}{left} C below its maximum operating temperature (T.Limit {left} C)"
            return [Finding("GPU_TEMPERATURE_HIGH", Status.WARNING, what, g.subject, remedy=_COOLING)]
        return []
    if temp is None:
        return []
    slowdown = g.slowdown_c if g.slowdown_c is not None else limits.slowdown_c_if_unknown
    if temp >= slowdown:
        what = f"{g.label} at {temp} C, at or above its slowdown threshold {slowdown} C"
        return [Finding("GPU_TEMPERATURE_CRITICAL", Status.CRITICAL, what, g.subject, remedy=_COOLING)]
    if temp >= slowdown - margin:
        what = f"{g.label} at {temp} C, within {margin} C of its slowdown threshold {slowdown} C"
        return [Finding("GPU_TEMPERATURE_HIGH", Status.WARNING, what, g.subject, remedy=_COOLING)]
    return []


def power(g: GpuSnapshot, limits: GpuLimits) -> list[Finding]:
    out: list[Finding] = []
    limit = g.power_limit_w
    fraction = limits.power_warn_fraction
    if fraction is not None and g.power_w is not None and limit and g.power_w >= fraction * limit:
        out.append(
            Finding(
                "GPU_POWER_HIGH",
                Status.WARNING,
                f"{g.label} draws {g.power_w:.0f} W, {g.power_w / limit:.0%} of its {limit:.0f} W limit",
                g.subject,
                remedy="sustained draw at the limit: check cooling and whether the load is expected",
            )
        )
    default = g.power_default_limit_w
    if limit is not None and default and limit < limits.power_limit_reduced_fraction * default:
        out.append(
            Finding(
                "GPU_POWER_LIMIT_REDUCED",
                Status.WARNING,
                f"{g.label} is capped at {limit:.0f} W, below its default {default:.0f} W: it will run slower than "
                f"its peers",
                g.subject,
                remedy="restore the default limit (nvidia-smi -pl <default>) unless the cap is intended on every node",
            )
        )
    return out


def clock_events(g: GpuSnapshot) -> list[Finding]:
    """SW power cap, idle, applications clocks and sync boost are normal operation: an inference GPU at full load
    sits at its power cap by design. Only hardware slowdowns (the GPU halves its clocks or more) and the
    driver's thermal slowdown are evidence of a problem."""
    reasons = g.clock_event_reasons
    if reasons is None:
        return []
    out: list[Finding] = []
    if reasons & CLOCK_EVENT_HW_THERMAL:
        out.append(
            Finding(
                "GPU_HW_THERMAL_SLOWDOWN",
                Status.CRITICAL,
                f"{g.label} clocks cut by hardware thermal slowdown (temperature {g.temperature_c} C)",
                g.subject,
                remedy="the GPU overheats: check fans, airflow and inlet temperature; the TP group runs at this "
                "GPU's speed",
            )
        )
    if reasons & CLOCK_EVENT_HW_POWER_BRAKE:
        out.append(
            Finding(
                "GPU_HW_POWER_BRAKE",
                Status.CRITICAL,
                f"{g.label} clocks cut by the external power brake",
                g.subject,
                remedy="the chassis asserted power brake: check PSUs and the BMC event log (ipmitool sel list)",
            )
        )
    if reasons & CLOCK_EVENT_HW_SLOWDOWN and not reasons & (CLOCK_EVENT_HW_THERMAL | CLOCK_EVENT_HW_POWER_BRAKE):
        out.append(
            Finding(
                "GPU_HW_SLOWDOWN",
                Status.WARNING,
                f"{g.label} clocks cut by hardware slowdown",
                g.subject,
                remedy="check temperature, power supply and the BMC event log; if it persists, the GPU needs service",
            )
        )
    if reasons & CLOCK_EVENT_SW_THERMAL:
        out.append(
            Finding(
                "GPU_SW_THERMAL_SLOWDOWN",
                Status.WARNING,
                f"{g.label} clocks reduced by the driver: above its maximum operating temperature",
                g.subject,
                remedy="check the node's cooling",
            )
        )
    return out


def memory_errors(g: GpuSnapshot) -> list[Finding]:
    """Uncorrected ECC since the driver loaded, pages waiting to retire, row remapping pending or failed."""
    out: list[Finding] = []
    if g.ecc_volatile_uncorrected:
        out.append(
            Finding(
                "GPU_ECC_UNCORRECTED",
                Status.CRITICAL,
                f"{g.label} had {g.ecc_volatile_uncorrected} uncorrected ECC errors since the driver loaded",
                g.subject,
                remedy="data on this GPU may be corrupt: drain the node, reset the GPU (nvidia-smi -r) so the bad "
                "row is remapped; replace the GPU if remapping fails",
            )
        )
    if g.retired_pages_pending:
        out.append(
            Finding(
                "GPU_RETIRED_PAGES_PENDING",
                Status.WARNING,
                f"{g.label} has memory pages waiting to be retired: reset GPU to apply",
                g.subject,
                remedy="at the next maintenance window drain the node and reset the GPU (nvidia-smi -r)",
            )
        )
    rows = g.remapped_rows
    if rows is not None and rows.failure:
        out.append(
            Finding(
                "GPU_ROW_REMAP_FAILED",
                Status.CRITICAL,
                f"{g.label} row remapping failed: no spare memory rows left",
                g.subject,
                remedy="the GPU's memory is worn out: take the node out of service and have the GPU replaced",
            )
        )
    elif rows is not None and rows.pending:
        out.append(
            Finding(
                "GPU_ROW_REMAP_PENDING",
                Status.WARNING,
                f"{g.label} has a memory row remapping pending: reset GPU to apply",
                g.subject,
                remedy="drain the node and reset the GPU (nvidia-smi -r) or reboot, so the remapping takes effect",
            )
        )
    return out


def nvlink(g: GpuSnapshot, limits: GpuLimits) -> list[Finding]:
    """A link reported down, or fewer active links than the node's design (``expected_nvlinks``)."""
    links = g.nvlink_active
    if not links:
        return []
    up = sum(links.values())
    down = sorted(link for link, active in links.items() if not active)
    remedy = (
        "an NVLink down slows or breaks NCCL all-reduce inside the node: check `nvidia-smi nvlink --status` and "
        "the fabric manager (systemctl status nvidia-fabricmanager); reset the GPU or reboot the node"
    )
    if down:
        what = f"{g.label} NVLink link(s) {', '.join(map(str, down))} down ({up}/{len(links)} up)"
        return [Finding("NVLINK_DOWN", Status.CRITICAL, what, g.subject, remedy=remedy)]
    if limits.expected_nvlinks and up < limits.expected_nvlinks:
        what = f"{g.label} has {up} active NVLinks, expected {limits.expected_nvlinks}"
        return [Finding("NVLINK_DOWN", Status.CRITICAL, what, g.subject, remedy=remedy)]
    return []


def pcie(g: GpuSnapshot, limits: GpuLimits) -> list[Finding]:
    """Width is always compared; the generation only under load (links train down to Gen1 at idle to save power
    and back up under load)."""
    out: list[Finding] = []
    remedy = "reseat the GPU or its riser at the next maintenance; check `lspci -vv` LnkSta and the BMC log"
    if g.pcie_width_current is not None and g.pcie_width_max and g.pcie_width_current < g.pcie_width_max:
        what = f"{g.label} PCIe link x{g.pcie_width_current}, capable of x{g.pcie_width_max}"
        out.append(Finding("GPU_PCIE_WIDTH_DEGRADED", Status.WARNING, what, g.subject, remedy=remedy))
    busy = g.utilization_ratio is not None and g.utilization_ratio >= limits.pcie_gen_min_utilization
    if busy and g.pcie_gen_current is not None and g.pcie_gen_max and g.pcie_gen_current < g.pcie_gen_max:
        what = f"{g.label} PCIe Gen{g.pcie_gen_current} under load, capable of Gen{g.pcie_gen_max}"
        out.append(Finding("GPU_PCIE_GEN_DEGRADED", Status.WARNING, what, g.subject, remedy=remedy))
    return out


def recovery(g: GpuSnapshot) -> list[Finding]:
    """Any recovery action the driver asks for is CRITICAL; its remedy says what it means."""
    if not g.recovery_action:
        return []
    action = RECOVERY_ACTIONS.get(g.recovery_action, f"action_{g.recovery_action}")
    _, remedy = RECOVERY_REMEDIES.get(action, ("investigate", "follow the driver's recovery action"))
    what = f"{g.label}: the driver asks for recovery action {action.replace('_', ' ')}"
    return [Finding("GPU_RECOVERY_ACTION", Status.CRITICAL, what, g.subject, remedy=remedy)]


def summary(findings: Sequence[Finding], gpus: Sequence[GpuSnapshot]) -> str:
    names = sorted({g.name for g in gpus if g.name})
    what = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}" + (f" ({', '.join(names)})" if names else "")
    bad = [f for f in findings if f.status in (Status.CRITICAL, Status.WARNING)]
    if not bad:
        return f"{what}: healthy"
    codes = sorted({f.code for f in bad})
    return f"{what}: {len(bad)} problem{'s' if len(bad) != 1 else ''} ({', '.join(codes)})"


def recovery_action(gpus: Sequence[GpuSnapshot]) -> Action | None:
    """The driver's own recovery action beats the generic "investigate" built from the worst remedy; a reboot
    beats a reset (one reboot fixes every GPU of the node)."""
    kinds = []
    for g in gpus:
        if g.recovery_action:
            action = RECOVERY_ACTIONS.get(g.recovery_action, "")
            if action in RECOVERY_REMEDIES:
                kinds.append((action, g))
    if not kinds:
        return None
    kinds.sort(key=lambda item: 0 if RECOVERY_REMEDIES[item[0]][0] == "reboot_node" else 1)
    action, g = kinds[0]
    kind, remedy = RECOVERY_REMEDIES[action]
    return Action(kind, f"{g.label}: {remedy}")


def smi_errors(g: GpuSnapshot, fields: Sequence[str]) -> list[Finding]:
    """``ERR!`` in the ``nvidia-smi`` table: NVML returned an error for those fields of this GPU, which is how a GPU
    that fell off the bus or needs a reset looks there (the same state NVML reads as unreadable)."""
    if not fields:
        return []
    return [
        Finding(
            "GPU_SMI_ERROR",
            Status.CRITICAL,
            f"{g.label}: nvidia-smi cannot read {', '.join(fields)} (ERR!)",
            g.subject,
            remedy="look for XID 79/48/94/95 in the kernel log (dmesg | grep -i xid); drain the node and reset the "
            "GPU (nvidia-smi -r) or reboot; if it recurs, the GPU needs service",
        )
    ]
