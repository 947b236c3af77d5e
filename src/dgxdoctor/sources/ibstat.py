"""``ibstat`` output (infiniband-diags, src/ibstat.c): one block per CA, one sub-block per port.

A ConnectX-7 NDR port as rdma-core 39+ prints it (tab-indented; copies that went through a web page or a
terminal often have spaces instead, both are accepted)::

    CA 'mlx5_0'
            CA type: MT4129
            Number of ports: 1
            Firmware version: 28.39.1002
            Hardware version: 0
            Node GUID: 0xa088c20300e3142a
            System image GUID: 0xa088c20300e3142a
            Port 1:
                    State: Active
                    Physical state: LinkUp
                    Rate: 400
                    Base lid: 1
                    LMC: 0
                    SM lid: 1
                    Capability mask: 0xa750e84a
                    Port GUID: 0xa088c20300e3142a
                    Link layer: InfiniBand

``Rate`` is Gb/s (``2.5`` for SDR 1X); old releases print no ``Link layer`` line. ``ibstat`` with no RDMA
devices prints nothing and exits 0.
"""

from __future__ import annotations

import re

from msgspec import Struct

from dgxdoctor.lazy_re import lazy_compile
from dgxdoctor.sources.sysfs_ib import IbPort, normalize_phys_state, normalize_state

# CA 'mlx5_0'
CA_RE = lazy_compile(r"^CA\s+'(?P<ca>[^']+)'\s*$")
# \tPort 1:
PORT_RE = lazy_compile(r"^\s+Port\s+(?P<port>\d{1,9}):\s*$")
# \t\tState: Active   /   \t\tPhysical state: LinkUp   /   \t\tRate: 400   /   \t\tLink layer: Ethernet
# The value is taken whole and stripped in code: a lazy value before ``\s*$`` cost quadratic time on a long run of
# spaces (100 KB of ibstat took 42.9 s).
FIELD_RE = lazy_compile(r"^\s+(?P<key>[A-Za-z][A-Za-z ]*?):(?P<value>.*)$")
# Rate: 400   /   Rate: 2.5   /   Rate: 400 Gb/sec (4X NDR)  (hand-edited copies carry a unit)
RATE_VALUE_RE = lazy_compile(r"^(?P<gbps>\d+(?:\.\d+)?)")


class IbstatFormatError(ValueError):
    """Text that claims to be ibstat output but has a block in the wrong place."""


class IbstatPort(Struct, frozen=True):
    ca: str
    port: int
    state: str | None = None
    physical_state: str | None = None
    rate_gbps: float | None = None
    link_layer: str | None = None
    ca_type: str | None = None
    firmware: str | None = None

    def to_dict(self) -> dict[str, object]:
        """The shape of ``dgxdoctor diagnose`` data.ports: every key present, null when ibstat lacked it."""
        rate: float | int | None = self.rate_gbps
        if self.rate_gbps is not None and self.rate_gbps.is_integer():
            rate = int(self.rate_gbps)
        return {
            "ca": self.ca,
            "port": self.port,
            "state": self.state,
            "physical_state": self.physical_state,
            "rate_gbps": rate,
            "link_layer": self.link_layer,
        }

    def to_ib_port(self) -> IbPort:
        """The same port as the sysfs reader returns it (no counters: ibstat shows none)."""
        return IbPort(
            device=self.ca,
            port=self.port,
            state=self.state,
            phys_state=self.physical_state,
            rate_gbps=self.rate_gbps,
            rate_text=None if self.rate_gbps is None else f"{self.rate_gbps:g}",
            link_layer=self.link_layer,
            counters={},
            counters_note="ibstat shows no counters",
            source="ibstat",
        )


def looks_like_ibstat(text: str) -> bool:
    """Cheap and conservative: a ``CA '...'`` line and a ``Port N:`` line with ``State:`` somewhere."""
    if "State:" not in text or "CA" not in text:  # before splitting the 1 MB head of a big log into lines
        return False
    has_ca = any(CA_RE.match(line) for line in text.splitlines()[:50])
    return has_ca and bool(re.search(r"^\s+Port\s+\d+:\s*$", text, re.M))


def parse_ibstat(text: str) -> list[IbstatPort]:
    """Every port in ``text``. Raises IbstatFormatError for a port or field outside a CA block."""
    ports: list[IbstatPort] = []
    ca: str | None = None
    ca_fields: dict[str, str] = {}
    current: dict[str, str] | None = None
    current_port: int | None = None

    def flush() -> None:
        if ca is not None and current is not None and current_port is not None:
            ports.append(_port(ca, current_port, current, ca_fields))

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not line.strip():
            continue
        if m := CA_RE.match(line):
            flush()
            ca, ca_fields, current, current_port = m.group("ca"), {}, None, None
            continue
        if m := PORT_RE.match(line):
            if ca is None:
                raise IbstatFormatError(f"line {lineno}: 'Port' before any CA line: {line.strip()!r}")
            flush()
            current, current_port = {}, int(m.group("port"))
            continue
        if m := FIELD_RE.match(line):
            if ca is None:
                raise IbstatFormatError(f"line {lineno}: field outside a CA block: {line.strip()!r}")
            target = current if current is not None else ca_fields
            target[m.group("key").strip().lower()] = m.group("value").strip()
            continue
        # Anything else (a warning from libibumad, a banner) is not ours to judge.
    flush()
    return ports


def _port(ca: str, port: int, fields: dict[str, str], ca_fields: dict[str, str]) -> IbstatPort:
    rate: float | None = None
    if (raw_rate := fields.get("rate")) is not None and (m := RATE_VALUE_RE.match(raw_rate)):
        rate = float(m.group("gbps"))
    state = fields.get("state")
    phys = fields.get("physical state")
    return IbstatPort(
        ca=ca,
        port=port,
        state=normalize_state(state) if state else None,
        physical_state=normalize_phys_state(phys) if phys else None,
        rate_gbps=rate,
        link_layer=fields.get("link layer") or None,
        ca_type=ca_fields.get("ca type"),
        firmware=ca_fields.get("firmware version"),
    )
