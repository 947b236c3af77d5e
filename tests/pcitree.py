"""Lay out a PCI tree the way the kernel does under sysfs, for checks that read an injected sysfs root."""

from __future__ import annotations

import os
from pathlib import Path

PCI_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "pci"


def add_pci_device(root: Path, line: str) -> Path:
    """One ``ADDRESS VENDOR DEVICE CLASS DRIVER [FLAGS]`` line (tests/fixtures/pci/SOURCES.md) under sysfs ``root``."""
    address, vendor, device, class_code, driver, *flags = line.split()
    real = root / "devices" / f"pci{address[:7]}" / address
    real.mkdir(parents=True, exist_ok=True)
    (real / "vendor").write_text(vendor + "\n")
    (real / "device").write_text(device + "\n")
    (real / "class").write_text(class_code + "\n")
    if driver != "-":
        drivers = root / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        (real / "driver").symlink_to(os.path.relpath(drivers, real))
    for flag in flags:
        if flag == "vf":
            (real / "physfn").symlink_to("..")
        elif flag.startswith("ib="):
            (real / "infiniband" / flag[3:]).mkdir(parents=True)
    link = root / "bus" / "pci" / "devices" / address
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(real, link.parent))
    return real


def build_pci_tree(root: Path, fixture: str, without: tuple[str, ...] = ()) -> Path:
    """Write ``fixture``'s functions (except the addresses in ``without``) under ``root``; returns ``root``."""
    for line in (PCI_FIXTURES / fixture).read_text().splitlines():
        if line and not line.startswith("#") and line.split()[0] not in without:
            add_pci_device(root, line)
    (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
    return root
