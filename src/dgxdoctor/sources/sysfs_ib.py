"""InfiniBand / RoCE ports from sysfs: ``<sysfs_root>/class/infiniband/<dev>/ports/<n>/``.

Layout and formats: the kernel's Documentation/ABI/stable/sysfs-class-infiniband and
drivers/infiniband/core/sysfs.c. Per port the kernel exposes ``state``, ``phys_state``, ``rate``,
``link_layer``, a ``counters/`` directory (the IBTA PortCounters / PortCountersExtended, read through the
device's PMA) and, for drivers with vendor counters (mlx5: drivers/infiniband/hw/mlx5/counters.c),
``hw_counters/`` (``out_of_buffer``, ``out_of_sequence``, ``packet_seq_err``, ``local_ack_timeout_err``,
``rnr_nak_retry_err``, ``implied_nak_seq_err``, ``duplicate_request``, ``np_cnp_sent``, ``rp_cnp_handled`` ...).

Quirks handled here, all of them seen on real hosts:
- A device without a PMA (some RoCE drivers, soft-RoCE) answers every ``counters/*`` read with the text
  ``N/A (no PMA)`` instead of a number: those counters are *unavailable*, not zero.
- A counter file can fail to read (EIO/EINVAL from the driver while the port is resetting, or the PMA MAD
  timing out): that counter is absent for this read.
- ``hw_counters/lifespan`` is a setting (milliseconds the driver caches the values), not a counter.
- ``port_rcv_data`` / ``port_xmit_data`` count 4-octet words, not bytes (see ``DATA_COUNTERS``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from msgspec import Struct, field

from dgxdoctor.lazy_re import lazy_compile

T = TypeVar("T")

# `state`, e.g. "4: ACTIVE" (kernel: "%d: %s" over ib_port_state; names NOP, DOWN, INIT, ARMED, ACTIVE,
# ACTIVE_DEFER). `phys_state`, e.g. "5: LinkUp" (names Sleep, Polling, Disabled, PortConfigurationTraining,
# LinkUp, LinkErrorRecovery, Phy Test). Both: "<code>: <name>". The name is taken whole and stripped in code: a lazy
# name before ``\s*$`` cost quadratic time on a long run of spaces (a 100 KB line, seconds).
STATE_RE = lazy_compile(r"^\s*(?P<code>\d{1,9})\s*:(?P<name>.*)$")

# `rate`, e.g. "400 Gb/sec (4X NDR)", "200 Gb/sec (4X HDR)", "2.5 Gb/sec (1X SDR)", "25 Gb/sec (1X EDR)"
# on a RoCE port (kernel: "%d%s Gb/sec (%dX%s)"). Older kernels print "40 Gb/sec (4X QDR)"; the
# parenthesis is absent when the width is unknown.
RATE_RE = lazy_compile(r"^\s*(?P<gbps>\d+(?:\.\d+)?)\s*Gb/sec(?:\s*\((?P<width>\d+)X(?P<speed>[^)]*)\))?")

# What the kernel prints instead of a value when the device has no Performance Management Agent.
NO_PMA = "N/A (no PMA)"

# Counters kept in units of 4-octet words (IBTA PortCounters: "Total number of data octets, divided by 4").
# The divisor is the word size, NOT the lane count: a 1X and a 4X link count the same way, so the byte count
# is always value * 4. (Reading it as "per lane, multiply by the width" is a common mistake.)
DATA_COUNTERS = frozenset({"port_rcv_data", "port_xmit_data"})
DATA_WORD_BYTES = 4

# Files in hw_counters/ that are settings, not counters.
NOT_COUNTERS = frozenset({"lifespan"})

# ibstat's names for the numeric codes (infiniband-diags ibstat.c); sysfs and ibstat are normalised to these.
PORT_STATES = {0: "NoChange", 1: "Down", 2: "Initializing", 3: "Armed", 4: "Active", 5: "ActiveDefer"}
PHYS_STATES = {
    0: "NoChange",
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "PhyTest",
}
_STATE_BY_NAME = {
    "nop": "NoChange",
    "down": "Down",
    "init": "Initializing",
    "initializing": "Initializing",
    "armed": "Armed",
    "active": "Active",
    "active_defer": "ActiveDefer",
    "activedefer": "ActiveDefer",
}
_PHYS_BY_NAME = {name.lower().replace(" ", ""): name for name in PHYS_STATES.values()}


class SysfsFormatError(ValueError):
    """A sysfs value that does not have the documented shape."""


class IbPort(Struct, frozen=True):
    """One port as read at one instant. ``None`` means the value could not be read, never a default."""

    device: str
    port: int
    state: str | None = None  # ibstat spelling: "Active", "Down", "Initializing", "Armed" ...
    phys_state: str | None = None  # "LinkUp", "Polling", "Disabled" ...
    rate_gbps: float | None = None
    rate_text: str | None = None  # "400 Gb/sec (4X NDR)" as read
    link_layer: str | None = None  # "InfiniBand" or "Ethernet"
    netdev: str | None = None  # "ibp12s0", as ibdev2netdev shows
    # Present counters only: counters/ and hw_counters/ merged, raw values as read (data counters in words).
    counters: Mapping[str, int] = field(default_factory=dict)
    # Why counters are missing: "N/A (no PMA)", "no counters directory", ...; None when all read.
    counters_note: str | None = None
    source: str = "sysfs"
    # GID table, read only when asked (256 entries per port): gids/<i> "fe80:0000:...:1a2b" and
    # gid_attrs/types/<i> "RoCE v2" or "IB/RoCE v1" (which fails with EINVAL on an unused index: absent here).
    gids: Mapping[int, str] = field(default_factory=dict)
    gid_types: Mapping[int, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def active(self) -> bool:
        return self.state == "Active"


def parse_state(text: str) -> str:
    """``"4: ACTIVE"`` -> ``"Active"`` (ibstat's spelling)."""
    m = STATE_RE.match(text)
    if m is None:
        raise SysfsFormatError(f"port state {text.strip()!r} is not '<code>: <NAME>'")
    code, name = int(m.group("code")), m.group("name").strip()
    return PORT_STATES.get(code) or _STATE_BY_NAME.get(name.lower(), name)


def parse_phys_state(text: str) -> str:
    """``"5: LinkUp"`` -> ``"LinkUp"``."""
    m = STATE_RE.match(text)
    if m is None:
        raise SysfsFormatError(f"physical state {text.strip()!r} is not '<code>: <Name>'")
    code = int(m.group("code"))
    return PHYS_STATES.get(code) or m.group("name").strip()


def normalize_state(name: str) -> str:
    """Either spelling (sysfs ``ACTIVE``, ibstat ``Active``) -> ibstat's."""
    return _STATE_BY_NAME.get(name.strip().lower(), name.strip())


def normalize_phys_state(name: str) -> str:
    return _PHYS_BY_NAME.get(name.strip().lower().replace(" ", ""), name.strip())


def parse_rate(text: str) -> float:
    """``"400 Gb/sec (4X NDR)"`` -> ``400.0``."""
    m = RATE_RE.match(text)
    if m is None:
        raise SysfsFormatError(f"rate {text.strip()!r} is not '<N> Gb/sec (<W>X <SPEED>)'")
    return float(m.group("gbps"))


def parse_counter(text: str) -> int | None:
    """A counter file's text -> its value; ``None`` for ``N/A (no PMA)``. Raises on anything else."""
    value = text.strip()
    if value.startswith("N/A"):
        return None
    try:
        number = int(value, 0)
    except ValueError:
        raise SysfsFormatError(f"counter value {value!r} is not a number") from None
    if number < 0:
        raise SysfsFormatError(f"counter value {value!r} is negative")
    return number


def data_bytes(counters: Mapping[str, int], name: str) -> int | None:
    """Bytes from a data counter (``port_rcv_data`` / ``port_xmit_data``), or ``None`` when absent."""
    value = counters.get(name)
    return None if value is None else value * DATA_WORD_BYTES


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def _read_counters(directory: Path) -> tuple[dict[str, int], int, int]:
    """Read every counter file in ``directory``: (values, how many said "N/A", how many failed)."""
    values: dict[str, int] = {}
    not_available = failed = 0
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return values, 0, 0
    for entry in entries:
        if entry.name in NOT_COUNTERS or entry.name.startswith("."):
            continue
        text = _read(entry)
        if text is None:
            failed += 1
            continue
        try:
            value = parse_counter(text)
        except SysfsFormatError:
            failed += 1
            continue
        if value is None:
            not_available += 1
        else:
            values[entry.name] = value
    return values, not_available, failed


def netdev_map(device_dir: Path) -> dict[int, str]:
    """Port number -> network interface, as ``ibdev2netdev`` does: ``device/net/<if>/dev_port`` (0-based;
    older kernels only have ``dev_id``, in hex). A single interface on a single-port device is port 1."""
    net = device_dir / "device" / "net"
    try:
        names = sorted(p.name for p in net.iterdir())
    except OSError:
        return {}
    mapping: dict[int, str] = {}
    for name in names:
        index = _port_index(net / name)
        if index is not None:
            mapping.setdefault(index + 1, name)
    if not mapping and len(names) == 1:
        mapping[1] = names[0]
    return mapping


def _port_index(netdev_dir: Path) -> int | None:
    raw = _read(netdev_dir / "dev_port")
    if raw is not None and raw.strip().isdigit():
        return int(raw.strip())
    raw = _read(netdev_dir / "dev_id")
    if raw is not None:
        try:
            return int(raw.strip(), 16)
        except ValueError:
            return None
    return None


def _parsed(port_dir: Path, name: str, parse: Callable[[str], T]) -> tuple[str | None, T | None]:
    raw = _read(port_dir / name)
    if raw is None:
        return None, None
    try:
        return raw.strip(), parse(raw)
    except SysfsFormatError:
        return raw.strip(), None


def _indexed(directory: Path) -> dict[int, str]:
    """``gids/<i>``-style directories: index -> non-empty value."""
    found: dict[int, str] = {}
    try:
        entries = list(directory.iterdir())
    except OSError:
        return found
    for entry in entries:
        value = _read(entry) if entry.name.isdigit() else None
        if value and value.strip():
            found[int(entry.name)] = value.strip()
    return found


def gid_is_zero(gid: str) -> bool:
    return gid.replace(":", "").strip("0") == ""


def read_port(
    device_dir: Path,
    port_dir: Path,
    netdevs: Mapping[int, str] | None = None,
    *,
    counters: bool = True,
    gids: bool = False,
) -> IbPort:
    """Read one ``ports/<n>`` directory. Unreadable or malformed files leave their field ``None``.

    ``counters=False`` skips the counter files, ``gids=True`` reads the GID table (the NCCL environment check)."""
    device = device_dir.name
    port = int(port_dir.name)

    _, state = _parsed(port_dir, "state", parse_state)
    _, phys = _parsed(port_dir, "phys_state", parse_phys_state)
    rate_text, rate = _parsed(port_dir, "rate", parse_rate)
    link_raw = _read(port_dir / "link_layer")
    link_layer = (link_raw.strip() or None) if link_raw is not None else None

    values, note = _port_counters(port_dir) if counters else ({}, None)
    return IbPort(
        device=device,
        port=port,
        state=state,
        phys_state=phys,
        rate_gbps=rate,
        rate_text=rate_text,
        link_layer=link_layer,
        netdev=(netdevs or {}).get(port),
        counters=values,
        counters_note=note,
        gids=_indexed(port_dir / "gids") if gids else {},
        gid_types=_indexed(port_dir / "gid_attrs" / "types") if gids else {},
    )


def _port_counters(port_dir: Path) -> tuple[dict[str, int], str | None]:
    """counters/ and hw_counters/ merged (counters/ wins), and why some are missing."""
    counters: dict[str, int] = {}
    notes: list[str] = []
    std_dir, hw_dir = port_dir / "counters", port_dir / "hw_counters"
    if std_dir.is_dir():
        values, na, failed = _read_counters(std_dir)
        counters.update(values)
        if na:
            notes.append(NO_PMA)
        if failed:
            notes.append(f"{failed} unreadable in counters/")
    else:
        notes.append("no counters directory")
    if hw_dir.is_dir():
        values, _, failed = _read_counters(hw_dir)
        for name, value in values.items():
            counters.setdefault(name, value)
        if failed:
            notes.append(f"{failed} unreadable in hw_counters/")
    return counters, "; ".join(notes) or None


def ib_class_dir(sysfs_root: Path) -> Path:
    return sysfs_root / "class" / "infiniband"


def read_ports(sysfs_root: Path, *, counters: bool = True, gids: bool = False) -> list[IbPort]:
    """Every port of every RDMA device under ``<sysfs_root>/class/infiniband``, sorted by device and port.

    Returns an empty list when the class directory is absent or has no devices.
    """
    base = ib_class_dir(sysfs_root)
    try:
        devices = sorted(base.iterdir(), key=lambda p: _natural(p.name))
    except OSError:
        return []
    ports: list[IbPort] = []
    for device_dir in devices:
        ports_dir = device_dir / "ports"
        try:
            port_dirs = sorted((p for p in ports_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        except OSError:
            continue
        netdevs = netdev_map(device_dir)
        ports.extend(read_port(device_dir, port_dir, netdevs, counters=counters, gids=gids) for port_dir in port_dirs)
    return ports


class IbDeviceInfo(Struct, frozen=True):
    """Device-level files: ``fw_ver`` ("28.39.1002"), ``hca_type`` ("MT4129"), ``board_id`` ("MT_0000000838");
    None where unreadable (soft-RoCE has no fw_ver)."""

    device: str
    fw_ver: str | None
    hca_type: str | None
    board_id: str | None


def read_device_info(sysfs_root: Path) -> dict[str, IbDeviceInfo]:
    """``<sysfs_root>/class/infiniband/<dev>/{fw_ver,hca_type,board_id}`` of every RDMA device."""
    try:
        names = sorted((p.name for p in ib_class_dir(sysfs_root).iterdir()), key=_natural)
    except OSError:
        return {}
    out: dict[str, IbDeviceInfo] = {}
    for name in names:
        base = ib_class_dir(sysfs_root) / name
        values = [(_read(base / f) or "").strip() or None for f in ("fw_ver", "hca_type", "board_id")]
        out[name] = IbDeviceInfo(name, *values)
    return out


def ports_by_device(sysfs_root: Path, *, counters: bool = True, gids: bool = False) -> dict[str, dict[int, IbPort]]:
    """device -> port number -> IbPort, every RDMA device listed (one whose ports cannot be read maps to {})."""
    try:
        names = sorted((p.name for p in ib_class_dir(sysfs_root).iterdir()), key=_natural)
    except OSError:
        return {}
    devices: dict[str, dict[int, IbPort]] = {name: {} for name in names}
    for port in read_ports(sysfs_root, counters=counters, gids=gids):
        devices[port.device][port.port] = port
    return devices


def _natural(name: str) -> tuple[object, ...]:
    """``mlx5_10`` sorts after ``mlx5_9``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
