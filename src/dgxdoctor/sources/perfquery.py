"""``perfquery`` output (infiniband-diags, src/perfquery.c), both forms.

Basic PortCounters (``perfquery`` without ``-x``)::

    # Port counters: Lid 1 port 1 (CapMask: 0x1600)
    PortSelect:......................1
    CounterSelect:...................0x0000
    SymbolErrorCounter:..............0
    LinkErrorRecoveryCounter:........0
    LinkDownedCounter:...............0
    PortRcvErrors:...................0
    ...
    PortXmitData:....................4294967295

Extended (``perfquery -x``; with rdma-core's infiniband-diags the error counters follow ``CounterSelect2``)::

    # Port extended counters: Lid 1719 port 1 (CapMask: 0x5300 CapMask2: 0x0000002)
    PortSelect:......................1
    CounterSelect:...................0x0000
    PortXmitData:....................36298026860928
    PortRcvData:.....................12279028775751
    ...
    CounterSelect2:..................0x00000000
    SymbolErrorCounter:..............0

Data counters are in 4-octet words, as in sysfs. ``perfquery -a`` prints one block with ``port 255``
(all ports summed). Field names map to the kernel's sysfs counter names so one threshold table serves both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from msgspec import Struct, field

from dgxdoctor.lazy_re import lazy_compile

# # Port counters: Lid 1 port 1 (CapMask: 0x1600)
# # Port extended counters: Lid 1719 port 1 (CapMask: 0x5300 CapMask2: 0x0000002)
HEADER_RE = lazy_compile(
    r"^#\s*Port\s+(?P<extended>extended\s+)?counters:\s*Lid\s+(?P<lid>\d{1,9})\s+port\s+(?P<port>\d{1,9})\b", re.I
)
# SymbolErrorCounter:..............0        (dots pad the name to a column)
# The dots are taken whole, never given back: the value's ``\S+`` also matches a dot, and giving dots back one at a
# time to it cost quadratic time (100 KB of dots ran past 90 s). Python 3.10 has no possessive ``\.*+``: a lookahead
# captures the run of dots and a backreference consumes exactly that run, the same atomic match.
FIELD_RE = lazy_compile(r"^(?P<name>[A-Za-z][A-Za-z0-9]*):(?=(?P<dots>\.*))(?P=dots)\s*(?P<value>\S+)\s*$")

# perfquery field -> sysfs counters/ file name (drivers/infiniband/core/sysfs.c).
FIELD_TO_COUNTER: Mapping[str, str] = {
    "SymbolErrorCounter": "symbol_error",
    "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed",
    "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors",
    "PortXmitDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors",
    "VL15Dropped": "VL15_dropped",
    "PortXmitData": "port_xmit_data",
    "PortRcvData": "port_rcv_data",
    "PortXmitPkts": "port_xmit_packets",
    "PortRcvPkts": "port_rcv_packets",
    "PortXmitWait": "port_xmit_wait",
    "PortUnicastXmitPkts": "unicast_xmit_packets",
    "PortUnicastRcvPkts": "unicast_rcv_packets",
    "PortMulticastXmitPkts": "multicast_xmit_packets",
    "PortMulticastRcvPkts": "multicast_rcv_packets",
    "QP1Dropped": "QP1_dropped",
}
# Selector fields, not counters.
_NOT_COUNTERS = frozenset({"PortSelect", "CounterSelect", "CounterSelect2"})


class PerfqueryFormatError(ValueError):
    """A counter line whose value is not a number."""


class PerfqueryBlock(Struct, frozen=True):
    lid: int
    port: int
    extended: bool
    # sysfs-style names -> values; fields perfquery did not print are absent.
    counters: Mapping[str, int] = field(default_factory=dict)
    # perfquery's own field names, for evidence lines.
    fields: Mapping[str, str] = field(default_factory=dict)


def looks_like_perfquery(text: str) -> bool:
    head = text.lstrip()[:2000]
    return bool(HEADER_RE.search(head) or re.search(r"^(SymbolErrorCounter|PortXmitData):\.", head, re.M))


def parse_perfquery(text: str) -> list[PerfqueryBlock]:
    """Every counters block in ``text``. A block without a ``# Port ... counters`` header gets lid/port 0."""
    blocks: list[PerfqueryBlock] = []
    header: tuple[int, int, bool] | None = None
    counters: dict[str, int] = {}
    fields: dict[str, str] = {}

    def flush() -> None:
        if header is not None or counters:
            lid, port, extended = header or (0, 0, False)
            blocks.append(PerfqueryBlock(lid, port, extended, dict(counters), dict(fields)))

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if m := HEADER_RE.match(line):
            flush()
            header = (int(m.group("lid")), int(m.group("port")), bool(m.group("extended")))
            counters, fields = {}, {}
            continue
        m = FIELD_RE.match(line)
        if m is None or m.group("name") in _NOT_COUNTERS:
            continue
        name, value = m.group("name"), m.group("value")
        try:
            number = int(value, 0)
        except ValueError:
            raise PerfqueryFormatError(f"line {lineno}: {name} is {value!r}, not a number") from None
        fields[name] = line
        counters[FIELD_TO_COUNTER.get(name, name)] = number
    flush()
    return blocks
