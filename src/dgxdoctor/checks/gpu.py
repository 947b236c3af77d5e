"""The ``gpu`` check: every GPU of the node over NVML, judged the way DCGM health checks and GPUd judge them.

By hand: ``nvidia-smi -q`` (temperatures and thresholds, "Clocks Event Reasons", "ECC Errors", "Remapped Rows",
"GPU Recovery Action", "GPU Link Info"), ``nvidia-smi nvlink --status``, ``nvidia-smi -L`` for the count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from dgxdoctor.checks.base import Check, CheckSettings, own_settings
from dgxdoctor.environment import Environment
from dgxdoctor.judge.presence import gpus_missing_from_nvml, no_gpus, nvml_unavailable
from dgxdoctor.result import Action, CheckResult, Finding, MetricSpec, ResultBuilder, Status
from dgxdoctor.sources.nvml import (
    CLOCK_EVENT_HW_POWER_BRAKE,
    CLOCK_EVENT_HW_SLOWDOWN,
    CLOCK_EVENT_HW_THERMAL,
    CLOCK_EVENT_REASONS,
    CLOCK_EVENT_SW_THERMAL,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    RECOVERY_ACTIONS,
    GpuSnapshot,
    NvmlClient,
    NvmlError,
    NvmlLibraryNotFound,
    NvmlSweep,
    format_cuda_version,
    sweep,
)
from dgxdoctor.sources.pci import PciDevice, nvidia_gpus, read_pci_devices

GPU_LABELS = ("gpu", "pci_bus_id")

GPU_COUNT = MetricSpec("dgxdoctor_gpu_count", "GPUs NVML reports on this node.")
GPU_INFO = MetricSpec(
    "dgxdoctor_gpu_info", "GPU identity: UUID and model name (value 1).", "info", (*GPU_LABELS, "uuid", "model")
)
MEMORY_USED = MetricSpec("dgxdoctor_gpu_memory_used_bytes", "GPU framebuffer memory in use, bytes.", labels=GPU_LABELS)
MEMORY_TOTAL = MetricSpec(
    "dgxdoctor_gpu_memory_total_bytes", "GPU framebuffer memory in total, bytes.", labels=GPU_LABELS
)
UTILIZATION = MetricSpec(
    "dgxdoctor_gpu_utilization_ratio",
    "Fraction of the last sample period in which a kernel ran on the GPU (0..1).",
    labels=GPU_LABELS,
)
# With utilization_ratio, the GPU-side sign of a rank waiting in a collective: the NCCL kernel keeps
# utilization.gpu at 100 % while memory traffic drops to 0 % (docs/h200/hang-recording-2026-11-30).
MEMORY_UTILIZATION = MetricSpec(
    "dgxdoctor_gpu_memory_utilization_ratio",
    "Fraction of the last sample period during which device memory was read or written (0..1).",
    labels=GPU_LABELS,
)
TEMPERATURE = MetricSpec(
    "dgxdoctor_gpu_temperature_celsius", "GPU core temperature, degrees Celsius.", labels=GPU_LABELS
)
TEMPERATURE_MARGIN = MetricSpec(
    "dgxdoctor_gpu_temperature_margin_celsius",
    "Degrees left below the GPU's maximum operating temperature (nvidia-smi T.Limit); at 0 clocks drop.",
    labels=GPU_LABELS,
)
TEMPERATURE_THRESHOLD = MetricSpec(
    "dgxdoctor_gpu_temperature_threshold_celsius",
    "GPU temperature thresholds the driver enforces (threshold: slowdown, shutdown, max_operating), Celsius.",
    labels=(*GPU_LABELS, "threshold"),
)
POWER = MetricSpec("dgxdoctor_gpu_power_watts", "GPU power draw, watts.", labels=GPU_LABELS)
POWER_LIMIT = MetricSpec(
    "dgxdoctor_gpu_power_limit_watts", "GPU power limit the driver enforces, watts.", labels=GPU_LABELS
)
POWER_DEFAULT_LIMIT = MetricSpec(
    "dgxdoctor_gpu_power_default_limit_watts", "GPU default power limit (board design), watts.", labels=GPU_LABELS
)
CLOCK_EVENT = MetricSpec(
    "dgxdoctor_gpu_clock_event_active",
    "1 while a clock event reason (formerly throttle reason) holds GPU clocks down, by reason; 0 otherwise.",
    labels=(*GPU_LABELS, "reason"),
)
ECC_ERRORS = MetricSpec(
    "dgxdoctor_gpu_ecc_errors_total",
    "ECC memory errors (error: corrected/uncorrected; scope: volatile since driver load, aggregate lifetime).",
    "counter",
    (*GPU_LABELS, "error", "scope"),
)
REMAPPED_ROWS = MetricSpec(
    "dgxdoctor_gpu_remapped_rows_total",
    "HBM rows remapped because of corrected or uncorrected errors (error label).",
    "counter",
    (*GPU_LABELS, "error"),
)
ROW_REMAP_PENDING = MetricSpec(
    "dgxdoctor_gpu_row_remap_pending", "1 if a row remapping waits for a GPU reset to take effect.", labels=GPU_LABELS
)
ROW_REMAP_FAILED = MetricSpec(
    "dgxdoctor_gpu_row_remap_failed", "1 if a row remapping failed (no spare rows left).", labels=GPU_LABELS
)
RETIRED_PAGES_PENDING = MetricSpec(
    "dgxdoctor_gpu_retired_pages_pending", "1 if a page retirement waits for a GPU reset.", labels=GPU_LABELS
)
NVLINK_UP = MetricSpec(
    "dgxdoctor_gpu_nvlink_up", "1 if the NVLink link is active, 0 if down.", labels=(*GPU_LABELS, "link")
)
NVLINK_LINKS_UP = MetricSpec("dgxdoctor_gpu_nvlink_links_up", "Active NVLink links of the GPU.", labels=GPU_LABELS)
PCIE_GENERATION = MetricSpec(
    "dgxdoctor_gpu_pcie_link_generation",
    "PCIe link generation now (it drops at idle to save power).",
    labels=GPU_LABELS,
)
PCIE_MAX_GENERATION = MetricSpec(
    "dgxdoctor_gpu_pcie_link_max_generation", "Highest PCIe generation GPU and host allow.", labels=GPU_LABELS
)
PCIE_WIDTH = MetricSpec("dgxdoctor_gpu_pcie_link_width_lanes", "PCIe link width now, lanes.", labels=GPU_LABELS)
PCIE_MAX_WIDTH = MetricSpec(
    "dgxdoctor_gpu_pcie_link_max_width_lanes", "Widest PCIe link possible, lanes.", labels=GPU_LABELS
)
RECOVERY_ACTION = MetricSpec(
    "dgxdoctor_gpu_recovery_action",
    "Recovery the driver asks for: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, "
    "5 recover IMEX domain, 6 bus reset, 7 system reboot.",
    labels=GPU_LABELS,
)

# What the driver's recovery action asks the operator to do, and the remediation kind it maps to.
_RECOVERY_REMEDIES: dict[str, tuple[str, str]] = {
    "gpu_reset": ("reset_gpu", "drain the GPU's work (stop vLLM on this node), then reset it: nvidia-smi -r -i <gpu>"),
    "node_reboot": ("reboot_node", "drain the node and reboot it"),
    "drain_p2p": ("investigate", "stop peer-to-peer (NVLink/NCCL) traffic to this GPU: stop vLLM on this node"),
    "drain_and_reset": ("reset_gpu", "stop vLLM on this node (drain P2P traffic), then reset the GPU: nvidia-smi -r"),
    "recover_imex_domain": ("investigate", "recover the IMEX domain (restart nvidia-imex on its nodes)"),
    "bus_reset": ("reset_gpu", "drain the node's GPU work, then reset the GPU's PCIe bus (or reboot the node)"),
    "system_reboot": ("reboot_node", "drain the node and reboot it"),
}


class GpuSettings(CheckSettings):
    interval_s: float = Field(15.0, gt=0, description="daemon: seconds between runs")
    # A full NVML sweep took 25 ms per GPU the first time and 7 ms for 2 GPUs after (H200 test machine); a
    # call that takes seconds means a GPU fell off the bus and NVML is stuck in the driver (the runner then
    # reports it hung). Without nvidia-persistenced the first nvmlInit can take seconds per GPU: a first run
    # that times out finishes in the background, and later runs use the initialised client.
    timeout_s: float = Field(10.0, gt=0, description="a run that takes longer is UNKNOWN (NVML hung in the driver)")
    expected_count: int = Field(8, ge=0, description="GPUs this node must have (8 on a DGX); 0 = do not check")
    expected_model: str = Field(
        "", description="substring every GPU name must contain, e.g. 'H200' (empty = any model, but all alike)"
    )
    temperature_margin_c: int = Field(
        5,
        ge=0,
        description="warn when a GPU is within this many degrees of its maximum operating (T.Limit) or "
        "slowdown temperature",
    )
    slowdown_c_if_unknown: int = Field(
        90, gt=0, description="slowdown temperature assumed where NVML does not report one, Celsius"
    )
    power_warn_fraction: float | None = Field(
        None,
        gt=0,
        description="warn when power draw reaches this fraction of the enforced limit (unset: inference at full "
        "load sits at the cap by design)",
    )
    power_limit_reduced_fraction: float = Field(
        0.9, gt=0, le=1, description="warn when the enforced power limit is below this fraction of the default limit"
    )
    expected_nvlinks: int = Field(
        0, ge=0, description="active NVLinks each GPU must have (18 on HGX H100/H200); 0 = judge only reported links"
    )
    pcie_gen_min_utilization: float = Field(
        0.5,
        ge=0,
        le=1,
        description="compare PCIe generation with its maximum only while GPU utilization is at least this "
        "(links train down to a low generation at idle to save power); width is always compared",
    )


class GpuCheck(Check):
    """GPUs over NVML: count, model, temperature, clock events, ECC, row remapping, NVLink, PCIe, recovery."""

    name: ClassVar[str] = "gpu"
    settings_model: ClassVar[type[CheckSettings]] = GpuSettings
    hang_probe: ClassVar[str] = "nvml"  # a run past its timeout is NVML stuck in the driver (a GPU off the bus)

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        settings = own_settings(self.name, settings, GpuSettings)
        self.settings: CheckSettings = settings
        self._settings = settings
        self._env = env
        # NVML is initialised once per instance and kept; a failed init is retried on the next run.
        self._client: NvmlClient | None = None

    def _nvml(self) -> NvmlClient:
        if self._client is None:
            client = self._env.nvml_factory()
            client.init()
            self._client = client
        return self._client

    def stop(self) -> None:
        """Shut NVML down (the runner calls this after the last run; the next run initialises it again)."""
        client, self._client = self._client, None
        if client is not None:
            client.shutdown()

    def _pci_gpus(self) -> list[PciDevice]:
        devices = read_pci_devices(self._env.sysfs_root)
        return nvidia_gpus(devices) if devices is not None else []

    def run(self) -> CheckResult:
        s = self._settings
        role = self._env.role
        try:
            client = self._nvml()
        except NvmlError as exc:
            # The bus and the role say whether "no NVML" is fine (a laptop) or a broken node (driver not loaded).
            code = exc.code
            if code is None and isinstance(exc, NvmlLibraryNotFound):
                code = NVML_ERROR_LIBRARY_NOT_FOUND
            failed = nvml_unavailable(str(exc), code, self._pci_gpus(), role, s.expected_count)
            if failed is None:
                if isinstance(exc, NvmlLibraryNotFound):
                    return CheckResult.skipped(self.name, f"{exc}; no NVIDIA GPU on the PCI bus")
                raise
            return _absent(self.name, failed)
        try:
            result = sweep(client)
        except NvmlError:
            # NVML itself failed (driver reloaded, device count unreadable): start afresh next run.
            self.stop()
            raise
        pci_gpus = self._pci_gpus()
        if not result.gpus:
            absent = no_gpus(pci_gpus, role, s.expected_count)
            if absent is None:
                return CheckResult.skipped(self.name, "NVML reports no GPUs on this node")
            return _absent(self.name, absent)
        return judge(result, s, self.name, pci_gpus)


def _absent(check: str, finding: Finding) -> CheckResult:
    b = ResultBuilder(check)
    b.add(finding)
    b.sample(GPU_COUNT, 0)
    return b.build(finding.message)


def judge(
    nvml: NvmlSweep, settings: GpuSettings, check: str = "gpu", pci_gpus: Sequence[PciDevice] = ()
) -> CheckResult:
    """Pure: turn one sweep (and the NVIDIA GPUs on the PCI bus) into findings, samples and facts."""
    b = ResultBuilder(check)
    gpus = nvml.gpus
    readable = [g for g in gpus if g.unreadable is None]

    b.sample(GPU_COUNT, len(gpus))
    b.facts["gpu_count"] = str(len(gpus))
    if nvml.driver_version:
        b.facts["driver_version"] = nvml.driver_version
    if nvml.cuda_driver_version is not None:
        b.facts["cuda_driver_version"] = format_cuda_version(nvml.cuda_driver_version)
    names = sorted({g.name for g in readable if g.name})
    if names:
        b.facts["gpu_name"] = ",".join(names)

    _judge_inventory(b, nvml, settings, names, pci_gpus)
    for g in gpus:
        if g.unreadable is not None:
            b.add(
                Finding(
                    "GPU_LOST" if g.lost else "GPU_UNREADABLE",
                    Status.CRITICAL,
                    f"GPU {g.index} cannot be read over NVML: {g.unreadable}",
                    f"gpu{g.index}",
                    remedy="the GPU fell off the bus or needs a reset: look for XID 79/48/94/95 in the kernel log, "
                    "drain the node and reboot it; if it recurs, the GPU needs service",
                )
            )
            continue
        _judge_gpu(b, g, settings)

    return b.build(_summary(b, gpus), _action(gpus))


def _judge_inventory(
    b: ResultBuilder, nvml: NvmlSweep, settings: GpuSettings, names: list[str], pci_gpus: Sequence[PciDevice]
) -> None:
    """Count and models: against the settings, against each other, and against the PCI bus."""
    gpus = nvml.gpus
    readable = [g for g in gpus if g.unreadable is None]
    if settings.expected_count and len(gpus) != settings.expected_count:
        b.add(
            Finding(
                "GPU_COUNT_MISMATCH",
                Status.CRITICAL,
                f"NVML sees {len(gpus)} GPUs, expected {settings.expected_count}",
                remedy="a GPU fell off the bus or failed to initialise: check `nvidia-smi -L` and the kernel log for "
                "XID 79; a node reboot usually brings it back, else the GPU needs service",
            )
        )
    missing = gpus_missing_from_nvml(pci_gpus, [g.pci_bus_id for g in gpus])
    if missing is not None:
        b.add(missing)
    if len(names) > 1:
        b.add(
            Finding(
                "GPU_MODEL_MIXED",
                Status.CRITICAL,
                f"GPUs of different models on one node: {', '.join(names)}",
                remedy="tensor parallelism needs identical GPUs: check the node's inventory",
            )
        )
    if settings.expected_model:
        for g in readable:
            if g.name is not None and settings.expected_model.lower() not in g.name.lower():
                b.add(
                    Finding(
                        "GPU_MODEL_UNEXPECTED",
                        Status.CRITICAL,
                        f"{g.label} is a {g.name}, expected a '{settings.expected_model}'",
                        g.subject,
                        remedy="wrong node or wrong hardware: check the inventory and the configured expected_model",
                    )
                )


def _judge_gpu(b: ResultBuilder, g: GpuSnapshot, s: GpuSettings) -> None:
    labels = {"gpu": str(g.index), "pci_bus_id": g.pci_bus_id or ""}
    if g.uuid or g.name:
        b.sample(GPU_INFO, 1, **labels, uuid=g.uuid or "", model=g.name or "")
    b.sample(MEMORY_USED, g.memory_used_bytes, **labels)
    b.sample(MEMORY_TOTAL, g.memory_total_bytes, **labels)
    b.sample(UTILIZATION, g.utilization_ratio, **labels)
    b.sample(MEMORY_UTILIZATION, g.memory_utilization_ratio, **labels)
    b.sample(TEMPERATURE, g.temperature_c, **labels)
    b.sample(TEMPERATURE_MARGIN, g.temperature_margin_c, **labels)
    for threshold, value in (
        ("slowdown", g.slowdown_c),
        ("shutdown", g.shutdown_c),
        ("max_operating", g.max_operating_c),
    ):
        b.sample(TEMPERATURE_THRESHOLD, value, **labels, threshold=threshold)
    b.sample(POWER, g.power_w, **labels)
    b.sample(POWER_LIMIT, g.power_limit_w, **labels)
    b.sample(POWER_DEFAULT_LIMIT, g.power_default_limit_w, **labels)
    b.sample(RECOVERY_ACTION, g.recovery_action, **labels)

    if g.lost:
        b.add(
            Finding(
                "GPU_LOST",
                Status.CRITICAL,
                f"{g.label} stopped answering NVML mid-read: {'; '.join(sorted(set(g.read_errors.values())))}",
                g.subject,
                remedy="the GPU fell off the bus or needs a reset: look for XID 79 in the kernel log, drain the node "
                "and reboot it",
            )
        )
    elif g.read_errors:
        b.add(
            Finding(
                "GPU_READ_ERROR",
                Status.UNKNOWN,
                f"{g.label}: NVML failed to read {', '.join(sorted(g.read_errors))}: "
                f"{'; '.join(sorted(set(g.read_errors.values())))}",
                g.subject,
            )
        )

    _judge_temperature(b, g, s)
    _judge_power(b, g, s)
    _judge_clock_events(b, g, labels)
    _judge_memory_errors(b, g, labels)
    _judge_nvlink(b, g, s, labels)
    _judge_pcie(b, g, s, labels)
    _judge_recovery(b, g)


def _judge_temperature(b: ResultBuilder, g: GpuSnapshot, s: GpuSettings) -> None:
    """Two views of the same limit. Drivers before R565 report absolute thresholds (H100: slowdown 89 C,
    max operating 87 C); R565+ report "T.Limit", the margin below the maximum operating temperature, at
    which the driver starts to lower clocks (slowdown sits 2 C past it on Hopper). Use whichever is known.
    """
    if g.temperature_c is None and g.temperature_margin_c is None:
        return
    remedy = "check the node's cooling (fans, airflow, inlet temperature, `ipmitool sdr type temperature`)"
    margin = s.temperature_margin_c
    slowdown = g.slowdown_c if g.slowdown_c is not None else s.slowdown_c_if_unknown
    temp = g.temperature_c
    if g.temperature_margin_c is not None:
        left = g.temperature_margin_c
        reading = f"{temp} C, " if temp is not None else ""
        if left <= 0:
            b.add(
                Finding(
                    "GPU_TEMPERATURE_CRITICAL",
                    Status.CRITICAL,
                    f"{g.label} at {reading}{-left} C past its maximum operating temperature (T.Limit {left} C)",
                    g.subject,
                    remedy=remedy,
                )
            )
        elif left <= margin:
            b.add(
                Finding(
                    "GPU_TEMPERATURE_HIGH",
                    Status.WARNING,
                    f"{g.label} at {reading}{left} C below its maximum operating temperature (T.Limit {left} C)",
                    g.subject,
                    remedy=remedy,
                )
            )
        return
    assert temp is not None
    if temp >= slowdown:
        b.add(
            Finding(
                "GPU_TEMPERATURE_CRITICAL",
                Status.CRITICAL,
                f"{g.label} at {temp} C, at or above its slowdown threshold {slowdown} C",
                g.subject,
                remedy=remedy,
            )
        )
    elif temp >= slowdown - margin:
        b.add(
            Finding(
                "GPU_TEMPERATURE_HIGH",
                Status.WARNING,
                f"{g.label} at {temp} C, within {margin} C of its slowdown threshold {slowdown} C",
                g.subject,
                remedy=remedy,
            )
        )


def _judge_power(b: ResultBuilder, g: GpuSnapshot, s: GpuSettings) -> None:
    limit = g.power_limit_w
    fraction = s.power_warn_fraction
    if fraction is not None and g.power_w is not None and limit and g.power_w >= fraction * limit:
        b.add(
            Finding(
                "GPU_POWER_HIGH",
                Status.WARNING,
                f"{g.label} draws {g.power_w:.0f} W, {g.power_w / limit:.0%} of its {limit:.0f} W limit",
                g.subject,
                remedy="sustained draw at the limit: check cooling and whether the load is expected",
            )
        )
    default = g.power_default_limit_w
    if limit is not None and default and limit < s.power_limit_reduced_fraction * default:
        b.add(
            Finding(
                "GPU_POWER_LIMIT_REDUCED",
                Status.WARNING,
                f"{g.label} is capped at {limit:.0f} W, below its default {default:.0f} W: it will run slower than "
                f"its peers",
                g.subject,
                remedy="restore the default limit (nvidia-smi -pl <default>) unless the cap is intended on every node",
            )
        )


def _judge_clock_events(b: ResultBuilder, g: GpuSnapshot, labels: dict[str, str]) -> None:
    reasons = g.clock_event_reasons
    if reasons is None:
        return
    for bit, reason in CLOCK_EVENT_REASONS.items():
        b.sample(CLOCK_EVENT, 1 if reasons & bit else 0, **labels, reason=reason)
    # SW power cap, idle, applications clocks and sync boost are normal operation: an inference GPU at full
    # load sits at its power cap by design. Only hardware slowdowns (the GPU halves its clocks or more)
    # and the driver's thermal slowdown are evidence of a problem.
    if reasons & CLOCK_EVENT_HW_THERMAL:
        b.add(
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
        b.add(
            Finding(
                "GPU_HW_POWER_BRAKE",
                Status.CRITICAL,
                f"{g.label} clocks cut by the external power brake",
                g.subject,
                remedy="the chassis asserted power brake: check PSUs and the BMC event log (ipmitool sel list)",
            )
        )
    if reasons & CLOCK_EVENT_HW_SLOWDOWN and not reasons & (CLOCK_EVENT_HW_THERMAL | CLOCK_EVENT_HW_POWER_BRAKE):
        b.add(
            Finding(
                "GPU_HW_SLOWDOWN",
                Status.WARNING,
                f"{g.label} clocks cut by hardware slowdown",
                g.subject,
                remedy="check temperature, power supply and the BMC event log; if it persists, the GPU needs service",
            )
        )
    if reasons & CLOCK_EVENT_SW_THERMAL:
        b.add(
            Finding(
                "GPU_SW_THERMAL_SLOWDOWN",
                Status.WARNING,
                f"{g.label} clocks reduced by the driver: above its maximum operating temperature",
                g.subject,
                remedy="check the node's cooling",
            )
        )


def _judge_memory_errors(b: ResultBuilder, g: GpuSnapshot, labels: dict[str, str]) -> None:
    for error, scope, value in (
        ("uncorrected", "volatile", g.ecc_volatile_uncorrected),
        ("corrected", "volatile", g.ecc_volatile_corrected),
        ("uncorrected", "aggregate", g.ecc_aggregate_uncorrected),
        ("corrected", "aggregate", g.ecc_aggregate_corrected),
    ):
        b.sample(ECC_ERRORS, value, **labels, error=error, scope=scope)
    if g.ecc_volatile_uncorrected:
        b.add(
            Finding(
                "GPU_ECC_UNCORRECTED",
                Status.CRITICAL,
                f"{g.label} had {g.ecc_volatile_uncorrected} uncorrected ECC errors since the driver loaded",
                g.subject,
                remedy="data on this GPU may be corrupt: drain the node, reset the GPU (nvidia-smi -r) so the bad "
                "row is remapped; replace the GPU if remapping fails",
            )
        )
    if g.retired_pages_pending is not None:
        b.sample(RETIRED_PAGES_PENDING, 1 if g.retired_pages_pending else 0, **labels)
        if g.retired_pages_pending:
            b.add(
                Finding(
                    "GPU_RETIRED_PAGES_PENDING",
                    Status.WARNING,
                    f"{g.label} has memory pages waiting to be retired: reset GPU to apply",
                    g.subject,
                    remedy="at the next maintenance window drain the node and reset the GPU (nvidia-smi -r)",
                )
            )
    rows = g.remapped_rows
    if rows is None:
        return
    b.sample(REMAPPED_ROWS, rows.corrected, **labels, error="corrected")
    b.sample(REMAPPED_ROWS, rows.uncorrected, **labels, error="uncorrected")
    b.sample(ROW_REMAP_PENDING, 1 if rows.pending else 0, **labels)
    b.sample(ROW_REMAP_FAILED, 1 if rows.failure else 0, **labels)
    if rows.failure:
        b.add(
            Finding(
                "GPU_ROW_REMAP_FAILED",
                Status.CRITICAL,
                f"{g.label} row remapping failed: no spare memory rows left",
                g.subject,
                remedy="the GPU's memory is worn out: take the node out of service and have the GPU replaced",
            )
        )
    elif rows.pending:
        b.add(
            Finding(
                "GPU_ROW_REMAP_PENDING",
                Status.WARNING,
                f"{g.label} has a memory row remapping pending: reset GPU to apply",
                g.subject,
                remedy="drain the node and reset the GPU (nvidia-smi -r) or reboot, so the remapping takes effect",
            )
        )


def _judge_nvlink(b: ResultBuilder, g: GpuSnapshot, s: GpuSettings, labels: dict[str, str]) -> None:
    links = g.nvlink_active
    if not links:
        return
    for link, active in sorted(links.items()):
        b.sample(NVLINK_UP, 1 if active else 0, **labels, link=str(link))
    up = sum(links.values())
    b.sample(NVLINK_LINKS_UP, up, **labels)
    down = sorted(link for link, active in links.items() if not active)
    remedy = (
        "an NVLink down slows or breaks NCCL all-reduce inside the node: check `nvidia-smi nvlink --status` and "
        "the fabric manager (systemctl status nvidia-fabricmanager); reset the GPU or reboot the node"
    )
    if down:
        b.add(
            Finding(
                "NVLINK_DOWN",
                Status.CRITICAL,
                f"{g.label} NVLink link(s) {', '.join(map(str, down))} down ({up}/{len(links)} up)",
                g.subject,
                remedy=remedy,
            )
        )
    elif s.expected_nvlinks and up < s.expected_nvlinks:
        b.add(
            Finding(
                "NVLINK_DOWN",
                Status.CRITICAL,
                f"{g.label} has {up} active NVLinks, expected {s.expected_nvlinks}",
                g.subject,
                remedy=remedy,
            )
        )


def _judge_pcie(b: ResultBuilder, g: GpuSnapshot, s: GpuSettings, labels: dict[str, str]) -> None:
    b.sample(PCIE_GENERATION, g.pcie_gen_current, **labels)
    b.sample(PCIE_MAX_GENERATION, g.pcie_gen_max, **labels)
    b.sample(PCIE_WIDTH, g.pcie_width_current, **labels)
    b.sample(PCIE_MAX_WIDTH, g.pcie_width_max, **labels)
    remedy = "reseat the GPU or its riser at the next maintenance; check `lspci -vv` LnkSta and the BMC log"
    if g.pcie_width_current is not None and g.pcie_width_max and g.pcie_width_current < g.pcie_width_max:
        b.add(
            Finding(
                "GPU_PCIE_WIDTH_DEGRADED",
                Status.WARNING,
                f"{g.label} PCIe link x{g.pcie_width_current}, capable of x{g.pcie_width_max}",
                g.subject,
                remedy=remedy,
            )
        )
    # The link trains down to Gen1 at idle (power saving) and back up under load, so a low generation
    # only means something while the GPU is busy.
    busy = g.utilization_ratio is not None and g.utilization_ratio >= s.pcie_gen_min_utilization
    if busy and g.pcie_gen_current is not None and g.pcie_gen_max and g.pcie_gen_current < g.pcie_gen_max:
        b.add(
            Finding(
                "GPU_PCIE_GEN_DEGRADED",
                Status.WARNING,
                f"{g.label} PCIe Gen{g.pcie_gen_current} under load, capable of Gen{g.pcie_gen_max}",
                g.subject,
                remedy=remedy,
            )
        )


def _judge_recovery(b: ResultBuilder, g: GpuSnapshot) -> None:
    if not g.recovery_action:
        return
    action = RECOVERY_ACTIONS.get(g.recovery_action, f"action_{g.recovery_action}")
    _, remedy = _RECOVERY_REMEDIES.get(action, ("investigate", "follow the driver's recovery action"))
    b.add(
        Finding(
            "GPU_RECOVERY_ACTION",
            Status.CRITICAL,
            f"{g.label}: the driver asks for recovery action {action.replace('_', ' ')}",
            g.subject,
            remedy=remedy,
        )
    )


def _summary(b: ResultBuilder, gpus: tuple[GpuSnapshot, ...]) -> str:
    names = sorted({g.name for g in gpus if g.name})
    what = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}" + (f" ({', '.join(names)})" if names else "")
    bad = [f for f in b.findings if f.status in (Status.CRITICAL, Status.WARNING)]
    if not bad:
        return f"{what}: healthy"
    codes = sorted({f.code for f in bad})
    return f"{what}: {len(bad)} problem{'s' if len(bad) != 1 else ''} ({', '.join(codes)})"


def _action(gpus: tuple[GpuSnapshot, ...]) -> Action | None:
    """The driver's own recovery action beats the generic "investigate" built from the worst remedy."""
    kinds = []
    for g in gpus:
        if g.recovery_action:
            action = RECOVERY_ACTIONS.get(g.recovery_action, "")
            if action in _RECOVERY_REMEDIES:
                kinds.append((action, g))
    if not kinds:
        return None
    # Reboot beats reset: one reboot fixes every GPU of the node.
    kinds.sort(key=lambda item: 0 if _RECOVERY_REMEDIES[item[0]][0] == "reboot_node" else 1)
    action, g = kinds[0]
    kind, remedy = _RECOVERY_REMEDIES[action]
    return Action(kind, f"{g.label}: {remedy}")
