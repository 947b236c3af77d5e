"""NVIDIA XID and NVSwitch SXID lines in the kernel log, and the XID catalog shipped as package data.

Formats are documented in NVIDIA's "Xid Errors" (https://docs.nvidia.com/deploy/xid-errors/) and, for SXids,
the Fabric Manager User Guide. The driver has printed them differently over the years; every form below
was seen in the wild (tests/fixtures/kernel_log/SOURCES.md says where). Whatever precedes ``NVRM:`` or
``nvidia-nvswitchN:`` (a dmesg ``[ 123.456]`` stamp, a syslog/journalctl ``May 18 19:02:39 host kernel:``
prefix, ``dmesg -x`` ``kern  :err   :``) is ignored, so one parser serves kmsg records and pasted logs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from functools import cache
from importlib import resources
from typing import Any, Literal

from msgspec import Struct

from dgxdoctor.lazy_re import lazy_compile

# A PCI address as the driver prints it: domain:bus:device, sometimes .function.
_BUS = r"(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?P<fn>\.[0-7])?"

# Every era of the XID line (the number is all we need to key on; the rest is the driver's text):
#   NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff            (3xx, no "PCI:")
#   NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.                          (no pid)
#   NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.
#   NVRM: Xid (PCI:0000:c6:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus.
#   NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception ...
#   NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 ...)   (NVLink5)
#   NVRM: Xid (PCI:...): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 11 (...)          (address redacted in a paste,
#   NVIDIA/nccl#2241: still an XID 145 event, on a GPU the paste does not name)
XID_RE = lazy_compile(
    r"NVRM: Xid \((?:PCI:)?(?:" + _BUS + r"|(?P<redacted>\.{3}|x{2,4}(?::x{2}){2}))\):\s*(?P<xid>\d{1,9})\b,?\s*"
    r"(?P<rest>.*)$"
)
# The address a paste redacted, as the event's bus id.
REDACTED_BUS = "unknown (redacted)"

# The header cut by a wrapped terminal or mail client: "... NVRM: Xid (PCI:0000:3b:00):" then "79, pid=...".
XID_HEADER_ONLY_RE = lazy_compile(r"NVRM: Xid(?: \((?:PCI:)?[0-9A-Fa-f:.]*\)?:?)?\s*$")

#   pid=1101234, name=nvc:[driver], GPU has fallen off the bus.
#   pid='<unknown>', name=<unknown>, Graphics SM Warp Exception ...
XID_PID_RE = lazy_compile(r"^pid=(?P<pid>'?<unknown>'?|\d{1,10}),\s*(?:name=(?P<name>[^,]*),\s*)?")

# NVLink5 sub-code form (Blackwell, XIDs 144-150), documented under WORKFLOW_NVLINK5_ERR in the XID catalog:
#   149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)
#   144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)
NVLINK5_RE = lazy_compile(
    r"^(?P<unit>[A-Z][A-Z0-9_]*) (?P<sev>Fatal|Nonfatal) XC(?P<xc>\d{1,9}) i(?P<inst>\d{1,9}) "
    r"Link (?P<link>-?\d{1,9})\b"
    r"(?: \((?P<regs>[0-9a-fx ]*)\))?"
)

# XID 154 names the recovery the driver now requires:
#   NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)
# (The action is bounded: unbounded, a long line of " to (" without ")" took quadratic time.)
XID154_RE = lazy_compile(r"recovery action changed from .*? to (?:0x[0-9a-fA-F]+ )?\((?P<action>[^)]{0,200})\)")

# The three lines NVSwitch prints per error; only the one with Fatal/Non-fatal is counted, the other two
# (Severity/Data) repeat the same SXid with register detail:
#   nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt
#   nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 44 Sub-engine instance 00
#   nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Data {0x0000002c, 0x0000002c, 0x00000000, ...}
SXID_RE = lazy_compile(
    r"(?P<device>nvidia-nvswitch\d+): SXid \((?:PCI:)?" + _BUS + r"\):\s*(?P<sxid>\d{1,9}),\s*"
    r"(?P<sev>Fatal|Non-fatal),\s*(?P<rest>.*)$"
)
# The other two lines of the event, read alone when a paste holds no Fatal/Non-fatal line for that SXid (a cut
# paste, or one line copied from a report); the device prefix may be cut too:
#   nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Data {0x0000002c, 0x0000002c, 0x00000000, ...}
#   SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 44 Sub-engine instance 00
SXID_DETAIL_RE = lazy_compile(
    r"(?:(?P<device>nvidia-nvswitch\d+): )?SXid \((?:PCI:)?" + _BUS + r"\):\s*(?P<sxid>\d{1,9}),\s*"
    r"(?P<rest>(?:Severity|Data)\b.*)$"
)
SXID_LINK_RE = lazy_compile(r"\bLink (?P<link>\d{1,9})\b")

# "Fallen off the bus" without an Xid line (counted as XID 79):
#   NVRM: GPU at 0000:01:00.0 has fallen off the bus.                       (older drivers)
#   NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.                     (printed beside Xid 79)
FALLEN_OFF_RE = lazy_compile(r"NVRM: GPU (?:at )?(?:PCI:)?" + _BUS + r":? (?:GPU )?has fallen off the bus")

# Open kernel modules 570+, one printk over three lines (dmesg indents the continuation lines):
#   NVRM: The NVIDIA GPU 0000:b3:00.0
#                  NVRM: (PCI ID: 10de:26b5) installed in this system has
#                  NVRM: fallen off the bus and is not responding to commands.
FALLEN_OFF_HEAD_RE = lazy_compile(r"NVRM: The NVIDIA GPU (?:PCI:)?" + _BUS + r"\b")
FALLEN_OFF_TAIL_RE = lazy_compile(r"NVRM: .*fallen off the bus")
FALLEN_OFF_LOOKAHEAD = 3  # lines from the "The NVIDIA GPU" head to its "fallen off the bus" tail
# The bus id of a fallen-off event whose "The NVIDIA GPU <address>" line is not in the paste.
UNNAMED_BUS = "unknown (not in the paste)"


class XidEvent(Struct, frozen=True):
    pci_bus_id: str
    xid: int
    line: str
    pid: int | None = None
    process: str | None = None
    detail: str = ""
    # NVLink5 sub-code (XIDs 144-150): the unit, whether the driver called it Fatal, and the link.
    nvlink_unit: str | None = None
    nvlink_fatal: bool | None = None
    link: int | None = None
    # XID 154: the recovery action the driver now requires ("GPU Reset Required", ...).
    recovery_action: str | None = None
    # True for a "fallen off the bus" line without an Xid line, counted as XID 79.
    synthesized: bool = False


class SxidEvent(Struct, frozen=True):
    pci_bus_id: str
    sxid: int
    line: str
    device: str
    # What NVSwitch printed (Fatal/Non-fatal); None when read from a Severity/Data line alone, which does not
    # say: judge.xid.sxid_fatal then takes it from the catalog.
    fatal: bool | None
    link: int | None = None
    detail: str = ""
    severity_known: bool = True


def _bus(match: re.Match[str]) -> str:
    """As printed, lowercase, without ``PCI:`` (and without the function for GPU addresses)."""
    bus = match["bus"]
    return REDACTED_BUS if bus is None else bus.lower()


def parse_xid_line(line: str) -> XidEvent | None:
    """An XID event if ``line`` is an NVRM Xid line, else None."""
    match = XID_RE.search(line)
    if match is None:
        return None
    rest = match["rest"].strip()
    pid: int | None = None
    process: str | None = None
    pid_match = XID_PID_RE.match(rest)
    if pid_match is not None:
        raw_pid = pid_match["pid"]
        pid = int(raw_pid) if raw_pid.isdigit() else None
        name = (pid_match["name"] or "").strip()
        process = name if name and name != "<unknown>" else None
        rest = rest[pid_match.end() :]
    xid = int(match["xid"])
    nvlink = NVLINK5_RE.match(rest)
    recovery = XID154_RE.search(rest) if xid == 154 else None
    return XidEvent(
        pci_bus_id=_bus(match),
        xid=xid,
        line=line.strip(),
        pid=pid,
        process=process,
        detail=rest,
        nvlink_unit=nvlink["unit"] if nvlink else None,
        nvlink_fatal=(nvlink["sev"] == "Fatal") if nvlink else None,
        link=int(nvlink["link"]) if nvlink and nvlink["link"] != "-1" else None,
        recovery_action=recovery["action"].strip() if recovery else None,
    )


def parse_sxid_line(line: str) -> SxidEvent | None:
    """An SXID event if ``line`` is the Fatal/Non-fatal line of an NVSwitch SXid, else None."""
    match = SXID_RE.search(line)
    if match is None:
        return None
    rest = match["rest"].strip()
    link = SXID_LINK_RE.search(rest)
    return SxidEvent(
        pci_bus_id=match["bus"].lower() + (match["fn"] or ""),
        sxid=int(match["sxid"]),
        line=line.strip(),
        device=match["device"],
        fatal=match["sev"] == "Fatal",
        link=int(link["link"]) if link else None,
        detail=rest,
    )


def parse_sxid_detail_line(line: str) -> SxidEvent | None:
    """An SXID event from its Severity or Data line alone: the severity is not in the line (the judge takes it
    from the catalog), the switch comes from the device prefix when the paste kept it."""
    match = SXID_DETAIL_RE.search(line)
    if match is None:
        return None
    sxid = int(match["sxid"])
    rest = match["rest"].strip()
    engine = re.search(r"\bEngine instance (?P<link>\d{1,9})\b", rest)
    return SxidEvent(
        pci_bus_id=match["bus"].lower() + (match["fn"] or ""),
        sxid=sxid,
        line=line.strip(),
        device=match["device"] or "NVSwitch",
        fatal=None,
        link=int(engine["link"]) if engine else None,
        detail=rest,
        severity_known=False,
    )


def parse_fallen_off_line(line: str) -> str | None:
    """The GPU's bus id if ``line`` says it fell off the bus outside an Xid line."""
    match = FALLEN_OFF_RE.search(line)
    return _bus(match) if match else None


