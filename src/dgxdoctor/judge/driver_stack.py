"""The NVIDIA driver stack a serving node needs beside the kernel module: verdicts, values in, findings out.

What the role needs and is missing is CRITICAL: on an NVSwitch system (HGX/DGX H100, H200) CUDA cannot start
without nvidia-fabricmanager ("system not yet initialized", cudaErrorSystemNotReady). What only costs speed or
visibility is WARNING: without nvidia-persistenced the driver tears the GPUs down between clients (seconds at each
start, and nvidia-smi slows); without GPUDirect RDMA (nvidia_peermem, or dma-buf with the open kernel module) NCCL
stages IB traffic through host memory; a DCGM host engine that is configured but down leaves no GPU telemetry.
A state that could not be read is UNKNOWN, never OK.
"""

from __future__ import annotations

from msgspec import Struct

from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.systemd import UnitState


class StackFacts(Struct, frozen=True):
    """What was read: NVIDIA GPUs and NVSwitches on the PCI bus, Mellanox NICs, the modules loaded."""

    gpus: int
    nvswitches: int
    rdma_nics: int
    peermem_loaded: bool
    open_kernel_module: bool | None  # None: /proc/driver/nvidia/version unreadable


def _unit_finding(state: UnitState | str, code: str, missing: Status, needed_for: str, remedy: str) -> Finding:
    if isinstance(state, str):
        return Finding("DRIVER_UNIT_UNKNOWN", Status.UNKNOWN, f"{needed_for}: {state}", remedy=remedy)
    if state.active:
        return Finding(f"{code}_OK", Status.OK, f"{state.describe()}", state.unit)
    return Finding(code, missing, f"{state.describe()}: {needed_for}", state.unit, remedy=remedy)


def fabric_manager_finding(facts: StackFacts, state: UnitState | str) -> Finding | None:
    if facts.nvswitches == 0:
        return None
    need = f"{facts.nvswitches} NVSwitch(es) on the bus need it, or CUDA fails with 'system not yet initialized'"
    remedy = (
        "systemctl enable --now nvidia-fabricmanager (its version must equal the driver's); "
        "`journalctl -u nvidia-fabricmanager` says why it stopped"
    )
    return _unit_finding(state, "DRIVER_FABRIC_MANAGER_DOWN", Status.CRITICAL, need, remedy)


def persistenced_finding(state: UnitState | str) -> Finding:
    need = "without it the driver re-initialises the GPUs for every client (slow starts, slow nvidia-smi)"
    return _unit_finding(
        state, "DRIVER_PERSISTENCED_DOWN", Status.WARNING, need, "systemctl enable --now nvidia-persistenced"
    )


def dcgm_finding(state: UnitState | str) -> Finding:
    need = "configured (dcgm = true) but the host engine does not run: no DCGM telemetry or diagnostics"
    return _unit_finding(state, "DRIVER_DCGM_DOWN", Status.WARNING, need, "systemctl enable --now nvidia-dcgm")


def gpudirect_finding(facts: StackFacts) -> Finding | None:
    """GPUDirect RDMA matters where RDMA NICs carry NCCL traffic."""
    if facts.rdma_nics == 0:
        return None
    if facts.peermem_loaded:
        return Finding("DRIVER_GPUDIRECT_RDMA_OK", Status.OK, "GPUDirect RDMA: nvidia_peermem loaded")
    if facts.open_kernel_module:
        return Finding(
            "DRIVER_GPUDIRECT_RDMA_OK", Status.OK, "GPUDirect RDMA: dma-buf (the open kernel module is loaded)"
        )
    if facts.open_kernel_module is None:
        return Finding(
            "DRIVER_GPUDIRECT_RDMA_UNKNOWN",
            Status.UNKNOWN,
            "nvidia_peermem is not loaded and /proc/driver/nvidia/version is unreadable: dma-buf support unknown",
        )
    return Finding(
        "DRIVER_GPUDIRECT_RDMA_OFF",
        Status.WARNING,
        f"no GPUDirect RDMA on a node with {facts.rdma_nics} RDMA NIC(s): nvidia_peermem is not loaded and the "
        "proprietary kernel module has no dma-buf path; NCCL stages through host memory",
        remedy="modprobe nvidia_peermem (and list it in /etc/modules-load.d), or install the open kernel module",
    )


# NVML_GPU_FABRIC_STATE_* (nvml.h): what the fabric manager has done for each GPU of an NVSwitch system.
FABRIC_STATES = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}
FABRIC_COMPLETED = 3


def fabric_state_finding(states: dict[int, tuple[int, int]]) -> Finding | None:
    """DRIVER_FABRIC_NOT_READY when NVML reports a GPU whose fabric registration has not completed (or failed):
    CUDA on it fails with "system not yet initialized". ``states``: GPU index -> (state, nvmlReturn status)."""
    reported = {i: s for i, s in states.items() if s[0] != 0}
    bad = {i: s for i, s in reported.items() if s[0] != FABRIC_COMPLETED or s[1] != 0}
    if not reported:
        return None
    if not bad:
        return Finding("DRIVER_FABRIC_NOT_READY_OK", Status.OK, f"NVML: fabric COMPLETED on {len(reported)} GPU(s)")
    listed = ", ".join(
        f"GPU {i} {FABRIC_STATES.get(state, str(state))}" + (f" (status {status})" if status else "")
        for i, (state, status) in sorted(bad.items())
    )
    return Finding(
        "DRIVER_FABRIC_NOT_READY",
        Status.CRITICAL,
        f"NVML: the NVSwitch fabric is not ready: {listed}",
        remedy="the fabric manager has not (or could not) put these GPUs on the fabric: "
        "`journalctl -u nvidia-fabricmanager`, `nvidia-smi -q | grep -A3 Fabric`; restart it, reboot if it persists",
    )
