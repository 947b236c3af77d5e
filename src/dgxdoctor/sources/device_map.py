"""Which device a kernel log line means: a PCI address or an interface name, resolved against this node's sysfs.

A GPU is named by its index in PCI bus order (the order ``nvidia-smi`` numbers GPUs in), an NVSwitch likewise, an
HCA by its RDMA device (``mlx5_3``) and interface; anything else keeps the address the line printed. Read once per
run from ``<sysfs_root>/bus/pci/devices`` and ``<sysfs_root>/class/infiniband/*/device/net``.
"""

from __future__ import annotations

from pathlib import Path

from msgspec import Struct, field

from dgxdoctor.sources.pci import VENDOR_NVIDIA, PciDevice, mellanox_nics, nvidia_gpus, read_pci_devices
from dgxdoctor.sources.sysfs_ib import ib_class_dir, netdev_map

CLASS_BRIDGE_OTHER = 0x0680  # an NVSwitch's class (PCI Code and ID Assignment: other bridge)


class Device(Struct, frozen=True):
    """``label``: the metric label and finding subject; ``role``: gpu, nvswitch, hca, or pci; ``text``: for people."""

    label: str
    role: str
    text: str


class DeviceMap(Struct):
    by_pci: dict[str, Device] = field(default_factory=dict)
    by_netdev: dict[str, Device] = field(default_factory=dict)

    def resolve(self, pci: str | None, netdev: str | None, other: str | None = None) -> Device | None:
        """The device a line names (its interface first, then its address); None when it names none."""
        if netdev and netdev in self.by_netdev:
            return self.by_netdev[netdev]
        if pci:
            known = self.by_pci.get(pci.lower())
            if known is not None:
                if netdev and known.role == "hca":
                    return Device(known.label, "hca", f"{known.text} ({netdev})")
                return known
            return Device(
                netdev or pci.lower(), "pci", f"PCI device {pci.lower()}" + (f" ({netdev})" if netdev else "")
            )
        if netdev:
            return Device(netdev, "netdev", f"interface {netdev}")
        if other:
            return Device(other, "other", other)
        return None


def _nvswitches(devices: list[PciDevice]) -> list[PciDevice]:
    return [d for d in devices if d.vendor == VENDOR_NVIDIA and d.class_code >> 8 == CLASS_BRIDGE_OTHER]


def read_device_map(sysfs_root: Path) -> DeviceMap:
    """This node's GPUs, NVSwitches and HCAs by address and interface (empty where sysfs shows none)."""
    out = DeviceMap()
    devices = read_pci_devices(sysfs_root) or []
    for index, gpu in enumerate(nvidia_gpus(devices)):
        out.by_pci[gpu.address] = Device(gpu.address, "gpu", f"GPU {index} ({gpu.address})")
    for index, switch in enumerate(_nvswitches(devices)):
        out.by_pci[switch.address] = Device(switch.address, "nvswitch", f"NVSwitch {index} ({switch.address})")
    for nic in mellanox_nics(devices):
        if nic.rdma_devices:
            name = nic.rdma_devices[0]
            out.by_pci[nic.address] = Device(name, "hca", f"HCA {name} ({nic.address})")
    try:
        ib_devices = sorted(ib_class_dir(sysfs_root).iterdir())
    except OSError:
        ib_devices = []
    for device_dir in ib_devices:
        for port, netdev in netdev_map(device_dir).items():
            suffix = f"/{port}" if port != 1 else ""
            out.by_netdev[netdev] = Device(device_dir.name, "hca", f"HCA {device_dir.name}{suffix} ({netdev})")
    return out