class KernelLogScanner:
    """Turns kernel log lines into XID/SXID events, keeping the little state that multi-line forms need.

    Feed lines in order (a followed log feeds forever); it handles a wrapped Xid header and the
    three-line "The NVIDIA GPU ... fallen off the bus" message.
    """

    def __init__(self) -> None:
        self._held_header: str | None = None
        self._fallen_head: tuple[str, list[str], int] | None = None  # (bus, lines so far, lines left)

    def feed(self, line: str) -> list[XidEvent | SxidEvent]:
        if self._held_header is not None:
            joined = self._held_header + " " + line.strip()
            self._held_header = None
            event = parse_xid_line(joined)
            if event is not None:
                return [event]
        out: list[XidEvent | SxidEvent] = []
        if "NVRM: Xid" in line:
            event = parse_xid_line(line)
            if event is not None:
                return [event]
            if XID_HEADER_ONLY_RE.search(line):
                self._held_header = line.rstrip()
                return []
        sxid = parse_sxid_line(line) if "SXid" in line else None
        if sxid is not None:
            return [sxid]
        if "fallen off" in line or "The NVIDIA GPU" in line:
            out.extend(self._fallen_off(line))
        elif self._fallen_head is not None:
            self._age_fallen_head(line)
        return out

    def _fallen_off(self, line: str) -> list[XidEvent | SxidEvent]:
        bus = parse_fallen_off_line(line)
        if bus is not None:
            return [
                XidEvent(
                    pci_bus_id=bus, xid=79, line=line.strip(), detail="GPU has fallen off the bus", synthesized=True
                )
            ]
        head = FALLEN_OFF_HEAD_RE.search(line)
        if head is not None:
            if FALLEN_OFF_TAIL_RE.search(line, head.end()):  # the whole message on one (joined) line
                return [XidEvent(_bus(head), 79, line.strip(), detail="GPU has fallen off the bus", synthesized=True)]
            self._fallen_head = (_bus(head), [line.strip()], FALLEN_OFF_LOOKAHEAD)
            return []
        if self._fallen_head is not None and FALLEN_OFF_TAIL_RE.search(line):
            bus, lines, _ = self._fallen_head
            self._fallen_head = None
            whole = " ".join([*lines, line.strip()])  # the message's lines, as one evidence line
            return [XidEvent(bus, 79, whole, detail="GPU has fallen off the bus", synthesized=True)]
        if FALLEN_OFF_TAIL_RE.search(line):
            # The message's last line pasted without its head: a GPU fell off the bus, which one is not said.
            return [XidEvent(UNNAMED_BUS, 79, line.strip(), detail="GPU has fallen off the bus", synthesized=True)]
        return []

    def _age_fallen_head(self, line: str) -> None:
        assert self._fallen_head is not None
        bus, lines, left = self._fallen_head
        lines.append(line.strip())
        self._fallen_head = (bus, lines, left - 1) if left > 1 else None


