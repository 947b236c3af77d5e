"""Absent or broken: what the node's declared role requires, and what the PCI bus shows, against what was found.

"Not here and not required" is SKIPPED; everything else that is missing is CRITICAL. Two sources say what must be
there: the node's declared role (``[node] role``) and the hardware itself (NVIDIA GPUs and Mellanox NICs on the PCI
bus, whatever their drivers say). Each function returns None when absence is fine (the check then SKIPs).
"""

from __future__ import annotations

from collections.abc import Sequence

from dgxdoctor.result import Finding, Status
from dgxdoctor.sources.nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_LIBRARY_NOT_FOUND,
)
from dgxdoctor.sources.pci import PciDevice

_DRIVER_REMEDY = (
    "the NVIDIA kernel module is not loaded (typical after a kernel update without the matching DKMS build): "
    "`dmesg | grep -i nvrm`, `modprobe nvidia`; if it fails, reinstall the driver for the running kernel "
    "(`dkms status`, `apt-get install --reinstall nvidia-driver-<version>`) and reboot"
)
_MISMATCH_REMEDY = (
    "the NVML library and the loaded kernel module are from different driver versions (a driver upgrade without a "
    "reboot): compare `cat /proc/driver/nvidia/version` with the installed driver package, then drain and reboot"
)
_LIBRARY_REMEDY = (
    "the driver's user-space libraries are missing (libnvidia-ml.so.1): install the NVIDIA driver (or the "
    "nvidia-ml-py module for dgxdoctor's Python), then `nvidia-smi` must list every GPU"
)
_FELL_OFF_REMEDY = (
    "a GPU on the PCI bus that the driver does not bring up: look for XID 79 / 'RmInitAdapter failed' in the kernel "
    "log (`dmesg | grep -iE 'xid|rminit'`); drain the node and reboot it; if it recurs, the GPU or its riser needs "
    "service"
)


def _ids(devices: Sequence[PciDevice]) -> str:
    return ", ".join(d.address for d in devices)


def nvml_unavailable(
    error: str, code: int | None, pci_gpus: Sequence[PciDevice], role: str | None, expected_count: int
) -> Finding | None:
    """NVML did not start (``error``, NVML's code). CRITICAL when GPUs are on the bus or the role needs them."""
    if pci_gpus:
        if code == NVML_ERROR_DRIVER_NOT_LOADED:
            verdict, remedy = "GPU_DRIVER_NOT_LOADED", _DRIVER_REMEDY
        elif code == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
            verdict, remedy = "GPU_DRIVER_MISMATCH", _MISMATCH_REMEDY
        elif code == NVML_ERROR_LIBRARY_NOT_FOUND:
            verdict, remedy = "GPU_NVML_MISSING", _LIBRARY_REMEDY
        else:
            verdict, remedy = "GPU_NVML_INIT_FAILED", _DRIVER_REMEDY
        return Finding(
            verdict,
            Status.CRITICAL,
            f"{len(pci_gpus)} NVIDIA GPU(s) on the PCI bus ({_ids(pci_gpus)}) but NVML cannot start: {error}",
            remedy=remedy,
        )
    if role is not None:
        need = f"{expected_count} GPUs" if expected_count else "GPUs"
        return Finding(
            "GPU_REQUIRED_MISSING",
            Status.CRITICAL,
            f"the {role} node needs {need} ([node] role) but NVML cannot start and the PCI bus shows no NVIDIA GPU: "
            f"{error}",
            remedy="check `lspci -d 10de:` and `nvidia-smi`: wrong node, GPUs not seen by the firmware, or no driver",
        )
    return None


