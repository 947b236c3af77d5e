"""The NVIDIA driver stack beside the kernel module: fabric manager, persistence daemon, GPUDirect RDMA, DCGM.

By hand::

    systemctl show -p LoadState,ActiveState,SubState,Result nvidia-fabricmanager nvidia-persistenced nvidia-dcgm
    ls /sys/module/nvidia_peermem; grep -o 'Open Kernel Module' /proc/driver/nvidia/version
    lspci -d 10de: ; lspci -d 15b3:

Runs only where the PCI bus shows NVIDIA GPUs (else SKIPPED). NVSwitches on the bus (class 0x0680 of vendor 0x10de)
make the fabric manager required; RDMA NICs (Mellanox, with an infiniband/ device) make GPUDirect RDMA matter.
Service states come from ``systemctl show`` through the command runner, module state from ``<sysfs_root>/module``,
the kernel module's flavour from ``<proc_root>/driver/nvidia/version``, and on NVSwitch nodes each GPU's fabric
state from NVML (``nvmlDeviceGetGpuFabricInfo``, where the driver reports it). Verdicts: judge/driver_stack.py.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from msgspec import Meta

from dgxdoctor.checks.base import Check, CheckSettings
from dgxdoctor.judge.driver_stack import (
    StackFacts,
    dcgm_finding,
    fabric_manager_finding,
    fabric_state_finding,
    gpudirect_finding,
    persistenced_finding,
)
from dgxdoctor.result import CheckResult, Finding, MetricSpec, ResultBuilder, Status
from dgxdoctor.settings.bounds import DAY_S
from dgxdoctor.sources.device_map import CLASS_BRIDGE_OTHER
from dgxdoctor.sources.nvml import NvmlError, NvmlNotSupported
from dgxdoctor.sources.pci import VENDOR_NVIDIA, mellanox_nics, nvidia_gpus, read_pci_devices
from dgxdoctor.sources.systemd import UNIT_NAME_RE, UnitState, read_unit

UNIT_ACTIVE = MetricSpec(
    "dgxdoctor_driver_unit_active",
    "1 when the driver-stack systemd unit is active, 0 when it is not (absent when its state could not be read)",
    labels=("unit",),
)
MODULE_LOADED = MetricSpec(
    "dgxdoctor_driver_module_loaded",
    "1 when the kernel module is loaded (/sys/module/<module> exists), 0 when not",
    labels=("module",),
)
# /proc/driver/nvidia/version of the open kernel module (NVIDIA/open-gpu-kernel-modules#326):
#   NVRM version:  NVIDIA UNIX Open Kernel Module for x86_64  515.57  Release Build ...
# The proprietary one says "NVIDIA UNIX x86_64 Kernel Module" instead.
OPEN_KERNEL_MODULE = "Open Kernel Module"


class DriverStackSettings(CheckSettings, frozen=True):
    interval_s: Annotated[float, Meta(gt=0, le=DAY_S, description="daemon: seconds between runs")] = 60.0
    fabric_manager_unit: Annotated[str, Meta(description="the fabric manager's unit")] = "nvidia-fabricmanager.service"
    persistenced_unit: Annotated[str, Meta(description="the persistence daemon's unit")] = "nvidia-persistenced.service"
    dcgm: Annotated[bool, Meta(description="the DCGM host engine is part of this node's setup: check its unit")] = False
    dcgm_unit: Annotated[str, Meta(description="the DCGM host engine's unit")] = "nvidia-dcgm.service"

    def __post_init__(self) -> None:
        for name in ("fabric_manager_unit", "persistenced_unit", "dcgm_unit"):
            value = getattr(self, name)
            if not UNIT_NAME_RE.match(value):
                raise ValueError(f"{name}: not a systemd unit name (letters, digits, ':-_.\\@'): {value[:80]!r}")


class DriverStackCheck(Check[DriverStackSettings]):
    name: ClassVar[str] = "driver_stack"
    probes: ClassVar[tuple[str, ...]] = ("systemctl",)

    def _facts(self) -> StackFacts | None:
        devices = read_pci_devices(self.env.sysfs_root)
        gpus = nvidia_gpus(devices or [])
        if not gpus or devices is None:
            return None
        switches = [d for d in devices if d.vendor == VENDOR_NVIDIA and d.class_code >> 8 == CLASS_BRIDGE_OTHER]
        rdma = [n for n in mellanox_nics(devices) if n.rdma_devices]
        try:
            version = (self.env.proc_root / "driver" / "nvidia" / "version").read_text(errors="replace")
            open_module: bool | None = OPEN_KERNEL_MODULE in version
        except OSError:
            open_module = None
        peermem = (self.env.sysfs_root / "module" / "nvidia_peermem").is_dir()
        return StackFacts(len(gpus), len(switches), len(rdma), peermem, open_module)

    def _unit(self, b: ResultBuilder, unit: str) -> UnitState | str:
        state = read_unit(self.env.run_command, unit)
        b.sample(UNIT_ACTIVE, (1.0 if state.active else 0.0) if isinstance(state, UnitState) else None, unit=unit)
        return state

    def _fabric_states(self) -> Finding | None:
        """NVML's fabric state per GPU, where the driver reports it (Hopper and later with a fabric manager)."""
        try:
            client = self.env.nvml_factory()
            client.init()
        except NvmlError:
            return None  # no NVML here: the gpu check says so
        try:
            states: dict[int, tuple[int, int]] = {}
            for index in range(client.device_count()):
                try:
                    states[index] = client.fabric_state(index)
                except NvmlNotSupported:
                    continue
                except NvmlError as exc:
                    return Finding("DRIVER_FABRIC_STATE_UNKNOWN", Status.UNKNOWN, f"NVML fabric state: {exc}")
            return fabric_state_finding(states)
        finally:
            client.shutdown()

    def run(self) -> CheckResult:
        facts = self._facts()
        if facts is None:
            return CheckResult.skipped(self.name, "no NVIDIA GPU on the PCI bus")
        b = ResultBuilder(self.name)
        cfg = self.settings
        found = [fabric_manager_finding(facts, self._unit(b, cfg.fabric_manager_unit)) if facts.nvswitches else None]
        if facts.nvswitches:
            found.append(self._fabric_states())
        found.append(persistenced_finding(self._unit(b, cfg.persistenced_unit)))
        found.append(gpudirect_finding(facts))
        if cfg.dcgm:
            found.append(dcgm_finding(self._unit(b, cfg.dcgm_unit)))
        b.sample(MODULE_LOADED, 1.0 if facts.peermem_loaded else 0.0, module="nvidia_peermem")
        b.add(*(f for f in found if f is not None))
        bad = [f for f in b.findings if f.status is not Status.OK]
        shape = f"{facts.gpus} GPU(s), {facts.nvswitches} NVSwitch(es), {facts.rdma_nics} RDMA NIC(s)"
        summary = f"{shape}: " + ("; ".join(f.message for f in bad[:3]) if bad else "driver stack complete")
        return b.build(summary)