def scan_lines(lines: Iterable[str]) -> Iterator[XidEvent | SxidEvent]:
    scanner = KernelLogScanner()
    for line in lines:
        yield from scanner.feed(line)


def _lone_sxid_details(lines: list[str], events: list[XidEvent | SxidEvent]) -> list[SxidEvent]:
    """One event per SXid whose Severity/Data lines are in the paste without its Fatal/Non-fatal line."""
    primary = {(e.pci_bus_id, e.sxid) for e in events if isinstance(e, SxidEvent)}
    lone: dict[tuple[str, int], SxidEvent] = {}
    for line in lines:
        if "SXid" not in line:
            continue
        detail = parse_sxid_detail_line(line)
        if detail is not None and (detail.pci_bus_id, detail.sxid) not in primary:
            lone.setdefault((detail.pci_bus_id, detail.sxid), detail)
    return list(lone.values())


# The driver prints "Xid 79" and "GPU ... has fallen off the bus" together; within this many seconds the
# lines of one GPU are one event.
FALLEN_OFF_MERGE_S = 30.0
Merge79 = Literal["new", "same", "better_evidence"]


class FallenOffMerge:
    """The one rule that makes the lines the driver prints for one GPU falling off the bus one XID 79.

    Within ``window_s`` of the previous 79 line of a GPU: a "fallen off the bus" line (``synthesized``) is the same
    event; a real ``Xid 79`` line is the same event when only fallen-off lines came before it (it is then the
    better evidence), and a new one when the event already had its Xid line (two Xid lines are two events).
    """

    def __init__(self, window_s: float = FALLEN_OFF_MERGE_S) -> None:
        self.window_s = window_s
        self._last: dict[str, tuple[float, bool]] = {}  # bus -> (time of its latest 79 line, has an Xid line)

    def classify(self, event: XidEvent, when: float) -> Merge79:
        bus, real = event.pci_bus_id, not event.synthesized
        previous = self._last.get(bus)
        if previous is None or abs(when - previous[0]) > self.window_s:
            self._last[bus] = (when, real)
            return "new"
        had_real = previous[1]
        if real and had_real:
            self._last[bus] = (when, True)
            return "new"
        self._last[bus] = (when, had_real or real)
        return "better_evidence" if real else "same"