def no_gpus(pci_gpus: Sequence[PciDevice], role: str | None, expected_count: int) -> Finding | None:
    """NVML started but lists no GPU."""
    if pci_gpus:
        return Finding(
            "GPU_NOT_VISIBLE",
            Status.CRITICAL,
            f"NVML lists no GPU while {len(pci_gpus)} NVIDIA GPU(s) are on the PCI bus ({_ids(pci_gpus)})",
            remedy=_FELL_OFF_REMEDY,
        )
    if role is not None:
        need = f"{expected_count} GPUs" if expected_count else "GPUs"
        return Finding(
            "GPU_REQUIRED_MISSING",
            Status.CRITICAL,
            f"the {role} node needs {need} ([node] role) but NVML lists none and the PCI bus shows none",
            remedy="check `lspci -d 10de:` and `nvidia-smi -L`: wrong node or GPUs not seen by the firmware",
        )
    return None


def gpus_missing_from_nvml(pci_gpus: Sequence[PciDevice], nvml_bus_ids: Sequence[str | None]) -> Finding | None:
    """GPUs on the PCI bus that NVML does not list (bus ids in the kernel log's form, ``0000:18:00``)."""
    if None in nvml_bus_ids:  # a GPU whose bus id NVML could not read might be any of them: count only
        if len(pci_gpus) <= len(nvml_bus_ids):
            return None
        return Finding(
            "GPU_MISSING_FROM_NVML",
            Status.CRITICAL,
            f"{len(pci_gpus)} NVIDIA GPUs on the PCI bus ({_ids(pci_gpus)}), NVML sees {len(nvml_bus_ids)}",
            remedy=_FELL_OFF_REMEDY,
        )
    seen = set(nvml_bus_ids)
    missing = [d for d in pci_gpus if d.bus_id not in seen]
    if not missing:
        return None
    return Finding(
        "GPU_MISSING_FROM_NVML",
        Status.CRITICAL,
        f"{len(missing)} NVIDIA GPU(s) on the PCI bus that NVML does not list: {_ids(missing)} "
        f"({len(pci_gpus)} on the bus, NVML sees {len(nvml_bus_ids)})",
        ", ".join(d.bus_id for d in missing),
        remedy=_FELL_OFF_REMEDY,
    )


def rdma_absent(nics: Sequence[PciDevice], role: str | None, expected_ports: int | None) -> Finding | None:
    """No RDMA device (``/sys/class/infiniband`` empty, ``ibstat`` empty). CRITICAL with NICs on the bus or a role."""
    if nics:
        unbound = [d for d in nics if d.driver is None]
        if unbound:
            why = f"no driver bound to {_ids(unbound)}: `modprobe mlx5_core`, then `dmesg | grep mlx5` for its error"
        else:
            drivers = ", ".join(sorted({d.driver or "" for d in nics}))
            why = f"bound to {drivers} but no RDMA device: `modprobe mlx5_ib` (MLNX_OFED/DOCA-OFED installed?)"
        return Finding(
            "IB_DRIVER_NOT_LOADED",
            Status.CRITICAL,
            f"{len(nics)} Mellanox/NVIDIA NIC function(s) on the PCI bus ({_ids(nics)}) but no RDMA device in "
            "/sys/class/infiniband",
            remedy=f"{why}; NCCL falls back to TCP sockets without it",
        )
    if role is not None:
        need = f"{expected_ports} RDMA ports" if expected_ports else "RDMA ports"
        return Finding(
            "IB_REQUIRED_MISSING",
            Status.CRITICAL,
            f"the {role} node needs {need} ([node] role) but finds no RDMA device and no Mellanox NIC on the PCI bus",
            remedy="check `lspci -d 15b3:` and `ibstat`: wrong node, NIC not seen by the firmware, or no driver",
        )
    return None


def nccl_env_absent(role: str | None, what: str) -> Finding | None:
    """The NCCL environment file (and the process) is not there."""
    if role is None:
        return None
    return Finding(
        "NCCL_ENV_MISSING",
        Status.CRITICAL,
        f"the {role} node needs its NCCL environment ([node] role): {what}",
        remedy="install the NCCL environment file (systemd/nccl.sh as /etc/profile.d/nccl.sh, systemd/nccl.env as "
        "/etc/nccl.env for the units) with NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_IB_GID_INDEX and VLLM_HOST_IP",
    )
