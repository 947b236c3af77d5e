"""The PCI tree under sysfs: which NVIDIA GPUs and Mellanox/NVIDIA NICs are on the bus, whatever their drivers say.

The hardware speaks for itself: a GPU on the bus that NVML does not see, or a ConnectX with no RDMA device, is a
driver or hardware fault, not "nothing here".

By hand: ``lspci -nn -d 10de:`` and ``lspci -nn -d 15b3:``, or ``grep . /sys/bus/pci/devices/*/{vendor,class}``.

Layout (``Documentation/ABI/testing/sysfs-bus-pci``): ``/sys/bus/pci/devices/<domain:bus:dev.fn>`` is a link into
``/sys/devices/pci<domain:bus>/...``; in each device ``vendor`` (``0x10de``), ``device`` (``0x2335``) and ``class``
(``0x030200``: base class, subclass, programming interface) are hex lines, ``driver`` links to the bound driver
(absent when none is bound), ``physfn`` exists on an SR-IOV virtual function, and an RDMA-capable function bound to
mlx5 has an ``infiniband/<mlx5_N>`` directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from msgspec import Struct

VENDOR_NVIDIA = 0x10DE
VENDOR_MELLANOX = 0x15B3  # ConnectX and BlueField, Mellanox's and NVIDIA's alike

# PCI class codes (PCI Code and ID Assignment spec): base class 0x03 display (0x0300 VGA, 0x0302 3D controller,
# what an SXM H100/H200 is); 0x0200 Ethernet and 0x0207 InfiniBand network controllers. NVSwitches are bridges
# (0x0680) and are not GPUs.
CLASS_DISPLAY_BASE = 0x03
NIC_CLASSES = frozenset({0x0200, 0x0207})

# Drivers that take a function away from the host on purpose (passed through to a VM).
PASSTHROUGH_DRIVERS = frozenset({"vfio-pci", "pci-stub"})

PCI_DEVICES = "bus/pci/devices"


class PciDevice(Struct, frozen=True):
    address: str  # 0000:17:00.0, lower case as sysfs names it
    vendor: int
    device: int | None
    class_code: int  # 24 bits: 0x030200
    driver: str | None
    virtual_function: bool
    rdma_devices: tuple[str, ...]  # the infiniband/ children (mlx5_0); empty when none

    @property
    def bus_id(self) -> str:
        """``0000:18:00``: the form the kernel log and the gpu metrics use for a GPU (always function 0)."""
        return self.address.rsplit(".", 1)[0]

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.vendor == VENDOR_NVIDIA and self.class_code >> 16 == CLASS_DISPLAY_BASE

    @property
    def is_mellanox_nic(self) -> bool:
        return self.vendor == VENDOR_MELLANOX and self.class_code >> 8 in NIC_CLASSES

    @property
    def passed_through(self) -> bool:
        return self.driver in PASSTHROUGH_DRIVERS


def _hex(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="ascii").strip(), 16)
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _read_device(path: Path) -> PciDevice | None:
    vendor = _hex(path / "vendor")
    class_code = _hex(path / "class")
    if vendor is None or class_code is None:
        return None
    try:
        driver: str | None = os.path.basename(os.readlink(path / "driver"))
    except OSError:
        driver = None
    try:
        rdma = tuple(sorted(p.name for p in (path / "infiniband").iterdir()))
    except OSError:
        rdma = ()
    return PciDevice(
        address=path.name.lower(),
        vendor=vendor,
        device=_hex(path / "device"),
        class_code=class_code,
        driver=driver,
        virtual_function=(path / "physfn").exists(),
        rdma_devices=rdma,
    )


def read_pci_devices(sysfs_root: Path) -> list[PciDevice] | None:
    """Every PCI function with a readable vendor and class, by address; None when the PCI tree is not there."""
    base = sysfs_root / PCI_DEVICES
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return None
    found = (_read_device(entry) for entry in entries)
    return [d for d in found if d is not None]


def nvidia_gpus(devices: list[PciDevice]) -> list[PciDevice]:
    """NVIDIA display/3D controllers, virtual functions (vGPU) and passed-through ones left out."""
    return [d for d in devices if d.is_nvidia_gpu and not d.virtual_function and not d.passed_through]


def mellanox_nics(devices: list[PciDevice]) -> list[PciDevice]:
    """ConnectX/BlueField physical functions of the host (virtual functions and passed-through ones left out)."""
    return [d for d in devices if d.is_mellanox_nic and not d.virtual_function and not d.passed_through]
