"""The ``gpu`` check: every GPU of the node over NVML, judged the way DCGM health checks and GPUd judge them.

By hand: ``nvidia-smi -q`` (temperatures and thresholds, "Clocks Event Reasons", "ECC Errors", "Remapped Rows",
"GPU Recovery Action", "GPU Link Info"), ``nvidia-smi nvlink --status``, ``nvidia-smi -L`` for the count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, ClassVar

from msgspec import Meta

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.environment import Environment
from dgxdoctor.judge import gpu as gpu_judge
from dgxdoctor.judge.gpu import GpuLimits
from dgxdoctor.judge.presence import no_gpus, nvml_unavailable
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder
from dgxdoctor.settings.bounds import DAY_S
from dgxdoctor.sources.nvml import (
    CLOCK_EVENT_REASONS,
    NVML_ERROR_LIBRARY_NOT_FOUND,
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

# A gauge of things is named for them ("_count" is a summary's or histogram's suffix: promtool check metrics).
GPU_COUNT = MetricSpec("dgxdoctor_gpus", "GPUs NVML reports on this node.")
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


class GpuSettings(CheckSettings, frozen=True):
    interval_s: Annotated[float, Meta(gt=0, le=DAY_S, description="daemon: seconds between runs")] = 15.0
    # A full NVML sweep took 25 ms per GPU the first time and 7 ms for 2 GPUs after (H200 test machine); a
    # call that takes seconds means a GPU fell off the bus and NVML is stuck in the driver (the runner then
    # reports it hung). Without nvidia-persistenced the first nvmlInit can take seconds per GPU: a first run
    # that times out finishes in the background, and later runs use the initialised client.
    timeout_s: Annotated[
        float, Meta(gt=0, le=DAY_S, description="a run that takes longer is UNKNOWN (NVML hung in the driver)")
    ] = 10.0
    expected_count: Annotated[
        int, Meta(ge=0, le=64, description="GPUs this node must have (8 on a DGX); 0 = do not check")
    ] = 8
    expected_model: Annotated[
        str, Meta(description="substring every GPU name must contain, e.g. 'H200' (empty = any model, but all alike)")
    ] = ""
    temperature_margin_c: Annotated[
        int,
        Meta(
            ge=0,
            le=100,
            description="warn when a GPU is within this many degrees of its maximum operating (T.Limit) or "
            "slowdown temperature",
        ),
    ] = 5
    slowdown_c_if_unknown: Annotated[
        int, Meta(gt=0, le=150, description="slowdown temperature assumed where NVML does not report one, Celsius")
    ] = 90
    power_warn_fraction: Annotated[
        Annotated[float, Meta(gt=0, le=2)] | None,
        Meta(
            description="warn when power draw reaches this fraction of the enforced limit (unset: inference at full "
            "load sits at the cap by design)"
        ),
    ] = None
    power_limit_reduced_fraction: Annotated[
        float,
        Meta(gt=0, le=1, description="warn when the enforced power limit is below this fraction of the default limit"),
    ] = 0.9
    expected_nvlinks: Annotated[
        int,
        Meta(
            ge=0,
            le=64,
            description="active NVLinks each GPU must have (18 on HGX H100/H200); 0 = judge only reported links",
        ),
    ] = 0
    pcie_gen_min_utilization: Annotated[
        float,
        Meta(
            ge=0,
            le=1,
            description="compare PCIe generation with its maximum only while GPU utilization is at least this "
            "(links train down to a low generation at idle to save power); width is always compared",
        ),
    ] = 0.5


class GpuCheck(Check[GpuSettings]):
    """GPUs over NVML: count, model, temperature, clock events, ECC, row remapping, NVLink, PCIe, recovery."""

    name: ClassVar[str] = "gpu"
    hang_probe: ClassVar[str] = "nvml"  # a run past its timeout is NVML stuck in the driver (a GPU off the bus)

    def __init__(self, settings: CheckSettings, env: Environment) -> None:
        super().__init__(settings, env)
        # NVML is initialised once per instance and kept; a failed init is retried on the next run.
        self._client: NvmlClient | None = None

    def _nvml(self) -> NvmlClient:
        if self._client is None:
            client = self.env.nvml_factory()
            client.init()
            self._client = client
        return self._client

    def stop(self) -> None:
        """Shut NVML down (the runner calls this after the last run; the next run initialises it again)."""
        client, self._client = self._client, None
        if client is not None:
            client.shutdown()

    def _pci_gpus(self) -> list[PciDevice]:
        devices = read_pci_devices(self.env.sysfs_root)
        return nvidia_gpus(devices) if devices is not None else []

    def run(self) -> CheckResult:
        s = self.settings
        role = self.env.role
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


def limits(s: GpuSettings) -> GpuLimits:
    return GpuLimits(
        expected_count=s.expected_count,
        expected_model=s.expected_model,
        temperature_margin_c=s.temperature_margin_c,
        slowdown_c_if_unknown=s.slowdown_c_if_unknown,
        power_warn_fraction=s.power_warn_fraction,
        power_limit_reduced_fraction=s.power_limit_reduced_fraction,
        expected_nvlinks=s.expected_nvlinks,
        pcie_gen_min_utilization=s.pcie_gen_min_utilization,
    )


def judge(
    nvml: NvmlSweep, settings: GpuSettings, check: str = "gpu", pci_gpus: Sequence[PciDevice] = ()
) -> CheckResult:
    """Pure: one sweep (and the NVIDIA GPUs on the PCI bus) as samples and facts, judged by ``judge.gpu``."""
    b = ResultBuilder(check)
    gpus = nvml.gpus
    lim = limits(settings)
    b.sample(GPU_COUNT, len(gpus))
    b.facts["gpu_count"] = str(len(gpus))
    if nvml.driver_version:
        b.facts["driver_version"] = nvml.driver_version
    if nvml.cuda_driver_version is not None:
        b.facts["cuda_driver_version"] = format_cuda_version(nvml.cuda_driver_version)
    names = sorted({g.name for g in gpus if g.unreadable is None and g.name})
    if names:
        b.facts["gpu_name"] = ",".join(names)
    b.add(*gpu_judge.inventory(nvml, lim, names, pci_gpus))
    for g in gpus:
        if g.unreadable is not None:
            b.add(gpu_judge.unreadable(g))
            continue
        _samples(b, g)
        b.add(*gpu_judge.gpu_findings(g, lim))
    return b.build(gpu_judge.summary(b.findings, gpus), gpu_judge.recovery_action(gpus))


def _samples(b: ResultBuilder, g: GpuSnapshot) -> None:
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
    if g.clock_event_reasons is not None:
        for bit, reason in CLOCK_EVENT_REASONS.items():
            b.sample(CLOCK_EVENT, 1 if g.clock_event_reasons & bit else 0, **labels, reason=reason)
    _memory_samples(b, g, labels)
    _link_samples(b, g, labels)


def _memory_samples(b: ResultBuilder, g: GpuSnapshot, labels: dict[str, str]) -> None:
    for error, scope, value in (
        ("uncorrected", "volatile", g.ecc_volatile_uncorrected),
        ("corrected", "volatile", g.ecc_volatile_corrected),
        ("uncorrected", "aggregate", g.ecc_aggregate_uncorrected),
        ("corrected", "aggregate", g.ecc_aggregate_corrected),
    ):
        b.sample(ECC_ERRORS, value, **labels, error=error, scope=scope)
    if g.retired_pages_pending is not None:
        b.sample(RETIRED_PAGES_PENDING, 1 if g.retired_pages_pending else 0, **labels)
    rows = g.remapped_rows
    if rows is not None:
        b.sample(REMAPPED_ROWS, rows.corrected, **labels, error="corrected")
        b.sample(REMAPPED_ROWS, rows.uncorrected, **labels, error="uncorrected")
        b.sample(ROW_REMAP_PENDING, 1 if rows.pending else 0, **labels)
        b.sample(ROW_REMAP_FAILED, 1 if rows.failure else 0, **labels)


def _link_samples(b: ResultBuilder, g: GpuSnapshot, labels: dict[str, str]) -> None:
    links = g.nvlink_active
    if links:
        for link, active in sorted(links.items()):
            b.sample(NVLINK_UP, 1 if active else 0, **labels, link=str(link))
        b.sample(NVLINK_LINKS_UP, sum(links.values()), **labels)
    b.sample(PCIE_GENERATION, g.pcie_gen_current, **labels)
    b.sample(PCIE_MAX_GENERATION, g.pcie_gen_max, **labels)
    b.sample(PCIE_WIDTH, g.pcie_width_current, **labels)
    b.sample(PCIE_MAX_WIDTH, g.pcie_width_max, **labels)