def scan_text(text: str) -> list[XidEvent | SxidEvent]:
    """Events of a pasted log in input order, the lines of one GPU falling off the bus merged into one XID 79 by
    ``FallenOffMerge`` (a paste has no reliable clock: its lines count as simultaneous); an SXid seen only in its
    Severity/Data lines counts once, at the end."""
    lines = text.splitlines()
    events = list(scan_lines(lines))
    events.extend(_lone_sxid_details(lines, events))
    merge = FallenOffMerge()
    kept: list[XidEvent | SxidEvent] = []
    for e in events:
        if isinstance(e, XidEvent) and e.xid == 79:
            verdict = merge.classify(e, 0.0)
            if verdict == "same":
                continue
            if verdict == "better_evidence":  # the Xid line replaces the fallen-off line counted for this GPU
                kept = [
                    k for k in kept if not (isinstance(k, XidEvent) and k.synthesized and k.pci_bus_id == e.pci_bus_id)
                ]
        kept.append(e)
    return kept


# --- catalog ---------------------------------------------------------------------------------------


# An XID the shipped catalog does not know (a newer driver's code) is treated as NVIDIA's CONTACT_SUPPORT.
UNKNOWN_XID_RESOLUTION = "CONTACT_SUPPORT"


class CatalogEntry(Struct, frozen=True):
    code: int
    mnemonic: str
    name: str
    description: str
    resolution: str
    unused: bool = False


class XidCatalog(Struct, frozen=True):
    xids: dict[int, CatalogEntry]
    sxids: dict[int, CatalogEntry]
    source: dict[str, str]

    def xid(self, code: int) -> CatalogEntry:
        """The catalog entry; an XID the catalog does not know gets CONTACT_SUPPORT (a new driver's code)."""
        found = self.xids.get(code)
        if found is not None:
            return found
        return CatalogEntry(
            code, "UNKNOWN", f"XID {code} (not in the catalog)", "not in the shipped catalog", UNKNOWN_XID_RESOLUTION
        )

    def sxid(self, code: int) -> CatalogEntry | None:
        return self.sxids.get(code)


def _entry(raw: dict[str, Any], key: str) -> CatalogEntry:
    return CatalogEntry(
        code=int(raw[key]),
        mnemonic=str(raw["mnemonic"]),
        name=str(raw["name"]),
        description=str(raw.get("description", raw["name"])),
        resolution=str(raw["resolution"]),
        unused=bool(raw.get("unused", False)),
    )


@cache
def load_catalog() -> XidCatalog:
    """The catalog shipped in ``dgxdoctor/data/xid_catalog.json`` (its ``source`` says where it came from)."""
    raw = json.loads(resources.files("dgxdoctor").joinpath("data/xid_catalog.json").read_text(encoding="utf-8"))
    return XidCatalog(
        xids={e.code: e for e in (_entry(r, "xid") for r in raw["xid"])},
        sxids={e.code: e for e in (_entry(r, "sxid") for r in raw["sxid"])},
        source=dict(raw["source"]),
    )
